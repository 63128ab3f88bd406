"""Small builders for the policy tests: nodes by utilisation, policies from YAML or dicts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from common.records import NodeName
from coordinator.nodeshards.policy import (
    AgentSchedulerSettings,
    EffectivePolicy,
    NodeView,
    ShardSettings,
    parse_sharding,
)

HERE = Path(__file__).parent
WARM = "node.volcano.sh/warmup"
ALLOC = 10_000  # 10 cores: utilisation u means round(u * 10_000) millicores requested


def node(
    name: str,
    util: float,
    *,
    warm: bool = False,
    holder: str | None = None,
    labels: dict[str, str] | None = None,
    alloc: int = ALLOC,
) -> NodeView:
    all_labels = dict(labels or {})
    if warm:
        all_labels[WARM] = "true"
    return NodeView(NodeName(name), alloc, round(util * alloc), all_labels, holder)


def scheduler(name: str, kind: str, *policies: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "type": kind, "policies": list(policies)}


def band(lo: float, hi: float, weight: int = 1) -> dict[str, Any]:
    return {"name": "allocation-rate", "weight": weight, "arguments": {"minCPUUtil": lo, "maxCPUUtil": hi}}


def warmup(weight: int, **arguments: str) -> dict[str, Any]:
    return {"name": "warmup", "weight": weight, "arguments": arguments}


def limit(max_nodes: int | None = None, min_nodes: int = 0) -> dict[str, Any]:
    args: dict[str, Any] = {"minNodes": min_nodes}
    if max_nodes is not None:
        args["maxNodes"] = max_nodes
    return {"name": "node-limit", "arguments": args}


def policy(
    *schedulers: dict[str, Any],
    band_hysteresis: float = 0.0,
    rank_hysteresis: float = 0.0,
    max_moves: int | None = None,
) -> EffectivePolicy:
    """A policy from scheduler dicts; damping off unless asked for, so tests see Volcano's semantics."""
    text = yaml.safe_dump({"schedulerConfigs": list(schedulers)})
    shards = ShardSettings(band_hysteresis, rank_hysteresis, max_moves)
    return EffectivePolicy(parse_sharding(text, []), AgentSchedulerSettings(shards=shards))


def configmap_data(fixture: str) -> dict[str, str]:
    doc = yaml.safe_load((HERE / fixture).read_text(encoding="utf-8"))
    data: dict[str, str] = doc["data"]
    return data
