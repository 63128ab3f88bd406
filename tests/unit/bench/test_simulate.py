"""The simulation at a small size: real policy, real engine (``scale.bench.simulate``)."""

from __future__ import annotations

import json

from coordinator.workershards.assignment import AssignmentConfig
from scale.bench import simulate


def test_small_simulation_balances_moves_little_and_decides() -> None:
    results = simulate.run(nodes=400, pods=4000, workers=[2, 4], sample=50, sample_workers=2, max_rounds=50)
    assert [r.workers for r in results] == [2, 4]
    for r in results:
        b = r.balance
        assert b.workers == r.workers
        assert b.capacity_ratio < 1.2  # the policy balances capacity, not node counts
        assert 0 < b.nodes_min <= b.nodes_max
        # a join moves about the newcomer's fair share of capacity, not a reshuffle
        assert r.join.moved > 0
        assert r.join.moved_capacity <= 1.5 * r.join.ideal_capacity
        # a leave moves the departed worker's nodes and barely anything else
        assert r.leave.ideal > 0
        assert r.leave.moved >= r.leave.ideal
        assert r.leave.moved_capacity <= 1.5 * r.leave.ideal_capacity
        e = r.engine
        assert e.sampled_workers == 2
        assert e.timed_per_worker == 50 and e.prefilled_per_worker == 4000 // r.workers - 50
        assert e.placed + e.unschedulable == 2 * 50
        assert e.unschedulable == 0
        assert all(rate > 0 for rate in e.decisions_per_s)
        assert r.cluster_decisions_per_s > 0
        json.dumps(r.to_json())
    text = simulate.render(results, config=AssignmentConfig())
    assert text.count("\n| ") == 2 + 1  # header separator + two rows
    assert "- 2 workers: join " in text and "in transit at once" in text


def test_a_join_reaches_its_fair_share_within_ten_rounds_and_a_leave_in_one() -> None:
    (r,) = simulate.run(nodes=20_000, pods=200, workers=[8], sample=5, sample_workers=1, max_rounds=30)
    assert r.join.settled and r.leave.settled
    assert r.join.rounds_to_fair_share is not None and r.join.rounds_to_fair_share <= 10
    assert r.leave.rounds_to_fair_share == 1
    limit = AssignmentConfig().transit_limit(20_000)
    assert 0 < r.join.max_in_transit <= limit and r.leave.max_in_transit <= limit
    assert r.to_json()["join"]["rounds_to_fair_share"] == r.join.rounds_to_fair_share


def test_an_unsettled_join_is_estimated_not_run() -> None:
    (r,) = simulate.run(nodes=600, pods=600, workers=[2], sample=10, sample_workers=1, max_rounds=1)
    assert not r.join.settled
    assert r.join.rounds == 1
    assert r.join.estimated_rounds > 0 and r.join.estimated_moved > 0
    assert r.join.simulated_s == (1 + r.join.estimated_rounds) * simulate.ROUND_SECONDS


def test_prefill_packs_first_fit_within_capacity() -> None:
    fleet = simulate.build_fleet(20)
    from common.records import pod_from_json
    from scale.workload import agent_pod
    from worker.cache import Cache

    cache = Cache()
    for record in fleet.values():
        cache.upsert_node(record)
    protos = [pod_from_json(agent_pod(i)) for i in range(4)]
    placed = simulate.prefill(cache, 300, protos, tag="t")
    assert placed == 300
    for info in cache.nodes.values():
        assert info.requested.milli_cpu <= info.node.allocatable.milli_cpu
        assert len(info.pods) <= info.node.allocatable.pods
        if info.node.taints:
            assert not info.pods
