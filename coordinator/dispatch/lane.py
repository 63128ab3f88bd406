"""The topology lane: the leader's rules for dispatching pods whose placement rules span nodes, so that workers
deciding at once never break one. The argument is in docs/architecture.md ("Inter-pod rules across shards").

Why a lane at all: every worker holds every node and every non-terminal pod of the cluster (its topology
counts are cluster-wide, ``worker.topology``); only its *candidates* are its own nodes. What a worker can
lack is a placement another worker decided whose binding its pod watch has not shown yet. A rule of the pod
being decided that reads other nodes' pods can then be broken, and so can the symmetric rule of an unseen pod
(a required anti-affinity keeps matching pods out of its domain).

Classes (``common.claims.lane_rule``, shared with the workers' claims):
- lane pods state a required cross-node rule: a topologySpreadConstraint with ``DoNotSchedule`` (any key,
  ``kubernetes.io/hostname`` too: the skew compares the nodes of every shard), a required podAntiAffinity
  term whose topologyKey is not ``kubernetes.io/hostname``, or a required podAffinity term (any key: the pod
  it needs may sit on another shard's node);
- plain pods are all others. Their hostname-level anti-affinity is shard-local (a node has one owner, which
  sees its own assumed pods; a node changes owner only after the new owner's cache caught up with it), and
  their preferred terms and ``ScheduleAnyway`` constraints are scores (a race changes a score, not a rule).

Rules (``Lane``; the dispatcher asks ``wait`` before it chooses a worker):
1. A lane pod is *in flight* from its DISPATCH until it is *settled*: the leader's pending-pod watch showed it
   leave the pending set (bound or deleted) at resourceVersion r, or a worker answered it without placing it
   (unschedulable, rejected, gone). A RESULT bound does not settle it: the resourceVersion of its binding is
   known only once the watch shows it. A lane pod goes out only when no lane pod in flight *interacts* with it
   (``interact``: one's labels match a selector of the other's required rules, either way, or one pod could
   match a selector of each: spread selectors, affinity and anti-affinity terms of any key), and at most
   ``MAX_IN_FLIGHT`` are in flight. Pods of one constraint group therefore go one at a time, in the order they
   are considered; independent groups go side by side ("one at a time cluster-wide" is the special case where
   every lane pod interacts).
2. Every DISPATCH carries ``min_rv`` and the worker decides the pod only once its pod watch has reached it:
   for a lane pod ``settled_rv``, the highest resourceVersion at which the watch showed any of our pods leave
   the pending set (every placement of ours the leader knows of); for a plain pod ``lane_rv``, the same over
   lane pods only (the placements whose anti-affinity a plain pod must respect). A worker sends a lane pod's
   binding only after the bindings it submitted before (``worker.binder``), so everything the decision counted
   is below the resourceVersion that settles it: a later interacting lane pod sees all of it.
3. A plain pod matching a cross-node required anti-affinity term of a lane pod in flight waits until that pod
   is settled; a lane pod with cross-node required anti-affinity waits until no pod in flight matches one of
   its terms (in flight: dispatched and not answered, answered bound and not yet seen by the watch, or
   claimed by a worker and still pending in the leader's view). A worker never claims a plain pod matching
   such a term of a pod pending in its own view (``common.claims``), and its watch shows every lane pod
   created before the plain pod: so each of the two pods is decided by a worker that sees the other placed.
   (With worker claims on, which is experimental, that holds only for pods the leader counts as claimed:
   docs/architecture.md, "Worker claims", lists the known gaps.)
4. A pod whose dispatch was lost (its worker's stream went down, or no RESULT came in time) may still be
   bound by the worker that had it. For ``LOST_HOLD`` after that, or until the watch shows it bound or
   deleted, it still counts as in flight for rules 1 and 3 (lane pods interacting with it wait, pods matching
   its cross-node anti-affinity wait, lane pods whose anti-affinity matches it wait); it may itself go out
   again at once.
5. A lane pod a shard cannot place is tried on the other shards as any pod is (``pending``); it leaves the
   lane meanwhile (no placement was made) and enters it again when it goes out next.
6. Earlier terms. A worker may still place pods an earlier leader dispatched (or it claimed) before this term
   began, which this term's lane knows nothing of. So a term starts *inheriting*: no lane pod goes out, and no
   plain pod matching a cross-node required anti-affinity term of a pod pending in the leader's view
   (``inherited_wait``), until every live worker has said, over this term's stream, that it has no binding
   of a pod from an earlier stream under way (CAPACITY ``earlier`` 0: a worker drops the queued ones when a
   new stream begins, and counts the others until its pod watch shows them), or for ``LOST_HOLD`` (as rule
   4) while no worker says it still binds one. A sole worker's period ending starts it again
   (``Dispatcher.check_sole``). All the while both versions follow the highest revision the workers
   reported (``listed``): the newest pod their watches delivered, at or above each binding a worker's watch
   showed, and one every worker's pod watch reaches by its own events (a list's or a bookmark's version might
   not be reached until the next bookmark). Every list of the leader's watch raises them to its newest pod's
   version. A pod with a lane rule that leaves the pending set raises ``lane_rv`` even when this term did not
   dispatch it (``seen``).

Nothing here talks to workers or the API server: the dispatcher tells the lane what happened
(``dispatched``, ``answered_bound``, ``answered``, ``lost``, ``seen``, ``listed``) and reads ``wait``,
``inherited_wait`` and ``min_rv``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Final, NamedTuple

from common.claims import cross_node_anti_affinity, lane_rule
from common.records import LabelSelector, PodKey, PodRecord, PodTerm, Requirement

MAX_SHAPES: Final = 4096  # lane shapes remembered (with the pairs decided between them) before starting over
LOST_HOLD: Final = 30.0  # seconds a pod whose dispatch was lost still counts as in flight (rule 4)
MAX_IN_FLIGHT: Final = 64  # lane pods in flight at once (each candidate is checked against all of them)

# why a pod waits (the ``reason`` label of the lane-wait metric)
BUSY: Final = "lane_busy"  # a lane pod in flight interacts with it, or the lane is full
ANTI_AFFINITY: Final = "anti_affinity"  # rule 3, either direction
LOST: Final = "lost_dispatch"  # rule 4: a lane pod it interacts with was lost lately
EARLIER_TERM: Final = "earlier_term"  # rule 6: a placement of an earlier term may still be under way


class Wait(NamedTuple):
    """Why a pod waits, and the lane pod in flight it waits for (None: no single one, e.g. a full lane)."""

    reason: str
    blocker: PodKey | None = None


def _matches(terms: tuple[PodTerm, ...], pod: PodRecord) -> bool:
    return any(t.matches(pod.namespace, pod.labels) for t in terms)


def _reads(pod: PodRecord, other: PodRecord) -> bool:
    """Does ``other`` count for one of ``pod``'s required rules (a hard spread constraint's selector in
    ``pod``'s namespace, a required affinity or anti-affinity term)?"""
    rules = pod.inter_pod
    if rules is None:
        return False
    if other.namespace == pod.namespace and any(
        c.hard and c.selector.matches(other.labels) for c in rules.spread
    ):
        return True
    return _matches(rules.affinity, other) or _matches(rules.anti_affinity, other)


def _selectors(pod: PodRecord) -> list[tuple[frozenset[str] | None, LabelSelector]]:
    """The selectors of the pod's required rules, each with the namespaces it looks in (None: all)."""
    rules = pod.inter_pod
    if rules is None:
        return []
    out: list[tuple[frozenset[str] | None, LabelSelector]] = [
        (frozenset({pod.namespace}), c.selector) for c in rules.spread if c.hard
    ]
    out += [(t.namespaces, t.selector) for t in (*rules.affinity, *rules.anti_affinity)]
    return out


def _contradict(a: Requirement, b: Requirement) -> bool:
    """Can no label set satisfy both requirements on one key? (False when unsure.)"""
    ops = {a.operator, b.operator}
    if a.operator == "In" and b.operator == "In":
        return not (a.value_set & b.value_set)
    if ops == {"In", "NotIn"}:
        inside, outside = (a, b) if a.operator == "In" else (b, a)
        return inside.value_set <= outside.value_set
    return ops in ({"In", "DoesNotExist"}, {"Exists", "DoesNotExist"})


def _compatible(a: LabelSelector, b: LabelSelector) -> bool:
    """Could one pod's labels match both selectors? Conservative: True unless two requirements on one key
    contradict each other."""
    if a.nothing or b.nothing:
        return False
    for ra in a.requirements:
        for rb in b.requirements:
            if ra.key == rb.key and _contradict(ra, rb):
                return False
    return True


def _share(a: PodRecord, b: PodRecord) -> bool:
    """Could one pod count for a required rule of each (rule 1: both read it, so their views of it must be
    ordered)?"""
    for ns_a, sel_a in _selectors(a):
        for ns_b, sel_b in _selectors(b):
            if (ns_a is None or ns_b is None or ns_a & ns_b) and _compatible(sel_a, sel_b):
                return True
    return False


def interact(a: PodRecord, b: PodRecord) -> bool:
    """Must these two lane pods be decided one after the other (rule 1)? When either's required rules count
    the other (which covers the symmetric anti-affinity rule: the other's term matching this pod), and when
    one pod could count for a required rule of each: then both decisions read it, and the later one must see
    whatever the earlier one saw of it."""
    return _reads(a, b) or _reads(b, a) or _share(a, b)


class _Interactions:
    """``interact`` remembered per pair of lane shapes. ``interact`` reads only each pod's namespace, labels and
    inter-pod rules, so pods of one template share a shape, and a burst of them is checked against the lane
    pods in flight with a dictionary lookup per pair instead of a comparison of selectors (each waiting pod is
    checked again whenever the lane changes). Bounded: past ``MAX_SHAPES`` shapes it starts over; shape ids are
    never reused, so an id kept from before (a pod in flight) never names another shape."""

    def __init__(self) -> None:
        self._ids: dict[tuple[str, frozenset[tuple[str, str]], object], int] = {}
        self._of: dict[PodKey, tuple[PodRecord, int]] = {}  # the shape of a pod's latest record
        self._pairs: dict[tuple[int, int], bool] = {}
        self._next = 0

    def shape(self, pod: PodRecord) -> int:
        held = self._of.get(pod.key)
        if held is not None and held[0] is pod:
            return held[1]
        shape = (pod.namespace, frozenset(pod.labels.items()), pod.inter_pod)
        sid = self._ids.get(shape)
        if sid is None:
            if len(self._ids) >= MAX_SHAPES:
                self.start_over()
            sid = self._ids[shape] = self._next
            self._next += 1
        if len(self._of) >= 16 * MAX_SHAPES:
            self._of.clear()  # mostly pods long gone; their shapes stay
        self._of[pod.key] = (pod, sid)
        return sid

    def start_over(self) -> None:
        """Forget every shape and pair (ids already handed out stay unused)."""
        self._ids.clear()
        self._of.clear()
        self._pairs.clear()

    def between(self, a: PodRecord, shape_a: int, b: PodRecord, shape_b: int) -> bool:
        """``interact(a, b)``, given their shapes."""
        pair = (shape_a, shape_b)
        known = self._pairs.get(pair)
        if known is None:
            known = self._pairs[pair] = interact(a, b)
        return known


class _Flying(NamedTuple):
    pod: PodRecord
    at: float  # dispatched at
    shape: int  # its lane shape (``_Interactions``)
    anti: tuple[PodTerm, ...]  # its cross-node required anti-affinity terms (rule 3)


class Lane:
    """The lane's state (see the module docstring). Resource versions are compared as integers, as the
    worker's shard catch-up does: they are etcd revisions in every API server we know."""

    def __init__(self) -> None:
        self.interactions = _Interactions()
        self.flying: dict[PodKey, _Flying] = {}  # lane pods in flight
        self.lane_rv = 0
        self.settled_rv = 0
        self.unseen: dict[PodKey, PodRecord] = {}  # answered bound, not yet seen leaving the pending set
        self.lost_dispatches: dict[
            PodKey, tuple[PodRecord, float]
        ] = {}  # rule 4: dispatch lost, counted until then
        self.settled = 0  # lane pods settled through the watch (bound or deleted)

    @property
    def in_flight(self) -> int:
        return len(self.flying)

    def _lost(self, now: float) -> list[PodRecord]:
        return [pod for pod, until in self.lost_dispatches.values() if until > now]

    def wait(self, pod: PodRecord, in_flight: Callable[[], Iterable[PodRecord]], now: float) -> Wait | None:
        """Why ``pod`` may not be dispatched now, or None. ``in_flight`` gives the pods dispatched and not
        yet answered, and the pods claimed; it is called only for a lane pod with cross-node anti-affinity."""
        lost = self._lost(now) if self.lost_dispatches else []
        if lane_rule(pod) is None:
            for f in self.flying.values():
                if f.anti and f.pod.key != pod.key and _matches(f.anti, pod):
                    return Wait(ANTI_AFFINITY, f.pod.key)
            for other in lost:
                if other.key != pod.key and _matches(cross_node_anti_affinity(other), pod):
                    return Wait(ANTI_AFFINITY, other.key)
            return None
        interactions = self.interactions
        shape = interactions.shape(pod)
        for f in self.flying.values():
            if f.pod.key != pod.key and interactions.between(pod, shape, f.pod, f.shape):
                return Wait(BUSY, f.pod.key)
        for other in lost:
            if (
                other.key != pod.key
                and lane_rule(other) is not None
                and interactions.between(pod, shape, other, interactions.shape(other))
            ):
                return Wait(LOST, other.key)
        if len(self.flying) >= MAX_IN_FLIGHT and pod.key not in self.flying:
            return Wait(BUSY)
        terms = cross_node_anti_affinity(pod)
        if terms:
            for other in (*in_flight(), *self.unseen.values(), *lost):
                if other.key != pod.key and _matches(terms, other):
                    return Wait(ANTI_AFFINITY)
        return None

    @staticmethod
    def inherited_wait(pod: PodRecord, anti: Mapping[PodKey, tuple[PodTerm, ...]]) -> Wait | None:
        """Rule 6, while the term inherits: why ``pod`` may not go out yet, or None. ``anti`` holds the
        cross-node required anti-affinity terms of the pods pending in the leader's view (any of which a worker
        may still be placing for an earlier term)."""
        if lane_rule(pod) is not None:
            return Wait(EARLIER_TERM)
        for other, terms in anti.items():
            if other != pod.key and _matches(terms, pod):
                return Wait(EARLIER_TERM)
        return None

    def listed(self, rv: int) -> None:
        """The placements rule 6 knows of are at or below ``rv`` (the newest pod of a list of the pending pods,
        or of the workers' watches while rule 6's hold lasts): the next decisions must see them all."""
        self.lane_rv = max(self.lane_rv, rv)
        self.settled_rv = max(self.settled_rv, rv)

    def min_rv(self, pod: PodRecord) -> int:
        """The resourceVersion the worker's pod watch must have reached before it decides ``pod`` (rule 2)."""
        return self.settled_rv if lane_rule(pod) is not None else self.lane_rv

    def dispatched(self, pod: PodRecord, now: float) -> None:
        if lane_rule(pod) is not None:
            self.flying[pod.key] = _Flying(
                pod, now, self.interactions.shape(pod), cross_node_anti_affinity(pod)
            )

    def answered_bound(self, pod: PodRecord) -> None:
        """A RESULT bound: the pod stays in flight until the watch shows it (its binding's version)."""
        self.unseen[pod.key] = pod

    def answered(self, key: PodKey) -> bool:
        """A RESULT that placed nothing (unschedulable, rejected, gone). True if ``key`` left the lane. A
        lost dispatch of the same pod still counts (rule 4): this answer is about another dispatch."""
        return self.flying.pop(key, None) is not None

    def lost(self, pod: PodRecord, now: float) -> bool:
        """The pod's dispatch was withdrawn without an answer (rule 4). True if it left the lane."""
        self.lost_dispatches[pod.key] = (pod, now + LOST_HOLD)
        return self.flying.pop(pod.key, None) is not None

    def holds(self, key: PodKey) -> bool:
        """Is ``key`` something pods may be waiting for (a lane pod in flight, or a lost dispatch)?"""
        return key in self.flying or key in self.lost_dispatches

    def expire(self, now: float) -> bool:
        """Forget lost dispatches older than ``LOST_HOLD``; True if any was."""
        expired = [key for key, (_, until) in self.lost_dispatches.items() if until <= now]
        for key in expired:
            del self.lost_dispatches[key]
        return bool(expired)

    def seen(self, key: PodKey, rv: int, *, lane_pod: bool = False) -> float | None:
        """The watch showed ``key`` leave the pending set (bound or deleted) at ``rv``; ``lane_pod``: the pod
        states a lane rule (placed by a dispatch of an earlier term, if this one did not dispatch it). Returns
        the time the pod was dispatched at if it was a lane pod in flight (it is settled now), else None."""
        self.settled_rv = max(self.settled_rv, rv)
        if lane_pod:
            self.lane_rv = max(self.lane_rv, rv)
        self.unseen.pop(key, None)
        lost = self.lost_dispatches.pop(key, None)
        if lost is not None and lane_rule(lost[0]) is not None:
            self.lane_rv = max(self.lane_rv, rv)
        flying = self.flying.pop(key, None)
        if flying is None:
            return None
        self.lane_rv = max(self.lane_rv, rv)
        self.settled += 1
        return flying.at

    def statistics(self) -> dict[str, int | list[str]]:
        return {
            "in_flight": sorted(self.flying),
            "lane_rv": self.lane_rv,
            "settled_rv": self.settled_rv,
            "unseen": len(self.unseen),
            "lost": len(self.lost_dispatches),
            "settled": self.settled,
        }
