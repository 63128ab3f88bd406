"""The worker's end of the dispatch protocol (``common.protocol``): a TCP server the coordinator leader
connects to. Pods it receives go into the scheduler's queue; results and capacity summaries go back.

Two objects:
- ``LeaderResults``: the current leader stream and the dispatch ids of the pods it sent. It is the
  scheduler's outcome receiver (``worker.outcomes.Outcomes``) under a coordinator: bound, unschedulable and
  rejected dispatched pods are answered with one RESULT each (the sole worker's own pods are reported on the
  pod instead); bound pods still get their Scheduled event and audit line.
- ``Intake``: the server. It authenticates each connection (the protocol's handshake under the shared
  secret), accepts only the leader etcd currently elects, puts dispatched pods into the scheduler's queue
  through the dispatch gate (``worker.gate``: a pod waits there until the pod watch has reached the
  DISPATCH's ``min_rv``), answers heartbeats, and sends the capacity summary (kept current by the cache's
  index, read in O(1)) when it changed, and at least every ``protocol.HEARTBEAT_INTERVAL`` even if it did
  not: that is the stream's heartbeat towards the leader. It looks every ``protocol.CAPACITY_INTERVAL`` while
  things move and, at rest, when poked (``Intake.poke``): a worker with nothing to do wakes for it only once
  per heartbeat.
  A DISPATCH's pod is parsed with the record the pod watch holds for it as ``previous``
  (``common.records.pod_from_json``), which is that record itself when the DISPATCH carries the same object.

Invariants:
- A pod this worker claimed (``worker.claims``) is answered only if it is not placed: a RESULT with id
  ``protocol.CLAIMED`` (unschedulable with its reasons and preemption candidate, or rejected), after which the
  pod is the leader's and is not claimed again. A DISPATCH of a claimed pod ends the claim: that dispatch is
  answered. The claim set is the current stream's (its CLAIMS); none while there is no stream.
- Only the elected leader's stream: a HELLO is accepted only if its MAC verifies and its ``term`` equals the
  create revision of the lowest key under the election prefix (``elected_term`` over the worker's mirror of
  it; a mirror that lags is waited for up to ``TERM_WAIT``). The stream replaces the current one only after
  the leader's first session frame verified, so a replayed HELLO changes nothing. A stream whose term etcd
  no longer elects (another key is now the lowest) is closed at the next capacity check: within
  ``protocol.CAPACITY_INTERVAL`` while things move, at once at rest (the election mirror's change pokes it).
  Nothing dispatched over an older stream is answered over the current one (see the rule-6 invariant below).
- Bounded before authentication: at most ``MAX_HANDSHAKES`` connections may be in their handshake at once,
  the handshake must finish within ``protocol.HELLO_TIMEOUT``, and its frames are capped at
  ``protocol.MAX_HANDSHAKE_FRAME``; nothing unauthenticated is decoded. When every slot is taken, a new
  connection is served and one in its handshake is closed instead (``_evict``): among those whose HELLO has
  not verified under our key with the elected term (all of them, if none is left unverified), the oldest from
  the source address holding the most slots. So no slot is held against a newcomer, by silent peers nor by a
  replayed HELLO (it verifies, but its replayer cannot send the first session frame); refusing newcomers
  instead would let a dozen idle sockets per ``protocol.HELLO_TIMEOUT`` keep a leader that lost its stream
  from ever reconnecting. What remains: peers from many addresses can still push the leader's connection
  out if ``MAX_HANDSHAKES`` of theirs reach the worker between the leader's connect and the reading of its
  HELLO (which follows at once, but waits its turn in the event loop), at every retry.
- The capacity sender and the read loop wait for ``drain()`` once the write buffer passes
  ``WRITE_HIGH_WATER``: a leader that does not read is not read either, and one that stays stuck for
  ``protocol.DEAD_AFTER`` is dropped.
- No dispatched pod is decided before the pod watch has reached its DISPATCH's ``min_rv`` (the topology
  lane's rule 2, see ``coordinator.dispatch.lane``); the ACK does not wait for that.
- When a new leader stream begins (a new leader, or the same one reconnecting), a DISPATCH still read from an
  earlier stream is refused (RESULT ``rejected``), and the pods dispatched or claimed over earlier streams
  that this worker is not binding are dropped (out of the gate and the queue, their
  entries forgotten: that stream's leader, or its successor, dispatches them again), and every binding under
  way (any assumed pod: answered or not) is kept in ``LeaderResults.earlier`` until the pod watch shows it
  (or the assumption ends: it expires ``binding.assume_ttl``, 30 s by default, after an answer the watch never
  confirms) and counted
  in every CAPACITY (``earlier``, with the pod watch's ``revision``): a new term's leader holds back the pods
  such a placement could make wrong until every worker counts none (the topology lane's rule 6). One of them
  whose binding fails transiently is dropped, not decided again (``LeaderResults.retry``), unless a DISPATCH
  over the new stream took it over or the new stream's claim set gave it to this worker again. Anything
  still queued when the new stream begins came from earlier streams and is dropped too. No RESULT goes out
  for a dispatch of an earlier stream: its id means nothing over the new one (``LeaderResults.carry_over``).
- Every DISPATCH is answered by ACK and later exactly one final RESULT per dispatch id, unless the stream
  breaks first (the leader then re-dispatches; duplicates are harmless, see the protocol) or the pod is gone
  before this worker decided it (deleted, or placed by another worker: the leader's own watch settles it, and
  the dispatch's entry here goes at least ``GONE_GRACE`` after the pod watch, a binding's 404 or a DISPATCH
  of the pod already placed showed it, and any entry after ``OWED_LIMIT``, when the leader no longer keeps the
  dispatch: a long-running worker keeps nothing of pods it will never answer for); before it, at most
  one RESULT ``waiting`` when the pod stays here for its preemption's victims (``waiting``). A pod whose
  binding failed transiently stays in this worker's queue (``worker.binder``) and is answered when bound.
  Results carry the pod's uid, and a result is sent only for the pod (same uid) that was dispatched.
- A pod whose ``spec.schedulerName`` is not ours is answered RESULT ``rejected`` and never queued.
- An unschedulable pod is answered and leaves this worker's queue: the leader decides where it goes next
  (unless this worker is the sole one: it stays here and retries, as standalone).
- A "no" is only given over the whole shard: while granted nodes are still catching up (``Shard.syncing``), an
  unschedulable decision is answered RESULT ``rejected`` ("try later"), so the leader's verdict never counts a
  shard's partial answer (its message would name too few nodes, and a node still catching up may fit the pod).
- While the worker cannot place pods (fenced, draining), DISPATCH is answered with RESULT ``rejected`` at
  once, so the leader tries later or elsewhere without waiting.
- The sole worker: SOLE over the current stream makes this worker take every pending pod of ours from its
  own pod watch (those it passed over before are listed once, ``Watches.list_pending``) and run as standalone
  (``Scheduler.set_sole``): its verdicts go on the pod, it preempts at once, and it answers no RESULT for
  them. While a granted node catches up, its verdicts and preemptions wait (a decision over part of the
  shard is no verdict) and the pods wait until no granted node catches up, then are decided again, as a
  dispatching leader's verdicts wait for this worker's "try later"; a decision over no usable node is no
  verdict either, unless the pod is malformed (its verdict is about the pod). Only while it can place pods
  and no claim set is in force; otherwise it closes the stream. It stops being sole
  when that stream ends (the leader ended it, or a newer stream replaced it), and ends the stream itself
  when a usable node leaves its shard (revoked, it may be on its way to another worker), it is fenced or
  begins to drain (its verdicts would no longer be over the whole pool), a claim set is in force, its leader
  has sent nothing for ``protocol.DEAD_AFTER`` (that leader may be dispatching again), or taking the listed
  pods failed (nobody else would place them). Stopping empties its queue (the leader dispatches those pods
  again); bindings under way go on and are counted in the next stream's ``earlier`` (rule 6).

What goes on the wire (RESULT construction, DISPATCH decoding, sealed writes) is kept in the few small
functions and the ``LeaderStream`` marked "wire" below.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping

from common import metrics, protocol
from common.etcd.kv import KeyValue
from common.keyring import Keys
from common.kube import ApiError
from common.records import NodeName, PodKey, PodRecord, pod_from_json, pod_key
from common.reporting import Reporter
from worker.audit import AuditLog
from worker.claims import Claims
from worker.engine import Decision
from worker.gate import RevisionGate
from worker.scheduler import Scheduler
from worker.shard import ShardChange, ShardView

log = logging.getLogger(__name__)

BIND_RATE_WINDOW = 5.0  # seconds over which ``binds_per_s`` is averaged
CAPACITY_QUIET = 1.0  # the capacity check runs every CAPACITY_INTERVAL until this long after a poke or change
# How long a dispatch's entry stays owed after the pod was shown gone (deleted, finished, placed; by the pod
# watch, a binding's 404 or a DISPATCH of a pod already placed): a binding of ours whose answer comes after the
# watch's event still finds it; a pod deleted in the queue, or placed by another worker, is dropped then (no
# outcome ever comes for it). A RESULT lost to this is harmless: the leader's own watch shows the pod bound
# or deleted.
GONE_GRACE = 60.0
# The backstop for an entry no event clears: longer than the leader keeps any dispatch (at most
# ``QUEUED_LIMIT`` unanswered, then ``PREEMPTION_WAIT_LIMIT`` after a RESULT waiting: 25 min, see
# ``coordinator.dispatch.pending``); a RESULT after that would be ignored. Swept every ``OWED_SWEEP``.
OWED_LIMIT = 30 * 60.0
OWED_SWEEP = 60.0
MAX_HANDSHAKES = 64  # connections in their handshake at once (an idle one costs a socket and a few KiB)
TERM_WAIT = 1.0  # how long a HELLO waits for our election mirror to name its term
TERM_POLL = 0.05
WRITE_HIGH_WATER = 1 << 20  # bytes buffered towards the leader before we wait for it to read
TAKE_CHUNK = 256  # pending pods the sole worker takes from its list between yields to the event loop

# ----- wire: every message this side encodes or decodes -------------------------------------------------


def _result(
    dispatch_id: int,
    pod: PodRecord,
    outcome: protocol.Outcome,
    *,
    node: str = "",
    nodes: int = 0,
    reasons: dict[str, int] | None = None,
    message: str = "",
    preemption: protocol.Candidate | None = None,
) -> protocol.Result:
    return protocol.Result(
        dispatch_id,
        pod.key,
        outcome,
        node=node,
        nodes=nodes,
        reasons=reasons or {},
        message=message,
        uid=pod.uid,
        preemption=preemption,
    )


def _dispatch(
    msg: protocol.Dispatch, previous: Callable[[PodKey], PodRecord | None]
) -> tuple[int, PodRecord, int]:
    """The DISPATCH's id, pod and ``min_rv``. The pod is parsed with the record this worker holds for it as
    ``previous``: that record itself when nothing in it changed (the same object), else only what changed is
    read again. Under a coordinator the pod watch keeps no record of a pending pod that is not nominated
    (``worker.feeds.PodFeed``), so a first DISPATCH is usually parsed in full, its spec-derived parts shared
    with earlier pods of the same template (``common.records``)."""
    return msg.id, pod_from_json(msg.pod, previous(pod_key(msg.pod))), msg.min_rv


_SHOWN = ("ts", "pending", "binds_per_s", "revision")  # CAPACITY fields only shown, or read with ``earlier``
_FREE = ("free_cpu", "free_memory", "max_cpu", "max_memory")


def _changed(summary: protocol.Capacity, last: protocol.Capacity | None, *, sole: bool = False) -> bool:
    """Does ``summary`` say anything the leader decides on that ``last`` did not? Its time, queue count, bind
    rate and watch revision aside: those are only shown (``agent-scheduler status``) or read with ``earlier``
    (which does count), and go out with the next summary or heartbeat; the bind rate, averaged over a sliding
    window, would otherwise keep an idle worker's check busy for ``BIND_RATE_WINDOW`` after its last binding.
    While this worker is the sole one (``sole``) the free amounts aside too: the leader dispatches nothing over
    the stream, so they are only shown, and every binding would otherwise send a summary (ten a second in a
    burst, each waking the leader). What ends or keeps the period (nodes, syncing, placing, earlier, sole)
    still goes out at once, and the next stream starts with a full summary."""
    if last is None:
        return True
    shown = _SHOWN + _FREE if sole else _SHOWN
    return dataclasses.replace(last, **{name: getattr(summary, name) for name in shown}) != summary


def elected_term(election: Mapping[str, KeyValue]) -> int | None:
    """The term of the leader etcd elects now: the lowest create revision among the election keys."""
    return min((kv.create_revision for kv in election.values()), default=None)


class LeaderStream(protocol.Outbox):
    """One authenticated leader stream of term ``term``, written through its ``protocol.Outbox``: frames
    sent within ``protocol.COALESCE`` of the first one not yet written (the ACKs of a batch of DISPATCHes,
    the RESULTs of bindings that end close together) go out in one write and wake the leader once."""

    def __init__(self, writer: asyncio.StreamWriter, session: protocol.Session, term: int) -> None:
        super().__init__(writer, session)
        self.term = term
        self.read_at = time.monotonic()  # when the latest frame from the leader was read

    async def drain(self, timeout: float = protocol.DEAD_AFTER) -> None:
        """Wait for the buffer to flush; ``TimeoutError`` if the leader has not read for ``timeout`` s."""
        await super().drain(timeout)


# ----- outcomes under a coordinator ---------------------------------------------------------------------


class LeaderResults:
    """The current leader stream, the pods it dispatched, and the RESULTs owed to it (``Outcomes``); with
    ``claims``, also the claimed pods' outcomes: none for one placed, a hand-back (id ``protocol.CLAIMED``) for
    one not placed; and the bindings under way of pods dispatched or claimed over earlier streams
    (``earlier``, the module docstring)."""

    def __init__(
        self,
        reporter: Reporter,
        *,
        audit: AuditLog | None = None,
        catching_up: Callable[[], int] = lambda: 0,
        clock: Callable[[], float] = time.monotonic,
        claims: Claims | None = None,
    ) -> None:
        self.reporter = reporter
        self.audit = audit
        self.claims = claims  # the pods this worker claims (``worker.claims``); their answers go here too
        self.catching_up = catching_up  # granted nodes the cache is still catching up on (``Shard.syncing``)
        self.stream: LeaderStream | None = None
        self.pending: dict[PodKey, tuple[int, str]] = {}  # pod -> (dispatch id, uid) of its latest DISPATCH
        self.told_waiting: dict[PodKey, int] = {}  # pod -> the dispatch id its RESULT waiting was sent for
        self._bound_times: deque[float] = deque()  # monotonic times of the bindings, oldest first
        # (monotonic time, pod, its entry) of pods shown gone, oldest first (``gone``)
        self._gone: deque[tuple[float, PodKey, tuple[int, str]]] = deque()
        self._since: dict[PodKey, float] = {}  # when each entry of ``pending`` was made (``OWED_LIMIT``)
        # pod -> uid of the pods dispatched or claimed over an earlier stream whose binding was under way when
        # the current stream began (``carry_over``): counted in CAPACITY until no longer assumed (``earlier_count``)
        self.earlier: dict[PodKey, str] = {}
        # The sole worker (``Intake``, SOLE): this stream's leader dispatches nothing; this worker places and
        # reports every pending pod of ours itself, as standalone, until the stream ends.
        self.sole = False
        self.clock = clock
        self._swept_at = clock()

    @property
    def term(self) -> int:
        return self.stream.term if self.stream is not None else -1

    def connect(self, stream: LeaderStream) -> None:
        """The elected leader's stream is authenticated: it replaces the current one (nothing is claimed
        until its CLAIMS)."""
        if self.stream is not None and self.stream is not stream:
            self.stream.flush()  # what it still owes (the frames of the last ``protocol.COALESCE``) goes out
            self.stream.writer.close()
        self.stream = stream
        if self.claims is not None:
            self.claims.set_workers((), sent=False)

    def disconnect(self, stream: LeaderStream) -> None:
        if self.stream is stream:
            self.stream = None
            if self.claims is not None:
                self.claims.set_workers((), sent=False)  # no leader to hand a pod back to: claim nothing

    def claim_set(self, stream: LeaderStream, workers: tuple[str, ...]) -> None:
        """CLAIMS over ``stream``: the claim set, if that is the current stream."""
        if self.claims is not None and self.stream is stream:
            self.claims.set_workers(workers)

    def refuse_claim(self, pod: PodRecord, message: str) -> None:
        """Hand a pod this worker is the claimant of to the leader at once, untried (``worker.claims``)."""
        self.send(_result(protocol.CLAIMED, pod, protocol.REJECTED, message=message))

    def carry_over(self, assumed: Mapping[PodKey, str]) -> None:
        """A new stream began: every binding under way (``assumed``: pod -> uid, the cache's assumptions; none
        of them is the new stream's yet) is kept in ``earlier``, whether its pod was dispatched or claimed,
        answered already or not; every entry of the earlier streams is forgotten (the intake empties the gate
        and the queue of the pods not being bound). No RESULT goes out for them: their dispatch ids mean
        nothing over the new stream (a new leader numbers its dispatches afresh, and one of its own could be
        taken for the answer; the same leader reconnecting counted what was in flight over the closed stream as
        lost and dispatches it again), and the new stream's leader learns of each binding from its watch."""
        self.earlier.update(assumed)
        for key in list(self.pending):
            self._withdraw(key)

    def _withdraw(self, key: PodKey) -> None:
        self.pending.pop(key, None)
        self._since.pop(key, None)
        self.told_waiting.pop(key, None)

    def earlier_count(self, assumed: Callable[[PodKey], bool]) -> int:
        """How many pods of ``earlier`` still have their binding under way (the others are forgotten here)."""
        for key in [k for k in self.earlier if not assumed(k)]:
            del self.earlier[key]
        return len(self.earlier)

    def expect(self, dispatch_id: int, pod: PodRecord) -> None:
        self.earlier.pop(pod.key, None)  # this stream's leader dispatched it: its own from here
        self.pending[pod.key] = (dispatch_id, pod.uid)
        now = self._since[pod.key] = self.clock()
        if now - self._swept_at >= OWED_SWEEP:
            self._sweep(now)

    def _sweep(self, now: float) -> None:
        """Drop the entries older than ``OWED_LIMIT`` (O(pods in this worker's hands), once a minute)."""
        self._swept_at = now
        for key in [k for k, since in self._since.items() if now - since >= OWED_LIMIT]:
            del self._since[key]
            self.pending.pop(key, None)
            self.told_waiting.pop(key, None)

    def send(self, message: protocol.Message) -> None:
        if self.stream is not None:
            self.stream.send(message)

    def _owed(self, pod: PodRecord) -> int | None:
        """The dispatch id owed a RESULT for this very pod (same uid), taken out of ``pending``."""
        entry = self.pending.get(pod.key)
        if entry is None or (entry[1] and pod.uid and entry[1] != pod.uid):
            return None  # not dispatched, or dispatched as another pod of the same name
        del self.pending[pod.key]
        self._since.pop(pod.key, None)
        self.told_waiting.pop(pod.key, None)
        return entry[0]

    def binds_per_second(self) -> float:
        now = time.monotonic()
        times = self._bound_times
        while times and now - times[0] >= BIND_RATE_WINDOW:
            times.popleft()  # appended in time order: the ones out of the window are at the left
        return len(times) / BIND_RATE_WINDOW

    # ----- worker.outcomes.Outcomes ----------------------------------------------------------------------

    def bound(self, pod: PodRecord, node: NodeName, *, assumed_at: float, bound_at: float) -> None:
        self.reporter.scheduled(pod, node)
        self._bound_times.append(time.monotonic())
        dispatch_id = self._owed(pod)
        via = ""
        if dispatch_id is not None:
            self.send(_result(dispatch_id, pod, protocol.BOUND, node=node))
            via = "dispatch"
        elif self.claims is not None and self.claims.done(pod):
            via = "claim"  # the leader's watch shows the binding: nothing to answer
        elif self.sole:
            via = "sole"
        if self.audit is not None:
            self.audit.bound(pod.key, node, assumed_at, bound_at, via=via)

    def _owed_or_claimed(self, pod: PodRecord) -> int | None:
        """The dispatch id owed a RESULT for ``pod``, or ``protocol.CLAIMED`` if this worker claimed it (and
        hands it back now), or None: nobody to answer."""
        dispatch_id = self._owed(pod)
        if dispatch_id is None and self.claims is not None and self.claims.hand_back(pod):
            return protocol.CLAIMED
        return dispatch_id

    def unschedulable(self, pod: PodRecord, decision: Decision) -> None:
        # Not reported on the pod: the leader may place it on another shard, and reports it when none can. The
        # sole worker's pods are its own: no other shard exists, and it reports them as standalone.
        dispatch_id = self._owed_or_claimed(pod)
        if dispatch_id is None:
            if self.sole and (pod.parse_error is not None or (decision.nodes > 0 and not self.catching_up())):
                # (a malformed pod's verdict is about the pod, whatever the shard. Otherwise, while granted
                # nodes catch up, the decision was over part of the shard: no verdict; the pod is decided again
                # once they are usable, ``Scheduler.release_held``. One over no usable node came between the
                # shard's change and the period's end, which follows at once)
                self.reporter.unschedulable(pod, decision.message)
            return
        syncing = self.catching_up()
        if syncing:
            # A "no" over part of the shard: the nodes still catching up were not considered, and one of them
            # may fit. The leader tries again later instead of counting a partial answer in its verdict.
            message = f"{syncing} granted nodes still catching up; try later"
            self.send(_result(dispatch_id, pod, protocol.REJECTED, message=message))
        else:
            self.send(
                _result(
                    dispatch_id,
                    pod,
                    protocol.UNSCHEDULABLE,
                    nodes=decision.nodes,
                    reasons=dict(decision.reasons),
                    message=decision.message,
                    preemption=decision.preemption,
                )
            )

    def rejected(self, pod: PodRecord, message: str) -> None:
        self.reporter.unschedulable(pod, message)
        dispatch_id = self._owed_or_claimed(pod)
        if dispatch_id is not None:
            self.send(_result(dispatch_id, pod, protocol.REJECTED, message=message))

    def retry(self, pod: PodRecord) -> bool:
        # A pod of an earlier stream is dropped: the current stream's leader dispatches it again if it is
        # still pending, and must not have it placed here unseen (the topology lane's rule 6). Unless the
        # current stream's claim set gave it to this worker again (claims are reset when a stream begins, so a
        # claim held now is the current stream's): the leader counts it as claimed here.
        uid = self.earlier.get(pod.key)
        if uid is None or (uid and pod.uid and uid != pod.uid):
            return True
        del self.earlier[pod.key]  # (no entry of ``pending`` to drop: ``carry_over`` forgot them all)
        if self.claims is None:
            return False
        if self.claims.claimed.get(pod.key) == pod.uid:
            return True
        self.claims.claimed.pop(pod.key, None)
        return False

    def gone(self, key: PodKey, uid: str) -> None:
        # Not dropped at once: the watch may show our own binding before the binder hears its answer, and
        # that ``bound`` still owes the leader a RESULT. At least ``GONE_GRACE`` later (on the next call) the
        # entry goes, unless the pod was dispatched again since (another dispatch id or uid: ids restart with
        # each leader term). A pod recreated under the same name and dispatched here before the watch showed
        # its predecessor deleted keeps its entry (another uid).
        now = self.clock()
        entry = self.pending.get(key)
        if entry is not None and not (uid and entry[1] and uid != entry[1]):
            self._gone.append((now, key, entry))
        while self._gone and now - self._gone[0][0] >= GONE_GRACE:
            _, old, marked = self._gone.popleft()
            if self.pending.get(old) == marked:
                del self.pending[old]
                self._since.pop(old, None)
                self.told_waiting.pop(old, None)
        if now - self._swept_at >= OWED_SWEEP:
            self._sweep(now)

    def waiting(self, pod: PodRecord, node: NodeName) -> None:
        # Once per dispatch: the leader keeps it until the final RESULT (or its backstop), and the pod is
        # retried here on every cluster change while its victims terminate.
        entry = self.pending.get(pod.key)
        if entry is None or (entry[1] and pod.uid and entry[1] != pod.uid):
            return
        if self.told_waiting.get(pod.key) != entry[0]:
            self.told_waiting[pod.key] = entry[0]
            self.send(_result(entry[0], pod, protocol.WAITING, node=node))


# ----- the server ---------------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _Handshaking:
    """A connection in its handshake: where from, and whether its HELLO verified with the elected term."""

    host: str
    verified: bool = False


class _Refused(Exception):
    """An authenticated HELLO that is not the elected leader's (answered with ERROR, then closed)."""


class Intake:
    def __init__(
        self,
        sched: Scheduler,
        results: LeaderResults,
        *,
        worker_id: str,
        shard: ShardView,
        keys: Keys,
        elected: Callable[[], int | None],
        scheduler_name: str,
        can_place: Callable[[], bool] = lambda: True,
        max_handshakes: int = MAX_HANDSHAKES,
    ) -> None:
        self.sched = sched
        self.results = results
        self.worker_id = worker_id
        self.shard = shard
        self.keys = keys
        self.elected = elected
        self.scheduler_name = scheduler_name
        self.can_place = can_place
        self.max_handshakes = max_handshakes
        self.gate = RevisionGate(
            sched.watches.revision, sched.watches.progress, self._queue, clock=sched.clock
        )
        self._gate_task: asyncio.Task[None] | None = None
        self._server: asyncio.Server | None = None
        self._handshaking: dict[asyncio.StreamWriter, _Handshaking] = {}  # oldest first
        self._evicted: set[asyncio.StreamWriter] = set()
        self.received = 0
        self.refused_connections = 0  # closed in their handshake to make room for a newcomer (``_evict``)
        self.failed_handshakes = 0  # unauthenticated, malformed, wrong term, or too slow
        self.foreign_pods = 0  # DISPATCHes of another scheduler's pods, refused
        self._last_failure_log = float("-inf")
        self._looked_for = asyncio.Event()  # ``poke``: the capacity check at rest wakes for it
        sched.cache.index.on_stale = self.poke
        self._sole_start: asyncio.Task[None] | None = None  # the sole worker's list of the pending pods
        shard.subscribe(self._shard_changed)

    async def start(self, listener: socket.socket) -> None:
        """Serve on an already bound socket (its address is in the worker's membership record)."""
        self._gate_task = asyncio.create_task(self.gate.run(), name="dispatch-gate")
        self._server = await asyncio.start_server(self.serve, sock=listener)

    async def close(self) -> None:
        if self._gate_task is not None:
            self._gate_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._gate_task
        if self._server is not None:
            self._server.close()
        if self.results.stream is not None:
            self.results.stream.flush()  # the RESULTs not yet written (``protocol.COALESCE``) still go out
            self.results.stream.writer.close()
        for writer in list(self._handshaking):
            writer.close()
        if self._server is not None:
            await self._server.wait_closed()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: the handshake, then (for the elected leader) its stream until it closes or a
        newer stream replaces it."""
        if len(self._handshaking) >= self.max_handshakes:
            self._evict()
        peer = writer.get_extra_info("peername")
        stream: LeaderStream | None = None
        self._handshaking[writer] = _Handshaking(str(peer[0]) if isinstance(peer, tuple) and peer else "")
        try:
            try:
                async with asyncio.timeout(protocol.HELLO_TIMEOUT):
                    stream, leader, first = await self._handshake(reader, writer)
            finally:
                self._handshaking.pop(writer, None)
            self._connect(stream)
            log.info("leader %s (term %d) connected from %s", leader, stream.term, peer)
            await self._follow(reader, stream, first)
        except (asyncio.IncompleteReadError, ConnectionError):
            if stream is not None:
                log.info("stream from %s closed", peer)
            else:
                self._failed(writer, None, "connection from %s closed during its handshake", peer)
        except TimeoutError:
            self._failed(writer, stream, "stream from %s timed out (handshake or a leader not reading)", peer)
        except _Refused as e:
            self._failed(writer, stream, "refused leader stream from %s: %s", peer, e)
        except protocol.ProtocolError as e:
            self._failed(writer, stream, "protocol error from %s: %s", peer, e)
        finally:
            if stream is not None:
                if self.results.stream is stream:
                    self._end_sole("its leader stream ended")
                self.results.disconnect(stream)
                stream.discard()  # the stream is over: a flush still due writes nothing
            self._evicted.discard(writer)
            writer.close()

    def _connect(self, stream: LeaderStream) -> None:
        """``stream`` is the leader's now: what earlier streams dispatched or claimed is dropped, unless its
        binding is under way (module docstring)."""
        self._end_sole("a new leader stream")
        self.results.connect(stream)  # claims reset: the claimed pods not being bound are let go
        self.results.carry_over({key: a.pod.uid for key, a in self.sched.cache.assumed.items()})
        # The new stream has sent nothing yet: whatever is parked or queued came from earlier streams (a claimed
        # pod whose binding failed while no stream was up is requeued with nothing kept for it here).
        self.sched.withdraw_all(parked=self.gate.clear())
        if self.results.earlier:
            log.info("%d bindings of pods from an earlier leader stream under way", len(self.results.earlier))

    def _evict(self) -> None:
        """Make room for a new connection: close one in its handshake (see the module docstring). O(slots)."""
        pool = [(w, h) for w, h in self._handshaking.items() if not h.verified] or list(
            self._handshaking.items()
        )
        slots: dict[str, int] = {}
        for _, h in pool:
            slots[h.host] = slots.get(h.host, 0) + 1
        most = max(slots.values())
        victim, state = next((w, h) for w, h in pool if slots[h.host] == most)  # the oldest of the busiest
        del self._handshaking[victim]
        self._evicted.add(victim)
        victim.transport.abort()
        self.refused_connections += 1
        self._log_limited(
            "handshake slots full: closed the oldest %s connection from %s (%d closed so far)",
            "verified" if state.verified else "unauthenticated",
            victim.get_extra_info("peername"),
            self.refused_connections,
        )

    def _failed(
        self, writer: asyncio.StreamWriter, stream: LeaderStream | None, fmt: str, *args: object
    ) -> None:
        if stream is not None:
            log.warning(fmt, *args)
            return
        if writer in self._evicted:
            return  # counted and logged when evicted (whatever it had sent is read and fails after)
        self.failed_handshakes += 1
        self._log_limited(fmt + " (%d refused so far)", *args, self.failed_handshakes)

    def _log_limited(self, fmt: str, *args: object) -> None:
        # Anyone who reaches the port can cause these: at most one line a second, the rest at debug level.
        now = time.monotonic()
        if now - self._last_failure_log >= 1.0:
            self._last_failure_log = now
            log.info(fmt, *args)
        else:
            log.debug(fmt, *args)

    async def _handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[LeaderStream, str, protocol.Message]:
        """HELLO under one of our keys and with the elected term, our WELCOME, and the leader's first session
        frame (its proof that it holds the key and saw our nonce)."""
        hello, key = await protocol.read_hello(reader, self.keys.keys())
        if not await self._is_elected(hello.term):
            message = f"term {hello.term} is not the elected leader's ({self.elected()})"
            writer.write(protocol.seal_reply(key, hello.nonce, protocol.Error(message)))
            await writer.drain()
            raise _Refused(message)
        state = self._handshaking.get(writer)
        if state is not None:  # (None: a newcomer evicted it meanwhile; its transport is closed)
            state.verified = True
        nonce = protocol.new_nonce()
        writer.write(
            protocol.seal_reply(key, hello.nonce, protocol.Welcome(self.worker_id, hello.term, nonce))
        )
        await writer.drain()
        session = protocol.Session(key, hello_nonce=hello.nonce, welcome_nonce=nonce, leader=False)
        first = await session.read(reader)
        return LeaderStream(writer, session, hello.term), hello.leader, first

    async def _is_elected(self, term: int) -> bool:
        """Does ``term`` name the leader etcd elects now? Our mirror of the election may lag the leader by a
        watch event: wait up to ``TERM_WAIT`` for it to agree."""
        deadline = time.monotonic() + TERM_WAIT
        while self.elected() != term:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(TERM_POLL)
        return True

    async def _follow(
        self, reader: asyncio.StreamReader, stream: LeaderStream, first: protocol.Message
    ) -> None:
        reporter = asyncio.create_task(self._report_capacity(stream))
        try:
            msg = first
            while True:
                stream.read_at = time.monotonic()
                self.handle(msg, stream)
                if stream.buffered() > WRITE_HIGH_WATER:
                    await stream.drain()
                msg = await stream.session.read(reader)
        finally:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError, ConnectionError):
                await reporter

    def handle(self, msg: protocol.Message, stream: LeaderStream) -> None:
        if not isinstance(msg, protocol.Ping):
            self.poke()  # a dispatch moves the queue's count; a claim set, what the claims will
        if isinstance(msg, protocol.Dispatch):
            dispatch_id, pod, min_rv = _dispatch(msg, self.sched.watches.pod_feed.previous)
            self.received += 1
            if pod.scheduler_name != self.scheduler_name:
                self.foreign_pods += 1
                message = f"pod is for scheduler {pod.scheduler_name!r}, not {self.scheduler_name!r}"
                stream.send(_result(dispatch_id, pod, protocol.REJECTED, message=message))
                return
            if stream is not self.results.stream:
                # read from a stream a newer one replaced (its frames still buffered): its leader is no longer
                # the one this worker answers to, and the current one must know of every placement here
                stream.send(_result(dispatch_id, pod, protocol.REJECTED, message="a newer leader stream"))
                return
            if not self.can_place():
                stream.send(
                    _result(dispatch_id, pod, protocol.REJECTED, message="worker cannot place pods now")
                )
                return
            self.results.expect(dispatch_id, pod)
            if self.results.claims is not None:
                self.results.claims.dispatched(pod)
            if msg.preempt:
                self.sched.preempt_next(pod.key, NodeName(msg.preempt))
            self.gate.hold(pod, min_rv)
            stream.send(protocol.Ack(dispatch_id))
        elif isinstance(msg, protocol.Claims):
            self.results.claim_set(stream, msg.workers)
        elif isinstance(msg, protocol.Sole):
            self._become_sole(stream)
        elif isinstance(msg, protocol.Ping):
            stream.send(protocol.Pong(msg.ts))
        else:
            log.debug("ignoring %s message", type(msg).__name__)

    # ----- the sole worker ---------------------------------------------------------------------------------

    def _not_sole(self) -> str:
        """Why this worker may not be (or stay) the sole one now; "" if it may: not while fenced or draining,
        nor under a claim set. Granted nodes catching up do not stop it: while any does, its verdicts and
        preemptions wait (``unschedulable``, ``Scheduler.schedule_one``), as a dispatching leader's would
        (this worker would answer it "try later"), and the pods are decided again once none does."""
        if not self.can_place():
            return "it cannot place pods (fenced or draining)"
        if self.results.claims is not None and self.results.claims.workers:
            return "a claim set is in force"
        return ""

    @staticmethod
    def _silent(stream: LeaderStream, now: float) -> str:
        """Has the leader sent nothing for ``protocol.DEAD_AFTER`` (it PINGs every heartbeat)? A sole worker
        whose leader is cut off stops: that leader may already dispatch again, and another worker may get
        nodes that never were this one's."""
        silent = now - stream.read_at
        return f"no frame from its leader for {silent:.1f} s" if silent > protocol.DEAD_AFTER else ""

    def _become_sole(self, stream: LeaderStream) -> None:
        """SOLE over ``stream``: place every pending pod of ours from here, as standalone, until the stream
        ends; or, if this worker may not, close the stream (its leader then dispatches again)."""
        if stream is not self.results.stream or self.results.sole:
            return
        if why := self._not_sole():
            log.warning("not becoming the sole worker: %s; closing the leader stream", why)
            stream.writer.close()
            return
        self.results.sole = True
        self.sched.set_sole(True)
        self._sole_start = asyncio.create_task(self._take_pending(), name="sole-start")
        log.info("the sole worker: placing every pending pod of ours from this worker's own watch")

    async def _take_pending(self) -> None:
        """The pending pods the pod watch passed over before this worker became the sole one, taken in chunks
        (a backlog's parse must not hold up the stream's heartbeats). Nobody else places them while this
        worker is sole, so a failure ends the period: the leader lists and dispatches them. The period's end
        cancels this task (``_end_sole``)."""
        feed = self.sched.watches.pod_feed
        feed.removed_since_list = set()
        try:
            pods = await self.sched.watches.list_pending()
            for start in range(0, len(pods), TAKE_CHUNK):
                feed.take_listed(pods[start : start + TAKE_CHUNK])
                await asyncio.sleep(0)
        except ApiError as e:
            self._end_sole_and_close(f"listing the pending pods failed: {e}")
        except Exception:
            log.exception("taking the pending pods failed")
            self._end_sole_and_close("taking the pending pods failed")
        finally:
            feed.removed_since_list = None

    def _end_sole(self, reason: str) -> None:
        """Stop being the sole worker: no pod is taken from the watch any more and the queue is emptied
        (``Scheduler.set_sole``); bindings under way go on, and the next stream counts them in ``earlier``."""
        if not self.results.sole:
            return
        self.results.sole = False
        self.sched.set_sole(False)
        if self._sole_start is not None:
            self._sole_start.cancel()
            self._sole_start = None
        log.info("no longer the sole worker: %s", reason)

    def _end_sole_and_close(self, reason: str) -> None:
        """End being the sole worker by this worker's own decision, and end the stream that made it so: its
        leader learns of it when the stream closes, and dispatches again over a new one."""
        stream = self.results.stream
        self._end_sole(reason)
        if stream is not None:
            stream.flush()
            stream.writer.close()

    def _shard_changed(self, change: ShardChange) -> None:
        """A usable node gone ends the period: revoked, it may be on its way to a worker that joins (the
        leader ends the period too, once it sees the handover, but this worker's next verdict would come
        first). Nodes added keep it: while no other worker is live, every node the leader grants is this
        worker's, and its verdicts wait while they catch up (``LeaderResults.unschedulable``,
        ``Scheduler.schedule_one``)."""
        if self.results.sole and change.removed:
            self._end_sole_and_close(f"{len(change.removed)} usable nodes left its shard")

    def shard_reevaluated(self) -> None:
        """The shard was looked at again (``worker.shard.Shard.on_reevaluated``: a grant, a catch-up, the
        lease's health): the sole worker must stop before its next decision when it can no longer place pods,
        not at the next capacity check; and once no granted node catches up, the pods whose "no" came while
        some did are decided again (``Scheduler.release_held``)."""
        self.poke()
        if self.results.sole and (why := self._not_sole()):
            self._end_sole_and_close(why)
        elif self.results.sole and not self.shard.syncing():
            self.sched.release_held()

    def _queue(self, pod: PodRecord, received_at: float) -> None:
        """The gate let a dispatched pod through (at once, or once the watch reached its ``min_rv``)."""
        self.sched.submit(pod)
        metrics.observe_stage("queued", self.sched.clock() - received_at)

    def capacity(self) -> protocol.Capacity:
        """The CAPACITY summary: the index's incremental totals, the queue's counts, the bind rate."""
        summary = self.sched.cache.index.summary()
        placing = self.can_place()
        stats = self.sched.queue.statistics()
        return protocol.Capacity(
            nodes=summary.nodes if placing else 0,
            free_cpu=summary.free_cpu,
            free_memory=summary.free_memory,
            max_cpu=summary.max_cpu if placing else 0,
            max_memory=summary.max_memory if placing else 0,
            pending=stats["active"] + stats["backoff"] + stats["flight"],
            syncing=self.shard.syncing(),
            binds_per_s=self.results.binds_per_second(),
            ts=time.time(),
            placing=placing,
            earlier=self.results.earlier_count(self.sched.cache.is_assumed),
            revision=self.sched.watches.object_revision(),
            sole=self.results.sole,
        )

    def poke(self) -> None:
        """Something the capacity summary or the elected-term check reads may have changed: look now."""
        self._looked_for.set()

    async def _report_capacity(self, stream: LeaderStream) -> None:
        """Each check closes the stream if its term is no longer elected, else sends the summary if it changed,
        and at least every ``HEARTBEAT_INTERVAL`` even if not (the stream's heartbeat: the leader hears from an
        idle worker well within ``DEAD_AFTER``, and answers with PING). A check runs every
        ``CAPACITY_INTERVAL`` until ``CAPACITY_QUIET`` has passed since the last poke or change; after that, at
        rest, only on a poke (``poke``: the index's summary went stale, the shard was re-evaluated, the election
        changed, the leader sent something, the worker began to drain) or when the heartbeat is due. Every field
        the leader decides on changes with a poke (the lease keeper's own timer tells the shard when the lease's
        health runs out); the ones only shown go out with the next summary or heartbeat (``_changed``)."""
        last: protocol.Capacity | None = None
        last_sent = float("-inf")
        active_until = time.monotonic() + CAPACITY_QUIET
        while not stream.writer.is_closing():
            if self._looked_for.is_set():  # poked since the last check
                active_until = time.monotonic() + CAPACITY_QUIET
                self._looked_for.clear()
            elected = self.elected()
            if elected is not None and elected != stream.term:
                log.warning(
                    "leader of term %d is no longer elected (term %d is); closing its stream",
                    stream.term,
                    elected,
                )
                stream.writer.close()
                return
            if self.results.sole and (why := self._not_sole() or self._silent(stream, time.monotonic())):
                self._end_sole_and_close(why)
                return
            summary = self.capacity()
            now = time.monotonic()
            changed = _changed(summary, last, sole=self.results.sole)
            if changed:
                active_until = now + CAPACITY_QUIET
            if changed or now - last_sent >= protocol.HEARTBEAT_INTERVAL:
                stream.send(summary)
                last, last_sent = summary, now
                if stream.buffered() > WRITE_HIGH_WATER:
                    await stream.drain()
            if now < active_until:
                await asyncio.sleep(protocol.CAPACITY_INTERVAL)
                continue
            # At rest: until a poke or the heartbeat. A timeout scope, not ``wait_for`` (no task per wait).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, last_sent + protocol.HEARTBEAT_INTERVAL - now)):
                    await self._looked_for.wait()
