"""Coordinator leader election on etcd: one leader at a time, standbys waiting, fast step-down.

Protocol (etcd's own election recipe, with our own lease keeping):
1. Grant a lease and put ``{prefix}/election/{lease}`` = LeaderRecord under it.
2. List the election prefix by create revision. The lowest create revision leads.
3. Otherwise watch the key just before ours until it is deleted (its lease ended), then go to 2. Each
   candidate watches a different key, so a leader's death wakes one standby, not the herd.

A term is identified by our key and its create revision. The shard map guards every write with
"that key still has that create revision", so a deposed leader's late writes fail in etcd itself.

Invariants:
- ``leading`` is True only while we hold the lowest key *and* our lease is healthy (``common.etcd.leases``):
  a leader that has not heard from etcd for TTL/2 stops acting before its lease can expire and a standby
  can take over.
- On losing leadership for any reason the term's ``lost`` event is set first, then callbacks run, then the
  lease is revoked (best effort) so a standby takes over without waiting for expiry; the next campaign
  uses a new lease, hence a new key and a new term.
- A leader that cannot lead gives its term up: ``step_down`` ends the term exactly like a lost lease (revoke,
  so a standby takes over at once) but keeps campaigning. ``run_as_leader`` steps down when the term's work
  fails or returns, or when one of the term's progress signals (``coordinator.leadership.progress``) stalls.
  Repeated step-downs wait longer before the next campaign (``STEP_DOWN_BACKOFF``), so a candidate that
  keeps failing stands behind the others instead of winning every election straight back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from etcd3aio import Etcd3Client
from etcd3aio.kv import KVService

from common.aiotools import cancel_and_wait, wait_first
from common.backoff import Backoff, etcd_retry
from common.etcd.keys import KeyLayout
from common.etcd.kv import DEFAULT_TIMEOUT, ETCD_FAILURES, describe, get_prefix, kv_service, wait_deleted
from common.etcd.leases import Clock, LeaseKeeper, LeaseState
from common.etcd.schema import LeaderRecord, RecordError
from coordinator.leadership.progress import Progress

log = logging.getLogger(__name__)

DEFAULT_TTL = 10
# After stepping down: wait before campaigning again, doubling while terms keep failing. A term that ran
# for STABLE_TERM seconds resets it.
STEP_DOWN_BACKOFF = (1.0, 30.0)
STABLE_TERM = 120.0
PROGRESS_CHECK_INTERVAL = 1.0


@dataclass(eq=False)
class LeaderTerm:
    """One continuous period of leadership."""

    record: LeaderRecord
    key: str
    create_revision: int
    lease_id: int
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    healthy: Callable[[], bool] = lambda: True  # the campaign's lease health (fencing)
    progress: Progress = field(default_factory=Progress)  # the term's work registers its signals here

    @property
    def active(self) -> bool:
        """Still leading: not ended, and the lease refreshed within TTL/2. Check before acting."""
        return not self.lost.is_set() and self.healthy()

    def guard(self) -> object:
        """A txn comparison that holds only while this term's key exists (guard every leader write)."""
        return KVService.txn_compare_create_revision(self.key, self.create_revision)


class LeaderElection:
    """Campaigns for leadership in ``run()``; others read ``leading`` / ``term`` or await ``wait_term``."""

    def __init__(
        self,
        client: Etcd3Client,
        record: LeaderRecord,
        *,
        keys: KeyLayout | None = None,
        ttl: int = DEFAULT_TTL,
        clock: Clock = time.monotonic,
    ) -> None:
        self._client = client
        self.record = record
        self._keys = keys or KeyLayout()
        self._keeper = LeaseKeeper(client, ttl=ttl, name=f"candidate {record.candidate_id}", clock=clock)
        self._term: LeaderTerm | None = None
        self._term_started = asyncio.Event()
        self._resign = asyncio.Event()
        self._step_down = asyncio.Event()
        self._step_down_backoff = Backoff(*STEP_DOWN_BACKOFF)
        self._standing_by = False
        self._listeners: list[Callable[[LeaderTerm], None]] = []
        self.terms = 0
        self.step_downs = 0
        self._term_began: float | None = None
        self._clock = clock

    @property
    def leading(self) -> bool:
        return self._term is not None and not self._term.lost.is_set() and self._keeper.healthy

    @property
    def term(self) -> LeaderTerm | None:
        """The current term while leading, else None."""
        return self._term if self.leading else None

    @property
    def standing_by(self) -> bool:
        """A healthy standby: our candidate key is in etcd behind the leader's and our lease is fresh."""
        return self._standing_by and self._keeper.healthy

    @property
    def keeper(self) -> LeaseKeeper:
        return self._keeper

    def on_lost(self, callback: Callable[[LeaderTerm], None]) -> Callable[[], None]:
        """Call ``callback(term)`` synchronously when a term ends; returns an unsubscriber."""
        self._listeners.append(callback)
        return lambda: self._listeners.remove(callback)

    async def wait_term(self) -> LeaderTerm:
        """Wait until we lead; returns the new term."""
        while True:
            await self._term_started.wait()
            term = self.term
            if term is not None:
                return term
            self._term_started.clear()

    def step_down(self, reason: str) -> None:
        """Give up the current term (revoking its lease, so a standby takes over now) and campaign again
        after ``STEP_DOWN_BACKOFF``. No-op while not leading."""
        if self.leading and not self._step_down.is_set():
            log.warning("%s: stepping down: %s", self.record.candidate_id, reason)
            self.step_downs += 1
            self._step_down.set()

    def resign(self) -> None:
        """End the current term (if any) and stop campaigning; ``run()`` returns after cleaning up."""
        self._resign.set()

    async def run(self) -> None:
        """Campaign until ``resign()`` or cancellation, re-campaigning after every lost term."""
        backoff = etcd_retry()
        while not self._resign.is_set():
            delay = backoff.initial
            self._step_down.clear()
            try:
                await self._campaign()
                backoff.reset()
            except ETCD_FAILURES as e:
                # Warn once per outage; the retries after that are routine.
                level = logging.WARNING if backoff.fresh else logging.DEBUG
                log.log(level, "%s: election round failed: %s", self.record.candidate_id, describe(e))
                delay = backoff.next()
            finally:
                self._standing_by = False
                started = self._term_began
                await self._end_term()
            if self._step_down.is_set():
                if started is not None and self._clock() - started >= STABLE_TERM:
                    self._step_down_backoff.reset()
                delay = max(delay, self._step_down_backoff.next())
            if not self._resign.is_set():
                await wait_first(asyncio.sleep(delay), self._resign.wait())

    async def _campaign(self) -> None:
        kv = kv_service(self._client)
        lease = await self._keeper.grant()
        key = self._keys.election(lease)
        put = await kv.put(key, self.record.encode(), lease=lease, timeout=DEFAULT_TIMEOUT)
        create_revision = int(put.header.revision)
        while True:
            candidates, revision = await get_prefix(self._client, self._keys.election_prefix)
            keys = [c.key for c in candidates]
            if key not in keys:
                log.warning("%s: candidate key vanished (lease %x gone)", self.record.candidate_id, lease)
                return
            index = keys.index(key)
            if index == 0:
                break
            log.info("%s: standing by behind %s", self.record.candidate_id, keys[index - 1])
            self._standing_by = True
            winner = await wait_first(
                wait_deleted(self._client, keys[index - 1], start_revision=revision + 1),
                self._keeper.wait_lost(),
                self._resign.wait(),
            )
            self._standing_by = False
            if winner != 0:
                return
        if not self._keeper.healthy:
            return  # we would be fenced at once; start over with a fresh lease
        keeper = self._keeper
        self._term = LeaderTerm(self.record, key, create_revision, lease, healthy=lambda: keeper.healthy)
        self.terms += 1
        self._term_began = self._clock()
        self._term_started.set()
        log.info("%s: leading (term key %s, revision %d)", self.record.candidate_id, key, create_revision)
        await wait_first(
            self._keeper.wait_unhealthy(),
            wait_deleted(self._client, key, start_revision=create_revision + 1),
            self._resign.wait(),
            self._step_down.wait(),
        )

    async def _end_term(self) -> None:
        term, self._term = self._term, None
        self._term_began = None
        self._term_started.clear()
        if term is not None:
            term.lost.set()  # first: whoever acts for the leader stops before anything else happens
            log.warning("%s: leadership lost (term %d)", self.record.candidate_id, term.create_revision)
            for callback in list(self._listeners):
                callback(term)
        if self._keeper.state is LeaseState.ALIVE:
            await self._keeper.revoke()


async def current_leader(client: Etcd3Client, keys: KeyLayout | None = None) -> LeaderRecord | None:
    """Who leads now, as seen in etcd (None when nobody does or the record is unreadable)."""
    candidates, _ = await get_prefix(client, (keys or KeyLayout()).election_prefix)
    if not candidates:
        return None
    try:
        return LeaderRecord.decode(candidates[0].value)
    except RecordError as e:
        log.error("unreadable leader record at %s: %s", candidates[0].key, e)
        return None


async def run_as_leader(
    election: LeaderElection,
    body: Callable[[LeaderTerm], Coroutine[Any, Any, None]],
    *,
    check_interval: float = PROGRESS_CHECK_INTERVAL,
) -> None:
    """Campaign forever; while leading run ``body(term)``, cancelling it the moment the term is lost.

    The leader steps down (``election.step_down``) when ``body`` raises or returns (a term whose work has
    ended leads nothing), or when a signal registered in ``term.progress`` stalls. Cancel this coroutine to
    stop; it resigns and waits for the campaign to clean up.
    """
    campaign = asyncio.create_task(election.run(), name=f"campaign-{election.record.candidate_id}")
    try:
        while not campaign.done():
            winner = await wait_first(election.wait_term(), asyncio.shield(campaign))
            if winner != 0:
                break
            term = election.term
            if term is None:
                continue
            work = asyncio.create_task(body(term), name=f"leader-{election.record.candidate_id}")
            try:
                ended = await wait_first(term.lost.wait(), work, _stalled(term, check_interval))
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise  # we are being stopped
                election.step_down("the term's work was cancelled")
            except Exception as e:  # the term's work failed: whatever it was, this term cannot lead
                log.error("leader work failed: %s", e, exc_info=e)
                election.step_down(f"the term's work failed ({type(e).__name__}: {e})")
            else:
                if ended == 1:
                    election.step_down("the term's work ended")
                elif ended == 2:
                    election.step_down(f"no progress: {term.progress.last_stall}")
            finally:
                await cancel_and_wait(work)
            await term.lost.wait()
    finally:
        election.resign()
        await cancel_and_wait(campaign)


async def _stalled(term: LeaderTerm, interval: float) -> None:
    """Return once one of the term's progress signals has stalled (never, while none has)."""
    while True:
        await asyncio.sleep(interval)
        if term.progress.stalled() is not None:
            return
