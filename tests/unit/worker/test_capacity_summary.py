"""The capacity summary kept by the index matches a brute-force walk after any sequence of changes."""

from __future__ import annotations

import random

from common.records import NodeName, PodKey
from tests.builders import make_node, make_pod
from tests.unit.worker.helpers import FixedShard
from worker.cache import Cache
from worker.index import CapacitySummary


def brute_force(cache: Cache) -> CapacitySummary:
    free_cpu = free_memory = max_cpu = max_memory = 0
    names = cache.index.names()
    for name in names:
        info = cache.nodes[NodeName(name)]
        cpu, memory = info.free_milli_cpu(), info.free_memory()
        free_cpu += cpu
        free_memory += memory
        max_cpu, max_memory = max(max_cpu, cpu), max(max_memory, memory)
    return CapacitySummary(len(names), free_cpu, free_memory, max_cpu, max_memory)


def test_empty_index_summarises_to_zero() -> None:
    assert Cache().index.summary() == CapacitySummary()


def test_summary_follows_assume_forget_and_removal() -> None:
    cache = Cache()
    cache.upsert_node(make_node("a", cpu="4", memory="8Gi").record())
    cache.upsert_node(make_node("b", cpu="2", memory="16Gi").record())
    assert cache.index.summary() == CapacitySummary(2, 6000, 24 * 2**30, 4000, 16 * 2**30)
    pod = make_pod("p").req(cpu="3", memory="1Gi").record()
    cache.assume(pod, NodeName("a"))
    assert cache.index.summary() == CapacitySummary(2, 3000, 23 * 2**30, 2000, 16 * 2**30)
    cache.remove_node(NodeName("b"))
    assert cache.index.summary() == CapacitySummary(1, 1000, 7 * 2**30, 1000, 7 * 2**30)
    cache.forget(pod.key)
    assert cache.index.summary() == CapacitySummary(1, 4000, 8 * 2**30, 4000, 8 * 2**30)


def test_node_at_its_pod_limit_leaves_the_summary() -> None:
    cache = Cache()
    cache.upsert_node(make_node("a", pods="1").record())
    cache.assume(make_pod("p").record(), NodeName("a"))
    assert cache.index.summary() == CapacitySummary()


def test_summary_matches_brute_force_after_random_changes() -> None:
    rng = random.Random(7)
    shard = FixedShard()
    cache = Cache(shard=shard)
    names = [f"n{i}" for i in range(40)]
    placed: dict[PodKey, str] = {}
    seq = 0
    for step in range(4000):
        action = rng.random()
        if action < 0.15:
            cpu, memory = rng.choice(["1", "2", "4", "8", "32"]), rng.choice(["1Gi", "4Gi", "16Gi", "64Gi"])
            cache.upsert_node(make_node(rng.choice(names), cpu=cpu, memory=memory, pods="8").record())
        elif action < 0.2:
            cache.remove_node(NodeName(rng.choice(names)))
        elif action < 0.3:
            shard.set(n for n in names if rng.random() < 0.8)
        elif action < 0.7:
            seq += 1
            key = f"p{seq}"
            node = rng.choice(names)
            cpu, memory = rng.choice(["100m", "250m", "1", "3"]), rng.choice(["128Mi", "1Gi", "6Gi"])
            pod = make_pod(key).req(cpu=cpu, memory=memory).on(node).record()
            cache.upsert_pod(pod)
            placed[pod.key] = node
        elif placed:
            key = rng.choice(sorted(placed))
            del placed[key]
            cache.remove_pod(key)
        assert cache.index.summary() == brute_force(cache), f"step {step}"
    assert len(cache.index) > 0  # the walk did exercise a populated index


def test_a_summary_is_kept_until_a_node_changes() -> None:
    cache = Cache()
    cache.upsert_node(make_node("a", cpu="4", memory="8Gi").record())
    first = cache.index.summary()
    assert cache.index.summary() is first  # a worker at rest summarises every 100 ms: no walk each time
    cache.assume(make_pod("p").req(cpu="1").record(), NodeName("a"))
    assert cache.index.summary() == CapacitySummary(1, 3000, 8 * 2**30, 3000, 8 * 2**30)
