"""The worker's shard: which nodes this worker may place pods on, right now, and the one stream of changes.

The scheduling cycle asks one question, ``usable(node)`` (for a whole decision at once, ``usable_now()``: the
same answers with the lease's health read once), and the cache re-indexes on one stream of ``ShardChange``
events (``subscribe``). Nothing else in the worker knows how the answer is reached.

Two implementations of ``ShardView``:
- ``WholeCluster`` (standalone): every node is usable, nothing ever changes.
- ``Shard`` (under a coordinator): registration under an etcd lease, the leader's assignment for that lease,
  fencing by lease health, release acknowledgements, and the catch-up of newly granted nodes.

``Shard`` keeps three sets: ``granted`` (the latest assignment made for *this* lease), ``syncing`` (granted
nodes whose pods the cache has not caught up with yet) and ``published`` (what subscribers were last told
is usable). ``owns(node)`` is "granted and the lease is healthy": the shard map's view, checked by the etcd
tests. ``usable(node)`` is "owns and not syncing": what the scheduler may place on. ``bind_deadline(node)``
is what the binder asks immediately before each binding attempt, and (through ``Binder.budget``) the
preemption executor before each of its writes: None unless the node is usable, else the lease's fencing
deadline (``LeaseKeeper.fence_deadline``), which the write must end before.

Invariants (the worker's half of "no node is ever usable by two workers at once"):
- Nothing is usable, and no binding or preemption write may be sent, while the lease is not healthy (fencing, see
  ``common.etcd.leases``), while draining, or outside the granted set of the latest assignment made for this
  lease. An assignment written for an earlier lease (a previous incarnation) grants nothing.
- A granted node becomes usable only after the cache holds every pod already bound there: either the pod
  watch completed a (re)list that started after the grant, or, per node, a consistent LIST of the pods bound
  there whose newest revision the watch has reached (after ``CATCH_UP_TIMEOUT`` the listed pods are applied
  directly, and held against the watch's older records of them, ``worker.feeds``: a pod deleted meanwhile
  may count until the watch shows it gone, conservative, never over).
- A revoked node stops being usable, and is published as removed, before the release hook runs; the
  release acknowledgement is written only after the release hook returned (in the worker: every binding, and
  every preemption's nomination and eviction, in flight to those nodes finished) for every node revoked up to
  that epoch. Releases are processed one at a
  time, in epoch order, so acks never go backwards.
- Subscribers are called synchronously, in subscription order, with the difference between the published
  set and the current usable set; the stream is consistent: a node is added only if it was not published,
  removed only if it was.
- A worker id is registered by at most one live lease: registration is a create-only transaction, and a
  restarted worker waits until its previous incarnation's lease has expired.
- When etcd reports the lease gone, everything is released locally (no ack: the lease is the proof) and
  the worker registers again under a new lease; it owns nothing until the leader assigns to that lease.

What it does not do: decide anything. The leader (``coordinator``'s shard map) owns the map.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from etcd3aio import Etcd3Client
from etcd3aio.kv import KVService

from common.aiotools import cancel_and_wait, wait_first
from common.backoff import api_retry, etcd_retry
from common.etcd.keys import KeyLayout, WorkerId
from common.etcd.kv import DEFAULT_TIMEOUT, ETCD_FAILURES, describe, kv_service
from common.etcd.leases import Clock, LeaseKeeper, LeaseState
from common.etcd.mirror import KeyMirror
from common.etcd.schema import LoadReport, RecordError, ReleaseAck, ShardAssignment, WorkerRecord
from common.records import NodeName, PodRecord

log = logging.getLogger(__name__)

DEFAULT_TTL = 10
CATCH_UP_TIMEOUT = 5.0  # seconds a newly granted node waits for the pod watch before a direct read is used
CATCH_UP_CONCURRENCY = 16
CATCH_UP_POLL = 0.01
INFINITY = float("inf")

ReleaseHook = Callable[[frozenset[NodeName]], Awaitable[None]]
Listener = Callable[["ShardChange"], None]


@dataclass(frozen=True, slots=True)
class ShardChange:
    """Nodes that became usable (``added``) or stopped being usable (``removed``); ``epoch`` of the
    assignment in force. Fencing and its end are changes too: every published node goes, then comes back."""

    added: frozenset[NodeName]
    removed: frozenset[NodeName]
    epoch: int


class ShardView(Protocol):
    """What the cache and the scheduling cycle may ask of the shard."""

    def usable(self, node: NodeName) -> bool:
        """May this worker place a pod on ``node`` now? O(1), no I/O."""
        ...

    def usable_now(self) -> Callable[[NodeName], bool]:
        """``usable`` for one synchronous pass over many nodes (a decision's walk), with the lease's health read
        once, at this call, instead of per node: a health that runs out during the pass (a decision's walk
        runs the filters: up to milliseconds, longer across a pause) is seen as it was at the call, which lets
        nothing unfenced through, since the binder asks ``bind_deadline`` again before each binding attempt.
        Not to be kept across an ``await``: the shard may change there, and a kept test would not follow all
        of it."""
        ...

    def subscribe(self, callback: Listener) -> Callable[[], None]:
        """Call ``callback`` on every change of the usable set; returns an unsubscriber."""
        ...

    def syncing(self) -> int:
        """Granted nodes not usable yet because the cache is catching up with them."""
        ...

    def bind_deadline(self, node: NodeName) -> float | None:
        """None if ``node`` is not usable now; else until when (``time.monotonic``) a binding to it may be
        under way: the fencing deadline of the lease (infinity without one). O(1), no I/O."""
        ...


def _every(node: NodeName) -> bool:
    return True


def _none(node: NodeName) -> bool:
    return False


class WholeCluster:
    """The standalone shard: every node the cache knows is usable, and that never changes."""

    def usable(self, node: NodeName) -> bool:
        return True

    def usable_now(self) -> Callable[[NodeName], bool]:
        return _every

    def subscribe(self, callback: Listener) -> Callable[[], None]:
        return lambda: None

    def syncing(self) -> int:
        return 0

    def bind_deadline(self, node: NodeName) -> float | None:
        return INFINITY


class PodWatch(Protocol):
    """The worker's pod watch and cache, as far as the catch-up of a granted node needs them."""

    async def wait_synced(self) -> None:
        """Return once the first complete list has been applied."""
        ...

    def listed_since(self, moment: float) -> bool:
        """Did a complete (re)list that started at or after ``moment`` (monotonic) reach the cache?"""
        ...

    def revision(self) -> int:
        """The newest resource revision the watch has applied."""
        ...

    async def list_bound(self, node: NodeName) -> tuple[list[PodRecord], int]:
        """A consistent read of the pods bound to ``node``, and the newest revision among them."""
        ...

    def apply_direct(self, pods: list[PodRecord]) -> None:
        """Account pods read directly (the watch lags): conservative until the watch catches up."""
        ...


AckWriter = Callable[[int, int, frozenset[NodeName]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ShardStats:
    worker_id: WorkerId
    lease_id: int
    healthy: bool
    epoch: int
    owned: int
    syncing: int
    releases: int
    acks: int
    registrations: int


class ShardState:
    """The in-memory part of ``Shard``: granted, syncing and published sets, catch-up, the release queue.

    Fed by ``Shard`` (``assign`` on every assignment or lease change, ``publish`` on every health change);
    does no etcd I/O itself: acknowledgements go through ``ack``. Usable without etcd, for tests.
    """

    def __init__(
        self,
        *,
        name: str,
        healthy: Callable[[], bool],
        ack: AckWriter,
        fence_deadline: Callable[[], float] = lambda: INFINITY,
    ) -> None:
        self.name = name
        self._healthy = healthy
        self._fence_deadline = fence_deadline
        self._ack = ack
        self._granted: frozenset[NodeName] = frozenset()
        self._syncing: Counter[NodeName] = Counter()
        self._published: frozenset[NodeName] = frozenset()
        self.epoch = 0
        self._listeners: list[Listener] = []
        self._touched: list[Callable[[], None]] = []
        self._releases: asyncio.Queue[tuple[int, int, frozenset[NodeName]]] = asyncio.Queue()
        self._pods: PodWatch | None = None
        self._on_release: ReleaseHook | None = None
        self._task: asyncio.Task[None] | None = None
        self._acquiring: set[asyncio.Task[None]] = set()
        self.releases = 0

    # ---- queries ----

    def owns(self, node: NodeName) -> bool:
        return node in self._granted and self._healthy()

    def usable(self, node: NodeName) -> bool:
        return node in self._granted and node not in self._syncing and self._healthy()

    def usable_now(self) -> Callable[[NodeName], bool]:
        # A set lookup per node where ``usable`` costs three frames and a clock read (a coordinated decision
        # cost 3-6.5 µs more than the standalone's ≈ 40 at 1,000 nodes, 2.2-2.4 after:
        # docs/results/floor-2026-12-06/)
        if not self._healthy():
            return _none
        granted, syncing = self._granted, self._syncing
        if not syncing:
            return granted.__contains__
        return lambda node: node in granted and node not in syncing

    def owned(self) -> frozenset[NodeName]:
        return self._granted if self._healthy() else frozenset()

    def bind_deadline(self, node: NodeName) -> float | None:
        if not self.usable(node):
            return None
        return self._fence_deadline()

    @property
    def granted(self) -> frozenset[NodeName]:
        """The granted set, whatever the lease health."""
        return self._granted

    def syncing(self) -> int:
        return len(self._syncing)

    def subscribe(self, callback: Listener) -> Callable[[], None]:
        self._listeners.append(callback)
        return lambda: self._listeners.remove(callback)

    # ---- lifecycle ----

    def start(self, *, pods: PodWatch | None, on_release: ReleaseHook | None) -> None:
        """Begin processing releases. Without ``pods`` granted nodes are usable at once (no cache to wait
        for); without ``on_release`` a release is acknowledged as soon as it is seen."""
        self._pods = pods
        self._on_release = on_release
        self._task = asyncio.create_task(self._release_loop(), name=f"releases-{self.name}")

    async def releases_done(self) -> None:
        """Wait until every release queued so far has run its hook and its acknowledgement."""
        await self._releases.join()

    async def stop(self) -> None:
        await cancel_and_wait(self._task, *self._acquiring)
        self._task = None

    # ---- changes ----

    def assign(self, granted: frozenset[NodeName], epoch: int | None, *, ack_lease: int) -> None:
        """Apply a new granted set (``epoch`` None: no assignment for our lease). Revoked nodes are
        published as removed now; their release, and the ack under ``ack_lease`` if not 0, are queued."""
        removed = self._granted - granted
        added = granted - self._granted
        self._granted = granted  # one reference swap: usable() never sees a half-applied assignment
        if epoch is not None:
            self.epoch = epoch
        if added or removed:
            log.info("worker %s: epoch %d +%d -%d nodes", self.name, self.epoch, len(added), len(removed))
        if added and self._pods is not None:
            self._acquire(added)
        self.publish()
        if removed or ack_lease:
            self._releases.put_nowait((ack_lease, self.epoch, removed))

    def drop_all(self) -> None:
        """Own nothing, without running release hooks or acks (the lease is going away by itself)."""
        self._granted = frozenset()
        self.publish()

    def on_reevaluated(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever the shard's state is looked at again (an assignment applied, the lease's
        health changed, a catch-up ended), whether or not the usable set changed: what ``syncing`` and the
        lease's health say may have."""
        self._touched.append(callback)

    def publish(self) -> None:
        """Tell subscribers how the usable set differs from what they were told last."""
        for touched in self._touched:
            touched()
        current = self._granted - self._syncing.keys() if self._healthy() else frozenset()
        added = current - self._published
        removed = self._published - current
        if not added and not removed:
            return
        self._published = current
        change = ShardChange(added, removed, self.epoch)
        for callback in list(self._listeners):
            callback(change)

    # ---- catch-up ----

    def _acquire(self, nodes: frozenset[NodeName]) -> None:
        self._syncing.update(nodes)  # counted: a node granted again while catching up waits for both
        task = asyncio.create_task(self._catch_up_all(nodes, time.monotonic()), name=f"acquire-{self.epoch}")
        self._acquiring.add(task)
        task.add_done_callback(self._acquiring.discard)

    async def _catch_up_all(self, nodes: frozenset[NodeName], granted_at: float) -> None:
        """Wait until the cache holds the pods bound to ``nodes``, then let them be used. If this is
        cancelled (the shard stops), they stay syncing: never usable without the catch-up. A failure other than
        the API's (which ``_catch_up`` retries node by node) is logged and the whole catch-up tried again after
        a backoff: left failed, its nodes would stay syncing for the life of the process, and a sole worker
        would hold back every verdict and preemption while any node syncs (``worker.intake``)."""
        pods = self._pods
        assert pods is not None
        backoff = api_retry()
        while True:
            try:
                reads = await self._read_all(pods, nodes, granted_at)  # the attempt that succeeded
                break
            except Exception:
                log.exception(
                    "worker %s: catching up on %d granted nodes failed; retrying", self.name, len(nodes)
                )
                await backoff.sleep()
        # How long granted nodes waited to be usable, and by how many reads: the cost of a grant that came
        # after the pod watch listed (one read per node) shows here, not only as a slower first burst.
        log.info(
            "worker %s: %d granted nodes usable after %.1fs (%d per-node reads)",
            self.name,
            len(nodes),
            time.monotonic() - granted_at,
            reads,
        )
        self._syncing.subtract(nodes)
        for node in nodes:
            if self._syncing[node] <= 0:
                del self._syncing[node]
        self.publish()

    async def _read_all(self, pods: PodWatch, nodes: frozenset[NodeName], granted_at: float) -> int:
        """The catch-up's reads: none if a relist reached the cache after the grant, else one per node still
        granted. Returns how many were made."""
        await pods.wait_synced()
        reads = 0
        if not pods.listed_since(granted_at):
            sem = asyncio.Semaphore(CATCH_UP_CONCURRENCY)

            async def one(node: NodeName) -> None:
                nonlocal reads
                async with sem:
                    reads += await self._catch_up(pods, node)

            # Every read runs to its end before a failure is raised (none is left running behind a retry), and a
            # cancellation (the shard stops) stays a cancellation, which ``except Exception`` above lets through.
            results = await asyncio.gather(*(one(n) for n in nodes), return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    raise result
        return reads

    async def _catch_up(self, pods: PodWatch, node: NodeName) -> bool:
        """Wait until the cache holds the pods bound to ``node`` (one read of them); False if ``node`` was
        revoked before it was read."""
        backoff = api_retry()
        while True:
            if node not in self._granted:
                return False  # revoked meanwhile: nothing to wait for
            try:
                listed, target = await pods.list_bound(node)
                break
            except Exception as e:  # the node stays unusable until a read succeeds
                log.warning(
                    "listing the pods of a granted node failed (%s); retrying", e, extra={"node": node}
                )
                await backoff.sleep()
        deadline = time.monotonic() + CATCH_UP_TIMEOUT
        while pods.revision() < target:
            if time.monotonic() >= deadline:
                log.warning(
                    "pod watch lags behind a granted node; applying a direct read", extra={"node": node}
                )
                pods.apply_direct(listed)
                return True
            await asyncio.sleep(CATCH_UP_POLL)
        return True

    # ---- releases ----

    async def _release_loop(self) -> None:
        while True:
            lease, epoch, nodes = await self._releases.get()
            try:
                if nodes:
                    self.releases += 1
                if nodes and self._on_release is not None:
                    try:
                        await self._on_release(nodes)
                    except Exception:
                        # The nodes are already unusable, so no new pod lands there; an unconfirmed in-flight
                        # bind cannot be waited for forever, or the node would never move. Ack anyway.
                        log.exception("worker %s: release hook failed for %d nodes", self.name, len(nodes))
                if lease:
                    await self._ack(lease, epoch, nodes)
            finally:
                self._releases.task_done()


class Shard:
    """One worker's membership and its shard, under an etcd lease (see the module docstring)."""

    def __init__(
        self,
        client: Etcd3Client,
        record: WorkerRecord,
        *,
        keys: KeyLayout | None = None,
        ttl: int = DEFAULT_TTL,
        clock: Clock = time.monotonic,
    ) -> None:
        self._client = client
        self.record = record
        self._keys = keys or KeyLayout()
        self._keeper = LeaseKeeper(client, ttl=ttl, name=f"worker {record.worker_id}", clock=clock)
        keeper = self._keeper
        self._state = ShardState(
            name=record.worker_id,
            healthy=lambda: keeper.healthy,
            ack=self._ack,
            fence_deadline=lambda: keeper.fence_deadline,
        )
        self._draining = False
        self._mirror = KeyMirror(
            client, self._keys.assignment(record.worker_id), prefix=False, on_change=self._reevaluate
        )
        self._keeper.add_listener(lambda _healthy: self._state.publish())
        self._tasks: list[asyncio.Task[None]] = []
        self._load: LoadReport | None = None
        self._load_written: tuple[int, LoadReport] | None = None  # (lease, report) etcd took last
        # One write at a time: a registration's republishing and the worker's own report may otherwise both be
        # in flight, and the reply that came last need not be the write etcd applied last.
        self._load_lock = asyncio.Lock()
        self.acks = 0
        self.registrations = 0
        # The scheduling hot path calls these directly: no extra frame per candidate node.
        self.usable = self._state.usable
        self.usable_now = self._state.usable_now
        self.owns = self._state.owns
        self.owned = self._state.owned
        self.syncing = self._state.syncing
        self.bind_deadline = self._state.bind_deadline
        self.subscribe = self._state.subscribe
        self.on_reevaluated = self._state.on_reevaluated

    # ---- introspection ----

    @property
    def worker_id(self) -> WorkerId:
        return self.record.worker_id

    @property
    def healthy(self) -> bool:
        return self._keeper.healthy

    @property
    def lease_id(self) -> int:
        return self._keeper.lease_id

    @property
    def epoch(self) -> int:
        """Epoch of the assignment the granted set comes from; 0 before the first one."""
        return self._state.epoch

    @property
    def keeper(self) -> LeaseKeeper:
        return self._keeper

    def statistics(self) -> ShardStats:
        return ShardStats(
            self.worker_id,
            self.lease_id,
            self.healthy,
            self.epoch,
            len(self._state.owned()),
            self._state.syncing(),
            self._state.releases,
            self.acks,
            self.registrations,
        )

    # ---- lifecycle ----

    async def start(self, *, pods: PodWatch | None = None, on_release: ReleaseHook | None = None) -> None:
        """Register, load the assignment, and keep both current in the background.

        ``pods``: the cache's pod watch, which granted nodes wait for (see the module docstring);
        ``on_release``: awaited for revoked nodes before their acknowledgement (the worker waits for its
        bindings and its preemptions' writes in flight there, ``Scheduler.release``). Returns once the
        assignment has been read once.
        """
        self._state.start(pods=pods, on_release=on_release)
        await self._register()
        self._tasks = [
            asyncio.create_task(self._mirror.run(), name=f"assignment-{self.worker_id}"),
            asyncio.create_task(self._supervise(), name=f"membership-{self.worker_id}"),
        ]
        await self._mirror.synced.wait()

    async def drain(self) -> None:
        """Graceful shutdown: stop owning everything, release it, acknowledge, give the lease back.

        Waits for the release hook and for the ack to reach etcd; bound it with ``asyncio.timeout`` and
        fall back to ``close()`` if etcd is unreachable (the lease then expires by itself).
        """
        self._draining = True
        self._reevaluate()  # empties the granted set and queues the release + ack
        await self._state.releases_done()
        await cancel_and_wait(*self._tasks)
        self._tasks = []
        await self._state.stop()
        # Revoking the lease deletes membership, load and ack at once; the leader frees our nodes then.
        await self._keeper.revoke()
        log.info("worker %s drained", self.worker_id)

    async def close(self) -> None:
        """Stop without releasing anything: the lease expires by itself (used for crash tests, and when the
        process is going away anyway and cannot run release hooks)."""
        await cancel_and_wait(*self._tasks)
        self._tasks = []
        await self._state.stop()
        await self._keeper.close()
        self._state.drop_all()  # subscribers learn we own nothing; no release hook (nothing to wait for)

    async def report_load(self, report: LoadReport) -> bool:
        """Publish the load report under our lease; False if etcd could not take it (it is kept and
        republished after the next registration)."""
        self._load = report
        async with self._load_lock:
            lease = self._keeper.lease_id
            if self._keeper.state is not LeaseState.ALIVE:
                return False
            try:
                await kv_service(self._client).put(
                    self._keys.load(self.worker_id), report.encode(), lease=lease, timeout=DEFAULT_TIMEOUT
                )
            except ETCD_FAILURES as e:
                log.debug("worker %s: load report not written: %s", self.worker_id, describe(e))
                return False
            self._load_written = (lease, report)
            return True

    def written_load(self) -> LoadReport | None:
        """The load report etcd holds for us: the latest it took under the current lease (None: none under
        it, e.g. after a registration whose republishing failed; a new lease starts with no report)."""
        if self._load_written is None or self._load_written[0] != self._keeper.lease_id:
            return None
        return self._load_written[1]

    # ---- registration ----

    async def _register(self) -> None:
        """Grant a lease and claim the membership key with it, waiting out an older incarnation's lease."""
        kv = kv_service(self._client)
        lease = await self._keeper.grant()
        key = self._keys.member(self.worker_id)
        while True:
            resp = await kv.txn(
                [KVService.txn_compare_create_revision(key, 0)],
                [KVService.txn_op_put(key, self.record.encode(), lease=lease)],
                [KVService.txn_op_get(key)],
                timeout=DEFAULT_TIMEOUT,
            )
            if resp.succeeded:
                break
            holders = resp.responses[0].response_range.kvs
            if holders and int(holders[0].lease) == lease:
                break  # our own earlier attempt went through and its reply was lost
            log.warning(
                "worker %s: id still registered under lease %x (a previous incarnation?); waiting for it to end",
                self.worker_id,
                int(holders[0].lease) if holders else 0,
            )
            await asyncio.sleep(self._keeper.ttl / 2)
        self.registrations += 1
        if self._load is not None:
            await self.report_load(self._load)
        log.info("worker %s registered with lease %x", self.worker_id, lease)

    async def _supervise(self) -> None:
        """When etcd says our lease is gone: release everything locally and register again."""
        while True:
            await self._keeper.wait_lost()
            self._reevaluate()  # the assignment no longer matches our lease: everything goes
            backoff = etcd_retry()
            while True:
                try:
                    await self._register()
                    break
                except ETCD_FAILURES as e:
                    delay = backoff.next()
                    log.warning(
                        "worker %s: re-registration failed (%s); retrying in %.1f s",
                        self.worker_id,
                        describe(e),
                        delay,
                    )
                    await asyncio.sleep(delay)
            self._reevaluate()

    # ---- applying assignments ----

    def _current_assignment(self) -> ShardAssignment | None:
        kv = self._mirror.items.get(self._keys.assignment(self.worker_id))
        if kv is None:
            return None
        try:
            assignment = ShardAssignment.decode(kv.value)
        except RecordError as e:
            log.error("worker %s: unreadable assignment, owning nothing: %s", self.worker_id, e)
            return None
        if assignment.worker_id != self.worker_id:
            log.error(
                "worker %s: assignment names worker %s, owning nothing", self.worker_id, assignment.worker_id
            )
            return None
        return assignment

    def _reevaluate(self) -> None:
        """Recompute the granted set from the mirrored assignment and the lease; queue releases."""
        assignment = self._current_assignment()
        lease = self._keeper.lease_id
        if assignment is None or assignment.lease_id != lease or self._keeper.state is not LeaseState.ALIVE:
            assignment = None  # not ours: a previous incarnation's, or our lease is gone
        granted = assignment.granted if assignment is not None and not self._draining else frozenset()
        # The leader waits for an ack when it revokes; when draining, an ack lets it see the release even
        # if revoking the lease fails. Without an assignment for our lease there is nothing to acknowledge.
        ack_lease = 0
        if assignment is not None and (assignment.revoking or (self._draining and self._state.granted)):
            ack_lease = lease
        self._state.assign(granted, assignment.epoch if assignment is not None else None, ack_lease=ack_lease)

    async def _ack(self, lease: int, epoch: int, nodes: frozenset[NodeName]) -> None:
        ack = ReleaseAck(self.worker_id, lease, epoch, nodes)
        backoff = etcd_retry()
        while self._keeper.lease_id == lease and self._keeper.state is LeaseState.ALIVE:
            try:
                await kv_service(self._client).put(
                    self._keys.ack(self.worker_id), ack.encode(), lease=lease, timeout=DEFAULT_TIMEOUT
                )
            except ETCD_FAILURES as e:
                log.warning(
                    "worker %s: ack of epoch %d not written (%s); retrying",
                    self.worker_id,
                    epoch,
                    describe(e),
                )
                # Stop retrying if the lease dies meanwhile: its expiry releases the nodes instead.
                await wait_first(asyncio.sleep(backoff.next()), self._keeper.wait_lost())
                continue
            self.acks += 1
            log.debug(
                "worker %s: acknowledged epoch %d (%d nodes released)", self.worker_id, epoch, len(nodes)
            )
            return
