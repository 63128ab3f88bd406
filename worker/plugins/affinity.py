"""NodeAffinity: ``spec.nodeSelector`` plus required node affinity as a filter, preferred node affinity as a
score, with kube-scheduler's semantics (terms are ORed, expressions in a term ANDed; an empty term list
matches nothing).

A pod with many required requirements (``common.records`` bounds them at ``MAX_REQUIREMENTS``) has its verdict
per node kept for as long as the same pod is asked about: a decision that finds no node asks once while
walking the candidates and once more while explaining, and the second pass then costs a lookup per node."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.records import PodRecord, SelectorTerm
from worker.framework import Status
from worker.nodeinfo import NodeInfo

_MISMATCH = Status.unresolvable("node(s) didn't match Pod's node affinity/selector")
# Below this many required requirements a verdict is cheaper to compute again than to look up.
_REMEMBER_FROM = 16


def _requirement_count(terms: tuple[SelectorTerm, ...] | None) -> int:
    return sum(len(t.expressions) + len(t.fields) for t in terms or ())


class AffinityFilter:
    name = "NodeAffinity"
    static = True

    def __init__(self) -> None:
        self._pod: PodRecord | None = None
        self._remember = False
        # node name -> (the labels the verdict was made on, verdict), for ``self._pod`` only
        self._verdicts: dict[str, tuple[dict[str, str], Status | None]] = {}

    def node_pods(self, pod: PodRecord) -> bool:
        return False  # static: the node record only

    def filter(self, pod: PodRecord, node: NodeInfo) -> Status | None:
        if pod is not self._pod:
            self._pod = pod
            self._remember = _requirement_count(pod.required_terms) >= _REMEMBER_FROM
            self._verdicts = {}
        if not self._remember:
            return _verdict(pod, node)
        labels = node.node.labels
        seen = self._verdicts.get(node.node.name)
        if seen is not None and seen[0] is labels:
            return seen[1]
        verdict = _verdict(pod, node)
        self._verdicts[node.node.name] = (labels, verdict)
        return verdict


def _verdict(pod: PodRecord, node: NodeInfo) -> Status | None:
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
