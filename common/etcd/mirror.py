"""A local, eventually exact copy of one etcd key or key prefix, kept current by list + watch.

The worker mirrors its own assignment key; the leader mirrors the whole installation prefix. Both read
``items`` synchronously, so the hot path never waits on etcd.

Invariants:
- ``items`` only ever reflects a state etcd actually had, and ``revision`` is the revision of that state.
  Events are applied in order; the callback runs after each applied batch, never in the middle of one.
- History loss (compaction, cancelled watch), a broken stream or an etcd error leads to a fresh list,
  which replaces ``items`` wholesale: keys deleted meanwhile do not linger.
- A periodic relist (``resync_interval``) bounds the damage of an event the client library lost.
- ``synced`` is set after the first complete list and stays set: a stale copy is still the best answer
  we have while etcd is away, and the lease keeper, not the mirror, decides whether it may be used.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

from etcd3aio import Etcd3Client

from common.backoff import etcd_retry
from common.etcd.kv import ETCD_FAILURES, EVENT_DELETE, KeyValue, describe, get_key, get_prefix, watch

log = logging.getLogger(__name__)

DEFAULT_RESYNC_INTERVAL = 60.0


class KeyMirror:
    """Mirror of ``key`` (one key, or every key under it with ``prefix=True``)."""

    def __init__(
        self,
        client: Etcd3Client,
        key: str,
        *,
        prefix: bool,
        on_change: Callable[[], None] | None = None,
        resync_interval: float = DEFAULT_RESYNC_INTERVAL,
        name: str = "",
    ) -> None:
        self._client = client
        self._key = key
        self._prefix = prefix
        self._on_change = on_change
        self._resync_interval = resync_interval
        self.name = name or key
        self._items: dict[str, KeyValue] = {}
        self.revision = 0
        self.synced = asyncio.Event()
        self._advanced = asyncio.Condition()
        self.relists = 0
        self.batches = 0

    @property
    def items(self) -> Mapping[str, KeyValue]:
        """The mirrored keys; read-only view, replaced or updated only by ``run``."""
        return self._items

    async def run(self) -> None:
        """List, then watch, forever; cancel the task to stop."""
        backoff = etcd_retry()
        while True:
            try:
                await self._relist()
                backoff.reset()
                async with asyncio.timeout(self._resync_interval):
                    await self._follow()
            except TimeoutError:
                continue  # periodic resync, or an etcd call timed out: both mean "list again"
            except ETCD_FAILURES as e:
                # Once per outage at warning level; the retries after it are routine.
                level = logging.WARNING if backoff.fresh else logging.DEBUG
                delay = backoff.next()
                log.log(
                    level,
                    "mirror %s: etcd unavailable (%s); relisting in %.1f s",
                    self.name,
                    describe(e),
                    delay,
                )
                await asyncio.sleep(delay)

    async def wait_revision(self, revision: int) -> None:
        """Return once the mirror reflects ``revision`` or later (e.g. our own write)."""
        async with self._advanced:
            await self._advanced.wait_for(lambda: self.revision >= revision)

    async def _relist(self) -> None:
        if self._prefix:
            kvs, revision = await get_prefix(self._client, self._key)
        else:
            kv, revision = await get_key(self._client, self._key)
            kvs = [kv] if kv is not None else []
        self._items = {kv.key: kv for kv in kvs}
        self.relists += 1
        await self._advance(revision)
        self.synced.set()

    async def _follow(self) -> None:
        stream = watch(self._client, self._key, prefix=self._prefix, start_revision=self.revision + 1)
        async with contextlib.aclosing(stream):
            async for batch in stream:
                if batch.lost_history:
                    return
                for kind, kv in batch.events:
                    if kind == EVENT_DELETE:
                        self._items.pop(kv.key, None)
                    else:
                        self._items[kv.key] = kv
                self.batches += 1
                # Not the header revision: while a watch catches up, the header is the store's current
                # revision and later batches still carry older events.
                await self._advance(max((kv.mod_revision for _, kv in batch.events), default=self.revision))

    async def _advance(self, revision: int) -> None:
        self.revision = revision
        if self._on_change is not None:
            self._on_change()
        async with self._advanced:
            self._advanced.notify_all()
