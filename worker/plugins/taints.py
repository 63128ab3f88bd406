"""TaintToleration: the filter (NoSchedule and NoExecute taints must be tolerated) and the score
(fewer untolerated PreferNoSchedule taints is better), as kube-scheduler defines them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.records import PodRecord, Taint, Toleration
from worker.framework import Status
from worker.nodeinfo import NodeInfo


def tolerated(taint: Taint, tolerations: tuple[Toleration, ...]) -> bool:
    return any(t.tolerates(taint) for t in tolerations)


class TaintFilter:
    name = "TaintToleration"
    static = True

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
