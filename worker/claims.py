"""A coordinated worker's claims (``common.claims``): the claim set the leader sent, the pods this worker took
from its own pod watch, and what it must know to take one safely.

Owned here:
- ``workers``: the current leader stream's claim set; empty while there is no stream or before its CLAIMS,
  so a worker with no leader claims nothing, and lets go of the claimed pods it is not already placing
  (the leader moves or dispatches them).
- ``claimed``: pod key -> uid of the pods claimed and not yet placed, handed back, taken by a DISPATCH, or let
  go because the claim set changed (``not_mine``).
- ``handed_back``: pod key -> uid of the pods handed to the leader, or dispatched by it: never claimed
  (again), until the pod leaves the pending set; the leader may dispatch them here.
- ``anti``: the cross-node required anti-affinity terms of every pending pod of ours in this worker's view.
  A pod matching one is not claimed but handed to the leader at once: the leader's lane decides when it may
  go (``coordinator.dispatch.lane``, rule 3). This view is the pod watch's, the same the decision reads: a
  pod with such a term created before the claimed pod is in it, pending (then the claimed pod is not taken)
  or placed (then the filter sees it). It is kept only from the first CLAIMS on: a pod pending since
  before then, with no event since, is in it only after the next relist (docs/architecture.md, "Worker
  claims", known gaps).
- ``unread``: the pending pods of ours the pod watch did not parse (claimed by another worker), as the watch
  gave them: read again when the claim set changes, so a pod now hashed here is claimed without waiting for
  its next event.

The feed (``worker.feeds.PodFeed``) asks ``to_read`` and ``take``, tells ``pending`` and ``left``, lets go of
``not_mine`` on a set change and resets the maps on a relist; the outcome receiver
(``worker.intake.LeaderResults``) calls ``done`` and ``hand_back``, and sets ``workers`` from its stream (the
intake hands it each CLAIMS); the intake calls ``dispatched`` for each DISPATCH.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from common import metrics
from common.claims import claimable, claimant, cross_node_anti_affinity
from common.records import PodKey, PodRecord, PodTerm


def _states_anti_affinity(obj: dict[str, Any]) -> bool:
    """Does the pod object state a required pod anti-affinity term (of any key: the parse tells which)?"""
    affinity = (obj.get("spec") or {}).get("affinity")
    if not isinstance(affinity, dict):
        return False
    anti = affinity.get("podAntiAffinity")
    return isinstance(anti, dict) and bool(anti.get("requiredDuringSchedulingIgnoredDuringExecution"))


# A claimed pod the watch showed placed is still answered for by ``done`` this long: the watch may show our own
# binding before the binder hears its answer.
LEFT_GRACE = 60.0


class Claims:
    def __init__(
        self,
        worker_id: str,
        scheduler_name: str,
        *,
        can_place: Callable[[], bool],
        refuse: Callable[[PodRecord, str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.worker_id = worker_id
        self.scheduler_name = scheduler_name
        self.can_place = can_place
        self.refuse = refuse  # hands a pod to the leader at once, with why (``take``)
        self.workers: tuple[str, ...] = ()
        # A leader has sent CLAIMS (claims are on): only then is anything kept for them (``unread``, ``anti``,
        # ``handed_back``); with claims off a worker keeps nothing per pod here.
        self.active = False
        self.claimed: dict[PodKey, str] = {}
        self.handed_back: dict[PodKey, str] = {}
        self.anti: dict[PodKey, tuple[PodTerm, ...]] = {}
        self.unread: dict[PodKey, dict[str, Any]] = {}
        # called when the claim set changed, to let go of and take pods accordingly (``PodFeed.claims_changed``)
        self.changed: Callable[[], None] = lambda: None
        self.clock = clock
        # claimed pods the watch showed placed, for ``done`` (``LEFT_GRACE``): (when, key, uid), oldest first
        self._left: deque[tuple[float, PodKey, str]] = deque()
        self._placed: dict[PodKey, str] = {}

    def set_workers(self, workers: Sequence[str], *, sent: bool = True) -> None:
        """The claim set: from a CLAIMS (``sent``), or empty for a stream that has sent none yet."""
        self.active = self.active or sent
        workers = tuple(workers)
        if workers != self.workers:
            self.workers = workers
            self.changed()

    def mine(self, uid: str) -> bool:
        return bool(self.workers) and claimant(uid, self.workers) == self.worker_id

    def to_read(self, key: PodKey, obj: dict[str, Any]) -> bool:
        """Must the feed parse this pending pod of ours, which it would otherwise leave unread? Yes if this
        worker may claim it, or if it states a required anti-affinity (``anti``)."""
        if not self.active:
            return False
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        if _states_anti_affinity(obj) or (self.mine(uid) and self.handed_back.get(key) != uid):
            self.unread.pop(key, None)
            return True
        self.unread[key] = obj
        return False

    def pending(self, pod: PodRecord) -> None:
        """A pending pod of ours, parsed: keep its cross-node anti-affinity terms (``anti``)."""
        if not self.active:
            return
        self.unread.pop(pod.key, None)
        terms = cross_node_anti_affinity(pod)
        if terms:
            self.anti[pod.key] = terms
        else:
            self.anti.pop(pod.key, None)

    def left(self, key: PodKey) -> None:
        """``key`` left the pending set (placed, deleted, finished, or not ours any more)."""
        if not self.active:
            return  # claims off: nothing is kept per pod (every map is empty)
        self.unread.pop(key, None)
        self.anti.pop(key, None)
        self.handed_back.pop(key, None)
        now = self.clock()
        uid = self.claimed.pop(key, None)
        if uid is not None:
            self._left.append((now, key, uid))
            self._placed[key] = uid
        while self._left and now - self._left[0][0] >= LEFT_GRACE:
            _, old, old_uid = self._left.popleft()
            if self._placed.get(old) == old_uid:
                del self._placed[old]

    def take(self, pod: PodRecord) -> bool:
        """Does this worker claim ``pod`` now (or hold it claimed)? A pod it is the claimant of but must not
        take (``anti``) is handed to the leader at once (``refuse``)."""
        key = pod.key
        if self.claimed.get(key) == pod.uid:
            return True
        if not self.workers or not self.can_place() or self.handed_back.get(key) == pod.uid:
            return False
        if not claimable(pod, self.scheduler_name) or claimant(pod.uid, self.workers) != self.worker_id:
            return False
        for other, terms in self.anti.items():
            if other != key and any(t.matches(pod.namespace, pod.labels) for t in terms):
                self.handed_back[key] = pod.uid
                self.refuse(pod, f"matches a required anti-affinity term of pending pod {other}")
                return False
        self.claimed[key] = pod.uid
        metrics.pods_claimed.inc()
        return True

    def dispatched(self, pod: PodRecord) -> None:
        """The leader dispatched ``pod`` here: the pod is on the leader's path (its dispatch is answered, not
        a claim), and is not claimed again."""
        self.claimed.pop(pod.key, None)
        if self.active:
            self.handed_back[pod.key] = pod.uid

    def done(self, pod: PodRecord) -> bool:
        """``pod`` was placed: True if it was claimed (then nobody is answered for it), even if the watch
        showed the binding first."""
        if self.claimed.get(pod.key) == pod.uid:
            del self.claimed[pod.key]
            return True
        if self._placed.get(pod.key) == pod.uid:
            del self._placed[pod.key]
            return True
        return False

    def hand_back(self, pod: PodRecord) -> bool:
        """``pod`` was not placed: True if it was claimed, and is now the leader's (never claimed again)."""
        if self.claimed.get(pod.key) != pod.uid:
            return False
        del self.claimed[pod.key]
        self.handed_back[pod.key] = pod.uid
        return True

    def not_mine(self) -> list[PodKey]:
        """The claimed pods whose claimant is another worker under the current set (they are let go)."""
        gone = [key for key, uid in self.claimed.items() if not self.mine(uid)]
        for key in gone:
            del self.claimed[key]
        return gone
