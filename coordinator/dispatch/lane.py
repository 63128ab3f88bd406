"""The topology lane: the leader's rules for dispatching pods whose placement rules span nodes, so that workers
deciding at once never break one. The argument is in docs/architecture.md ("Inter-pod rules across shards").

Why a lane at all: every worker holds every node and every non-terminal pod of the cluster (its topology
counts are cluster-wide, ``worker.topology``); only its *candidates* are its own nodes. What a worker can
lack is a placement another worker decided whose binding its pod watch has not shown yet. A rule of the pod
being decided that reads other nodes' pods can then be broken, and so can the symmetric rule of an unseen pod
(a required anti-affinity keeps matching pods out of its domain).

Classes (``lane_rule``):
- lane pods state a required cross-node rule: a topologySpreadConstraint with ``DoNotSchedule`` (any key,
  ``kubernetes.io/hostname`` too: the skew compares the nodes of every shard), a required podAntiAffinity
  term whose topologyKey is not ``kubernetes.io/hostname``, or a required podAffinity term (any key: the pod
  it needs may sit on another shard's node);
- plain pods are all others. Their hostname-level anti-affinity is shard-local (a node has one owner, which
  sees its own assumed pods; a node changes owner only after the new owner's cache caught up with it), and
  their preferred terms and ``ScheduleAnyway`` constraints are scores (a race changes a score, not a rule).

Rules (``Lane``; the dispatcher asks ``wait_reason`` before it chooses a worker):
1. One lane pod in flight cluster-wide (``current``): from its DISPATCH until it is *settled*: the leader's
   pending-pod watch showed it leave the pending set (bound or deleted) at resourceVersion r, or a worker
   answered it without placing it (unschedulable, rejected, gone). A RESULT bound does not settle it: the
   resourceVersion of its binding is known only once the watch shows it.
2. Every DISPATCH carries ``min_rv`` and the worker decides the pod only once its pod watch has reached it:
   for a lane pod ``settled_rv``, the highest resourceVersion at which the watch showed any of our pods leave
   the pending set (every placement of ours the leader knows of); for a plain pod ``lane_rv``, the same over
   lane pods only (the placements whose anti-affinity a plain pod must respect).
3. A plain pod matching a cross-node required anti-affinity term of the lane pod in flight waits until that
   pod is settled; a lane pod with cross-node required anti-affinity waits until no pod in flight matches one
   of its terms (in flight: dispatched and not answered, or answered bound and not yet seen by the watch).
4. A lane pod whose dispatch was lost (its worker's stream went down, or no RESULT came in time) may still be
   bound by the worker that had it. For ``LOST_HOLD`` after that no *other* lane pod goes out; the lost one
   may go out again at once, and the hold ends early when the watch shows it bound or deleted.
5. A lane pod a shard cannot place is tried on the other shards as any pod is (``pending``); it gives the
   lane back meanwhile (no placement was made) and takes it again when it goes out next.

Nothing here talks to workers or the API server: the dispatcher tells the lane what happened
(``dispatched``, ``answered_bound``, ``answered``, ``lost``, ``seen``) and reads ``min_rv``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Final

from common.records import PodKey, PodRecord, PodTerm

HOSTNAME: Final = "kubernetes.io/hostname"
LOST_HOLD: Final = 30.0  # seconds no other lane pod goes out after a lane pod's dispatch was lost (rule 4)

# why a pod waits (the ``reason`` label of the lane-wait metric)
BUSY: Final = "lane_busy"  # another lane pod is in flight
ANTI_AFFINITY: Final = "anti_affinity"  # rule 3, either direction
LOST: Final = "lost_dispatch"  # rule 4


def lane_rule(pod: PodRecord) -> str | None:
    """The rule that makes ``pod`` a lane pod (for logs and tests), or None for a plain pod."""
    rules = pod.inter_pod
    if rules is None:
        return None
    for c in rules.spread:
        if c.hard:
            return f"topology spread on {c.topology_key} (DoNotSchedule)"
    for term in rules.anti_affinity:
        if term.topology_key != HOSTNAME:
            return f"required pod anti-affinity on {term.topology_key}"
    if rules.affinity:
        return f"required pod affinity on {rules.affinity[0].topology_key}"
    return None


def cross_node_anti_affinity(pod: PodRecord) -> tuple[PodTerm, ...]:
    """The pod's required anti-affinity terms whose domain spans nodes (rule 3)."""
    rules = pod.inter_pod
    if rules is None:
        return ()
    return tuple(t for t in rules.anti_affinity if t.topology_key != HOSTNAME)


def _matches(terms: tuple[PodTerm, ...], pod: PodRecord) -> bool:
    return any(t.matches(pod.namespace, pod.labels) for t in terms)


class Lane:
    """The lane's state (see the module docstring). Resource versions are compared as integers, as the
    worker's shard catch-up does: they are etcd revisions in every API server we know."""

    def __init__(self) -> None:
        self.current: PodRecord | None = None  # the lane pod in flight (rule 1)
        self.dispatched_at = 0.0
        self.lane_rv = 0
        self.settled_rv = 0
        self.unseen: dict[PodKey, PodRecord] = {}  # answered bound, not yet seen leaving the pending set
        self.held_for: PodKey | None = None  # rule 4: only this lane pod may go out until ``hold_until``
        self.hold_until = -math.inf
        self.settled = 0  # lane pods settled through the watch (bound or deleted)

    @property
    def in_flight(self) -> int:
        return 1 if self.current is not None else 0

    def wait_reason(
        self, pod: PodRecord, in_flight: Callable[[], Iterable[PodRecord]], now: float
    ) -> str | None:
        """Why ``pod`` may not be dispatched now (one of the reasons above), or None. ``in_flight`` gives the
        pods dispatched and not yet answered; it is called only for a lane pod with cross-node
        anti-affinity."""
        current = self.current
        if lane_rule(pod) is None:
            if (
                current is not None
                and current.key != pod.key
                and _matches(cross_node_anti_affinity(current), pod)
            ):
                return ANTI_AFFINITY
            return None
        if current is not None and current.key != pod.key:
            return BUSY
        if now < self.hold_until and self.held_for != pod.key:
            return LOST
        terms = cross_node_anti_affinity(pod)
        if terms:
            for other in (*in_flight(), *self.unseen.values()):
                if other.key != pod.key and _matches(terms, other):
                    return ANTI_AFFINITY
        return None

    def min_rv(self, pod: PodRecord) -> int:
        """The resourceVersion the worker's pod watch must have reached before it decides ``pod`` (rule 2)."""
        return self.settled_rv if lane_rule(pod) is not None else self.lane_rv

    def dispatched(self, pod: PodRecord, now: float) -> None:
        if lane_rule(pod) is not None:
            self.current = pod
            self.dispatched_at = now
            # a hold (rule 4) stays: an answer without placement from this dispatch does not end it

    def answered_bound(self, pod: PodRecord) -> None:
        """A RESULT bound: the pod stays in flight until the watch shows it (its binding's version)."""
        self.unseen[pod.key] = pod

    def answered(self, key: PodKey) -> bool:
        """A RESULT that placed nothing (unschedulable, rejected, gone). True if that released the lane."""
        if self.current is not None and self.current.key == key:
            self.current = None
            return True
        return False

    def lost(self, key: PodKey, now: float) -> bool:
        """The pod's dispatch was withdrawn without an answer (rule 4). True if that released the lane."""
        if self.current is not None and self.current.key == key:
            self.current = None
            self.held_for, self.hold_until = key, now + LOST_HOLD
            return True
        return False

    def seen(self, key: PodKey, rv: int) -> float | None:
        """The watch showed ``key`` leave the pending set (bound or deleted) at ``rv``. Returns the time the
        lane pod was dispatched at if this settled the lane pod in flight, else None."""
        self.settled_rv = max(self.settled_rv, rv)
        self.unseen.pop(key, None)
        if self.held_for == key:
            self.held_for, self.hold_until = None, -math.inf
            self.lane_rv = max(self.lane_rv, rv)
        if self.current is not None and self.current.key == key:
            self.current = None
            self.lane_rv = max(self.lane_rv, rv)
            self.settled += 1
            return self.dispatched_at
        return None

    def statistics(self) -> dict[str, int | str | None]:
        return {
            "in_flight": self.current.key if self.current is not None else None,
            "lane_rv": self.lane_rv,
            "settled_rv": self.settled_rv,
            "unseen": len(self.unseen),
            "settled": self.settled,
        }
