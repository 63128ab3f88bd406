"""Dispatched pods wait here until this worker's pod watch has reached the DISPATCH's ``min_rv``.

The leader's topology lane (``coordinator.dispatch.lane``) puts in every DISPATCH the resourceVersion of the
latest placement the pod's decision must see (another worker's binding of a pod with a cross-node rule, for
example). A decision reads this worker's cache, which the pod watch feeds in resourceVersion order, so the
pod may be decided once the watch has delivered every event up to ``min_rv``: ``revision() >= min_rv``.

``hold`` hands the pod to ``release`` (the scheduler's queue; with the time ``hold`` was called) at once when
the watch is there, or parks it;
``run`` releases parked pods as the watch advances. It wakes on every pod event or relist (``progress``, set
by the pod feed) and every ``POLL`` besides, for advances that are not events (bookmarks).

Invariants:
- A pod is released only when ``revision() >= min_rv``. The watch's revision only grows while its stream
  lasts and a relist's revision covers every event before it (``common.watching``), so a released pod is
  decided on a cache that has applied every event up to ``min_rv``.
- At most one hold per pod: a pod dispatched again while parked keeps one entry, with the later ``min_rv``.
- A parked pod is not answered here; the scheduler answers it after release. One dropped (``clear``: the
  leader stream that dispatched it was replaced) is never released. If the watch never gets there
  (the API server is unreachable) the leader's dispatch timeout sends the pod elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import time
from collections.abc import Callable

from common import metrics
from common.records import PodKey, PodRecord

POLL = 0.05  # seconds between checks of a watch that delivers no events while pods are parked


class RevisionGate:
    def __init__(
        self,
        revision: Callable[[], int],
        progress: asyncio.Event,
        release: Callable[[PodRecord, float], None],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.revision = revision
        self.progress = progress
        self.release = release
        self.clock = clock
        self._parked: dict[PodKey, tuple[int, PodRecord, float]] = {}  # key -> (min_rv, pod, parked at)
        self._heap: list[tuple[int, int, PodKey]] = []  # (min_rv, seq, key); stale entries skipped
        self._seq = 0
        self._parked_event = asyncio.Event()
        self.waited = 0  # pods that had to wait

    def __len__(self) -> int:
        return len(self._parked)

    def hold(self, pod: PodRecord, min_rv: int) -> None:
        """Release ``pod`` now if the watch has reached ``min_rv``, else park it until it has."""
        parked = self._parked.get(pod.key)
        if parked is not None:
            min_rv = max(min_rv, parked[0])
        elif min_rv <= self.revision():
            self.release(pod, self.clock())
            return
        self._parked[pod.key] = (min_rv, pod, parked[2] if parked is not None else self.clock())
        self._seq += 1
        heapq.heappush(self._heap, (min_rv, self._seq, pod.key))
        self._parked_event.set()
        self.check()

    def clear(self) -> list[PodKey]:
        """Forget every parked pod (none is to be decided here any more); returns their keys."""
        keys = list(self._parked)
        self._parked.clear()
        self._heap.clear()
        return keys

    def check(self) -> int:
        """Release every parked pod whose ``min_rv`` the watch has reached; returns how many."""
        reached = self.revision()
        n = 0
        while self._heap and self._heap[0][0] <= reached:
            min_rv, _, key = heapq.heappop(self._heap)
            parked = self._parked.get(key)
            if parked is None or parked[0] != min_rv:
                continue  # released already, or parked again with a later min_rv
            del self._parked[key]
            self.waited += 1
            metrics.watch_wait.observe(self.clock() - parked[2])
            self.release(parked[1], parked[2])
            n += 1
        return n

    async def run(self) -> None:
        """Release parked pods as the watch advances, until cancelled."""
        while True:
            if not self._parked:
                self._parked_event.clear()
                await self._parked_event.wait()
            self.progress.clear()
            self.check()
            if self._parked:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.progress.wait(), POLL)
