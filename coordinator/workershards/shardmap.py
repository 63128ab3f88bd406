"""The leader's shard map driver: reads membership, loads and acks from etcd, decides with the policy,
and writes assignments through guarded transactions.

One round: mirror snapshot -> ask etcd about suspicious leases -> ``handoff.settle`` -> policy plan ->
``handoff.apply_targets`` -> one transaction with the changed assignments and the bumped epoch. A round runs on
every change of the mirror or the pool and at least every ``interval``; it is skipped when nothing it reads
changed since a round that found nothing to write, asked etcd about no lease and left its own carried state
as it found it (``_inputs``, ``_carried``), so a leader at rest does not walk the whole pool every second. The
load reports count only through the effective weights, and new weights only when they could move a node
(``AssignmentPolicy.stands``): a load report, every few seconds from every busy worker, mostly could not.

Invariants:
- Every write is a transaction guarded by (a) this term's election key still having its create revision
  (a deposed leader's writes fail in etcd) and (b) the shardmap meta key still having the mod revision we
  read (every leader write bumps it, so a round planned on a stale copy fails instead of overwriting).
- The epoch increases by one with every write; changed assignments carry the new epoch. It never goes
  backwards, even if the meta key is lost (the next epoch is above every epoch found in etcd): an old
  ack must never satisfy a newer revocation.
- A node is granted only after its previous holder acknowledged the release or etcd confirmed the
  holder's lease gone at least ``grant_delay`` (the maximum binding time) ago (see
  ``coordinator.workershards.handoff``); a dead worker's nodes therefore move only after its lease has
  expired and any binding it sent before fencing itself has landed. The confirmation time is taken on this
  leader's monotonic clock when etcd answers; a new leader learns it afresh (and so waits again).
- The node pool comes from one seam, ``PoolSource``. An empty pool revokes every node: a pool source
  that cannot tell must keep returning its last good answer, not an empty one.

Limits:
- A malformed assignment (only corruption or a newer schema could produce one) is treated as holding
  nothing, on both sides; its worker owns nothing while it is unreadable.
- etcd caps a transaction at 128 operations by default; a round touching more workers writes the
  releases first and leaves the rest to the next round, so a grant never precedes the release it needs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

from etcd3aio import Etcd3Client
from etcd3aio.kv import KVService

from common.aiotools import cancel_and_wait, wait_first
from common.backoff import etcd_retry
from common.etcd.keys import KeyFamily, KeyLayout, WorkerId
from common.etcd.kv import (
    DEFAULT_TIMEOUT,
    ETCD_FAILURES,
    KeyValue,
    compare_mod_revision,
    describe,
    kv_service,
    lease_remaining,
)
from common.etcd.leases import MAX_BIND_TIME
from common.etcd.mirror import KeyMirror
from common.etcd.schema import (
    LoadReport,
    RecordError,
    ReleaseAck,
    ShardAssignment,
    ShardMapMeta,
    WorkerRecord,
)
from common.records import NodeName
from coordinator.leadership.election import LeaderTerm
from coordinator.metrics import HandoffTimer
from coordinator.workershards import handoff
from coordinator.workershards.assignment import AssignmentPolicy, WorkerInfo, effective_weights
from coordinator.workershards.pools import PoolSource

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 1.0  # a round at least this often, to notice pool changes and expired leases
DEBOUNCE = 0.02  # let a burst of etcd events land before planning
MAX_TXN_OPS = 128


_R = TypeVar("_R", WorkerRecord, LoadReport, ReleaseAck, ShardAssignment, ShardMapMeta)


class _Decoded:
    """The records decoded from the mirror, by key, kept while the key holds the same bytes: a round, the
    ack scan on every etcd change and the read-only views decode only what changed since (a record is a
    pure function of its bytes, and frozen). A value that does not decode is not kept: it fails again, and
    is logged again, every time it is read."""

    def __init__(self) -> None:
        self._by_key: dict[str, tuple[bytes, object]] = {}

    def get(self, kv: KeyValue, kind: type[_R]) -> _R:
        """``kind.decode(kv.value)``; raises ``RecordError`` as it does."""
        cached = self._by_key.get(kv.key)
        if cached is not None and cached[0] == kv.value and type(cached[1]) is kind:
            return cached[1]
        record = kind.decode(kv.value)
        self._by_key[kv.key] = (kv.value, record)
        return record

    def keep_only(self, keys: Mapping[str, object]) -> None:
        """Forget the keys no longer in the mirror."""
        if len(self._by_key) > len(keys):
            self._by_key = {k: v for k, v in self._by_key.items() if k in keys}


@dataclass(slots=True)
class _Snapshot:
    members: dict[WorkerId, tuple[WorkerRecord, int]]
    loads: dict[WorkerId, LoadReport]
    acks: dict[WorkerId, ReleaseAck]
    assignments: dict[WorkerId, ShardAssignment]
    meta: ShardMapMeta | None
    meta_kv: KeyValue | None
    # Every key the layout parses but the load reports, with its version: two snapshots with equal versions
    # read the same records (a key's mod revision names one value of it; a deleted key is absent).
    versions: frozenset[tuple[str, int]] = frozenset()
    malformed: list[str] = field(default_factory=list)  # logged by a round that is not skipped


class ShardMapLeader:
    """Drives the shard map for one leadership term; ``run()`` returns when the term ends."""

    def __init__(
        self,
        client: Etcd3Client,
        term: LeaderTerm,
        pool: PoolSource,
        *,
        keys: KeyLayout | None = None,
        policy: AssignmentPolicy | None = None,
        interval: float = DEFAULT_INTERVAL,
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        grant_delay: float = MAX_BIND_TIME,
        handoffs: HandoffTimer | None = None,
    ) -> None:
        self._client = client
        self._handoffs = handoffs or HandoffTimer()
        self._term = term
        self._pool = pool
        self._keys = keys or KeyLayout()
        self._policy = policy or AssignmentPolicy()
        self._interval = interval
        self._wall_clock = wall_clock
        self._clock = clock
        self._grant_delay = grant_delay
        self._mirror = KeyMirror(
            client, self._keys.root, prefix=True, on_change=self._mirror_changed, name="shardmap"
        )
        self._poked = asyncio.Event()
        self._decoded = _Decoded()
        self._dead_leases: dict[int, float] = {}  # lease -> when etcd confirmed it gone (``clock``)
        # The latest ack seen per worker, kept after its key vanished with its lease (a graceful leave
        # acknowledges, then revokes): handoff rule 3c needs it once the lease is gone.
        self._acks_seen: dict[WorkerId, ReleaseAck] = {}
        self._destinations: dict[NodeName, WorkerId] = {}  # revoking node -> where the plan sends it
        self._planned: frozenset[NodeName] = frozenset()  # the pool the latest round planned with
        self._epoch = 0
        self._in_transit = 0
        # What the latest round read, when that round found nothing to write, asked etcd about no lease and
        # changed nothing it carries: a round that would read the same again is skipped (``_inputs``).
        self._quiet: tuple[object, ...] | None = None
        self._quiet_weights: dict[WorkerId, float] = {}  # ... and the effective weights it planned with
        self.rounds = 0  # loop passes, skipped ones too: the term's progress check counts them
        self.skipped = 0
        self.writes = 0
        self.conflicts = 0

    @property
    def epoch(self) -> int:
        return self._epoch

    def poke(self) -> None:
        """Ask for a round soon (pool changed, or etcd changed: the mirror calls this)."""
        self._poked.set()

    def _mirror_changed(self) -> None:
        for key, kv in self._mirror.items.items():
            parsed = self._keys.parse(key)
            if parsed is None or parsed[0] is not KeyFamily.ACK:
                continue
            try:
                ack = self._decoded.get(kv, ReleaseAck)
            except RecordError:
                continue  # logged by the round that reads it
            self._acks_seen[ack.worker_id] = ack
        self.poke()

    def nodes_in_use(self) -> frozenset[NodeName] | None:
        """Nodes a worker may be using or may be granted before the next round (read-only; for NodeShard
        ``status.nodesInUse``): every node held - granted or revoking - in the mirrored map, plus the pool the
        latest round planned with. ``None`` until the mirror has listed.

        A node removed from the pool stays in this set until a round that no longer saw it has read the pool,
        which happens only after the previous round's write (a grant of that node, say) is in the mirror.
        """
        if not self._mirror.synced.is_set():
            return None
        nodes = set(self._planned)
        for key, kv in list(self._mirror.items.items()):
            parsed = self._keys.parse(key)
            if parsed is None or parsed[0] is not KeyFamily.ASSIGNMENT:
                continue
            try:
                nodes |= self._decoded.get(kv, ShardAssignment).held
            except RecordError:
                continue  # logged by the round that reads it
        return frozenset(nodes)

    def granted_counts(self) -> dict[WorkerId, int]:
        """Worker -> nodes granted to it in the mirrored map (read-only; for the coordinator's metrics, and
        the dispatcher's "is the map moving" before a verdict)."""
        counts: dict[WorkerId, int] = {}
        for key, kv in list(self._mirror.items.items()):
            parsed = self._keys.parse(key)
            if parsed is None or parsed[0] is not KeyFamily.ASSIGNMENT:
                continue
            try:
                counts[WorkerId(parsed[1])] = len(self._decoded.get(kv, ShardAssignment).granted)
            except RecordError:
                continue  # logged by the round that reads it
        return counts

    @property
    def in_transit(self) -> int:
        """Nodes being released after the latest round (revoking, not yet free)."""
        return self._in_transit

    async def run(self) -> None:
        mirror = asyncio.create_task(self._mirror.run(), name="shardmap-mirror")
        try:
            await wait_first(self._mirror.synced.wait(), self._term.lost.wait())
            backoff = etcd_retry()
            while not self._term.lost.is_set():
                try:
                    if not await self._round():
                        return  # deposed
                    backoff.reset()
                except ETCD_FAILURES as e:
                    log.warning("shard map round failed: %s", describe(e))
                    await wait_first(asyncio.sleep(backoff.next()), self._term.lost.wait())
                    continue
                await wait_first(self._poked.wait(), asyncio.sleep(self._interval), self._term.lost.wait())
                await asyncio.sleep(DEBOUNCE)
                self._poked.clear()
        finally:
            await cancel_and_wait(mirror)

    # ---- one round ----

    def _inputs(self, snap: _Snapshot, pool: Mapping[NodeName, float], now: float) -> tuple[object, ...]:
        """What a round reads from outside, as ``snap`` (the mirror's copy) and ``pool`` show it, apart from
        the load reports (``_weights``):
        - every mirrored key but the load reports, by its version (``_Snapshot.versions``: a key's change,
          creation or deletion changes them, a relist's included), and the mirror's relist count (so a relist,
          once a minute, also replans: a cheap check that the versions missed nothing);
        - the pool by its contents (the caller keeps a copy: a ``PoolSource`` may change its mapping in
          place);
        - the policy's configuration;
        - which dead leases are past the grant delay at ``now`` (the only way the clock enters a round:
          their ``call_later`` poke wakes the loop when one passes it).
        What a round carries to the next, the dead leases themselves included, is ``_carried``: a round
        changes it, and so does an ack key's change (``_mirror_changed`` keeps acks), which is an input too;
        a reused round left it unchanged."""
        return (
            snap.versions,
            self._mirror.relists,
            pool,
            self._policy.config,
            frozenset(lease for lease, t in self._dead_leases.items() if now - t >= self._grant_delay),
        )

    def _weights(self, snap: _Snapshot) -> dict[WorkerId, float]:
        """What a round takes from the load reports: the live workers' effective weights
        (``assignment.effective_weights``; ``AssignmentPolicy.plan`` reads ``WorkerInfo`` only through them).
        A worker reports its load every few seconds while it works; a lone worker's weight is its capacity
        weight whatever its load, and other reports mostly move the shares too little to start rebalancing
        (``AssignmentPolicy.stands``)."""
        _, workers = self._live(snap)
        return effective_weights(workers, self._policy.config)

    def _live(self, snap: _Snapshot) -> tuple[dict[WorkerId, int], dict[WorkerId, WorkerInfo]]:
        """The members whose lease is not known dead (worker -> lease), and what the policy knows of each."""
        members = {w: lease for w, (_, lease) in snap.members.items() if lease not in self._dead_leases}
        workers = {
            w: WorkerInfo(rec.capacity.weight, snap.loads.get(w))
            for w, (rec, _) in snap.members.items()
            if w in members
        }
        return members, workers

    def _carried(self) -> tuple[object, ...]:
        """The state a round leaves for the next one: where revoking nodes go, the policy's rebalancing
        episode, the acknowledgements kept after their keys vanished, the dead leases. A round whose result
        is to be reused must leave these as it found them: then the next round on the same inputs starts
        where it did and, the plan being deterministic (``AssignmentPolicy``: no clock, no randomness), ends
        where it did."""
        return (
            dict(self._destinations),
            self._policy.rebalancing,
            dict(self._acks_seen),
            dict(self._dead_leases),
        )

    async def _round(self) -> bool:
        """Plan and write once. False when we turned out to be deposed."""
        self.rounds += 1
        snap = self._snapshot()
        if self._quiet is not None and self._quiet == self._inputs(snap, self._pool(), self._clock()):
            # Nothing a round reads changed since one found nothing to do and changed none of its own state,
            # but perhaps the load reports: at rest this is every round (one per ``interval``), in a burst
            # every load report, and each would otherwise walk the whole pool to conclude the same again.
            weights = self._weights(snap)
            if weights == self._quiet_weights or self._policy.stands(weights):
                # The same weights, or weights under which the quiet round's plan keeps every node where it
                # is: the round would find nothing to do again and leave what it carries as it is.
                self.skipped += 1
                return True
        for line in snap.malformed:
            # Logged by the rounds that run, not by every skipped one. Under assign/ only our own writes land,
            # so there this is corruption or a newer schema: the worker fails closed on it (owns nothing) and
            # our next write for that worker replaces it.
            log.error("%s", line)
        carried = self._carried()
        self._quiet = None
        # Epochs must never go backwards, or an old ack could satisfy a new revocation: take the highest
        # epoch anywhere, in case the meta key was lost or is unreadable.
        self._epoch = max(
            [snap.meta.epoch if snap.meta else 0]
            + [a.epoch for a in snap.assignments.values()]
            + [a.epoch for a in snap.acks.values()]
        )
        members, workers = self._live(snap)
        acks = {**self._acks_seen, **snap.acks}
        observed = handoff.Observed(snap.assignments, members, acks, self._dead_leases)
        suspects = handoff.suspect_leases(observed)
        for lease in sorted(suspects):
            if await lease_remaining(self._client, lease) < 0:
                log.info(
                    "lease %x confirmed gone; its holder's nodes are free in %.1f s", lease, self._grant_delay
                )
                self._dead_leases[lease] = self._clock()
                asyncio.get_running_loop().call_later(self._grant_delay, self.poke)
        now = self._clock()  # one reading: the grant delay settle applies is the one ``_inputs`` records
        observed = replace(observed, now=now, grant_delay=self._grant_delay)
        settled = handoff.settle(observed)

        current = {
            n: w
            for w, a in settled.items()
            if a is not None and members.get(w) == a.lease_id
            for n in a.granted
        }
        revoking = {n for a in settled.values() if a is not None for n in a.revoking}
        pending = {n: w for n, w in self._destinations.items() if n in revoking and w in members}
        pool = self._pool()
        self._planned = frozenset(pool)
        plan = self._policy.plan(pool, workers, current, pending=pending, in_transit=len(revoking))
        wanted = handoff.apply_targets(settled, members, plan.target, set(pool))

        now_revoking = {n for a in wanted.values() if a is not None for n in a.revoking}
        self._destinations = {
            n: (pending.get(n) or plan.target[n]) for n in now_revoking if n in pending or n in plan.target
        }
        self._in_transit = len(now_revoking)
        mentioned = {a.lease_id for a in snap.assignments.values()}
        self._dead_leases = {lease: t for lease, t in self._dead_leases.items() if lease in mentioned}
        self._acks_seen = {w: ack for w, ack in self._acks_seen.items() if ack.lease_id in mentioned}

        diff = handoff.changes(snap.assignments, wanted)
        if not diff:
            # Not when a lease etcd said is alive must be asked about again, nor when this round changed what
            # it carries (a new leader's first round learns where revoking nodes go; the next one may plan
            # differently on the same inputs).
            if not suspects and self._carried() == carried:
                self._quiet = self._inputs(snap, dict(pool), now)
                self._quiet_weights = self._weights(snap)
            return True
        return await self._write(diff, snap)

    def _snapshot(self) -> _Snapshot:
        snap = _Snapshot({}, {}, {}, {}, None, None)
        items = self._mirror.items
        self._decoded.keep_only(items)
        versions = []
        for key, kv in list(items.items()):
            parsed = self._keys.parse(key)
            if parsed is None:
                continue
            family, name = parsed
            if family is not KeyFamily.LOAD:
                versions.append((key, kv.mod_revision))
            if family is KeyFamily.SHARDMAP:
                snap.meta_kv = kv  # kept even if unreadable: our next write must compare against it
            try:
                if family is KeyFamily.MEMBER:
                    record = self._decoded.get(kv, WorkerRecord)
                    snap.members[_owner(name, record.worker_id)] = (record, kv.lease)
                elif family is KeyFamily.LOAD:
                    snap.loads[WorkerId(name)] = self._decoded.get(kv, LoadReport)
                elif family is KeyFamily.ACK:
                    ack = self._decoded.get(kv, ReleaseAck)
                    snap.acks[_owner(name, ack.worker_id)] = ack
                elif family is KeyFamily.ASSIGNMENT:
                    assignment = self._decoded.get(kv, ShardAssignment)
                    snap.assignments[_owner(name, assignment.worker_id)] = assignment
                elif family is KeyFamily.SHARDMAP:
                    snap.meta = self._decoded.get(kv, ShardMapMeta)
            except RecordError as e:
                snap.malformed.append(f"ignoring malformed {family.value} at {key}: {e}")
        snap.versions = frozenset(versions)
        return snap

    async def _write(self, diff: Mapping[WorkerId, ShardAssignment | None], snap: _Snapshot) -> bool:
        if not self._term.active:
            return True  # fenced or ending: write nothing; the election ends the term or it recovers
        epoch = self._epoch + 1
        # Releases first (no new grants), so a truncated round never grants what it has not freed.
        order = sorted(diff, key=lambda w: (_grants_more(snap.assignments.get(w), diff[w]), w))
        if len(order) > MAX_TXN_OPS - 1:
            log.warning(
                "round touches %d workers; writing %d now, the rest next round", len(order), MAX_TXN_OPS - 1
            )
            order = order[: MAX_TXN_OPS - 1]
            self.poke()
        ops = []
        for worker in order:
            new = diff[worker]
            key = self._keys.assignment(worker)
            if new is None:
                ops.append(KVService.txn_op_delete(key))
            else:
                ops.append(KVService.txn_op_put(key, replace(new, epoch=epoch).encode()))
        meta = ShardMapMeta(epoch, self._term.record.candidate_id, self._wall_clock())
        ops.append(KVService.txn_op_put(self._keys.shardmap, meta.encode()))
        if snap.meta_kv is None:
            fresh = KVService.txn_compare_create_revision(self._keys.shardmap, 0)
        else:
            fresh = compare_mod_revision(self._keys.shardmap, snap.meta_kv.mod_revision)
        resp = await kv_service(self._client).txn(
            [self._term.guard(), fresh], ops, [KVService.txn_op_get(self._term.key)], timeout=DEFAULT_TIMEOUT
        )
        if resp.succeeded:
            self.writes += 1
            self._epoch = epoch
            self._handoffs.written(snap.assignments, {w: diff[w] for w in order})
            log.info("shard map epoch %d: %d assignments written", epoch, len(order))
            # Plan the next round on a copy that includes this write, or its compare would fail.
            await wait_first(
                self._mirror.wait_revision(int(resp.header.revision)), asyncio.sleep(DEFAULT_TIMEOUT)
            )
            return True
        ours = resp.responses[0].response_range.kvs
        if not ours or int(ours[0].create_revision) != self._term.create_revision:
            log.warning("shard map write refused: no longer leader")
            return False
        self.conflicts += 1
        log.info("shard map changed under us (epoch %d); replanning", self._epoch)
        self.poke()
        return True


def _owner(name: str, recorded: WorkerId) -> WorkerId:
    """The worker a record belongs to: the key's, which must agree with the record's own field."""
    if name != recorded:
        raise RecordError(f"record for worker {recorded!r} stored under the key of {name!r}")
    return recorded


def _grants_more(old: ShardAssignment | None, new: ShardAssignment | None) -> bool:
    if new is None:
        return False
    return bool(new.granted - (old.granted if old is not None else frozenset()))
