"""The capacity audit: what the API server says is placed where, checked against every node's allocatable.

Read back from the API server (not from any scheduler's cache), so it judges every scheduler alike: the demo
prints it, the integration tests assert on it. A node is overcommitted when the summed requests of its
non-terminal pods exceed its allocatable in cpu, memory, an extended resource or the pod count.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from common.kube import KubeClient
from common.records import node_from_json, pod_from_json


@dataclass
class Audit:
    """Bound non-terminal pods, the overcommitted nodes (``"name: [resources]"``) and pods per node."""

    pods_bound: int = 0
    overcommitted: list[str] = field(default_factory=list)
    per_node: dict[str, int] = field(default_factory=dict)


async def audit_capacity(kube: KubeClient) -> Audit:
    """Read every node and non-terminal pod from the API server and check no node's summed requests exceed
    its allocatable (cpu, memory, extended resources, pod count)."""
    nodes = {n["metadata"]["name"]: node_from_json(n) for n in (await kube.get("/api/v1/nodes"))["items"]}
    pods = (
        await kube.get("/api/v1/pods", {"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"})
    )["items"]
    used: dict[str, Any] = {}
    count: dict[str, int] = defaultdict(int)
    out = Audit()
    for obj in pods:
        rec = pod_from_json(obj)
        if not rec.node_name:
            continue
        out.pods_bound += 1
        count[rec.node_name] += 1
        if rec.node_name not in used:
            used[rec.node_name] = rec.requests.copy()
        else:
            used[rec.node_name].add(rec.requests)
    for name, req in used.items():
        node = nodes.get(name)
        if node is None:
            continue
        a = node.allocatable
        over = [
            r
            for r, have, want in [
                ("cpu", a.milli_cpu, req.milli_cpu),
                ("memory", a.memory, req.memory),
                ("pods", a.pods, count[name]),
                *[(k, a.scalar.get(k, 0), v) for k, v in req.scalar.items()],
            ]
            if want > have
        ]
        if over:
            out.overcommitted.append(f"{name}: {over}")
    out.per_node = dict(count)
    return out
