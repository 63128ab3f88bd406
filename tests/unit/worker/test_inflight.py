"""Writes under way per node (worker.inflight): what a node's release waits for."""

from __future__ import annotations

import asyncio

from common.records import NodeName
from worker.inflight import InFlight

A, B = NodeName("a"), NodeName("b")


async def test_idle_waits_only_for_the_nodes_it_is_asked_about() -> None:
    counts = InFlight()
    counts.start(A)
    counts.start(A)
    counts.start(B)
    assert (counts.count(A), counts.count(B), counts.count()) == (2, 1, 3)
    waiting_b = asyncio.create_task(counts.idle({B}))
    await asyncio.sleep(0)
    await counts.end(B)  # wakes b's waiter; a's writes do not hold it
    await asyncio.wait_for(waiting_b, 1)
    waiting = asyncio.create_task(counts.idle({A}))
    await counts.end(A)
    await asyncio.sleep(0.01)
    assert not waiting.done()  # one of a's two writes is still under way
    counts.end_soon(A)  # from a timer's callback
    await asyncio.wait_for(waiting, 1)
    assert counts.count() == 0


async def test_an_unanswered_write_stays_counted_for_its_hold() -> None:
    counts = InFlight()
    counts.start(A)
    counts.end_later(A, 0.1)
    waiting = asyncio.create_task(counts.idle())
    await asyncio.sleep(0.03)
    assert not waiting.done() and counts.count(A) == 1
    await asyncio.wait_for(waiting, 1)
    assert counts.count(A) == 0
