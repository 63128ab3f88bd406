"""Small asyncio helpers shared by the etcd layer: racing waits and cancelling tasks cleanly.

Invariant: nothing started here outlives the call that started it; every helper cancels and awaits the
tasks it created, so no "Task was destroyed but it is pending" warnings escape into tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


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
