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

    def score(self, pod: PodRecord, node: NodeInfo) -> float:
        return float(
            sum(
                1
                for t in node.node.taints
                if t.effect == "PreferNoSchedule" and not tolerated(t, pod.tolerations)
            )
        )

    def normalize(self, scores: list[float]) -> None:
        top = max(scores, default=0.0)
        for i, s in enumerate(scores):
            scores[i] = 100.0 if top == 0 else 100.0 * (top - s) / top


def taint_filter(_: Mapping[str, Any]) -> TaintFilter:
    return TaintFilter()


def taint_score(_: Mapping[str, Any]) -> TaintScore:
    return TaintScore()
