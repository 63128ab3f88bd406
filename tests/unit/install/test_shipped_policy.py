"""The shard policy a fresh install ships gives the agent scheduler nodes on an idle cluster.

Checked with the coordinator's own policy evaluation: Volcano's default policy (what applies when the
coordinator is told to use it until the ConfigMap exists) gives agents only nodes at 70 %+ CPU requested,
so on an idle cluster the agent shard would be empty and nothing would schedule.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from common.records import NodeName
from coordinator.nodeshards.policy import NodeView, default_policy, parse_configmap

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ROOT / "manifests" / "configmap-sharding.yaml"


def idle_nodes(count: int) -> list[NodeView]:
    return [
        NodeView(name=NodeName(f"node-{i:04d}"), allocatable_milli_cpu=32_000, requested_milli_cpu=0)
        for i in range(count)
    ]


def shipped_data() -> dict[str, str]:
    doc = yaml.safe_load(SHIPPED.read_text())
    assert doc["kind"] == "ConfigMap"
    assert doc["metadata"]["name"] == "volcano-sharding-configmap"
    data: dict[str, str] = doc["data"]
    return data


def test_volcano_default_policy_leaves_agents_without_nodes_when_idle() -> None:
    result = default_policy().evaluate(idle_nodes(200))
    assert len(result.desired["agent-scheduler"]) == 0


@pytest.mark.parametrize("count", [200, 10, 1])
def test_shipped_policy_gives_agents_nodes_on_an_idle_cluster(count: int) -> None:
    policy = parse_configmap(shipped_data())
    result = policy.evaluate(idle_nodes(count))
    agent = result.desired["agent-scheduler"]
    assert len(agent) == min(count, 50)
    # Volcano still gets the nodes the agent scheduler did not take, up to its limit.
    assert len(result.desired["volcano"]) == min(count - len(agent), 100)
    assert not set(agent) & set(result.desired["volcano"])


def test_shipped_policy_still_prefers_busy_nodes_for_agents() -> None:
    nodes = idle_nodes(100) + [
        NodeView(name=NodeName(f"busy-{i:02d}"), allocatable_milli_cpu=32_000, requested_milli_cpu=24_000)
        for i in range(10)
    ]
    agent = parse_configmap(shipped_data()).evaluate(nodes).desired["agent-scheduler"]
    assert {f"busy-{i:02d}" for i in range(10)} <= set(agent)
