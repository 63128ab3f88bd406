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
from common.backoff import etcd_retry
from common.etcd.keys import KeyLayout
from common.etcd.kv import DEFAULT_TIMEOUT, ETCD_FAILURES, describe, get_prefix, kv_service, wait_deleted
from common.etcd.leases import Clock, LeaseKeeper, LeaseState
from common.etcd.schema import LeaderRecord, RecordError

log = logging.getLogger(__name__)

DEFAULT_TTL = 10


@dataclass(eq=False)
class LeaderTerm:
    """One continuous period of leadership."""

    record: LeaderRecord
    key: str
    create_revision: int
    lease_id: int
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    healthy: Callable[[], bool] = lambda: True  # the campaign's lease health (fencing)

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
        self._listeners: list[Callable[[LeaderTerm], None]] = []
        self.terms = 0

    @property
    def leading(self) -> bool:
        return self._term is not None and not self._term.lost.is_set() and self._keeper.healthy

    @property
    def term(self) -> LeaderTerm | None:
        """The current term while leading, else None."""
        return self._term if self.leading else None

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

    def resign(self) -> None:
        """End the current term (if any) and stop campaigning; ``run()`` returns after cleaning up."""
        self._resign.set()

    async def run(self) -> None:
        """Campaign until ``resign()`` or cancellation, re-campaigning after every lost term."""
        backoff = etcd_retry()
        while not self._resign.is_set():
            delay = backoff.initial
            try:
                await self._campaign()
                backoff.reset()
            except ETCD_FAILURES as e:
                # Warn once per outage; the retries after that are routine.
                level = logging.WARNING if backoff.fresh else logging.DEBUG
                log.log(level, "%s: election round failed: %s", self.record.candidate_id, describe(e))
                delay = backoff.next()
            finally:
                await self._end_term()
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
            winner = await wait_first(
                wait_deleted(self._client, keys[index - 1], start_revision=revision + 1),
                self._keeper.wait_lost(),
                self._resign.wait(),
            )
            if winner != 0:
                return
        if not self._keeper.healthy:
            return  # we would be fenced at once; start over with a fresh lease
        keeper = self._keeper
        self._term = LeaderTerm(self.record, key, create_revision, lease, healthy=lambda: keeper.healthy)
        self.terms += 1
        self._term_started.set()
        log.info("%s: leading (term key %s, revision %d)", self.record.candidate_id, key, create_revision)
        await wait_first(
            self._keeper.wait_unhealthy(),
            wait_deleted(self._client, key, start_revision=create_revision + 1),
            self._resign.wait(),
        )

    async def _end_term(self) -> None:
        term, self._term = self._term, None
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
    election: LeaderElection, body: Callable[[LeaderTerm], Coroutine[Any, Any, None]]
) -> None:
    """Campaign forever; while leading run ``body(term)``, cancelling it the moment the term is lost.

    ``body`` returning early ends nothing: we stay leader (idle) until the term ends. Cancel this
    coroutine to stop; it resigns and waits for the campaign to clean up.
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
            work.add_done_callback(_log_failure)
            try:
                await term.lost.wait()
            finally:
                await cancel_and_wait(work)
    finally:
        election.resign()
        await cancel_and_wait(campaign)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("leader work failed; staying leader, idle, until the term ends", exc_info=task.exception())
