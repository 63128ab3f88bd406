"""The leader's pod dispatcher: every pending pod of our scheduler goes to one worker whose shard can fit it.

Inputs: a watch of pending pods (``spec.schedulerName`` = ours, phase Pending: ``pending_selector``; a pod
that names a node has left the pending set), the set of live
workers with their dispatch addresses (from etcd membership, through ``set_workers``) and the shard map's
grants and nodes in transit (``granted``, ``in_transit``). Output: the claim set (CLAIMS), DISPATCH messages
over each worker's link (``common.protocol``), and the unschedulable report for pods no shard can take. The
parts: ``pending`` (the table and the verdict), ``choice`` (what is known of each worker and which one a pod
goes to), ``links`` (one worker's stream), ``lane`` (pods with inter-pod rules); this module wires
them and runs the loop.

Invariants:
- Worker claims (``common.claims``, experimental, off unless ``claims``): a claimable pod that becomes ready to
  place (seen pending, or its gate lifted) while the claim set is not empty is counted as claimed by its claimant
  (the ready workers that place pods and own nodes, sent to every worker as CLAIMS whenever it changes) and is
  not dispatched while the claim stands: until the watch shows it bound or deleted, its claimant hands it back
  (RESULT with id 0; one that comes before the claim, our watch behind the worker's, is kept ``EARLY_HOLD``
  for it), the claim set changes (the pod moves to its claimant in the new set, or is dispatched if there is
  none; either way a lost dispatch for the lane), or the claim expires as a dispatch would
  (``expire_claims``). A claimed pod counts as in flight for the lane's anti-affinity rule. Workers may claim
  pods the leader does not count as claimed (docs/architecture.md, "Worker claims": known gaps).
- A pod is dispatched to at most one worker at a time; it is tracked until its final RESULT, until the watch
  shows it bound or deleted, until the worker's stream dies, or until ``DISPATCH_TIMEOUT`` passes without a
  RESULT (then it is dispatched again, elsewhere if possible); while the worker answers other dispatches (a
  live worker working through a long queue) up to ``QUEUED_LIMIT``; after a RESULT ``waiting`` (the worker
  holds the pod until its preemption's victims are gone) up to ``PREEMPTION_WAIT_LIMIT``. A RESULT for a dispatch
  no longer tracked (late, duplicate, or over a replaced stream), naming another pod than the one dispatched
  under its id (it counts as no ACK either), or for another pod of the same name (its uid differs) is
  ignored; a pod recreated under the same name replaces its predecessor's entry and dispatch.
- A pod is declared unschedulable (condition + event, with the reasons summed over every shard) only when
  every live worker with nodes has said no (or its summary rules the pod out) and no connected worker is
  still settling (including a worker that is not placing pods: fenced or draining); it is retried when a
  worker's capacity grows, the set of workers changes, or ``UNSCHEDULABLE_RETRY`` passes. A RESULT rejected
  is never a no, nor is an unschedulable answer over zero nodes (a worker that saw no usable node): the pod
  is dispatched again after a backoff (``pending``), so workers fenced through an etcd outage cause no
  Unschedulable verdict. Nor is a verdict given, nor preemption tried, while the shard map moves nodes (some
  revoking, or granted to a worker whose summary counts none of its nodes yet), for up to ``SETTLE_LIMIT`` per
  pod from its first deferral since it was last dispatched: the live shards' answers then do not cover every
  node.
- A worker with ``protocol.MAX_UNACKED`` dispatches awaiting ACK is not chosen; pods that only it could take
  wait (they are not "no" answers) and are queued again as soon as an ACK frees its window.
- Preemption across shards (``choice``, ``pending``): before a pod is declared unschedulable, the live
  workers its summary ruled out are asked (if it may preempt), then the best candidate the shards proposed is
  sent to its worker as DISPATCH ``preempt`` (at most ``MAX_PREEMPTIONS`` per parking cycle). That dispatch is
  an ordinary one for every rule here: one worker at a time, the lane's order and ``min_rv``, in flight until
  the RESULT (the worker answers once the pod is bound, or no if the node is no longer a candidate).
- Malformed pods are reported unschedulable at once with their parse error; they are never dispatched.
- A DISPATCH carries the pod as the watch showed it, without ``metadata.managedFields`` (no scheduler reads
  them; they are often the larger part of the object).
- Pods with inter-pod rules go through the topology lane (``lane``): a pod the lane holds back is not
  dispatched until the lane lets it (it is considered again as soon as the lane's state changes), and every
  DISPATCH carries the lane's ``min_rv`` for that pod. The lane is told every dispatch, every answer, every
  lost dispatch, every pod the pending watch shows leaving the pending set with its resourceVersion (or, for
  one a relist no longer shows, the list's), and every list's newest pod's resourceVersion.
- A term starts inheriting (the lane's rule 6): until the pending watch has listed, membership has named the
  live workers, and each of them has said over this term's stream that it binds no pod of an earlier stream
  (CAPACITY ``earlier`` 0), or for ``LOST_HOLD`` from the term's start while no worker says it still binds
  one, no lane pod is dispatched and no
  plain pod matching a cross-node required anti-affinity term of a pending pod; meanwhile the lane's versions
  follow the highest pod revision the workers reported (a pod's, which every worker's watch reaches).
- The sole worker (``sole``, on unless ``--no-sole-worker``): when one worker is live, owns every granted node
  (all usable, none in transit, no other worker holding any), nothing is in flight or held by the lane, claims
  are off and the term no longer inherits, the leader sends it SOLE and from then dispatches nothing. Once the worker says
  it took it (CAPACITY ``sole``) the leader stops its pending watch and forgets every pod: the worker places,
  reports and preempts them all as standalone. The period ends when another worker joins, nodes are in
  transit or another worker holds some (seen when membership changes and at housekeeping; the leader ends the
  worker's stream by replacing its link), when the
  worker leaves membership or comes back under another address (its link is dropped), or when the worker's
  stream ends (the worker ended it, ``worker.intake`` says when, or it broke). Then the term inherits again,
  as a new term does (the worker may still be binding pods it took, which this term never saw: rule 6 holds
  the lane until the worker says over its new stream that none is under way, past ``LOST_HOLD`` while it
  says one is), and the pending watch lists afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from common import aiotools, metrics, protocol
from common.claims import claimable, claimant, cross_node_anti_affinity, lane_rule
from common.etcd.keys import WorkerId
from common.keyring import Keys, NoSecret
from common.kube import KubeClient
from common.records import PodKey, PodRecord, PodTerm, pod_from_json, pod_key
from common.watching import Reflector, revision_of
from coordinator import metrics as coordinator_metrics
from coordinator.dispatch.choice import Worker, choose, decisive, for_candidates, pick_candidate
from coordinator.dispatch.lane import ANTI_AFFINITY, LOST_HOLD, MAX_IN_FLIGHT, Lane
from coordinator.dispatch.links import Inbound, Link, LinkEvents, LinkFactory, Transport
from coordinator.dispatch.pending import (
    DISPATCH_TIMEOUT,
    MAX_PREEMPTIONS,
    SETTLE_LIMIT,
    PendingPod,
    PendingTable,
    verdict,
)

log = logging.getLogger(__name__)

EARLY_HOLD = 30.0  # seconds a hand-back that came before its claim is kept for it
IDLE_RESCAN = 0.5  # with nothing queued, waiting pods are considered again this often
YIELD_EVERY = 256  # dispatches between yields to the event loop during a burst
HOUSEKEEPING = 1.0  # seconds between the chores no message starts (``Dispatcher.housekeep``)


def pending_selector(scheduler_name: str) -> str:
    """The field selector of the leader's pod watch: the pods this scheduler places that are in phase Pending,
    which holds every pod not bound yet, and bound pods until their kubelet reports them running.

    Not ``spec.nodeName=`` (exactly the unbound pods, one event fewer per pod): a selector that requires
    ``spec.nodeName`` to equal a value is served through the API server's per-node index and gets a buffer
    of 10 events in its watch cache (the kubelets' per-node watches), where other watches get up to 1,000.
    Under a burst the leader falls more than 10 events behind; the API server then holds back the delivery of
    every pod event, to every watcher, for up to its dispatch budget (0.1 s), and closes the leader's watch if
    it is still behind (``docs/results/watchcost-pending-2026-12-04/``).

    The price: the watch also shows a bound pod's status updates until it runs (one in a kwok burst; with a
    real kubelet a few, and all of an image pull that keeps failing), and a relist lists the pods still
    starting. The feed passes over them without a parse (``_PendingFeed._bound``)."""
    return f"spec.schedulerName={scheduler_name},status.phase=Pending"


class UnschedulableReports(Protocol):
    """The part of ``common.reporting.Reporter`` the dispatcher uses."""

    def unschedulable(self, pod: PodRecord, message: str) -> None: ...

    def forget(self, key: PodKey) -> None: ...


class _PendingFeed:
    def __init__(self, d: Dispatcher) -> None:
        self.d = d

    def replace(self, objects: list[dict[str, Any]]) -> None:
        # Every pod missing from a list at version R left the pending set at or before R.
        listed_at = revision_of(self.d.reflector.resource_version)
        seen = set()
        for obj in objects:
            seen.add(self._bound(obj) or self.d.observe(obj))
        gone = {k for k in self.d.table if k not in seen} | {k for k in self.d.lane.unseen if k not in seen}
        gone |= {k for k in self.d.lane.flying if k not in seen}
        gone |= {k for k in self.d.lane.lost_dispatches if k not in seen}
        for key in gone:
            self.d.forget(key, listed_at, listed=True)
        self.d.listed(self.d.reflector.object_version)  # the newest pod it has shown, this list's included

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        if self._bound(obj) is not None:
            return
        if kind == "DELETED":
            self._left(pod_key(obj), obj)
        else:
            self.d.observe(obj)

    def _bound(self, obj: dict[str, Any]) -> PodKey | None:
        """If ``obj`` names a node (bound), its key, forgotten at its resourceVersion if the pod is still
        tracked; else None. The first event that names a node is the binding's. The watch (phase Pending)
        also shows a bound pod's later updates while it starts, and its DELETED once it runs or is deleted:
        by then nothing tracks the pod any more, and they are passed over unparsed, as the former selector
        (``spec.nodeName=``) never showed them. ``forget`` gets the uid, so such an event of a deleted pod
        does not drop a hand-back kept for its successor of the same name."""
        spec = obj.get("spec")
        if not isinstance(spec, dict) or not spec.get("nodeName"):
            return None
        key = pod_key(obj)
        if self.d.tracks(key):
            self._left(key, obj)
        return key

    def _left(self, key: PodKey, obj: dict[str, Any]) -> None:
        """``obj``, the last state the watch showed of pod ``key``, has left the pending set."""
        meta = obj.get("metadata") or {}
        self.d.forget(key, revision_of(meta.get("resourceVersion")), uid=str(meta.get("uid") or ""))


def _for_dispatch(obj: dict[str, Any]) -> dict[str, Any]:
    """The pod as it is kept and sent in DISPATCH: without ``metadata.managedFields``, which no scheduler
    reads and which is often the larger part of a pod object (every DISPATCH is packed, MACed and checked).
    The leader's watch already cuts them (``common.kube.without_managed_fields``); this is for an object it
    left whole (not laid out as the API server writes it) and for callers of ``observe``: one lookup otherwise."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or "managedFields" not in meta:
        return obj
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


class Dispatcher:
    def __init__(
        self,
        client: KubeClient,
        reporter: UnschedulableReports,
        *,
        scheduler_name: str,
        leader_id: str,
        term: int,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        connect: LinkFactory | None = None,
        keys: Keys | None = None,
        claims: bool = False,
        granted: Callable[[], Mapping[WorkerId, int]] = dict,
        in_transit: Callable[[], int] = lambda: 0,
        sole: bool = False,
    ) -> None:
        self.client = client
        self.reporter = reporter
        self.scheduler_name = scheduler_name
        self.leader_id = leader_id
        self.term = term
        self.clock = clock
        self.keys: Keys = keys or NoSecret()
        self.rng = rng or random.Random()
        self.connect: LinkFactory = connect or self._open_link
        self.table = PendingTable()
        self.workers: dict[str, Worker] = {}
        self._blocked: dict[PodKey, None] = {}  # waiting only for a full ACK window to free (ordered set)
        self.lane = Lane()
        # The lane's rule 6: this term inherits until its pending watch listed, membership named the live
        # workers, and each said it binds no pod of an earlier stream (``check_inherited``), or ``LOST_HOLD``.
        self.started_at = clock()
        self.inheriting = True  # (``_begin_inheriting`` starts it again after a sole worker's period)
        self._listed = False
        self._workers_known = False
        # the cross-node anti-affinity terms of the pending pods, kept while the term inherits
        self._anti_pending: dict[PodKey, tuple[PodTerm, ...]] = {}
        self._waiting_inherited: dict[PodKey, None] = {}  # held back by rule 6 (an ordered set)
        # Held back by the lane: the reason per pod, and who to wake when (ordered sets): waiting for one lane
        # pod in flight (by that pod), for room in the lane or the end of a hold, for pods in flight that a
        # required anti-affinity is about (rule 3). Waking moves them to the ready queue; a pod still held
        # back when considered again is registered again.
        self._lane_waits: dict[PodKey, str] = {}
        self._waiting_on: dict[PodKey, dict[PodKey, None]] = {}
        self._waiting_for_room: dict[PodKey, None] = {}
        self._waiting_for_pods: dict[PodKey, None] = {}
        self._next_id = 0
        # The shard map's view (``coordinator.workershards``): nodes granted per worker, nodes being handed over
        self.granted = granted
        self.in_transit = in_transit
        # Worker claims (``common.claims``): on or off for this term, the claim set sent to the workers, and
        # the pods claimed now (an ordered set: the pods a claimant's departure or the claim timeout concerns)
        self.claims = claims
        self.claim_set: tuple[str, ...] = ()
        self._claimed: dict[PodKey, None] = {}  # in the order they were claimed (``claimed_at``)
        # hand-backs that came before the claim they answer (our watch behind the worker's): pod ->
        # (worker, its RESULT, when), oldest first
        self._early: dict[PodKey, tuple[str, protocol.Result, float]] = {}
        # a pod arrived (new, or its scheduling gates lifted) since the loop's last pass (``_loop``)
        self._arrived = False
        # The sole worker (``check_sole``): on or off for this term; the worker SOLE was sent to (nothing is
        # dispatched while it is set), and whether it took it (the pending watch is then stopped)
        self.sole = sole
        self.sole_worker: str | None = None
        self.sole_taken = False
        self.sole_periods = 0  # times a worker took SOLE in this term
        self._tasks: asyncio.TaskGroup | None = None  # ``run``'s, for the pending watch's restarts
        self._watch: asyncio.Task[None] | None = None
        self.reflector = Reflector(
            client,
            "/api/v1/pods",
            _PendingFeed(self),
            params={"fieldSelector": pending_selector(scheduler_name)},
            name="pending-pods",
        )
        self.declared_unschedulable = 0
        self.redispatched = 0
        self.timed_out = 0
        self.rejected = 0
        self.claimed = 0
        self.claims_declined = 0
        self.claims_taken_over = 0

    def _open_link(self, worker_id: str, address: str, events: LinkEvents) -> Transport:
        link = Link(
            worker_id,
            address,
            events,
            leader_id=self.leader_id,
            term=self.term,
            keys=self.keys,
            clock=self.clock,
        )
        return link.start()

    # ----- pods ------------------------------------------------------------------------------------------

    def observe(self, obj: dict[str, Any]) -> PodKey:
        # An update of a pod we hold (a status change, a gate lifted) reuses its spec-derived fields when the
        # spec did not change (``pod_from_json``'s ``previous``: the same record as a full parse)
        known = self.table.get(pod_key(obj))
        record = pod_from_json(obj, known.record if known is not None else None)
        obj = _for_dispatch(obj)
        key = record.key
        if record.node_name or record.terminal or record.deleting:
            self.forget(key, revision_of(record.resource_version), uid=record.uid)
            return key
        p = self.table.get(key)
        if p is not None and p.record.uid != record.uid:
            # deleted and recreated under the same name: a new pod
            self.forget(key, revision_of(record.resource_version))
            p = None
        if self.inheriting:  # (only rule 6 reads them)
            terms = cross_node_anti_affinity(record)
            if terms:
                self._anti_pending[key] = terms
            else:
                self._anti_pending.pop(key, None)
        if p is None:
            p = self.table.pods[key] = PendingPod(obj, record, seen_at=self.clock())
            refusal = record.parse_error
            if refusal is not None:
                self.reporter.unschedulable(record, refusal)
                p.parked_at = self.clock()
                return key
            if not record.gated:
                self._claim_or_queue(p)
            return key
        was_gated = p.record.gated
        p.obj, p.record = obj, record
        if was_gated and not record.gated and p.worker is None:
            p.seen_at = self.clock()  # the time spent gated is the user's, not the scheduler's
            self._claim_or_queue(p)
        return key

    def _claim_or_queue(self, p: PendingPod) -> None:
        """A pod that just became ready to place: its claimant's (``common.claims``), or the ready queue's.
        The workers compute the claimant from the same object and claim set; a pod they see otherwise (a
        claim set on its way to them) is decided twice at worst (the second binding gets a conflict), or taken
        over after the claim timeout."""
        key = p.record.key
        wid = claimant(p.record.uid, self.claim_set) if self.claim_set else None
        if wid is None or not claimable(p.record, self.scheduler_name):
            self._arrived = True
            self.table.enqueue(key)
            return
        p.claimant, p.claimed_at = wid, self.clock()
        self._claimed[key] = None
        self.claimed += 1
        coordinator_metrics.claims.labels("claimed").inc()
        early = self._early.pop(key, None)
        w = self.workers.get(wid)
        if early is not None and early[0] == wid and w is not None:
            self._handed_back(w, early[1])  # its claimant's watch was ahead of ours

    def _remember_early(self, w: Worker, result: protocol.Result) -> None:
        """A hand-back for a pod we do not count as claimed yet: our watch may be behind the worker's (the
        pod not seen yet, or still gated here). Kept ``EARLY_HOLD`` for the claim it answers."""
        now = self.clock()
        key = PodKey(result.key)
        self._early.pop(key, None)
        self._early[key] = (w.worker_id, result, now)
        while self._early:
            oldest = next(iter(self._early))
            if now - self._early[oldest][2] < EARLY_HOLD:
                break
            del self._early[oldest]

    def _unclaim(self, p: PendingPod) -> None:
        p.claimant = None
        self._claimed.pop(p.record.key, None)

    def tracks(self, key: PodKey) -> bool:
        """Is anything kept about ``key``: pending, answered bound and not yet seen so, a lane pod in flight or
        a lost dispatch, or a hand-back that came before its claim?"""
        return key in self.table.pods or key in self._early or key in self.lane.unseen or self.lane.holds(key)

    def forget(self, key: PodKey, rv: int = 0, *, uid: str = "", listed: bool = False) -> None:
        """``key`` left the pending set (bound, deleted, or replaced by a pod of the same name), as the watch
        showed at resourceVersion ``rv`` (``listed``: a list at ``rv`` no longer had it, so it left at or before
        ``rv``, a revision of the whole store); ``uid``, if known, is the uid of the pod that left."""
        p = self.table.pods.pop(key, None)
        if p is not None:
            self._release(p)
            if p.claimant is not None:
                w = self.workers.get(p.claimant)
                if w is not None:
                    w.answered_at = self.clock()  # its claimant is progressing (``PendingPod.claim_expired``)
                self._unclaim(p)
        self.reporter.forget(key)
        early = self._early.get(key)
        left = p.record.uid if p is not None else uid
        if early is not None and (not left or not early[1].uid or early[1].uid == left):
            del self._early[key]  # a hand-back for the pod that left (one for its successor is kept)
        self._lane_waits.pop(key, None)
        self._anti_pending.pop(key, None)
        self._waiting_inherited.pop(key, None)
        held = self.lane.holds(key)
        # A lane pod this term did not dispatch was placed by an earlier term's (or deleted): plain pods'
        # versions must cover it. Only while the term inherits when the version is a list's (after that only
        # this term places lane pods, and a list's version would hold plain pods until a bookmark when idle).
        lane_pod = p is not None and lane_rule(p.record) is not None and (self.inheriting or not listed)
        dispatched_at = self.lane.seen(key, rv, lane_pod=lane_pod)
        if dispatched_at is not None:
            coordinator_metrics.lane_settle_duration.observe(self.clock() - dispatched_at)
        self._wake_lane(key if held else None)

    def _release(self, p: PendingPod) -> None:
        if p.worker is not None:
            w = self.workers.get(p.worker)
            if w is not None:
                w.release(p.dispatch_id, p.record)
        p.worker, p.waiting_since = None, None

    def dispatch(self, key: PodKey) -> None:
        """Consider one queued pod: send it to a worker, declare it unschedulable, or leave it waiting."""
        if self.sole_worker is not None:
            return  # the sole worker places every pod (``check_sole``); queued again when that ends
        p = self.table.get(key)
        now = self.clock()
        if p is None or not p.waiting or p.not_before > now:
            return  # a pod rejected lately is considered again by the idle rescan once its backoff ends
        held = self.lane.inherited_wait(p.record, self._anti_pending) if self.inheriting else None
        if held is not None:
            if self._lane_waits.get(key) != held.reason:
                coordinator_metrics.lane_waits.labels(held.reason).inc()
            self._lane_waits[key] = held.reason
            self._waiting_inherited[key] = None
            return  # considered again when the term stops inheriting (``check_inherited``)
        held = self.lane.wait(p.record, self._in_flight, now)
        if held is not None:
            if self._lane_waits.get(key) != held.reason:
                coordinator_metrics.lane_waits.labels(held.reason).inc()  # once per wait and reason
            self._lane_waits[key] = held.reason
            if held.blocker is not None:
                self._waiting_on.setdefault(held.blocker, {})[key] = None
            elif held.reason == ANTI_AFFINITY:
                self._waiting_for_pods[key] = None
            else:
                self._waiting_for_room[key] = None
            return  # considered again when the lane's state changes (``_wake_lane``) or by the idle rescan
        self._lane_waits.pop(key, None)
        preempt = ""
        w = choose(self.workers.values(), p.record, p.tried, self.rng)
        if w is None:
            message = verdict(p, self.workers)
            if message is not None and self._shards_moving():
                if p.deferred_since is None:
                    p.deferred_since = now
                if now - p.deferred_since < SETTLE_LIMIT:
                    return  # considered again by the idle rescan, once the shards have settled
            if message is not None:
                # every live shard said no: preemption (see ``choice``) before the verdict stands
                w = for_candidates(self.workers.values(), p.record, p.tried)
                if w is None and p.preemptions < MAX_PREEMPTIONS and p.candidates:
                    chosen = pick_candidate(p.candidates, self.workers)
                    if chosen is None:
                        self._blocked[key] = None  # its workers' windows are full: wait for an ACK
                        return
                    w, candidate = chosen
                    del p.candidates[w.worker_id]
                    p.preemptions += 1
                    preempt = candidate.node
                    log.info("pod %s: preempting on %s (%s)", key, candidate.node, w.worker_id)
                if w is None:
                    self._declare_unschedulable(p, message)
                    return
            elif any(
                o.window_full and o.fits(p.record) for wid, o in self.workers.items() if wid not in p.tried
            ):
                self._blocked[key] = None
                return
            else:
                return  # no worker can take it now: it waits for capacity, an ACK, or workers to change
        self._next_id += 1
        p.worker, p.dispatch_id, p.dispatched_at = w.worker_id, self._next_id, now
        p.deferred_since = None  # a later move of the shard map may hold back its verdict again
        w.assign(p.dispatch_id, p.record)
        self.lane.dispatched(p.record, now)
        w.link.send(
            protocol.Dispatch(p.dispatch_id, p.obj, min_rv=self.lane.min_rv(p.record), preempt=preempt)
        )
        aiotools.PACER.poke()

    def _shards_moving(self) -> bool:
        """Are nodes between workers, or granted to a worker whose summary counts none of its nodes yet? Then the
        live shards' answers do not cover every node (a verdict would count too few nodes, and one not
        counted may fit the pod)."""
        if self.in_transit() > 0:
            return True
        for wid, n in self.granted().items():
            w = self.workers.get(wid)
            if n > 0 and (w is None or w.capacity is None or w.nodes + w.capacity.syncing == 0):
                return True
        return False

    def _in_flight(self) -> list[PodRecord]:
        """The pods dispatched and not yet answered, and the pods claimed (for the lane's anti-affinity
        rule)."""
        out = []
        for w in self.workers.values():
            for key in w.in_flight.values():
                p = self.table.get(key)
                if p is not None:
                    out.append(p.record)
        for key in self._claimed:
            p = self.table.get(key)
            if p is not None:
                out.append(p.record)
        return out

    def lane_waiting(self) -> int:
        """Pods the lane holds back now."""
        return len(self._lane_waits)

    def _wake_lane(self, left: PodKey | None) -> None:
        """The lane's state changed: queue again the pods that waited for what changed, in the order they
        waited. ``left``: the lane pod that left the lane (its waiters, the room it made, and the pods in
        flight it was one of), or None when only some pod in flight was answered or seen."""
        woken: list[PodKey] = list(self._waiting_for_pods)
        self._waiting_for_pods.clear()
        if left is not None:
            woken += self._waiting_on.pop(left, {})
            # As many of the pods waiting for room as there is room, first come first: waking all of them
            # would check each against every lane pod in flight once per departure (quadratic in a burst of
            # lane pods). One woken that finds another reason to wait leaves its room to the next departure,
            # which wakes as many as there is room then (and the idle rescan considers every waiting pod).
            room = MAX_IN_FLIGHT - self.lane.in_flight
            waiting = self._waiting_for_room
            while room > 0 and waiting:
                key = next(iter(waiting))
                del waiting[key]
                woken.append(key)
                room -= 1
        for key in woken:
            self.table.enqueue(key)

    def _wake_all(self) -> None:
        for waiters in self._waiting_on.values():
            for key in waiters:
                self.table.enqueue(key)
        self._waiting_on.clear()
        self._wake_lane(PodKey(""))

    def dispatch_ready(self) -> int:
        """Consider every pod queued so far (not those queued meanwhile); returns how many."""
        n, pending = 0, len(self.table.ready)
        while self.table.ready and n < pending:
            self.dispatch(self.table.ready.popleft())
            n += 1
        return n

    def _declare_unschedulable(self, p: PendingPod, message: str) -> None:
        self.reporter.unschedulable(p.record, message)
        p.parked_at = self.clock()
        self.declared_unschedulable += 1
        log.info("pod %s unschedulable on every shard: %s", p.record.key, message)

    def retry_parked(self, *, force: bool = False) -> int:
        return self.table.retry_parked(self.clock(), force=force)

    def listed(self, rv: int) -> None:
        """The pending watch listed; ``rv`` is the highest resourceVersion of a pod it has shown, the listed ones
        included (``Reflector.object_version``; bound pods too: a placement still starting is at or below it).
        Not the list's own version: that is a revision of the whole store, which a worker's pod watch may not
        reach until its next bookmark, a minute later."""
        self.lane.listed(rv)
        self._listed = True
        self.check_inherited()

    def check_inherited(self) -> None:
        """End the term's inheritance (the lane's rule 6) once no worker can be placing a pod of an earlier
        stream: the pending watch listed, membership named the live workers, and each one's latest summary
        over this term's stream counts no such binding under way; or ``LOST_HOLD`` after the term began (or
        the sole worker's period ended), unless a worker's latest summary still counts one: a worker that says
        it is binding is waited for (each binding ends by its own deadlines, and its assumption expires), one
        that says nothing is held to rule 4's bound.
        While it inherits, the lane's versions follow the highest pod revision the workers reported, at or
        above each binding their watches showed: the plain pods that go out meanwhile see the placements the
        workers that reported have seen, and the others start from there."""
        if not self.inheriting:
            return
        self.lane.listed(
            max((w.capacity.revision for w in self.workers.values() if w.capacity is not None), default=0)
        )
        binding = any(w.capacity is not None and w.capacity.earlier > 0 for w in self.workers.values())
        timed_out = self.clock() >= self.started_at + LOST_HOLD and not binding
        if not timed_out and not (
            self._listed
            and self._workers_known
            and all(w.capacity is not None and w.capacity.earlier == 0 for w in self.workers.values())
        ):
            return
        self.inheriting = False
        self._anti_pending.clear()
        log.log(
            logging.WARNING if timed_out else logging.INFO,
            "no earlier term's placement is under way%s; pods with cross-node rules may go (from revision %d)",
            f" (not confirmed by every worker within {LOST_HOLD:.0f} s)" if timed_out else "",
            self.lane.settled_rv,
        )
        for key in self._waiting_inherited:
            self._lane_waits.pop(key, None)
            self.table.enqueue(key)
        self._waiting_inherited.clear()

    # ----- workers ---------------------------------------------------------------------------------------

    def set_workers(self, workers: Mapping[str, str]) -> None:
        """The live workers and their dispatch addresses ("host:port"), from membership."""
        for wid in [w for w in self.workers if w not in workers or self.workers[w].address != workers[w]]:
            self._drop_worker(wid)
        for wid, address in workers.items():
            if wid not in self.workers:
                self._add_worker(wid, address)
        self._workers_known = True
        self._update_claims()
        self.check_sole()
        self.retry_parked(force=True)
        self.check_inherited()  # a worker that left is no longer waited for

    def _add_worker(self, wid: str, address: str) -> None:
        """A worker and a new link to it (a new stream)."""
        self.workers[wid] = Worker(wid, address, self.connect(wid, address, self))

    def close(self) -> None:
        """Drop every worker link (the term ended)."""
        for wid in list(self.workers):
            self._drop_worker(wid)

    def _drop_worker(self, wid: str) -> None:
        w = self.workers.pop(wid, None)
        if w is not None:
            w.link.stop()
            self._requeue_from(w)
            self._update_claims()
            if wid == self.sole_worker:  # it left, or is back under another address (a new link and stream)
                self._end_sole("its membership changed", new_stream=False)

    def _requeue_from(self, w: Worker) -> None:
        now = self.clock()
        for key in w.disconnected():
            p = self.table.get(key)
            if p is not None:
                self.lane.lost(p.record, now)
                p.worker, p.waiting_since = None, None
                self.redispatched += 1
                self.table.enqueue(key)
        self._wake_all()
        self._unblock()  # the pods that waited for this worker's window may go elsewhere now

    def _current(self, link: Transport) -> Worker | None:
        """The worker ``link`` belongs to, unless the link has been replaced or dropped since."""
        w = self.workers.get(link.worker_id)
        return w if w is not None and w.link is link else None

    def link_up(self, link: Transport) -> None:
        w = self._current(link)
        if w is not None:
            w.capacity = None
            if self.claims:
                # a new stream gets the claim set at once, before it is in it: from here the worker keeps
                # what a claim moved to it later needs (``worker.claims``)
                link.send(protocol.Claims(self.claim_set))
            self._update_claims()

    def link_down(self, link: Transport) -> None:
        w = self._current(link)
        if w is not None:
            self._requeue_from(w)
            self._update_claims()
            if w.worker_id == self.sole_worker:
                # the worker ended its stream (it stopped being the sole worker: a usable node left its shard,
                # it was fenced or drained), or the stream broke; the link connects again by itself
                self._end_sole("its stream ended", new_stream=False)

    def _update_claims(self) -> None:
        """Recompute the claim set (the ready workers that place pods and own nodes); when it changed, send
        it to every worker and move each claimed pod to its claimant in the new set. A new stream gets the
        current set at once (``link_up``); its worker joins the set at its first summary. A pod left
        with no claimant is dispatched; its former claimant may still place it, so for the lane it counts
        as a lost dispatch (rule 4)."""
        if not self.claims:
            return
        claim_set = tuple(
            sorted(
                wid
                for wid, w in self.workers.items()
                if w.ready and w.capacity is not None and w.capacity.placing and w.capacity.nodes > 0
            )
        )
        if claim_set == self.claim_set:
            return
        self.claim_set = claim_set
        log.info("claim set: %s", ", ".join(claim_set) or "(none)")
        message = protocol.Claims(claim_set)
        for w in self.workers.values():
            w.link.send(message)
        now = self.clock()
        for key in list(self._claimed):
            p = self.table.get(key)
            if p is None:
                self._claimed.pop(key, None)
                continue
            wid = claimant(p.record.uid, claim_set)
            if wid is None:
                self._unclaim(p)
                self.lane.lost(p.record, now)
                self.table.enqueue(key)
            elif wid != p.claimant:
                self.lane.lost(p.record, now)  # its former claimant may still be placing it (rule 4)
                p.claimant, p.claimed_at = wid, now
                del self._claimed[key]
                self._claimed[key] = None  # kept in the order of ``claimed_at`` (``expire_claims``)

    def received(self, link: Transport, message: Inbound) -> None:
        w = self._current(link)
        if w is None:
            return
        match message:
            case protocol.Capacity():
                changed = decisive(w.capacity) != decisive(message)
                grew = w.summarised(message, self.table.record_of)
                if changed:
                    # the pods waiting for a worker to become able are considered again (``requeue_waiting``);
                    # a summary that changes nothing ``choice`` decides by leaves them waiting (the idle
                    # rescan still reconsiders them every ``IDLE_RESCAN``)
                    self.table.wakeup.set()
                    self._update_claims()
                if grew:
                    self.retry_parked(force=True)
                self.check_inherited()
                if message.sole and w.worker_id == self.sole_worker and not self.sole_taken:
                    self._sole_taken(w)
                elif self.sole_worker is None:
                    # (only the offer: what ends a period is checked when membership or links change and at
                    # housekeeping, and the worker ends it itself on any change of its nodes; reading the
                    # shard map's grants per summary costs a walk of every node)
                    self.check_sole()
            case protocol.Ack(dispatch_id):
                self._acknowledged(w, dispatch_id)
            case protocol.Result(id=protocol.CLAIMED) if self.claims:
                self._handed_back(w, message)
            case protocol.Result():
                key = w.in_flight.get(message.id)
                if key is not None and key != message.key:
                    # the answer to a dispatch of an earlier stream (workers of earlier builds send those over
                    # the new one), or a worker's mistake: not this dispatch's answer, and no sign that the
                    # worker has read this dispatch either (its ACK window stays as it is)
                    log.debug(
                        "ignoring %s's result %d for %s: dispatched %s",
                        w.worker_id,
                        message.id,
                        message.key,
                        key,
                    )
                    return
                w.answered_at = self.clock()
                self._acknowledged(w, message.id)
                if key is not None:
                    self._result(w, message, key)

    def _acknowledged(self, w: Worker, dispatch_id: int) -> None:
        if w.acknowledged(dispatch_id):
            self._unblock()

    def _unblock(self) -> None:
        for key in self._blocked:
            self.table.enqueue(key)
        self._blocked.clear()

    def _result(self, w: Worker, result: protocol.Result, key: PodKey) -> None:
        """``result`` answers the dispatch ``result.id`` of ``key`` in flight to ``w``."""
        p = self.table.get(key)
        if p is None or p.worker != w.worker_id or p.dispatch_id != result.id:
            w.in_flight.pop(result.id, None)
            return
        if result.uid and p.record.uid and result.uid != p.record.uid:
            log.warning(
                "ignoring %s's result for %s: uid %s, expected %s", w.worker_id, key, result.uid, p.record.uid
            )
            return  # not this pod: the dispatch stays in flight until its own RESULT or the timeout
        if result.outcome == protocol.WAITING:
            # not final: the worker holds the pod until its preemption's victims are gone (``PendingPod.expired``)
            if p.waiting_since is None:
                p.waiting_since = self.clock()
            return
        self._release(p)
        if result.outcome == protocol.BOUND:
            w.bound += 1
            self.table.pods.pop(key, None)
            self.lane.answered_bound(p.record)  # in flight for the lane until the watch shows the binding
            metrics.observe_stage("dispatched", p.dispatched_at - p.seen_at)
            metrics.observe_stage("result", self.clock() - p.dispatched_at)
            return
        # nothing placed: the pod leaves the lane (if it was in it)
        self._wake_lane(key if self.lane.answered(key) else None)
        if result.outcome == protocol.GONE:
            self.table.pods.pop(key, None)
        elif result.outcome == protocol.REJECTED or result.nodes == 0:
            # "Try later", never "no": the worker cannot place pods now, its binding was refused, it was still
            # catching up on granted nodes, or it considered no node at all (fenced when it decided)
            self.rejected += 1
            p.rejected(self.clock())
            self.table.enqueue(key)
        else:
            p.answered_no(w.worker_id, result)
            self.table.enqueue(key)

    def _handed_back(self, w: Worker, result: protocol.Result) -> None:
        """A worker hands back a pod it claimed and could not place: from here the pod goes the leader's way
        (an unschedulable answer over its nodes counts as that shard's no). Ignored unless the pod (same uid)
        is still claimed by that worker: a claim moved or taken over meanwhile stands. One for a pod not yet
        claimed here is remembered for its claim (``_remember_early``)."""
        p = self.table.get(PodKey(result.key))
        if (
            p is None
            or (result.uid and result.uid != p.record.uid)
            or (p.claimant is None and p.worker is None and p.parked_at is None)
        ):
            # our watch shows no such pod yet, or still its predecessor of the same name, or the pod is not
            # yet claimed, dispatched or parked here
            self._remember_early(w, result)
            return
        if p.claimant != w.worker_id:
            return
        self._unclaim(p)
        self.claims_declined += 1
        coordinator_metrics.claims.labels("handed_back").inc()
        if result.outcome == protocol.UNSCHEDULABLE and result.nodes > 0:
            p.answered_no(w.worker_id, result)
        self.table.enqueue(p.record.key)
        self._wake_lane(None)  # no longer in flight for the lane's anti-affinity rule

    def expire_claims(self) -> int:
        """Take over every claim whose claimant has neither placed nor handed back its pod in time
        (``PendingPod.claim_expired``): the pod is dispatched as any pod. Returns how many."""
        now = self.clock()
        expired = []
        for key in self._claimed:  # in the order of ``claimed_at``: the first one not due ends the scan
            p = self.table.get(key)
            if p is not None and now <= p.claimed_at + DISPATCH_TIMEOUT:
                break
            if p is not None and p.claimant is not None:
                w = self.workers.get(p.claimant)
                if p.claim_expired(now, w.answered_at if w is not None else None):
                    expired.append(p)
        for p in expired:
            log.warning(
                "%s has not placed %s, claimed %.0f s ago; dispatching it",
                p.claimant,
                p.record.key,
                now - p.claimed_at,
            )
            self._unclaim(p)
            self.lane.lost(p.record, now)  # its claimant may still place it (rule 4)
            self.claims_taken_over += 1
            coordinator_metrics.claims.labels("taken_over").inc()
            self.table.enqueue(p.record.key)
        return len(expired)

    def expire_dispatches(self) -> int:
        """Withdraw every dispatch that has had no final RESULT in time (``PendingPod.expired``: after
        ``DISPATCH_TIMEOUT``, later while its worker answers other dispatches or after a RESULT ``waiting``)
        and queue its pod again; returns how many. A late RESULT for it is then ignored (its id is no longer
        tracked)."""
        now = self.clock()
        workers = self.workers
        expired = [
            (key, p)
            for key, p in self.table.pods.items()
            if p.worker is not None
            and p.expired(now, w.answered_at if (w := workers.get(p.worker)) is not None else None)
        ]
        for key, p in expired:
            w = self.workers.get(p.worker) if p.worker is not None else None
            log.warning(
                "no result from %s for %s within %.0f s; dispatching it again",
                p.worker,
                key,
                now - p.dispatched_at,
            )
            dispatch_id = p.dispatch_id
            self._release(p)
            if w is not None:
                self._acknowledged(w, dispatch_id)
            self.lane.lost(p.record, self.clock())
            self.timed_out += 1
            self.redispatched += 1
            self.table.enqueue(key)
        if expired:
            self._wake_all()
        return len(expired)

    # ----- the sole worker -------------------------------------------------------------------------------

    def check_sole(self) -> None:
        """With ``sole`` on: send SOLE to a worker that may place every pod by itself, or end the sole worker's
        period when that no longer holds (module docstring)."""
        if not self.sole:
            return
        if self.sole_worker is not None:
            if why := self._sole_broken(self.sole_worker):
                self._end_sole(why, new_stream=True)
            return
        w = self._sole_candidate()
        if w is None:
            return
        self.sole_worker = w.worker_id
        w.link.send(protocol.Sole())
        w.link.flush()
        log.info("%s is the only worker and owns every node: offering it the sole worker's role", w.worker_id)

    def _sole_candidate(self) -> Worker | None:
        """The one live worker, if it owns every granted node, all of them usable and summarised, and nothing is
        in flight that this term would have to follow: no dispatch unanswered or unacknowledged, no lane pod in
        flight, no lost dispatch held, no earlier term's binding under way (rule 6 over), no claims."""
        if self.claims or self.inheriting or len(self.workers) != 1:
            return None
        (w,) = self.workers.values()
        cap = w.capacity
        if not w.ready or cap is None or not cap.placing or cap.nodes == 0 or cap.syncing or cap.earlier:
            return None
        if w.in_flight or w.unacked or self.lane.flying or self.lane.lost_dispatches:
            return None
        granted = {wid: n for wid, n in self.granted().items() if n > 0}  # (a walk of the map: last)
        if self.in_transit() or granted != {w.worker_id: cap.nodes}:
            return None
        return w

    def _sole_broken(self, wid: str) -> str:
        """Why the sole worker's period must end now; "" while it may go on."""
        if set(self.workers) != {wid}:
            return "the set of workers changed"
        if self.in_transit():
            return "nodes are being handed over"
        if any(n > 0 for other, n in self.granted().items() if other != wid):
            return "another worker holds nodes"
        return ""

    def _sole_taken(self, w: Worker) -> None:
        """The worker took SOLE: it places every pending pod from its own watch. This term stops its pending
        watch and forgets every pod: nothing it kept is in flight (``_sole_candidate``), and all of it will be
        read again, by a fresh list, when the period ends."""
        self.sole_taken = True
        self.sole_periods += 1
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        for key in self.table.pods:
            self.reporter.forget(key)
        self.table.pods.clear()
        self.table.ready.clear()
        for waiting in (
            self._blocked,
            self._lane_waits,
            self._waiting_on,
            self._waiting_for_room,
            self._waiting_for_pods,
            self._waiting_inherited,
            self._anti_pending,
            self._claimed,
            self._early,
        ):
            waiting.clear()
        self.lane.unseen.clear()
        log.info(
            "%s took the sole worker's role: no dispatch and no pending-pod watch until it ends", w.worker_id
        )

    def _end_sole(self, reason: str, *, new_stream: bool) -> None:
        """End the sole worker's period (or an offer not yet taken). The worker may still be binding pods this
        term never saw, so the term inherits again (the lane's rule 6, as a new term does) until the worker
        says over a new stream that none is under way; the pending watch lists afresh. ``new_stream``: end
        the worker's stream here (it stops being the sole worker when it does); otherwise it has ended."""
        wid = self.sole_worker
        if wid is None:
            return
        self.sole_worker, self.sole_taken = None, False
        log.info("%s is no longer the sole worker: %s", wid, reason)
        w = self.workers.get(wid)
        if new_stream and w is not None:
            self._drop_worker(wid)
            self._add_worker(wid, w.address)
        self._begin_inheriting()
        # (offered, not taken as far as this term heard: these were not dispatched meanwhile, and the worker
        # may be placing any of them; rule 6 reads their anti-affinity before the new list comes)
        for key, p in self.table.pods.items():
            if terms := cross_node_anti_affinity(p.record):
                self._anti_pending[key] = terms
            self.table.enqueue(key)

    def _begin_inheriting(self) -> None:
        """Rule 6 from now, as at a term's start; the pending watch lists afresh (every pending pod is observed
        again, its cross-node anti-affinity read while the term inherits)."""
        self.inheriting = True
        self.started_at = self.clock()
        self._listed = False
        self._start_watch()

    # ----- loop ------------------------------------------------------------------------------------------

    async def run(self) -> None:
        with aiotools.PACER.backlog_of(self.backlog):
            async with asyncio.TaskGroup() as tg:
                self._tasks = tg
                self._start_watch()
                tg.create_task(self._loop())
                tg.create_task(self._housekeeping())

    def _start_watch(self) -> None:
        """(Re)start the pending-pod watch: it lists first, so every pending pod is observed again."""
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self._tasks is None:
            return
        watch = self.reflector.run()
        try:
            self._watch = self._tasks.create_task(watch, name="pending-pods")
        except RuntimeError:  # the term is ending (its task group takes no new task): nothing to watch for
            watch.close()

    def backlog(self) -> int:
        """Pods queued for a pass of the dispatch loop or sent and not yet acknowledged: while there are many,
        the leader may pace (``common.aiotools.Pacer``). Only work that moves: a pod a worker acknowledged may
        wait there for long (its preemption's victims to go, its claims to be bound, its binding's retries),
        and a parked one (unschedulable) waits for a retry; counted, 32 of those would pace an idle leader and
        every pod that came to it."""
        return len(self.table.ready) + sum(len(w.unacked) for w in self.workers.values())

    async def _loop(self) -> None:
        ready = self.table.ready
        while True:
            if not ready:
                self.table.wakeup.clear()
                # a timeout scope, not ``wait_for``: that would start a task per wait (about one per pod
                # when pods arrive one by one)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(IDLE_RESCAN):
                        await self.table.wakeup.wait()
                if not ready:
                    self.table.requeue_waiting()
                if ready and self._arrived:
                    # Woken by a newly arrived pod (the first of a burst): let the next ones, a few ms behind
                    # it, join this pass, so that they go out in one write per worker and wake each worker
                    # once (``protocol.COALESCE``). A pod queued again (its worker answered, the lane let it
                    # go, a retry came due) does not wait.
                    await asyncio.sleep(protocol.COALESCE)
            self._arrived = False
            n = 0
            pending = len(ready)
            while ready and n < pending:
                self.dispatch(ready.popleft())
                n += 1
                if n % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
            # Write what this pass sent; wait (together, bounded) only for the links whose worker reads
            # slower than we write.
            behind = [w.link for w in list(self.workers.values()) if w.link.flush()]
            if behind:
                await asyncio.gather(*(link.drain() for link in behind))
            if ready and n == pending:
                await asyncio.sleep(0.01)

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(HOUSEKEEPING)
            self.housekeep()

    def housekeep(self) -> None:
        """What waits for time rather than for a message, every ``HOUSEKEEPING``: parked pods whose backoff
        ended, dispatches and claims past their time-out, the end of a term's inheritance at ``LOST_HOLD``
        (rule 6) and of the lane's holds (rule 4)."""
        self.retry_parked()
        self.expire_dispatches()
        self.expire_claims()
        self.check_inherited()
        if self.lane.expire(self.clock()):
            self._wake_all()
        self.check_sole()

    def statistics(self) -> dict[str, Any]:
        return {
            "pending": len(self.table),
            "parked": self.table.parked(),
            "declared_unschedulable": self.declared_unschedulable,
            "redispatched": self.redispatched,
            "timed_out": self.timed_out,
            "rejected": self.rejected,
            "waiting_for_window": len(self._blocked),
            "waiting_for_lane": self.lane_waiting(),
            "inheriting": self.inheriting,
            "sole": {"worker": self.sole_worker, "taken": self.sole_taken, "periods": self.sole_periods},
            "claims": {
                "set": list(self.claim_set),
                "claimed_now": len(self._claimed),
                "claimed": self.claimed,
                "handed_back": self.claims_declined,
                "taken_over": self.claims_taken_over,
            },
            "lane": self.lane.statistics(),
            "workers": {
                wid: {
                    "connected": w.ready,
                    "nodes": w.nodes,
                    "free_cpu": w.capacity.free_cpu if w.capacity else 0,
                    "free_memory": w.capacity.free_memory if w.capacity else 0,
                    "pending": w.capacity.pending if w.capacity else 0,
                    "binds_per_s": w.capacity.binds_per_s if w.capacity else 0.0,
                    "dispatched": w.dispatched,
                    "in_flight": len(w.in_flight),
                    "unacked": len(w.unacked),
                }
                for wid, w in self.workers.items()
            },
        }
