"""The scheduling queue, after kube-scheduler's: activeQ, backoffQ, the unschedulable pool, and gated pods.

- activeQ: a heap ordered by priority (higher first), then by when the pod entered the queue (FIFO).
- backoffQ: a heap by the time a pod's backoff ends; ``flush_backoff`` moves due pods to activeQ. Backoff is
  ``INITIAL_BACKOFF`` doubling per failed attempt up to ``MAX_BACKOFF``.
- unschedulable pool: pods that no node could take; they move back (to backoffQ if their backoff is still
  running, else activeQ) when ``move_all`` is called for an event that could help (node added or changed,
  capacity freed), or ``move_if`` for an event that can help only some of them (a storage object: the pods
  with a claim it concerns), and at the latest after ``UNSCHEDULABLE_TIMEOUT``. A pod refused for its own spec
  (``PodRecord.parse_error``: invalid, or a field the engine does not support) waits there for an update of
  itself only: no cluster event can make it schedulable.
- gated: pods with ``spec.schedulingGates``; they enter activeQ when an update removes the last gate.

Invariants:
- A pod key is in at most one of: activeQ (live entry), backoffQ (live entry), unschedulable, gated, or
  in flight (popped, not yet done). Heaps use lazy deletion: an entry is live only if its sequence number
  matches the pod's current one.
- A pod updated while in flight is re-queued by ``done`` with the newest record; a pod deleted while in
  flight is not re-queued.
- If an event arrived while a pod was in flight, a failed pod goes to backoffQ rather than the
  unschedulable pool, so that event is not lost for it (kube-scheduler's move-request cycle).

Single-threaded (asyncio): no locks. Time comes from the injected clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from common.records import PodKey, PodRecord

INITIAL_BACKOFF = 1.0
MAX_BACKOFF = 10.0
UNSCHEDULABLE_TIMEOUT = 300.0


@dataclass(slots=True)
class QueuedPod:
    pod: PodRecord
    added_at: float  # first time the pod entered the queue (for the scheduling SLI)
    attempts: int = 0
    seq: int = 0
    backoff_until: float = 0.0
    unschedulable_since: float = 0.0
    move_cycle: int = 0  # move-request cycle when the current attempt started
    last_message: str = field(default="")


class SchedulingQueue:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._seq = itertools.count(1)
        self._pods: dict[PodKey, QueuedPod] = {}
        self._where: dict[PodKey, str] = {}  # "active" | "backoff" | "unschedulable" | "gated" | "flight"
        self._active: list[tuple[int, float, int, PodKey]] = []
        self._backoff: list[tuple[float, int, PodKey]] = []
        self._unschedulable: dict[PodKey, QueuedPod] = {}
        self._gated: dict[PodKey, QueuedPod] = {}
        self._updated_in_flight: dict[PodKey, PodRecord | None] = {}
        self._move_cycle = 0
        self._wakeup = asyncio.Event()
        # backoffQ's head changed to an earlier end (``wait_backoff``)
        self._earlier_backoff = asyncio.Event()

    # ----- entering --------------------------------------------------------------------------------------

    def add(self, pod: PodRecord) -> None:
        """A new or updated pending pod from the watch (or the dispatcher)."""
        key = pod.key
        where = self._where.get(key)
        if where == "flight":
            self._updated_in_flight[key] = pod
            return
        qp = self._pods.get(key)
        if qp is None:
            qp = QueuedPod(pod, self.clock())
            self._pods[key] = qp
        else:
            qp.pod = pod
        if pod.gated:
            self._place(qp, "gated")
        elif where in (None, "gated"):
            self._place(qp, "active")
        elif where == "unschedulable":
            self._place(qp, "active")  # an update may have made it schedulable: retry now
        # in activeQ/backoffQ: the live entry now carries the new record

    def delete(self, key: PodKey) -> None:
        where = self._where.get(key)
        if where == "flight":
            self._updated_in_flight[key] = None
            return
        self._where.pop(key, None)
        self._pods.pop(key, None)
        self._unschedulable.pop(key, None)
        self._gated.pop(key, None)

    def _place(self, qp: QueuedPod, where: str) -> None:
        key = qp.pod.key
        self._unschedulable.pop(key, None)
        self._gated.pop(key, None)
        qp.seq = next(self._seq)
        self._where[key] = where
        if where == "active":
            heapq.heappush(self._active, (-qp.pod.priority, qp.added_at, qp.seq, key))
            self._wakeup.set()
        elif where == "backoff":
            heapq.heappush(self._backoff, (qp.backoff_until, qp.seq, key))
            if self._backoff[0][1] == qp.seq:  # it ends first: a waiting flush must wake sooner
                self._earlier_backoff.set()
        elif where == "unschedulable":
            qp.unschedulable_since = self.clock()
            self._unschedulable[key] = qp
        elif where == "gated":
            self._gated[key] = qp

    # ----- leaving ---------------------------------------------------------------------------------------

    def pop_nowait(self) -> QueuedPod | None:
        while self._active:
            _, _, seq, key = heapq.heappop(self._active)
            qp = self._pods.get(key)
            if qp is None or qp.seq != seq or self._where.get(key) != "active":
                continue
            self._where[key] = "flight"
            qp.attempts += 1
            qp.move_cycle = self._move_cycle
            return qp
        self._wakeup.clear()
        return None

    async def wait(self, timeout: float | None = None) -> None:
        """Wait until activeQ may have something (or ``timeout`` passes). Every way into activeQ wakes it."""
        if self._active:
            return
        if timeout is None:
            await self._wakeup.wait()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), timeout)

    async def wait_backoff(self, limit: float) -> None:
        """Wait until backoffQ's first entry ends, a pod enters backoffQ ahead of it, or ``limit`` seconds
        pass, whichever is first. ``flush_backoff`` after it moves what is due: so a backoff ends on time, and
        a queue with nothing backing off costs no wake-up before ``limit``. (The first entry may be a stale
        one, of a pod that left backoffQ: the flush then moves nothing, which is harmless.)"""
        delay = limit
        if self._backoff:
            delay = min(limit, self._backoff[0][0] - self.clock())
        if delay <= 0:
            return
        self._earlier_backoff.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self._earlier_backoff.wait()

    def _backoff_for(self, attempts: int) -> float:
        return float(min(MAX_BACKOFF, INITIAL_BACKOFF * (2 ** max(0, attempts - 1))))

    def done(self, qp: QueuedPod, *, scheduled: bool, retry: bool = False, message: str = "") -> None:
        """Finish an attempt. ``scheduled``: the pod was assumed on a node (it leaves the queue).
        ``retry``: an error, not a verdict: the pod goes to backoffQ. Otherwise it was unschedulable."""
        key = qp.pod.key
        update = self._updated_in_flight.pop(key, ...)
        if update is None:  # deleted while in flight
            self._where.pop(key, None)
            self._pods.pop(key, None)
            return
        if scheduled:
            self.leave(qp)
            return
        qp.last_message = message
        if isinstance(update, PodRecord):
            qp.pod = update
            if update.gated:
                self._place(qp, "gated")
                return
        qp.backoff_until = self.clock() + self._backoff_for(qp.attempts)
        # An update of the pod itself, like a move event, may have made it schedulable: retry after backoff.
        if retry or qp.move_cycle < self._move_cycle or isinstance(update, PodRecord):
            self._place(qp, "backoff")
        else:
            self._place(qp, "unschedulable")

    def leave(self, qp: QueuedPod) -> None:
        """Finish an attempt whose pod leaves the queue: assumed on a node, or handed back to whoever
        dispatched it. An update that arrived while it was in flight is dropped with it."""
        key = qp.pod.key
        self._updated_in_flight.pop(key, None)
        self._where.pop(key, None)
        self._pods.pop(key, None)

    def requeue(self, pod: PodRecord, attempts: int = 0) -> None:
        """A pod whose assumed binding failed: back through backoffQ. ``attempts`` (the scheduling attempts
        it had made when it was assumed) keeps its backoff growing: the pod left the queue when it was
        assumed, and starting again from the first step would retry a lasting refusal every second."""
        qp = self._pods.get(pod.key) or QueuedPod(pod, self.clock())
        qp.pod = pod
        qp.attempts = max(qp.attempts + 1, attempts)
        qp.backoff_until = self.clock() + self._backoff_for(qp.attempts)
        self._pods[pod.key] = qp
        self._place(qp, "backoff")

    # ----- moves -----------------------------------------------------------------------------------------

    def flush_backoff(self) -> int:
        now = self.clock()
        moved = 0
        while self._backoff and self._backoff[0][0] <= now:
            _, seq, key = heapq.heappop(self._backoff)
            qp = self._pods.get(key)
            if qp is None or qp.seq != seq or self._where.get(key) != "backoff":
                continue
            self._place(qp, "active")
            moved += 1
        return moved

    def flush_unschedulable(self) -> int:
        """Pods in the pool longer than ``UNSCHEDULABLE_TIMEOUT`` go back for another try."""
        now = self.clock()
        due = [
            qp
            for qp in self._unschedulable.values()
            if now - qp.unschedulable_since >= UNSCHEDULABLE_TIMEOUT and qp.pod.parse_error is None
        ]
        for qp in due:
            self._place(qp, "backoff" if qp.backoff_until > now else "active")
        return len(due)

    def move_all(self) -> int:
        """An event that could help unschedulable pods happened: move them all out of the pool."""
        return self.move_if(None)

    def move_if(self, helps: Callable[[PodRecord], bool] | None) -> int:
        """An event that could help only the pods ``helps`` says yes to (None: all) happened: move those out
        of the pool. The move-request cycle advances all the same: a pod in flight now goes to backoffQ, not
        the pool, whatever the event (it is not known yet what rejected it)."""
        self._move_cycle += 1
        now = self.clock()
        pods = [
            qp
            for qp in self._unschedulable.values()
            if qp.pod.parse_error is None and (helps is None or helps(qp.pod))
        ]
        for qp in pods:
            self._place(qp, "backoff" if qp.backoff_until > now else "active")
        return len(pods)

    def activate(self, key: PodKey) -> None:
        """Move one pod out of the unschedulable pool now (its own preemption finished: kube-scheduler's
        Activate); a pod elsewhere is left where it is."""
        qp = self._unschedulable.get(key)
        if qp is not None:
            self._place(qp, "active")

    # ----- introspection ---------------------------------------------------------------------------------

    def __contains__(self, key: PodKey) -> bool:
        return key in self._where

    def queued(self, key: PodKey) -> PodRecord | None:
        """The record ``key`` is queued with (or was popped with, while in flight), if any."""
        qp = self._pods.get(key)
        return qp.pod if qp is not None else None

    def records(self) -> list[PodRecord]:
        """The record of every pod queued or in flight (as ``queued`` gives it)."""
        return [qp.pod for qp in self._pods.values()]

    def where(self, key: PodKey) -> str | None:
        return self._where.get(key)

    def statistics(self) -> dict[str, int]:
        counts = {"active": 0, "backoff": 0, "unschedulable": 0, "gated": 0, "flight": 0}
        for where in self._where.values():
            counts[where] += 1
        return counts
