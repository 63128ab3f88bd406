"""ImageLocality, as kube-scheduler scores it: nodes that already hold the pod's images score higher, so a
sandbox lands where it starts without a pull.

Per node: the sum, over the pod's init containers and containers whose (normalized) image the node lists, of
the image's size scaled by the share of all nodes that list it (the spread ratio keeps a rare image from
drawing every pod to the one node that has it); that sum, clamped to [23 MiB, 1000 MiB x containers], maps
linearly onto 0..100 in integers. The share counts every known node of the cluster, as kube-scheduler's
snapshot does, so a sharded worker scores exactly as a standalone one. Weight 1, as in kube's default
profile.

kube-scheduler scores every feasible node (at our sizes); the engine scores a window of ``feasible_nodes`` in
binpack order, which often holds no node with the pod's image. ``widen`` names the pod's images whose holders
the engine should add to the window (``worker.engine``; the holders come from the cache's ``ImageHolders``):
those that could score above the minimum and that no node of the window lists. It never changes a score.

What a decision derives from the cluster-wide counts (each image's spread-scaled size, and the score of each
distinct node image list) is kept per pod image list across decisions, until the counts change
(``ImageStates.version``) or the number of known nodes does: a burst of pods of one image pays for that
arithmetic once, not twice per decision. Node image lists are interned by the records, so a few hundred
distinct lists cover a cluster; the memo holds them (their identity is its key) and starts over beyond
``MEMO_LIMIT`` pod image lists.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.records import NodeImages, PodRecord
from worker.cache import Cache
from worker.images import ImageHolders, ImageStates
from worker.nodeinfo import NodeInfo

MB = 1024 * 1024
MIN_THRESHOLD = 23 * MB
MAX_CONTAINER_THRESHOLD = 1000 * MB
MAX_NODE_SCORE = 100
MEMO_LIMIT = 256  # pod image lists whose derived values are kept (see the module docstring)


def image_score(total: int, containers: int, max_score: int = MAX_NODE_SCORE) -> int:
    """The node score for ``total`` bytes of (spread-scaled) images already present, for a pod of
    ``containers`` containers (kube-scheduler's calculatePriority)."""
    if containers < 1:
        return 0
    high = MAX_CONTAINER_THRESHOLD * containers
    clamped = min(max(total, MIN_THRESHOLD), high)
    return max_score * (clamped - MIN_THRESHOLD) // (high - MIN_THRESHOLD)


def scaled_size(size: int, nodes: int, total_nodes: int) -> int:
    """An image's size scaled by the share of nodes listing it (kube-scheduler's scaledImageScore: float64
    arithmetic, truncated)."""
    return int(float(size) * (float(nodes) / float(total_nodes)))


class _Derived:
    """What the counts give for one pod image list, valid while ``version`` and ``nodes`` are current."""

    __slots__ = ("above", "held", "nodes", "present", "scores", "version")

    def __init__(self, version: int, nodes: int, present: list[tuple[str, int]]) -> None:
        self.version = version
        self.nodes = nodes
        # per image of the pod some node lists: its spread-scaled size
        self.present = present
        # False when not even a node with all of them gets above the minimum: every node scores 0
        self.above = sum(s for _, s in present) > MIN_THRESHOLD
        # id(node image list) -> score; ``held`` keeps those lists alive, so an id is never reused meanwhile
        self.scores: dict[int, float] = {}
        self.held: list[NodeImages] = []


class ImageLocality:
    name = "ImageLocality"

    def __init__(self) -> None:
        self._images = ImageStates()
        self._holders = ImageHolders()
        self._known: set[Any] = set()
        self._memo: dict[tuple[str, ...], _Derived] = {}

    def attach(self, cache: Cache) -> None:
        self._images = cache.images
        self._holders = cache.image_holders
        self._known = cache.known
        self._memo = {}

    def applies(self, pod: PodRecord) -> bool:
        # Every node scores 0 unless some node lists one of the pod's images.
        return self._images.holds_any(pod.images)

    def batch_key(self, pod: PodRecord) -> tuple[Any, ...]:
        # the cluster-wide counts the scores derive from are part of the key
        return pod.images, self._images.version, len(self._known)

    def _derived(self, pod: PodRecord) -> _Derived:
        """The derived values for the pod's images (see the module docstring), computed when the counts or
        the number of known nodes changed since they were last asked for."""
        images = self._images
        total_nodes = len(self._known)
        entry = self._memo.get(pod.images)
        if entry is not None and entry.version == images.version and entry.nodes == total_nodes:
            return entry
        present: list[tuple[str, int]] = []
        if total_nodes:
            for name in pod.images:
                state = images.get(name)
                if state is not None:
                    scaled = scaled_size(state[0], state[1], total_nodes)
                    if scaled:
                        present.append((name, scaled))
        entry = _Derived(images.version, total_nodes, present)
        if len(self._memo) >= MEMO_LIMIT:
            self._memo.clear()
        self._memo[pod.images] = entry
        return entry

    def widen(self, pod: PodRecord, window: list[NodeInfo]) -> list[str]:
        """The pod's images whose holders are worth adding to ``window`` (see the module docstring), the
        largest scaled first; empty when no node can score above the minimum."""
        holders = self._holders
        missing = [name for name in pod.images if name in holders]
        if not missing:
            return []
        # Usually a node of the window already holds it (binpacking fills holders first): check that before
        # any arithmetic, and cheaply for the common single image.
        if len(missing) == 1:
            only = missing[0]
            for info in window:
                if only in info.node.images.names:
                    return []
        else:
            for info in window:
                names = info.node.images.names
                missing = [name for name in missing if name not in names]
                if not missing:
                    return []
        derived = self._derived(pod)
        if not derived.above:
            return []
        scaled = dict(derived.present)
        return sorted((name for name in missing if name in scaled), key=lambda name: -scaled[name])

    def scores(self, pod: PodRecord, nodes: list[NodeInfo]) -> list[float]:
        derived = self._derived(pod)
        if not derived.above:
            return [0.0] * len(nodes)
        memo = derived.scores
        try:
            # the common case: every node's image list was scored before for these images
            return [memo[id(info.node.images)] for info in nodes]
        except KeyError:
            pass
        present = derived.present
        containers = len(pod.images)
        out: list[float] = []
        for info in nodes:
            images = info.node.images
            score = memo.get(id(images))
            if score is None:
                names = images.names
                total = sum(scaled for name, scaled in present if name in names)
                score = memo[id(images)] = float(image_score(total, containers))
                derived.held.append(images)
            out.append(score)
        return out


def image_locality(args: Mapping[str, Any]) -> ImageLocality:
    return ImageLocality()
