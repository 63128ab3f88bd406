"""Resource plugins: NodeResourcesFit (filter) and the allocation scores MostAllocated (binpack, the
default for agent pods: it leaves whole nodes free for batch work), LeastAllocated and BalancedAllocation.

Scores follow kube-scheduler: CPU and memory, each weighted 1, using the non-zero request defaults for
request-less pods, on a 0..100 scale. The allocation scores read the same requested fractions: one pass over
the nodes computes all three lists, kept with the pod, the node list and each node's ``generation`` they came
from, so the second plugin of a decision takes its list while all three are unchanged (``_Last``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.records import (
    DEFAULT_MEMORY_FOR_SCORING,
    DEFAULT_MILLI_CPU_FOR_SCORING,
    EPHEMERAL_STORAGE,
    PodRecord,
)
from worker.framework import Code, Status
from worker.nodeinfo import NodeInfo

_TOO_MANY_PODS = Status.unschedulable("Too many pods")


class NodeResourcesFit:
    name = "NodeResourcesFit"
    static = False

    def node_pods(self, pod: PodRecord) -> bool:
        return True  # the node's requested resources and pod count (preemption's arithmetic reproduces it)

    def filter(self, pod: PodRecord, node: NodeInfo) -> Status | None:
        req = pod.requests
        alloc = node.node.allocatable
        used = node.requested
        if len(node.pods) + 1 > alloc.pods:
            return _TOO_MANY_PODS
        # The common case, a fit, decided without building the reasons (this runs for every candidate node).
        if (
            (not req.milli_cpu or req.milli_cpu <= alloc.milli_cpu - used.milli_cpu)
            and (not req.memory or req.memory <= alloc.memory - used.memory)
            and (
                not req.ephemeral_storage
                or req.ephemeral_storage <= alloc.ephemeral_storage - used.ephemeral_storage
            )
            and not req.scalar
        ):
            return None
        reasons: list[str] = []
        code = Code.UNSCHEDULABLE
        if req.milli_cpu and req.milli_cpu > alloc.milli_cpu - used.milli_cpu:
            reasons.append("Insufficient cpu")
            if req.milli_cpu > alloc.milli_cpu:
                code = Code.UNRESOLVABLE
        if req.memory and req.memory > alloc.memory - used.memory:
            reasons.append("Insufficient memory")
            if req.memory > alloc.memory:
                code = Code.UNRESOLVABLE
        if req.ephemeral_storage and req.ephemeral_storage > alloc.ephemeral_storage - used.ephemeral_storage:
            reasons.append(f"Insufficient {EPHEMERAL_STORAGE}")
            if req.ephemeral_storage > alloc.ephemeral_storage:
                code = Code.UNRESOLVABLE
        for name, amount in req.scalar.items():
            have = alloc.scalar.get(name, 0)
            if amount > have - used.scalar.get(name, 0):
                reasons.append(f"Insufficient {name}")
                if amount > have:
                    code = Code.UNRESOLVABLE
        return Status(code, tuple(reasons)) if reasons else None


class _Last:
    """The allocation scores computed last, with what they were computed from. MostAllocated and
    BalancedAllocation both score the same nodes for the same pod one after the other in a decision: the first
    computes both lists in one pass over the nodes, the second takes its list when the pod is the same object,
    the node list holds the same ``NodeInfo`` objects in the same order and no node changed since (its
    ``generation``, which every change of its record or pods bumps)."""

    __slots__ = ("balanced", "generations", "least", "most", "nodes", "pod")

    def __init__(self) -> None:
        self.pod: PodRecord | None = None
        self.nodes: list[NodeInfo] = []
        self.generations: list[int] = []
        self.most: list[float] = []
        self.least: list[float] = []
        self.balanced: list[float] = []


_last = _Last()


def _scores(pod: PodRecord, nodes: list[NodeInfo]) -> _Last:
    """The three allocation scores of ``nodes`` for ``pod`` (``_last``, recomputed unless still current)."""
    last = _last
    generations = [info.generation for info in nodes]
    if last.pod is pod and last.nodes == nodes and last.generations == generations:
        return last
    pod_cpu = pod.requests.milli_cpu or DEFAULT_MILLI_CPU_FOR_SCORING
    pod_mem = pod.requests.memory or DEFAULT_MEMORY_FOR_SCORING
    most: list[float] = []
    least: list[float] = []
    balanced: list[float] = []
    for info in nodes:
        alloc = info.node.allocatable
        cpu = alloc.milli_cpu
        memory = alloc.memory
        # the requested fractions with the pod added, capped at 1 (kube-scheduler's rule); ``min(1.0, x)``
        # spelled out: the same value, without a call per node (this runs on every decision)
        c = (info.nonzero_cpu + pod_cpu) / cpu if cpu > 0 else 1.0
        m = (info.nonzero_memory + pod_mem) / memory if memory > 0 else 1.0
        fc = c if c < 1.0 else 1.0
        fm = m if m < 1.0 else 1.0
        most.append(50.0 * (fc + fm))
        least.append(50.0 * ((1.0 - fc) + (1.0 - fm)))
        balanced.append(100.0 * (1.0 - abs(fc - fm) / 2.0))
    last.pod, last.nodes, last.generations = pod, list(nodes), generations
    last.most, last.least, last.balanced = most, least, balanced
    return last


class MostAllocated:
    """Higher for fuller nodes: packs agent pods tightly."""

    name = "MostAllocated"

    def batch_key(self, pod: PodRecord) -> tuple[()]:
        return ()  # the pod's requests, all these scores read of it, are in every shape

    def applies(self, pod: PodRecord) -> bool:
        return True

    def scores(self, pod: PodRecord, nodes: list[NodeInfo]) -> list[float]:
        return list(_scores(pod, nodes).most)


class LeastAllocated:
    """Higher for emptier nodes: spreads pods."""

    name = "LeastAllocated"

    def batch_key(self, pod: PodRecord) -> tuple[()]:
        return ()  # the pod's requests, all these scores read of it, are in every shape

    def applies(self, pod: PodRecord) -> bool:
        return True

    def scores(self, pod: PodRecord, nodes: list[NodeInfo]) -> list[float]:
        return list(_scores(pod, nodes).least)


class BalancedAllocation:
    """Higher when CPU and memory are used in the same proportion (100 minus their spread)."""

    name = "BalancedAllocation"

    def batch_key(self, pod: PodRecord) -> tuple[()]:
        return ()  # the pod's requests, all these scores read of it, are in every shape

    def applies(self, pod: PodRecord) -> bool:
        return True

    def scores(self, pod: PodRecord, nodes: list[NodeInfo]) -> list[float]:
        return list(_scores(pod, nodes).balanced)


def fit(_: Mapping[str, Any]) -> NodeResourcesFit:
    return NodeResourcesFit()


def most_allocated(_: Mapping[str, Any]) -> MostAllocated:
    return MostAllocated()


def least_allocated(_: Mapping[str, Any]) -> LeastAllocated:
    return LeastAllocated()


def balanced(_: Mapping[str, Any]) -> BalancedAllocation:
    return BalancedAllocation()
