"""The capacity index: usable, schedulable nodes bucketed by free CPU, so a pod finds candidates without a
scan of every node.

Buckets are ``BUCKET_MILLI`` millicores wide. ``candidates(request)`` walks the non-empty buckets starting
at the one that could hold the request, in ascending free CPU (binpack: the fullest node that fits comes
first) or descending (spread). A node in the first bucket may still be a little short; the fit filter checks.

Invariants:
- A node is in at most one bucket, the one of its current free CPU, and in none while it is at its pod
  limit (it can take nothing, and would otherwise be walked past by every pod); the cache calls ``update`` after every
  change of a node's requested resources and ``remove`` when the node leaves the usable set.
- ``_keys`` is the sorted list of non-empty bucket numbers.
- ``summary()`` describes exactly the indexed nodes: ``_free`` holds each one's free CPU and memory as of its
  last ``update``, and the totals are their sums. The largest free CPU is in the highest bucket. The largest
  free memory comes from a lazy max-heap whose invariant is: every indexed node has an entry at least its
  current free memory. So an entry is pushed only when a node enters or its free memory grows (a shrink,
  the common case after an assume, leaves the old entry as an upper bound); ``summary`` fixes stale entries
  as they reach the top, and the heap is rebuilt when it holds too many stale ones. The summary costs O(1)
  amortised plus one bucket, instead of a walk over every node, and nothing when no node changed since the
  last one (it is kept until the next ``update`` or ``remove``, which call ``on_stale``: a summary's reader
  at rest waits for that instead of asking again and again).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from worker.nodeinfo import NodeInfo

# Narrow buckets: nearly-full nodes (a few millicores free) must not share a bucket with nodes that can
# still take a typical 100m pod, or every pod would walk past all of them.
BUCKET_MILLI = 10
HEAP_SLACK = 64  # stale heap entries tolerated beyond the live ones before a rebuild


@dataclass(frozen=True, slots=True)
class CapacitySummary:
    """Free capacity over the indexed nodes: totals, and the largest amounts free on one node (a pod larger
    than ``max_*`` cannot fit). Free amounts may be negative on an overcommitted node; the maxima are at
    least 0."""

    nodes: int = 0
    free_cpu: int = 0
    free_memory: int = 0
    max_cpu: int = 0
    max_memory: int = 0


class CapacityIndex:
    def __init__(self, *, ascending: bool = True) -> None:
        self.ascending = ascending
        self._bucket_of: dict[str, int] = {}
        self._buckets: dict[int, dict[str, NodeInfo]] = {}
        self._keys: list[int] = []
        self._free: dict[str, tuple[int, int]] = {}  # name -> (free millicores, free bytes)
        self._free_cpu = 0
        self._free_memory = 0
        self._memory_heap: list[tuple[int, str]] = []  # (-free bytes, name), lazily deleted
        self._summary: CapacitySummary | None = None  # ``summary()`` since the last change; None: stale
        # called when a kept summary goes stale (once per ``summary()``: the hot path pays a None check)
        self.on_stale: Callable[[], None] | None = None

    def _stale(self) -> None:
        self._summary = None
        if self.on_stale is not None:
            self.on_stale()

    def __len__(self) -> int:
        return len(self._bucket_of)

    def names(self) -> list[str]:
        return list(self._bucket_of)

    def __contains__(self, name: str) -> bool:
        return name in self._bucket_of

    def bucket(self, name: str) -> int | None:
        """The bucket ``name`` is in (None: not indexed)."""
        return self._bucket_of.get(name)

    def update(self, info: NodeInfo) -> None:
        if self._summary is not None:
            self._stale()
        node = info.node
        name = node.name
        alloc = node.allocatable
        if len(info.pods) >= alloc.pods:
            # A node at its pod limit can take nothing; leaving it in would make every pod walk past it.
            self.remove(name)
            return
        requested = info.requested
        cpu = alloc.milli_cpu - requested.milli_cpu
        memory = alloc.memory - requested.memory
        # The summary's running totals and heap, inline: this runs after every assume.
        old_free = self._free.get(name)
        self._free[name] = (cpu, memory)
        if old_free is None:
            self._free_cpu += cpu
            self._free_memory += memory
            self._push_memory(name, memory)
        else:
            self._free_cpu += cpu - old_free[0]
            self._free_memory += memory - old_free[1]
            if memory > old_free[1]:
                self._push_memory(name, memory)
        bucket = max(0, cpu) // BUCKET_MILLI
        old = self._bucket_of.get(name)
        if old == bucket:
            return
        if old is not None:
            self._drop(name, old)
        self._bucket_of[name] = bucket
        members = self._buckets.get(bucket)
        if members is None:
            members = self._buckets[bucket] = {}
            bisect.insort(self._keys, bucket)
        members[name] = info

    def remove(self, name: str) -> None:
        if self._summary is not None:
            self._stale()
        old = self._bucket_of.pop(name, None)
        if old is not None:
            self._drop(name, old)
        free = self._free.pop(name, None)
        if free is not None:
            self._free_cpu -= free[0]
            self._free_memory -= free[1]

    def _push_memory(self, name: str, memory: int) -> None:
        heap = self._memory_heap
        heapq.heappush(heap, (-memory, name))
        if len(heap) > 2 * len(self._free) + HEAP_SLACK:
            self._memory_heap = [(-m, n) for n, (_, m) in self._free.items()]
            heapq.heapify(self._memory_heap)

    def summary(self) -> CapacitySummary:
        """Free capacity over the indexed nodes (see the module docstring for the cost); kept until the next
        ``update`` or ``remove``, so a capacity check with no node changed since the last walks no
        bucket."""
        if self._summary is not None:
            return self._summary
        heap = self._memory_heap
        while heap:
            memory, name = -heap[0][0], heap[0][1]
            free = self._free.get(name)
            if free is None:
                heapq.heappop(heap)  # the node left the index
            elif free[1] != memory:
                heapq.heapreplace(heap, (-free[1], name))  # an upper bound from before a shrink
            else:
                break  # exact, and no other node's entry (an upper bound of its free memory) is larger
        max_memory = -heap[0][0] if heap else 0
        max_cpu = 0
        if self._keys:
            max_cpu = max(self._free[name][0] for name in self._buckets[self._keys[-1]])
        self._summary = CapacitySummary(
            len(self._free), self._free_cpu, self._free_memory, max(0, max_cpu), max(0, max_memory)
        )
        return self._summary

    def _drop(self, name: str, bucket: int) -> None:
        members = self._buckets[bucket]
        del members[name]
        if not members:
            del self._buckets[bucket]
            del self._keys[bisect.bisect_left(self._keys, bucket)]

    def candidates(self, milli_cpu: int) -> Iterator[NodeInfo]:
        """Nodes whose free CPU may hold ``milli_cpu``, best-first for the index's order.

        The caller stops early, so iteration must tolerate the index changing after it stops; it must not
        change the index while iterating (the engine only reads)."""
        first = bisect.bisect_left(self._keys, milli_cpu // BUCKET_MILLI)
        keys = (
            self._keys[first:]
            if self.ascending
            else self._keys[: first - 1 : -1]
            if first
            else self._keys[::-1]
        )
        for key in keys:
            yield from self._buckets[key].values()

    def statistics(self) -> dict[str, int]:
        return {"nodes": len(self._bucket_of), "buckets": len(self._keys)}
