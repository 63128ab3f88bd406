"""The capacity index: owned, schedulable nodes bucketed by free CPU, so a pod finds candidates without a
scan of every node.

Buckets are ``BUCKET_MILLI`` millicores wide. ``candidates(request)`` walks the non-empty buckets starting
at the one that could hold the request, in ascending free CPU (binpack: the fullest node that fits comes
first) or descending (spread). A node in the first bucket may still be a little short; the fit filter checks.

Invariants:
- A node is in at most one bucket, the one of its current free CPU, and in none while it is at its pod
  limit (it can take nothing, and would otherwise be walked past by every pod); the cache calls ``update`` after every
  change of a node's requested resources and ``remove`` when the node leaves the owned set.
- ``_keys`` is the sorted list of non-empty bucket numbers.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from worker.nodeinfo import NodeInfo

# Narrow buckets: nearly-full nodes (a few millicores free) must not share a bucket with nodes that can
# still take a typical 100m pod, or every pod would walk past all of them.
BUCKET_MILLI = 10


class CapacityIndex:
    def __init__(self, *, ascending: bool = True) -> None:
        self.ascending = ascending
        self._bucket_of: dict[str, int] = {}
        self._buckets: dict[int, dict[str, NodeInfo]] = {}
        self._keys: list[int] = []

    def __len__(self) -> int:
        return len(self._bucket_of)

    def names(self) -> list[str]:
        return list(self._bucket_of)

    def __contains__(self, name: str) -> bool:
        return name in self._bucket_of

    def update(self, info: NodeInfo) -> None:
        name = info.node.name
        if len(info.pods) >= info.node.allocatable.pods:
            # A node at its pod limit can take nothing; leaving it in would make every pod walk past it.
            self.remove(name)
            return
        bucket = max(0, info.free_milli_cpu()) // BUCKET_MILLI
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
        old = self._bucket_of.pop(name, None)
        if old is not None:
            self._drop(name, old)

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
