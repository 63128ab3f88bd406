"""Cluster-wide image counts for ImageLocality: for every image name some node lists, its size and how many
nodes list it (kube-scheduler's ``ImageStateSummary``).

Owned by the cache (``worker.cache``), which calls ``update`` for every node added, changed or removed; the
ImageLocality score (``worker.plugins.images``) reads it.

Invariants (kube-scheduler's cache semantics):
- ``nodes(name)`` is the number of known nodes whose ``status.images`` lists ``name`` (a node counts once per
  name); a name no node lists has no entry.
- ``size(name)`` is the size given by the node that made the entry: a node update removes the node's old
  names and adds its new ones, so an entry only this node held is made again with its new size, as in
  kube-scheduler (``removeNodeImageStates`` then ``addNodeImageStates``).
- An update whose old and new lists are the same object (records intern equal lists) costs nothing, so status
  heartbeats that leave images alone do not touch the counts.
- ``version`` changes whenever any count or size may have changed (every update whose lists differ), so a
  reader may keep what it derived from the counts for as long as ``version`` stays the same.

``ImageHolders`` (also owned by the cache) answers "which usable nodes hold image X, fullest first" for
ImageLocality's extra candidates (``worker.engine``): the capacity index's window of ``feasible_nodes`` nodes in
binpack order often holds no node with a pod's image, so the score never sees one. Invariants:
- A node is listed under an image exactly when it is in the capacity index (usable, known, below its pod
  limit) and its record lists that image with a size of at least ``HOLDER_MIN_SIZE``, in the same CPU bucket
  as in the capacity index: the cache calls ``place`` after every index update or removal of a node.
- Memory is bounded by the images kubelet reports (at most 50 per node, records cap them) and only large
  images are listed: a smaller one cannot lift a node above ImageLocality's minimum on its own.
- Every indexed node has an entry in ``_placed`` (with no names when it holds no large image), so
  ``place`` for a node whose bucket and (interned) image list are unchanged costs one dict lookup and two
  comparisons: it runs after every assume.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from common.records import NodeImages
from worker.index import BUCKET_MILLI
from worker.nodeinfo import NodeInfo

# ImageLocality's minimum (23 MiB, kube-scheduler's minThreshold): an image smaller than that scores nothing
# by itself, so its holders are not worth widening a decision for.
HOLDER_MIN_SIZE = 23 * 1024 * 1024


class ImageStates:
    __slots__ = ("_states", "version")

    def __init__(self) -> None:
        # name -> [size in bytes, nodes listing it]
        self._states: dict[str, list[int]] = {}
        self.version = 0

    def update(self, old: NodeImages, new: NodeImages) -> None:
        if old is new:
            return
        self.version += 1
        states = self._states
        for name in old.names:  # names are unique per node
            state = states[name]
            state[1] -= 1
            if not state[1]:
                del states[name]
        for name, size in zip(new.names, new.sizes, strict=True):
            known = states.get(name)
            if known is None:
                states[name] = [size, 1]
            else:
                known[1] += 1

    def __contains__(self, name: str) -> bool:
        return name in self._states

    def holds_any(self, names: tuple[str, ...]) -> bool:
        """Does some node list one of ``names``? (In C, no generator: asked on every decision.)"""
        return not self._states.keys().isdisjoint(names)

    def __len__(self) -> int:
        return len(self._states)

    def get(self, name: str) -> tuple[int, int] | None:
        """(size, nodes listing it), or None when no node lists ``name``."""
        state = self._states.get(name)
        return None if state is None else (state[0], state[1])


class _Holders:
    """The holders of one image, bucketed by free CPU like the capacity index."""

    __slots__ = ("buckets", "count", "keys")

    def __init__(self) -> None:
        self.buckets: dict[int, dict[str, NodeInfo]] = {}
        self.keys: list[int] = []  # sorted non-empty bucket numbers
        self.count = 0

    def add(self, bucket: int, info: NodeInfo) -> None:
        members = self.buckets.get(bucket)
        if members is None:
            members = self.buckets[bucket] = {}
            bisect.insort(self.keys, bucket)
        members[info.node.name] = info
        self.count += 1

    def drop(self, bucket: int, name: str) -> None:
        members = self.buckets[bucket]
        del members[name]
        self.count -= 1
        if not members:
            del self.buckets[bucket]
            del self.keys[bisect.bisect_left(self.keys, bucket)]


class ImageHolders:
    __slots__ = ("_images", "_min_size", "_placed")

    def __init__(self, *, min_size: int = HOLDER_MIN_SIZE) -> None:
        self._min_size = min_size
        # node -> (bucket, its image list as placed, the names listed under)
        self._placed: dict[str, tuple[int, NodeImages, tuple[str, ...]]] = {}
        self._images: dict[str, _Holders] = {}

    def place(self, info: NodeInfo, bucket: int | None) -> None:
        """``info``'s node is in the capacity index's ``bucket`` (None: not in the index)."""
        name = info.node.name
        images = info.node.images
        old = self._placed.get(name)
        if old is not None and old[0] == bucket and old[1] is images:
            return
        if old is not None:
            for image in old[2]:
                holders = self._images[image]
                holders.drop(old[0], name)
                if not holders.count:
                    del self._images[image]
            del self._placed[name]
        if bucket is None:
            return
        if old is not None and old[1] is images:
            tracked = old[2]
        else:
            floor = self._min_size
            tracked = tuple(n for n, size in zip(images.names, images.sizes, strict=True) if size >= floor)
        for image in tracked:
            entry = self._images.get(image)
            if entry is None:
                entry = self._images[image] = _Holders()
            entry.add(bucket, info)
        self._placed[name] = (bucket, images, tracked)

    def __contains__(self, image: str) -> bool:
        return image in self._images

    def count(self, image: str) -> int:
        holders = self._images.get(image)
        return 0 if holders is None else holders.count

    def candidates(
        self, image: str, milli_cpu: int, *, ascending: bool = True, after: int | None = None
    ) -> Iterator[NodeInfo]:
        """Holders of ``image`` whose free CPU may hold ``milli_cpu``, in the capacity index's order; with
        ``after`` (a bucket), only from that bucket on in that order (where an index walk stopped)."""
        holders = self._images.get(image)
        if holders is None:
            return
        keys = holders.keys
        low = bisect.bisect_left(keys, milli_cpu // BUCKET_MILLI)
        if ascending:
            if after is not None:
                low = max(low, bisect.bisect_left(keys, after))
            order = keys[low:]
        else:
            high = len(keys) if after is None else bisect.bisect_right(keys, after)
            order = keys[low:high][::-1]
        buckets = holders.buckets
        for key in order:
            yield from buckets[key].values()

    def statistics(self) -> dict[str, int]:
        return {"images": len(self._images), "nodes": len(self._placed)}
