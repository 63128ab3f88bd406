"""The ``interpod`` mix of ``bench engine``: every pod placed, and the placements keep the pools' hard rules."""

from __future__ import annotations

from collections import Counter

from common.records import node_from_json, pod_from_json
from scale.bench.engine import POOL_SIZE, interpod_pod, run_engine_bench
from scale.cluster.nodes import LABEL_ZONE, ZONES, generate_nodes
from worker.cache import Cache
from worker.scheduler import build_engine
from worker.settings import WorkerSettings


def test_the_interpod_mix_places_every_pod_within_its_pools_rules() -> None:
    cache = Cache()
    for obj in generate_nodes(60):
        cache.upsert_node(node_from_json(obj))
    engine = build_engine(WorkerSettings(), cache)
    placed: dict[int, list[str]] = {}
    for i in range(400):
        pod = pod_from_json(interpod_pod(i))
        d = engine.schedule(pod)
        assert d.node is not None, d.message
        cache.assume(pod, d.node)
        placed.setdefault(i // POOL_SIZE, []).append(d.node)
    for pool, nodes in placed.items():
        if pool % 3 == 0:  # zone spread, maxSkew 1, DoNotSchedule
            zones = Counter(cache.nodes[n].node.labels[LABEL_ZONE] for n in nodes)  # type: ignore[index]
            counts = [zones.get(z, 0) for z in ZONES]
            assert max(counts) - min(counts) <= 1, (pool, zones)
        elif pool % 3 == 1:  # required anti-affinity on the hostname
            assert len(set(nodes)) == len(nodes), (pool, nodes)


def test_bench_engine_runs_the_interpod_mix() -> None:
    r = run_engine_bench(50, 100, mix="interpod")
    assert r.mix == "interpod" and r.placed == 100
