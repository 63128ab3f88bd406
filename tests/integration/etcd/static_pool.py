"""``StaticPool``: a shard-map ``PoolSource`` the test sets by hand (every node weight 1 unless given)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from common.records import NodeName


class StaticPool:
    def __init__(self, nodes: Iterable[NodeName] = ()) -> None:
        self._nodes: dict[NodeName, float] = dict.fromkeys(nodes, 1.0)

    def set(self, nodes: Iterable[NodeName] | Mapping[NodeName, float]) -> None:
        self._nodes = dict(nodes) if isinstance(nodes, Mapping) else dict.fromkeys(nodes, 1.0)

    def __call__(self) -> Mapping[NodeName, float]:
        return self._nodes
