"""The ``interpod`` mix of ``bench engine``: every pod placed, and the placements keep the pools' hard rules."""

from __future__ import annotations

from common.records import node_from_json, pod_from_json
from scale.bench.engine import run_engine_bench
from scale.cluster.nodes import LABEL_ZONE, generate_nodes
from scale.workload import POOL_LABEL, POOL_SIZE, interpod_pod, pool_rule_violations
from worker.cache import Cache
from worker.scheduler import build_engine
from worker.settings import WorkerSettings


def test_the_interpod_mix_places_every_pod_within_its_pools_rules() -> None:
    cache = Cache()
    for obj in generate_nodes(60):
        cache.upsert_node(node_from_json(obj))
    engine = build_engine(WorkerSettings(), cache)
    placed: list[tuple[str, str]] = []
    for i in range(400):
        pod = pod_from_json(interpod_pod(i))
        d = engine.schedule(pod)
        assert d.node is not None, d.message
        cache.assume(pod, d.node)
        placed.append((pod.labels[POOL_LABEL], d.node))
    zone_of = {str(name): info.node.labels[LABEL_ZONE] for name, info in cache.nodes.items()}
    audit = pool_rule_violations(placed, zone_of)
    assert audit["skew_violations"] == 0 and audit["anti_affinity_violations"] == 0, audit
    assert audit["spread_pools"] == audit["anti_affinity_pools"] == 400 // POOL_SIZE // 3 + 1


def test_pool_rule_violations_finds_a_skewed_spread_pool_and_a_shared_node() -> None:
    zone_of = {"a1": "local-1a", "a2": "local-1a", "b1": "local-1b", "c1": "local-1c"}
    clean = [("pool-0", "a1"), ("pool-0", "b1"), ("pool-0", "c1"), ("pool-0", "a2"), ("pool-1", "a1")]
    clean += [("pool-1", "a2"), ("pool-2", "a1"), ("pool-2", "a1")]  # pool-2: preferred rules only
    assert pool_rule_violations(clean, zone_of) == {
        "spread_pools": 1,
        "skew_violations": 0,
        "anti_affinity_pools": 1,
        "anti_affinity_violations": 0,
    }
    skewed = [("pool-3", "a1"), ("pool-3", "a2"), ("pool-4", "b1"), ("pool-4", "b1")]  # 2-0-0; two on b1
    audit = pool_rule_violations(skewed, zone_of)
    assert (audit["skew_violations"], audit["anti_affinity_violations"]) == (1, 1)


def test_bench_engine_runs_the_interpod_mix() -> None:
    r = run_engine_bench(50, 100, mix="interpod")
    assert r.mix == "interpod" and r.placed == 100
