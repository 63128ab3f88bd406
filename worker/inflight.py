"""Writes under way per node, and the wait until none is under way on some nodes: what a node's release waits for
before it is acknowledged (``worker.shard``'s release hook, ``Scheduler.release``). Kept by the binder for its
bindings and by the preemption executor for its nominations and evictions.

Invariants: a node is counted while a write for it is under way or may still land (the binder counts each
binding from its submission, the executor each preemption from its start, and each write that got no answer
for the writer's hold, ``end_later``); a count goes down only through ``end`` or ``end_soon``, and every
decrement wakes the waiters of ``idle``, which returns only once none of its nodes is counted."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from common.records import NodeName


class InFlight:
    def __init__(self) -> None:
        self._counts: dict[NodeName, int] = {}
        self._changed = asyncio.Condition()
        self._notifying: set[asyncio.Task[None]] = set()

    def start(self, node: NodeName) -> None:
        self._counts[node] = self._counts.get(node, 0) + 1

    def count(self, node: NodeName | None = None) -> int:
        """Under way for ``node``, or for every node when None."""
        if node is None:
            return sum(self._counts.values())
        return self._counts.get(node, 0)

    async def end(self, node: NodeName) -> None:
        """One write for ``node`` ended; its waiters are woken before this returns."""
        self._decrement(node)
        async with self._changed:
            self._changed.notify_all()

    def end_soon(self, node: NodeName) -> None:
        """``end`` from synchronous code (a timer's callback): the waiters are woken by a task."""
        self._decrement(node)
        task = asyncio.get_running_loop().create_task(self._notify())
        self._notifying.add(task)
        task.add_done_callback(self._notifying.discard)

    def end_later(self, node: NodeName, hold: float) -> None:
        """One write for ``node`` ended without an answer: it stays counted ``hold`` seconds more, by when it
        has been applied or never will be."""
        asyncio.get_running_loop().call_later(hold, self.end_soon, node)

    async def idle(self, nodes: Iterable[NodeName] | None = None) -> None:
        """Wait until nothing is under way for ``nodes`` (every node when None)."""
        wanted = set(nodes) if nodes is not None else None
        async with self._changed:
            await self._changed.wait_for(
                lambda: not any(n for node, n in self._counts.items() if wanted is None or node in wanted)
            )

    def _decrement(self, node: NodeName) -> None:
        left = self._counts.get(node, 0) - 1
        if left > 0:
            self._counts[node] = left
        else:
            self._counts.pop(node, None)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
