"""The agent node pool: which nodes the shard map hands out to workers. One seam, ``PoolSource``.

``LabelPool`` (this module) is the pool chosen by a node label selector: every node matching it, weighted by
its allocatable CPU, kept current by a watch. The shard-policy ConfigMap's pool
(``coordinator.sharding.PolicyPool``) is the other implementation of the same seam.

Invariant: a pool that has not yet listed its nodes, or whose watch is down, keeps answering with its last good
set (the shard map would otherwise revoke every node); before the first list it answers empty, which grants
nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.kube import KubeClient
from common.records import NodeName, node_from_json
from common.watching import Reflector


class LabelPool:
    def __init__(self, client: KubeClient, selector: str = "") -> None:
        self._weights: dict[NodeName, float] = {}
        self.reflector = Reflector(
            client,
            "/api/v1/nodes",
            self,
            params={"labelSelector": selector} if selector else {},
            name="pool-nodes",
        )
        self.listeners: list[Any] = []

    def __call__(self) -> Mapping[NodeName, float]:
        return self._weights

    def _set(self, obj: dict[str, Any]) -> bool:
        rec = node_from_json(obj)
        weight = max(1.0, rec.allocatable.milli_cpu / 1000.0)
        changed = self._weights.get(rec.name) != weight
        self._weights[rec.name] = weight
        return changed

    def _changed(self) -> None:
        for callback in self.listeners:
            callback()

    def replace(self, objects: list[dict[str, Any]]) -> None:
        before = dict(self._weights)
        self._weights = {}
        for obj in objects:
            self._set(obj)
        if before != self._weights:
            self._changed()

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            name = NodeName((obj.get("metadata") or {}).get("name") or "")
            if self._weights.pop(name, None) is not None:
                self._changed()
        elif self._set(obj):
            self._changed()

    async def run(self) -> None:
        await self.reflector.run()
