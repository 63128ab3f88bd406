"""Engine construction for unit tests: the default profile over an in-memory cache."""

from __future__ import annotations

from common.records import NodeName, NodeRecord, PodRecord
from worker.cache import Cache
from worker.engine import Engine
from worker.scheduler import build_engine
from worker.settings import WorkerSettings


def engine_over(
    nodes: list[NodeRecord], *, owned: set[str] | None = None, feasible_nodes: int = 16
) -> Engine:
    settings = WorkerSettings()
    settings.scheduling.feasible_nodes = feasible_nodes
    owns = (lambda n: n in owned) if owned is not None else None
    cache = Cache(owns=owns, session_label=settings.scheduling.session_label)
    for n in nodes:
        cache.upsert_node(n)
    return build_engine(settings, cache)


def place(engine: Engine, pod_record: PodRecord) -> NodeName | None:
    """Decide and assume, as the scheduler loop does."""
    d = engine.schedule(pod_record)
    if d.node is not None:
        engine.cache.assume(pod_record, d.node)
    return d.node
