"""What the shard policy needs to know about the cluster: nodes, their allocatable CPU and labels, and the CPU
requested on each, kept current by two watches.

- ``NodeTable`` (``coordinator.workershards.pools``; watch of the nodes matching the coordinator's node selector):
  allocatable CPU and labels, the same table the label pool keeps.
- ``RequestTable`` (watch of bound, non-terminal pods, across namespaces): CPU requests summed per node, and per
  node and pod ``schedulerName`` (what ``free-capacity``'s ``reclaim`` reads), updated incrementally per event
  from a pod -> (node, millicores, scheduler) table, so utilisation costs nothing to read.
  The field selector does the filtering: a pod enters the watch when bound and leaves it when it terminates or
  is deleted. Most events of a bound pod change only its status: an event whose ``spec_digest`` (what the
  requests are read from, ``common.records``) equals the entry's keeps the entry's millicores unparsed.

``views`` builds the ``NodeView`` list the policy evaluates (utilisation = requests / allocatable, as in
Volcano's sharding controller; no metrics server).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from common.records import NodeName, pod_from_json, spec_digest
from coordinator.nodeshards.policy import NodeView
from coordinator.workershards.pools import NodeFacts

BOUND_LIVE_PODS = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"


class RequestTable:
    """Watch handler of bound, live pods: CPU requests per node."""

    def __init__(self) -> None:
        self._pods: dict[str, tuple[NodeName, int, str]] = {}
        self._digests: dict[str, bytes] = {}  # the spec digest each entry of ``_pods`` was parsed from
        self._per_node: dict[NodeName, int] = defaultdict(int)
        self._by_scheduler: dict[NodeName, dict[str, int]] = defaultdict(dict)

    def requested(self, node: NodeName) -> int:
        """Millicores requested by the live pods bound to ``node``."""
        return self._per_node.get(node, 0)

    def requested_by(self, node: NodeName) -> dict[str, int]:
        """Millicores requested on ``node`` per pod ``schedulerName`` (a copy; only schedulers with pods)."""
        return dict(self._by_scheduler.get(node, {}))

    def __len__(self) -> int:
        return len(self._pods)

    def _entry(self, obj: dict[str, Any]) -> tuple[str, tuple[NodeName, int, str] | None, bytes]:
        meta = obj.get("metadata") or {}
        key = str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")
        status = obj.get("status") or {}
        spec = obj.get("spec") or {}
        digest = spec_digest(meta, spec)
        old = self._pods.get(key)
        if (
            old is not None
            and digest
            and self._digests.get(key) == digest
            and old[0] == spec.get("nodeName")
            and status.get("phase") not in ("Succeeded", "Failed")
        ):
            return key, old, digest  # the spec (node and requests) is the one the entry was parsed from
        rec = pod_from_json(obj)
        if not rec.node_name or rec.terminal:
            return key, None, digest
        return key, (NodeName(rec.node_name), rec.requests.milli_cpu, rec.scheduler_name), digest

    def _remove(self, key: str) -> None:
        self._digests.pop(key, None)
        old = self._pods.pop(key, None)
        if old is not None:
            node, milli, scheduler = old
            left = self._per_node[node] - milli
            if left:
                self._per_node[node] = left
            else:
                del self._per_node[node]
            per = self._by_scheduler[node]
            mine = per.get(scheduler, 0) - milli
            if mine:
                per[scheduler] = mine
            else:
                per.pop(scheduler, None)
                if not per:
                    del self._by_scheduler[node]

    def replace(self, objects: list[dict[str, Any]]) -> None:
        self._pods.clear()
        self._digests.clear()
        self._per_node.clear()
        self._by_scheduler.clear()
        for obj in objects:
            self.event("ADDED", obj)

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        key, entry, digest = self._entry(obj)
        self._remove(key)
        if kind != "DELETED" and entry is not None:
            self._pods[key] = entry
            node, milli, scheduler = entry
            self._per_node[node] += milli
            per = self._by_scheduler[node]
            per[scheduler] = per.get(scheduler, 0) + milli
            if digest:
                self._digests[key] = digest


def views(
    nodes: Mapping[NodeName, NodeFacts], requests: RequestTable, holders: Mapping[NodeName, str]
) -> list[NodeView]:
    """One ``NodeView`` per node; ``holders`` maps a node to the scheduler whose NodeShard lists it now."""
    return [
        NodeView(
            name,
            facts.allocatable_milli_cpu,
            requests.requested(name),
            facts.labels,
            holders.get(name),
            requests.requested_by(name),
        )
        for name, facts in nodes.items()
    ]
