"""The agent node pool: which nodes the shard map hands out to workers, and what each weighs. One seam,
``PoolSource``; two implementations.

- ``LabelPool``: every node matching a label selector, kept current by its own watch. Used when no shard policy
  is configured.
- ``PolicyPool``: the pool as the NodeShard level decides it. Only ``coordinator.nodeshards.ShardingController``
  sets it.

A node's weight is its allocatable CPU in cores, at least 1 (``NodeFacts.weight``); ``pool_weights`` is the one
place a set of nodes becomes a pool, for both implementations (the NodeShard controller also uses it for the
label-selected pool it offers before a policy is in force).

Invariants:
- A pool that has not yet listed its nodes, or whose watch is down, keeps answering with its last good set (the
  shard map would otherwise revoke every node); before the first list it answers empty, which grants nothing.
- ``PolicyPool`` (kept by the controller, stated here because this is what the shard map trusts): a node enters
  the pool only after it has been published in the agent NodeShard's ``status.nodesInUse`` and while no other
  NodeShard's ``status.nodesInUse`` lists it. Leaving the pool needs nothing: the shard map then revokes the
  node, and the controller keeps publishing it until the worker released it.
- Listeners are told only when the pool (names or weights) changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from common.kube import KubeClient
from common.records import NodeName, node_from_json
from common.watching import Reflector

PoolSource = Callable[[], Mapping[NodeName, float]]
"""Agent-pool node -> capacity weight; read by the shard map at the start of every round."""


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """The parts of a Node the pools and the shard policy read."""

    allocatable_milli_cpu: int
    labels: Mapping[str, str]

    @property
    def weight(self) -> float:
        """Share of the pool for the shard map: allocatable cores, at least 1."""
        return max(1.0, self.allocatable_milli_cpu / 1000.0)


def pool_weights(nodes: Mapping[NodeName, NodeFacts], names: Iterable[NodeName]) -> dict[NodeName, float]:
    """Shard-map weights of the named nodes that exist."""
    return {n: nodes[n].weight for n in names if n in nodes}


def label_pool_reason(selector: str) -> str:
    """Why a label-selected pool is empty (for the operator: events and readiness)."""
    if selector:
        return f"no node matches the agent node selector {selector!r}"
    return "the cluster has no nodes"


class NodeTable:
    """Watch handler (``common.watching.WatchHandler``) of a set of nodes: allocatable CPU and labels.

    Reports a change only when something a pool or the policy reads changed (a node added or deleted, its labels
    or allocatable CPU), never for the status heartbeats kubelets and kwok write all the time. A node's facts
    depend only on its name, ``status.allocatable`` and ``metadata.labels``: an event whose two are equal to
    the ones last parsed for that node is not parsed again: a heartbeat costs a comparison of two small
    mappings instead of a full ``node_from_json`` (about 3 µs against 22 for a bench node on the development
    machine), and 5,000 nodes send about 17 a second.
    """

    def __init__(self) -> None:
        self.nodes: dict[NodeName, NodeFacts] = {}
        self.listeners: list[Callable[[], None]] = []
        self.version = 0  # grows with every reported change
        self._parsed: dict[str, tuple[Any, Any]] = {}  # per node in ``nodes``: (allocatable, labels) parsed

    @staticmethod
    def _facts(obj: dict[str, Any]) -> tuple[NodeName, NodeFacts]:
        rec = node_from_json(obj)
        return rec.name, NodeFacts(rec.allocatable.milli_cpu, dict(rec.labels))

    @staticmethod
    def _inputs(obj: dict[str, Any]) -> tuple[str, tuple[Any, Any]]:
        """The node's name and the two fields its facts are parsed from, as the event carries them."""
        meta = obj.get("metadata") or {}
        return meta.get("name") or "", ((obj.get("status") or {}).get("allocatable"), meta.get("labels"))

    def _changed(self) -> None:
        self.version += 1
        for callback in self.listeners:
            callback()

    def replace(self, objects: list[dict[str, Any]]) -> None:
        fresh = dict(self._facts(o) for o in objects)
        self._parsed = dict(self._inputs(o) for o in objects)
        if fresh != self.nodes:
            self.nodes = fresh
            self._changed()

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            name, _ = self._facts(obj)
            self._parsed.pop(name, None)
            if self.nodes.pop(name, None) is not None:
                self._changed()
            return
        key, inputs = self._inputs(obj)
        if self._parsed.get(key) == inputs:
            return  # the same inputs parse to the same facts
        name, facts = self._facts(obj)
        self._parsed[name] = inputs
        if self.nodes.get(name) != facts:
            self.nodes[name] = facts
            self._changed()


class PolicyPool:
    """A ``PoolSource`` its owner sets: calling it returns the current pool (read-only)."""

    def __init__(self) -> None:
        self._weights: Mapping[NodeName, float] = MappingProxyType({})
        self.listeners: list[Callable[[], None]] = []

    def __call__(self) -> Mapping[NodeName, float]:
        return self._weights

    def nodes(self) -> frozenset[NodeName]:
        return frozenset(self._weights)

    def set(self, weights: Mapping[NodeName, float]) -> bool:
        """Replace the pool; tell the listeners when it changed. True when it changed."""
        if dict(weights) == dict(self._weights):
            return False
        self._weights = MappingProxyType(dict(weights))
        for callback in self.listeners:
            callback()
        return True


class LabelPool:
    """A ``PoolSource``: the nodes matching ``selector`` (all nodes when empty), from its own watch."""

    def __init__(self, client: KubeClient, selector: str = "") -> None:
        self._table = NodeTable()
        self._table.listeners.append(self._refresh)
        self._weights: Mapping[NodeName, float] = MappingProxyType({})
        self.listeners: list[Callable[[], None]] = []
        self.reflector = Reflector(
            client,
            "/api/v1/nodes",
            self._table,
            params={"labelSelector": selector} if selector else {},
            name="pool-nodes",
        )

    def __call__(self) -> Mapping[NodeName, float]:
        return self._weights

    def _refresh(self) -> None:
        weights = pool_weights(self._table.nodes, self._table.nodes)
        if weights != dict(self._weights):
            self._weights = MappingProxyType(weights)
            for callback in self.listeners:
                callback()

    async def run(self) -> None:
        await self.reflector.run()
