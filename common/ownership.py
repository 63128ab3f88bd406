"""The worker's side of the shard map: which agent nodes this worker may place pods on, right now.

A worker registers under its lease, mirrors its assignment key, and answers ``owns(node)`` from memory.

Invariants (the worker's half of "no node is ever usable by two workers at once"):
- ``owns`` is False for every node while the lease is not healthy (fencing, see ``common.etcd.leases``), while
  draining, and for any node not in the granted set of the latest assignment made for *this* lease.
  An assignment written for an earlier lease (a previous incarnation) grants nothing.
- A revoked node stops being owned the moment its revocation is seen, before ``on_release`` runs; the
  release acknowledgement is written only after ``on_release`` returned for every node revoked up to
  that epoch. Releases are processed one at a time, in epoch order, so acks never go backwards.
- A worker id is registered by at most one live lease: registration is a create-only transaction, and a
  restarted worker waits until its previous incarnation's lease has expired.
- When etcd reports the lease gone, everything is released locally (no ack: the lease is the proof) and
  the worker registers again under a new lease; it owns nothing until the leader assigns to that lease.

What it does not do: decide anything. The leader (``coordinator.shardmap``) owns the map.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from etcd3aio import Etcd3Client
from etcd3aio.kv import KVService

from common.aiotools import cancel_and_wait, wait_first
from common.etcd.keys import KeyLayout, WorkerId
from common.etcd.kv import DEFAULT_TIMEOUT, ETCD_FAILURES, describe, kv_service
from common.etcd.leases import Clock, LeaseKeeper, LeaseState
from common.etcd.mirror import KeyMirror
from common.etcd.schema import LoadReport, RecordError, ReleaseAck, ShardAssignment, WorkerRecord
from common.records import NodeName

log = logging.getLogger(__name__)

ReleaseHook = Callable[[frozenset[NodeName]], Awaitable[None]]

DEFAULT_TTL = 10
RETRY_DELAY = 0.2
MAX_RETRY_DELAY = 2.0


@dataclass(frozen=True, slots=True)
class OwnershipChange:
    """Delivered to subscribers whenever the granted set changes (not on fencing: see ``healthy``)."""

    added: frozenset[NodeName]
    removed: frozenset[NodeName]
    epoch: int


@dataclass(frozen=True, slots=True)
class MembershipStats:
    worker_id: WorkerId
    lease_id: int
    healthy: bool
    epoch: int
    owned: int
    releases: int
    acks: int
    registrations: int


class ShardMembership:
    """One worker's membership and its view of its shard."""

    def __init__(
        self,
        client: Etcd3Client,
        record: WorkerRecord,
        *,
        keys: KeyLayout | None = None,
        ttl: int = DEFAULT_TTL,
        on_release: ReleaseHook | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self._client = client
        self.record = record
        self._keys = keys or KeyLayout()
        self._on_release = on_release
        self._keeper = LeaseKeeper(client, ttl=ttl, name=f"worker {record.worker_id}", clock=clock)
        self._granted: frozenset[NodeName] = frozenset()
        self._epoch = 0
        self._draining = False
        self._mirror = KeyMirror(
            client, self._keys.assignment(record.worker_id), prefix=False, on_change=self._reevaluate
        )
        self._releases: asyncio.Queue[tuple[int, int, frozenset[NodeName]]] = asyncio.Queue()
        self._listeners: list[Callable[[OwnershipChange], None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._load: LoadReport | None = None
        self.releases = 0
        self.acks = 0
        self.registrations = 0

    # ---- hot path ----

    def owns(self, node: NodeName) -> bool:
        """May this worker place a pod on ``node`` now? O(1); no I/O."""
        return node in self._granted and self._keeper.healthy

    def owned(self) -> frozenset[NodeName]:
        """The nodes ``owns`` is True for (empty while fenced)."""
        return self._granted if self._keeper.healthy else frozenset()

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
        return self._epoch

    @property
    def keeper(self) -> LeaseKeeper:
        return self._keeper

    def statistics(self) -> MembershipStats:
        return MembershipStats(
            self.worker_id,
            self.lease_id,
            self.healthy,
            self._epoch,
            len(self._granted),
            self.releases,
            self.acks,
            self.registrations,
        )

    def subscribe(self, callback: Callable[[OwnershipChange], None]) -> Callable[[], None]:
        """Call ``callback`` synchronously on each change of the granted set; returns an unsubscriber."""
        self._listeners.append(callback)
        return lambda: self._listeners.remove(callback)

    # ---- lifecycle ----

    async def start(self) -> None:
        """Register, load the assignment, and keep both current in the background.

        Returns once the assignment has been read once, so ``owned()`` reflects etcd.
        """
        await self._register()
        self._tasks = [
            asyncio.create_task(self._mirror.run(), name=f"assignment-{self.worker_id}"),
            asyncio.create_task(self._release_loop(), name=f"releases-{self.worker_id}"),
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
        await self._releases.join()
        await cancel_and_wait(*self._tasks)
        self._tasks = []
        # Revoking the lease deletes membership, load and ack at once; the leader frees our nodes then.
        await self._keeper.revoke()
        log.info("worker %s drained", self.worker_id)

    async def close(self) -> None:
        """Stop without releasing anything: the lease expires by itself (used for crash tests, and when the
        process is going away anyway and cannot run release hooks)."""
        await cancel_and_wait(*self._tasks)
        self._tasks = []
        await self._keeper.close()
        removed, self._granted = self._granted, frozenset()
        if removed:  # subscribers learn we own nothing; the release hook is not run (nothing to wait for)
            change = OwnershipChange(frozenset(), removed, self._epoch)
            for callback in list(self._listeners):
                callback(change)

    async def report_load(self, report: LoadReport) -> bool:
        """Publish the load report under our lease; False if etcd could not take it (it is kept and
        republished after the next registration)."""
        self._load = report
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
        return True

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
            delay = RETRY_DELAY
            while True:
                try:
                    await self._register()
                    break
                except ETCD_FAILURES as e:
                    log.warning(
                        "worker %s: re-registration failed (%s); retrying in %.1f s",
                        self.worker_id,
                        describe(e),
                        delay,
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, MAX_RETRY_DELAY)
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
        removed = self._granted - granted
        added = granted - self._granted
        self._granted = granted  # one reference swap: owns() never sees a half-applied assignment
        if assignment is not None:
            self._epoch = assignment.epoch
        if added or removed:
            log.info(
                "worker %s: epoch %d +%d -%d nodes", self.worker_id, self._epoch, len(added), len(removed)
            )
            change = OwnershipChange(added, removed, self._epoch)
            for callback in list(self._listeners):
                callback(change)
        # The leader waits for an ack when it revokes; when draining, an ack lets it see the release even
        # if revoking the lease fails. Without an assignment for our lease there is nothing to acknowledge.
        ack_lease = 0
        if assignment is not None and (assignment.revoking or (self._draining and removed)):
            ack_lease = lease
        if removed or ack_lease:
            self._releases.put_nowait((ack_lease, self._epoch, removed))

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
                        # The nodes are already unowned, so no new pod lands there; an unconfirmed in-flight
                        # bind cannot be waited for forever, or the node would never move. Ack anyway.
                        log.exception(
                            "worker %s: release hook failed for %d nodes", self.worker_id, len(nodes)
                        )
                if lease:
                    await self._ack(lease, epoch, nodes)
            finally:
                self._releases.task_done()

    async def _ack(self, lease: int, epoch: int, nodes: frozenset[NodeName]) -> None:
        ack = ReleaseAck(self.worker_id, lease, epoch, nodes)
        delay = RETRY_DELAY
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
                await wait_first(asyncio.sleep(delay), self._keeper.wait_lost())
                delay = min(delay * 2, MAX_RETRY_DELAY)
                continue
            self.acks += 1
            log.debug(
                "worker %s: acknowledged epoch %d (%d nodes released)", self.worker_id, epoch, len(nodes)
            )
            return
