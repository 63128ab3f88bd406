"""NodeAffinity: ``spec.nodeSelector`` plus required node affinity as a filter, preferred node affinity as a
score, with kube-scheduler's semantics (terms are ORed, expressions in a term ANDed; an empty term list
matches nothing)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.records import PodRecord
from worker.framework import Status
from worker.nodeinfo import NodeInfo

_MISMATCH = Status.unresolvable("node(s) didn't match Pod's node affinity/selector")


class AffinityFilter:
    name = "NodeAffinity"
    static = True

    def filter(self, pod: PodRecord, node: NodeInfo) -> Status | None:
        labels = node.node.labels
        for key, value in pod.node_selector:
            if labels.get(key) != value:
                return _MISMATCH
        terms = pod.required_terms
        if terms is not None and not any(t.matches(node.node.name, labels) for t in terms):
            return _MISMATCH
        return None


class AffinityScore:
    """Raw score: the summed weights of the matching preferred terms; normalized to 0..100 by the maximum."""

    name = "NodeAffinityScore"

    def applies(self, pod: PodRecord) -> bool:
        return bool(pod.preferred_terms)

    def scores(self, pod: PodRecord, nodes: list[NodeInfo]) -> list[float]:
        raw = [
            float(sum(w for w, term in pod.preferred_terms if term.matches(info.node.name, info.node.labels)))
            for info in nodes
        ]
        top = max(raw, default=0.0)
        return [100.0 * r / top for r in raw] if top > 0 else raw


def affinity_filter(_: Mapping[str, Any]) -> AffinityFilter:
    return AffinityFilter()


def affinity_score(_: Mapping[str, Any]) -> AffinityScore:
    return AffinityScore()
