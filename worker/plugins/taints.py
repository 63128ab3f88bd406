"""TaintToleration: the filter (NoSchedule and NoExecute taints must be tolerated) and the score
(fewer untolerated PreferNoSchedule taints is better), as kube-scheduler defines them.

A pod's tolerations are looked up through a ``TolerationIndex``, built once per pod (``index_of`` keeps the
last one: a decision asks about one pod for every node in turn), so a taint costs the same however many
tolerations the pod has."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.records import PodRecord, Taint, Toleration, TolerationIndex
from worker.framework import Status
from worker.nodeinfo import NodeInfo


class _LastIndex:
    """The index of the tolerations asked about last. The tuple is kept referenced, so its identity cannot be
    taken by another tuple while it is compared."""

    __slots__ = ("index", "tolerations")

    def __init__(self) -> None:
        self.tolerations: tuple[Toleration, ...] = ()
        self.index = TolerationIndex(())

    def of(self, tolerations: tuple[Toleration, ...]) -> TolerationIndex:
        if self.tolerations is not tolerations:
            self.tolerations, self.index = tolerations, TolerationIndex(tolerations)
        return self.index


_last = _LastIndex()


def index_of(tolerations: tuple[Toleration, ...]) -> TolerationIndex:
    """The index of ``tolerations``, rebuilt only when another pod's tolerations are asked about."""
    return _last.of(tolerations)


def tolerated(taint: Taint, tolerations: tuple[Toleration, ...]) -> bool:
    return index_of(tolerations).tolerates(taint)


class TaintFilter:
    name = "TaintToleration"
    static = True

    def node_pods(self, pod: PodRecord) -> bool:
        return False  # static: the node record only

    def filter(self, pod: PodRecord, node: NodeInfo) -> Status | None:
        for taint in node.node.taints:
            if taint.effect in ("NoSchedule", "NoExecute") and not tolerated(taint, pod.tolerations):
                return Status.unresolvable(f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}")
        return None


class TaintScore:
    """Raw score: the number of untolerated PreferNoSchedule taints; normalized so fewer scores higher."""

    name = "TaintTolerationScore"

    def applies(self, pod: PodRecord) -> bool:
        return True

    def scores(self, pod: PodRecord, nodes: list[NodeInfo]) -> list[float]:
        if not any(info.node.taints for info in nodes):
            return [100.0] * len(nodes)  # the common case: no taint anywhere, every raw score 0
        raw = [
            sum(
                1
                for t in info.node.taints
                if t.effect == "PreferNoSchedule" and not tolerated(t, pod.tolerations)
            )
            if info.node.taints
            else 0
            for info in nodes
        ]
        top = max(raw, default=0)
        return [100.0 if top == 0 else 100.0 * (top - r) / top for r in raw]


def taint_filter(_: Mapping[str, Any]) -> TaintFilter:
    return TaintFilter()


def taint_score(_: Mapping[str, Any]) -> TaintScore:
    return TaintScore()
