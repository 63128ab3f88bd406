"""InterPodAffinity, as kube-scheduler defines it: required pod affinity and anti-affinity as a filter
(including the symmetric rule: a placed pod's required anti-affinity keeps a matching incoming pod out of its
topology domain), preferred terms and placed pods' terms as a score.

Filter, per node, in kube-scheduler's order and with its reasons:
1. required affinity: the node must carry every term's topology key, and each term's domain must hold a pod
   matching all the terms, except that a pod matching its own terms may go anywhere (that has the keys) when no
   pod matches them anywhere (the first pod of a group);
2. required anti-affinity: no pod matching a term in the node's domain for that term's key;
3. placed pods' required anti-affinity: no placed pod whose term matches the incoming pod in the node's domain.

Score: for each topology domain, the summed weights of the incoming pod's preferred affinity terms (minus
those of its preferred anti-affinity terms) times the pods matching them there, plus, for every placed pod whose
required affinity (``hardPodAffinityWeight`` 1), preferred affinity or preferred anti-affinity (negative) term
matches the incoming pod, that term's weight in the placed pod's domain; a node scores the sum over the domains
it is in, normalized min-max to 0..100 over the candidates.

The counts come from the cache (``worker.topology``), never from a walk over the pods; the per-pod state
(kube-scheduler's PreFilter/PreScore) is computed once per decision and reused while the counts are unchanged.
Plugins get the cache through ``attach`` (the engine calls it).

Namespaces as kube-scheduler reads them: a term applies to the namespaces it names, or the pod's own when it
names none and has no ``namespaceSelector``; an empty ``namespaceSelector`` ({}) means every namespace; a
non-empty one adds the namespaces whose labels it matches: for the incoming pod's terms the Namespace objects
that exist (kube unrolls the selector into their names; one that an empty label set satisfies selects every
namespace there, see ``worker.topology.incoming``), for a placed pod's terms the incoming pod's Namespace
labels (empty when it has no object). The counts follow Namespace label changes
(``worker.topology``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from common.records import PodRecord
from worker.framework import Status
from worker.nodeinfo import NodeInfo
from worker.topology import incoming, matches

if TYPE_CHECKING:
    from worker.cache import Cache

AFFINITY_MISMATCH = Status.unresolvable("node(s) didn't match pod affinity rules")
ANTI_AFFINITY_MISMATCH = Status.unschedulable("node(s) didn't match pod anti-affinity rules")
EXISTING_ANTI_AFFINITY = Status.unschedulable("node(s) didn't satisfy existing pods anti-affinity rules")

Counts = dict[str, int]


class _FilterState:
    __slots__ = ("affinity", "anti", "existing", "first")

    def __init__(
        self,
        affinity: list[tuple[str, Counts]],
        first: bool,
        anti: list[tuple[str, Counts]],
        existing: list[tuple[str, Counts]],
    ) -> None:
        self.affinity = affinity
        self.first = first
        self.anti = anti
        self.existing = existing


class InterPodAffinityFilter:
    name = "InterPodAffinity"
    static = False

    def __init__(self) -> None:
        self.cache: Cache | None = None
        self._pod: PodRecord | None = None
        self._version = -1
        self._state: _FilterState | None = None

    def attach(self, cache: Cache) -> None:
        self.cache = cache

    def _prepare(self, pod: PodRecord) -> _FilterState | None:
        assert self.cache is not None, "InterPodAffinity used without a cache"
        topology = self.cache.topology
        if pod is self._pod and topology.version == self._version:
            return self._state
        nodes = self.cache.nodes
        rules = pod.inter_pod
        affinity: list[tuple[str, Counts]] = []
        anti: list[tuple[str, Counts]] = []
        first = False
        if rules is not None and rules.affinity:
            # kube-scheduler counts a pod for the affinity only when it matches every term
            match = tuple(incoming(t.namespaces, t.selector, t.namespace_selector) for t in rules.affinity)
            tracker = topology.tracker(match, live_only=False)
            tracker.affinity = True
            affinity = [(t.topology_key, tracker.counts(t.topology_key, nodes)) for t in rules.affinity]
            first = not any(c for _, c in affinity) and matches(
                match, pod, topology.namespace_labels.get(pod.namespace)
            )
        if rules is not None:
            for t in rules.anti_affinity:
                tracker = topology.tracker(
                    (incoming(t.namespaces, t.selector, t.namespace_selector),), live_only=False
                )
                anti.append((t.topology_key, tracker.counts(t.topology_key, nodes)))
        existing = [(g.term.topology_key, g.domains) for g in topology.anti_against(pod)]
        state = _FilterState(affinity, first, anti, existing) if affinity or anti or existing else None
        self._pod, self._version, self._state = pod, topology.version, state
        return state

    def applies(self, pod: PodRecord) -> bool:
        assert self.cache is not None, "InterPodAffinity used without a cache"
        if pod.inter_pod is None and not self.cache.topology.anti_groups:
            return False  # the common case, decided without building any state
        return self._prepare(pod) is not None

    def node_pods(self, pod: PodRecord) -> bool:
        # the cheap test of ``applies``, without building the state: a pod with no rule of its own passes
        # every node unless some placed pod has a required anti-affinity term (which may match it)
        assert self.cache is not None, "InterPodAffinity used without a cache"
        return pod.inter_pod is not None or bool(self.cache.topology.anti_groups)

    def filter(self, pod: PodRecord, node: NodeInfo) -> Status | None:
        state = self._prepare(pod)
        if state is None:
            return None
        labels = node.node.labels
        if state.affinity:
            exist = True
            for key, counts in state.affinity:
                value = labels.get(key)
                if value is None:
                    return AFFINITY_MISMATCH  # every topology key must be on the node
                if not counts.get(value):
                    exist = False
            if not exist and not state.first:
                return AFFINITY_MISMATCH
        for key, counts in state.anti:
            value = labels.get(key)
            if value is not None and counts.get(value):
                return ANTI_AFFINITY_MISMATCH
        for key, counts in state.existing:
            value = labels.get(key)
            if value is not None and counts.get(value):
                return EXISTING_ANTI_AFFINITY
        return None


class InterPodAffinityScore:
    name = "InterPodAffinityScore"

    def __init__(self, hard_weight: int) -> None:
        self.hard_weight = hard_weight
        self.cache: Cache | None = None
        self._pod: PodRecord | None = None
        self._version = -1
        self._terms: list[tuple[str, Counts, int]] = []

    def attach(self, cache: Cache) -> None:
        self.cache = cache

    def _prepare(self, pod: PodRecord) -> list[tuple[str, Counts, int]]:
        assert self.cache is not None, "InterPodAffinityScore used without a cache"
        topology = self.cache.topology
        if pod is self._pod and topology.version == self._version:
            return self._terms
        nodes = self.cache.nodes
        terms: list[tuple[str, Counts, int]] = []
        rules = pod.inter_pod
        if rules is not None:
            for sign, weighted in ((1, rules.preferred_affinity), (-1, rules.preferred_anti_affinity)):
                for weight, t in weighted:
                    tracker = topology.tracker(
                        (incoming(t.namespaces, t.selector, t.namespace_selector),), live_only=False
                    )
                    terms.append((t.topology_key, tracker.counts(t.topology_key, nodes), sign * weight))
        for g in topology.scoring(pod):
            # weight 0 marks a placed pod's required affinity term: it scores with hardPodAffinityWeight
            terms.append((g.term.topology_key, g.domains, g.weight or self.hard_weight))
        self._pod, self._version, self._terms = pod, topology.version, terms
        return terms

    def applies(self, pod: PodRecord) -> bool:
        assert self.cache is not None, "InterPodAffinityScore used without a cache"
        if pod.inter_pod is None and not self.cache.topology.score_groups:
            return False
        return bool(self._prepare(pod))

    def scores(self, pod: PodRecord, nodes: list[NodeInfo]) -> list[float]:
        terms = self._prepare(pod)
        raw: list[int] = []
        for info in nodes:
            labels = info.node.labels
            total = 0
            for key, counts, weight in terms:
                value = labels.get(key)
                if value is not None:
                    total += weight * counts.get(value, 0)
            raw.append(total)
        low, high = min(raw), max(raw)
        if high == low:
            return [0.0] * len(raw)
        return [float(int(100 * (r - low) / (high - low))) for r in raw]


def inter_pod_affinity_filter(_: Mapping[str, Any]) -> InterPodAffinityFilter:
    return InterPodAffinityFilter()


def inter_pod_affinity_score(args: Mapping[str, Any]) -> InterPodAffinityScore:
    return InterPodAffinityScore(int(args.get("hardPodAffinityWeight", 1)))
