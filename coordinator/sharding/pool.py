"""``PolicyPool``: the agent node pool as the shard policy decides it, behind the shard map's ``PoolSource`` seam.

The pool holds the nodes the shard map may hand to workers, with their weights (allocatable cores). Only
``ShardingController`` sets it; the shard map reads it at the start of each round and is poked through
``listeners`` when it changes.

Invariant (kept by the controller, stated here because this is what the shard map trusts): a node enters the pool
only after it has been published in the agent NodeShard's ``status.nodesInUse`` and while no other NodeShard's
``status.nodesInUse`` lists it. Leaving the pool needs nothing: the shard map then revokes the node, and the
controller keeps publishing it until the worker released it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from common.records import NodeName


class PolicyPool:
    """A ``PoolSource``: calling it returns the current pool (read-only)."""

    def __init__(self) -> None:
        self._weights: Mapping[NodeName, float] = MappingProxyType({})
        self.listeners: list[Callable[[], None]] = []
        self.changes = 0

    def __call__(self) -> Mapping[NodeName, float]:
        return self._weights

    def nodes(self) -> frozenset[NodeName]:
        return frozenset(self._weights)

    def set(self, weights: Mapping[NodeName, float]) -> bool:
        """Replace the pool; tell the listeners when it changed. True when it changed."""
        if dict(weights) == dict(self._weights):
            return False
        self._weights = MappingProxyType(dict(weights))
        self.changes += 1
        for callback in self.listeners:
            callback()
        return True
