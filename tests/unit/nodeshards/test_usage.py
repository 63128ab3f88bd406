"""``RequestTable`` and ``views``: CPU requested per node from the pod watch, and the policy's node views."""

from __future__ import annotations

from typing import Any

from common.records import NodeName
from coordinator.nodeshards.usage import RequestTable, views
from coordinator.workershards.pools import NodeTable
from tests.unit.nodeshards.helpers import node_obj


def pod_obj(uid: str, node: str, cpu: str, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": uid, "namespace": "x", "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
        "status": {"phase": phase},
    }


def test_request_table_sums_live_bound_pods_per_node() -> None:
    table = RequestTable()
    table.replace([pod_obj("a", "n1", "500m"), pod_obj("b", "n1", "1")])
    assert table.requested(NodeName("n1")) == 1500
    table.event("MODIFIED", pod_obj("a", "n1", "500m", phase="Succeeded"))
    assert table.requested(NodeName("n1")) == 1000
    table.event("DELETED", pod_obj("b", "n1", "1"))
    assert table.requested(NodeName("n1")) == 0 and len(table) == 0
    table.event("ADDED", pod_obj("c", "n2", "250m"))
    nodes = NodeTable()
    nodes.replace([node_obj("n2", "1")])
    (view,) = views(nodes.nodes, table, {NodeName("n2"): "agent"})
    assert view.util_pct == 25 and view.holder == "agent"


def test_status_only_events_keep_the_entry_and_spec_changes_replace_it() -> None:
    table = RequestTable()
    table.event("ADDED", pod_obj("a", "n1", "500m"))
    running = pod_obj("a", "n1", "500m")
    running["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    table.event("MODIFIED", running)
    assert table.requested(NodeName("n1")) == 500 and len(table) == 1
    table.event("MODIFIED", pod_obj("a", "n1", "700m"))  # resized: the spec changed, parsed again
    assert table.requested(NodeName("n1")) == 700
    table.event("MODIFIED", pod_obj("a", "n1", "700m", phase="Failed"))  # terminal, same spec
    assert table.requested(NodeName("n1")) == 0 and len(table) == 0


def test_request_table_splits_each_node_by_the_pods_scheduler() -> None:
    table = RequestTable()
    agent = pod_obj("a", "n1", "500m")
    agent["spec"]["schedulerName"] = "agent"
    table.replace([agent, pod_obj("b", "n1", "1"), pod_obj("c", "n1", "2")])
    assert table.requested_by(NodeName("n1")) == {"agent": 500, "default-scheduler": 3000}
    table.event("DELETED", pod_obj("b", "n1", "1"))
    table.event("MODIFIED", pod_obj("c", "n1", "2", phase="Failed"))
    assert table.requested_by(NodeName("n1")) == {"agent": 500}
    table.event("DELETED", agent)
    assert table.requested_by(NodeName("n1")) == {} and table.requested(NodeName("n1")) == 0
    nodes = NodeTable()
    nodes.replace([node_obj("n1", "4")])
    table.event("ADDED", agent)
    (view,) = views(nodes.nodes, table, {})
    assert view.requested_by == {"agent": 500}
