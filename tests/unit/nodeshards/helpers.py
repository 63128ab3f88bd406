"""Builders shared by the NodeShard-level tests: ConfigMap and Node objects as the API server sends them."""

from __future__ import annotations

from typing import Any

from common.records import NodeName

SHARDING = """\
schedulerConfigs:
  - name: agent
    type: agent
    policies:
      - {name: warmup, weight: 5}
      - {name: node-limit, arguments: {maxNodes: %d}}
  - name: batch
    type: volcano
    policies:
      - {name: node-limit, arguments: {maxNodes: 100}}
shardSyncPeriod: "2s"
"""


def ns(*names: str) -> frozenset[NodeName]:
    return frozenset(NodeName(n) for n in names)


def configmap(data: dict[str, str] | None, rv: str, name: str = "cm") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv, "uid": "u1"}, "data": data}


def node_obj(
    name: str, cpu: str, labels: dict[str, str] | None = None, heartbeat: str = "t0"
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}, "resourceVersion": heartbeat},
        "status": {
            "allocatable": {"cpu": cpu, "memory": "1Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": heartbeat}],
        },
    }
