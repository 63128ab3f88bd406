"""Small asyncio helpers: racing waits and cancelling tasks cleanly (the etcd layer), and the event loop a
worker or coordinator process runs on (``--event-loop``).

Invariants: nothing started here outlives the call that started it; every helper cancels and awaits the
tasks it created, so no "Task was destroyed but it is pending" warnings escape into tests. A process's loop
is chosen once, before anything is created on it: ``run`` makes a new loop and closes it, as ``asyncio.run``.

Pacing (``Pacer``, one per process: ``PACER``): while the process has at least ``min_backlog`` pieces of
work queued behind something slower than itself (bindings and Scheduled events waiting for the API server, pods
the leader has not yet sent or a worker not yet acknowledged), a pass of the loop that finds nothing to do
sleeps, until ``pace`` after the previous such sleep ended, instead of blocking until the next arrival: what
arrives meanwhile (watch chunks, binding answers, dispatch frames) is handled in one pass instead of one
wake-up each. Below that backlog the loop runs exactly as it would without a pacer: a pod that arrives to an
idle scheduler is never held back.

Invariants: a sleep lasts at most ``pace``; a pass that took ``IDLE_PASS`` (20 µs) or longer never sleeps, nor
does an idle one when ``pace`` has passed since the previous sleep (a process short of CPU is not slowed
further); while paced, every wait of a coroutine (a timer, an answer, a signal) may end up to ``pace`` late, so
a step that crosses several waits is late by up to that many paces (``MAX_PACE`` keeps three inside the binder's
fencing margin, 0.1 s, the shortest deadline such a step has); nothing sleeps unless the backlog sources
registered with ``backlog_of`` reach ``min_backlog``, and a source counts only while its ``with`` block lasts.
What the pacer cannot tell from an idle pass: a chain of passes that each do less than ``IDLE_PASS`` (e.g. a
loop of ``await asyncio.sleep(0)`` with a trivial body) runs one pass per ``pace`` while paced; the scheduler's
yielding loops do far more per pass. On the standard library's loop the pacer's callback runs before the I/O
callbacks its pass collected, so these may wait for the sleep, as anything arriving within the pace does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import uvloop

from common import metrics

T = TypeVar("T")

log = logging.getLogger(__name__)


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel the tasks and wait until they have finished; their results and errors are dropped.

    If the caller itself is cancelled while waiting, that cancellation propagates (the children have been
    cancelled already); a child's CancelledError is never mistaken for the caller's.
    """
    live = [t for t in tasks if t is not None and not t.done()]
    for task in live:
        task.cancel()
    if live:
        await asyncio.wait(live)
    for task in live:
        if not task.cancelled():
            task.exception()  # mark retrieved: the task's own code was responsible for logging it


async def wait_first(*waits: Awaitable[Any]) -> int:
    """Wait until one of the awaitables completes; cancel the others. Returns the index of the winner.

    An exception raised by the winner propagates. Ties (several done together) go to the lowest index.
    """
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait(*tasks)
    for index, task in enumerate(tasks):
        if task in done:
            task.result()  # re-raise the winner's error, if any
            return index
    raise AssertionError("asyncio.wait returned with nothing done")


# ----- the event loop a process runs on -----------------------------------------------------------------

EVENT_LOOP_ENV = "AGENT_SCHEDULER_EVENT_LOOP"
EVENT_LOOPS = ("uvloop", "asyncio")


def _event_loop(value: str) -> str:
    if value not in EVENT_LOOPS:
        raise argparse.ArgumentTypeError(f"{value!r} is not an event loop: choose {' or '.join(EVENT_LOOPS)}")
    return value


def add_event_loop_argument(p: argparse.ArgumentParser) -> None:
    """``--event-loop``, defaulting to ``$AGENT_SCHEDULER_EVENT_LOOP`` or uvloop; a bad value of either is a
    usage error."""
    p.add_argument(
        "--event-loop",
        type=_event_loop,  # also checks the environment's value: argparse converts a string default
        metavar="{" + ",".join(EVENT_LOOPS) + "}",
        default=os.environ.get(EVENT_LOOP_ENV) or "uvloop",
        help="uvloop (default); asyncio, the standard library's loop (to rule the loop out when debugging)",
    )


def add_pace_argument(p: argparse.ArgumentParser) -> None:
    """``--pace`` in milliseconds (``Pacer``), 0 to ``MAX_PACE``, default ``PACE``; a bad value is a usage error."""
    p.add_argument(
        "--pace",
        type=_pace_ms,
        metavar="MS",
        default=PACE * 1000,
        help=f"while at least {PACE_BACKLOG} bindings, events or dispatches are queued behind the API server or "
        "the workers, handle I/O at most once per this many milliseconds, in one pass (less CPU per pod in "
        f"bursts; a pod arriving to an idle scheduler is not held back); 0: never (default {PACE * 1000:g})",
    )


def _pace_ms(value: str) -> float:
    try:
        ms = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of milliseconds") from None
    if not 0 <= ms <= MAX_PACE * 1000:
        raise argparse.ArgumentTypeError(f"{value} ms: the pace is 0 (off) to {MAX_PACE * 1000:g} ms")
    return ms


def run(main: Coroutine[Any, Any, T], event_loop: str, *, pace_ms: float = 0.0) -> T:
    """Run ``main`` to completion on a new event loop of the kind named, as ``asyncio.run`` does, paced by
    ``PACER`` at ``pace_ms`` (0: not paced).

    uvloop is the default: it does the loop's own per-event machinery (watch reads, TLS, stream reads and
    writes, timers) in C, and the processes spent less CPU per pod on it than on the standard library's loop
    (``docs/architecture.md``, "Event loop", has the measurements)."""
    paced = _paced(main, pace_ms / 1000)
    if event_loop == "uvloop":
        return uvloop.run(paced)
    return asyncio.run(paced)


async def _paced(main: Coroutine[Any, Any, T], pace: float) -> T:
    PACER.attach(asyncio.get_running_loop(), pace)
    try:
        return await main
    finally:
        PACER.detach()


# ----- pacing ----------------------------------------------------------------------------------------------

# The default pace. In bursts of 2,000 pods it took 17 % off the standalone worker's CPU per pod and 4 % off each
# coordinated worker's (one paired run; a first version that also paced the leader, 8.5-16 % off each
# configuration in two); a steady stream of 100 pods/s engaged it only once it had backed up
# (docs/results/pace-2026-12-06/). Paced whatever the backlog, an earlier paced loop raised that stream's p50 by
# 7-8 ms (docs/results/wakeups-2026-12-05/).
PACE = 0.005
# While paced, each wait of a coroutine (a timer, an answer) may end up to the pace late, and a binding's
# attempt may cross a few between its fencing check and the API server's receipt of it (a new connection, the
# rate limiter, a token refresh): at 20 ms, three such waits stay inside the binder's fencing margin (0.1 s).
MAX_PACE = 0.02
# Work queued behind a slower party from which a process paces. A steady stream of 100 pods/s keeps a few
# bindings and events queued at most; a burst keeps hundreds in a worker, each waiting far longer than a pace.
# (The leader's unacknowledged dispatches stayed under it in the measured bursts: workers acknowledge on reading.)
PACE_BACKLOG = 32
# A pass of the loop that runs nothing but one callback: p50 0.47 µs on uvloop, 1.41 µs on the standard loop, p99
# under 3 µs (docs/results/pace-2026-12-06/idlepass.py); a pass that decides a pod takes longer than the decision
# alone (about 30 µs of CPU per plain pod, bench engine). Lighter passes (one answer read, one frame) were not
# measured: those under it count as idle (the module docstring's invariants).
IDLE_PASS = 20e-6


class Pacer:
    """The process's pacing (module docstring). ``clock`` and ``sleep`` are injectable for tests.

    How a pass ends in a sleep without access to the loop's poll (uvloop has no hook there): while paced, a
    pacer callback is always in the loop's ready queue, putting itself back each time it runs, so the loop polls
    without blocking. When that callback finds that less than ``idle_pass`` went by since its previous run
    (no I/O was handled, no other callback ran, as far as a clock can tell), the loop has nothing to do and
    would block now: it sleeps instead, until ``pace`` after its previous sleep ended, and the next poll
    collects what arrived meanwhile. A pass that did work never sleeps, so work split over many passes (a
    burst's decisions, yielding every few dozen) is not slowed (but see the module docstring for passes of
    less than ``idle_pass``). ``poke`` starts the callback when work is queued and the backlog has
    reached ``min_backlog``; it stops once the backlog is below it, and the loop blocks as usual."""

    def __init__(
        self,
        *,
        min_backlog: int = PACE_BACKLOG,
        idle_pass: float = IDLE_PASS,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.min_backlog = min_backlog
        self.idle_pass = idle_pass
        self._clock = clock
        self._sleep = sleep
        self.pace = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sources: list[Callable[[], int]] = []
        self._failed: set[int] = set()  # ids of sources that raised and were logged
        self._armed = False
        self._ran = float("-inf")  # when the pacer callback last returned
        self._last = float("-inf")  # when its latest sleep ended (or an idle pass found none due)
        self.sleeps = 0  # passes that slept, and for how long in all (also ``agent_scheduler_paced_*``)
        self.slept = 0.0

    def attach(self, loop: asyncio.AbstractEventLoop, pace: float) -> None:
        if not 0 <= pace <= MAX_PACE:
            raise ValueError(f"pace {pace} s: 0 (off) to {MAX_PACE} s")
        self._loop, self.pace, self._armed = (loop if pace > 0 else None), pace, False

    def detach(self) -> None:
        self._loop, self._armed = None, False

    @contextlib.contextmanager
    def backlog_of(self, source: Callable[[], int]) -> Iterator[None]:
        """Count ``source()`` in the backlog while the block lasts (a component's queue, for its lifetime)."""
        self._sources.append(source)
        try:
            yield
        finally:
            self._sources.remove(source)

    def backlog(self) -> int:
        """The sources' sum. A source that raises counts as 0 (logged the first time only: ``poke`` runs per
        pod): pacing is an optimisation, and its check runs inside the callers' own work, which must not fail
        for it."""
        total = 0
        for source in self._sources:
            try:
                total += source()
            except Exception:
                if id(source) not in self._failed:
                    self._failed.add(id(source))
                    log.exception("a pacing backlog source failed: counted as 0 (logged once)")
        return total

    def poke(self) -> None:
        """Work was queued: start pacing if the backlog has reached the threshold. Runs per pod, so it is one
        attribute test when already paced or unattached."""
        if self._armed or self._loop is None or self.backlog() < self.min_backlog:
            return
        self._armed = True
        self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        loop = self._loop
        if loop is None or self.backlog() < self.min_backlog:
            self._armed = False
            return
        now = self._clock()
        if now - self._ran < self.idle_pass:
            wait = self._last + self.pace - now
            if wait > 0:
                self._sleep(wait)
                slept = self._clock() - now  # a sleep may return late
                now += slept
                self.sleeps += 1
                self.slept += slept
                metrics.paced_sleeps.inc()
                metrics.paced_seconds.inc(slept)
            self._last = now
        loop.call_soon(self._tick)
        self._ran = self._clock()


PACER = Pacer()
