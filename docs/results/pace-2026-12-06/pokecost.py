"""What ``Pacer.poke`` costs when the backlog is below the threshold (nothing paced), on uvloop: CPU per call
with two sources registered as a worker registers them (a queue's ``qsize`` and an ordered dict's ``len``),
and with the leader's ``Dispatcher.backlog`` shape (a deque's length plus the unacknowledged sets of two
workers). Run from the project root: ``PYTHONPATH=. .venv/bin/python docs/results/pace-2026-12-06/pokecost.py``."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time

import uvloop

from common import aiotools

N = 1_000_000


async def main() -> None:
    pacer = aiotools.Pacer()
    pacer.attach(asyncio.get_running_loop(), 0.005)
    queue: asyncio.Queue[int] = asyncio.Queue()
    events: collections.OrderedDict[str, int] = collections.OrderedDict(a=1)
    ready: collections.deque[int] = collections.deque([1, 2])
    unacked = [{1, 2}, {3}]

    def leader() -> int:
        return len(ready) + sum(len(u) for u in unacked)

    for name, sources in (("worker", [queue.qsize, events.__len__]), ("leader", [leader])):
        for _ in range(3):
            with contextlib.ExitStack() as stack:
                for source in sources:
                    stack.enter_context(pacer.backlog_of(source))
                start = time.process_time()
                for _ in range(N):
                    pacer.poke()
                took = time.process_time() - start
            print(f"{name}: {took / N * 1e6:.2f} µs CPU per poke (nothing paced)")
    pacer.detach()


uvloop.run(main())
