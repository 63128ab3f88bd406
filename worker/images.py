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
"""

from __future__ import annotations

from common.records import NodeImages


class ImageStates:
    __slots__ = ("_states",)

    def __init__(self) -> None:
        # name -> [size in bytes, nodes listing it]
        self._states: dict[str, list[int]] = {}

    def update(self, old: NodeImages, new: NodeImages) -> None:
        if old is new:
            return
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

    def __len__(self) -> int:
        return len(self._states)

    def get(self, name: str) -> tuple[int, int] | None:
        """(size, nodes listing it), or None when no node lists ``name``."""
        state = self._states.get(name)
        return None if state is None else (state[0], state[1])
