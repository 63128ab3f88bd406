"""Small asyncio helpers: racing waits and cancelling tasks cleanly (the etcd layer), and the event loop a
worker or coordinator process runs on (``--event-loop``).

Invariants: nothing started here outlives the call that started it; every helper cancels and awaits the
tasks it created, so no "Task was destroyed but it is pending" warnings escape into tests. A process's loop
is chosen once, before anything is created on it: ``run`` makes a new loop and closes it, as ``asyncio.run``.

The paced loop (``paced``: the standard library's selector loop on a ``PacedSelector``) does not poll for I/O
in a way that would block sooner than ``PACE`` after its previous poll returned: a loop with nothing ready to
run first sleeps until then, so what arrived meanwhile (watch chunks, binding answers, dispatch frames) is
handled in one pass instead of one wake-up each. A loop with callbacks ready polls without waiting, as the
standard loop does; a timer due sooner cuts the sleep short (it fires about as late as on the standard loop:
the poll's timeout is taken from the clock after the sleep); a loop that was idle for ``PACE`` or longer
handles the first arrival at once. So only I/O that arrives within ``PACE`` of the last poll waits, at most
``PACE``, and so do wake-ups from other threads (``call_soon_threadsafe``) and signals.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import selectors
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


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
EVENT_LOOPS = ("uvloop", "asyncio", "paced")
# The paced loop's shortest time between a poll and the next one that may block. Every deadline of the
# scheduler's protocols is seconds long, so none is at risk; a pod's path crosses several polls, and in a
# steady stream each may now wait: its p50 rose by 7-8 ms (docs/results/wakeups-2026-12-05/), which is why
# this loop is a choice and not the default.
PACE = 0.005


class PacedSelector(selectors.DefaultSelector):
    """The selector of the paced loop (module docstring): a poll that would block comes no sooner than
    ``pace`` after the previous one returned. ``clock`` and ``sleep`` are injectable for tests."""

    def __init__(
        self,
        pace: float = PACE,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__()
        self.pace = pace
        self._clock = clock
        self._sleep = sleep
        self._next = 0.0  # no poll before this, unless something is ready to run or a timer is due

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        # timeout 0 (or less): the loop has callbacks ready to run, it only collects what I/O is there
        if timeout is None or timeout > 0:
            now = self._clock()
            wait = self._next - now
            if wait > 0:
                if timeout is None:
                    self._sleep(wait)
                else:
                    due = now + timeout  # the next timer's time, which the sleep must not push back
                    self._sleep(min(wait, timeout))
                    timeout = max(0.0, due - self._clock())
        events = super().select(timeout)
        self._next = self._clock() + self.pace
        return events


def _paced_loop() -> asyncio.AbstractEventLoop:
    return asyncio.SelectorEventLoop(PacedSelector())


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
        help="uvloop (default); asyncio, the standard library's loop (to rule the loop out when debugging); paced, "
        f"the standard library's loop waiting for I/O no sooner than {PACE * 1000:g} ms after its last poll "
        "(less CPU in bursts, more latency in a steady stream)",
    )


def run(main: Coroutine[Any, Any, T], event_loop: str) -> T:
    """Run ``main`` to completion on a new event loop of the kind named, as ``asyncio.run`` does.

    uvloop is the default: it does the loop's own per-event machinery (watch reads, TLS, stream reads and
    writes, timers) in C, and the processes spent less CPU per pod on it than on the standard library's loop
    (``docs/architecture.md``, "Event loop", has the measurements)."""
    if event_loop == "uvloop":
        return uvloop.run(main)
    if event_loop == "paced":
        with asyncio.Runner(loop_factory=_paced_loop) as runner:
            return runner.run(main)
    return asyncio.run(main)
