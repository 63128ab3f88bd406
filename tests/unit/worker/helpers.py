"""Engine construction for unit tests: the default profile over an in-memory cache, and a shard fake."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from common.records import NodeName, NodeRecord, PodRecord
from worker.cache import Cache
from worker.engine import Engine
from worker.scheduler import build_engine
from worker.settings import WorkerSettings
from worker.shard import Listener, ShardChange


class FixedShard:
    """A ``ShardView`` whose usable set a test sets directly; ``set`` publishes the difference."""

    def __init__(self, nodes: Iterable[str] = ()) -> None:
        self.nodes = frozenset(NodeName(n) for n in nodes)
        self.listeners: list[Listener] = []
        self.syncing_nodes = 0

    def usable(self, node: NodeName) -> bool:
        return node in self.nodes

    def usable_now(self) -> Callable[[NodeName], bool]:
        return self.nodes.__contains__

    def subscribe(self, callback: Listener) -> Callable[[], None]:
        self.listeners.append(callback)
        return lambda: self.listeners.remove(callback)

    def syncing(self) -> int:
        return self.syncing_nodes

    def bind_deadline(self, node: NodeName) -> float | None:
        return math.inf if node in self.nodes else None  # no lease: no fencing deadline

    def set(self, nodes: Iterable[str]) -> None:
        new = frozenset(NodeName(n) for n in nodes)
        change = ShardChange(new - self.nodes, self.nodes - new, 0)
        self.nodes = new
        for callback in list(self.listeners):
            callback(change)


def engine_over(
    nodes: list[NodeRecord],
    *,
    owned: set[str] | None = None,
    feasible_nodes: int = 16,
    settings: WorkerSettings | None = None,
) -> Engine:
    settings = settings or WorkerSettings()
    settings.scheduling.feasible_nodes = feasible_nodes
    shard = FixedShard(owned) if owned is not None else None
    cache = Cache(shard=shard, session_label=settings.scheduling.session_label)
    for n in nodes:
        cache.upsert_node(n)
    return build_engine(settings, cache)


def place(engine: Engine, pod_record: PodRecord) -> NodeName | None:
    """Decide and assume, as the scheduler loop does."""
    d = engine.schedule(pod_record)
    if d.node is not None:
        engine.cache.assume(pod_record, d.node)
    return d.node
