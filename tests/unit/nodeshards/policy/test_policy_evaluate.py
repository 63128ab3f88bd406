"""Evaluation: Volcano's filter -> sort -> select per scheduler in config order, plus hysteresis and the move
budget. Damping is off unless a test turns it on (see ``_policy_builders.policy``)."""

from __future__ import annotations

import random

import pytest

from common.records import NodeName
from coordinator.nodeshards.policy import NodeView, ShardMove
from coordinator.nodeshards.policy.pipeline import Damping, rank
from tests.unit.nodeshards.policy._policy_builders import band, limit, node, policy, scheduler, warmup

VOLCANO = scheduler("volcano", "volcano", band(0.0, 0.6))
AGENT = scheduler("agent-scheduler", "agent", band(0.7, 1.0))


def names(*items: str) -> tuple[NodeName, ...]:
    return tuple(NodeName(i) for i in items)


def test_band_filter_is_inclusive_on_rounded_percentages() -> None:
    p = policy(scheduler("agent-scheduler", "agent", band(0.3, 0.6)))
    nodes = [
        node("below", 0.29),
        node("rounds-up-in", 0.295),  # 29.5 % -> 30 %
        node("low-edge", 0.30),
        node("high-edge", 0.60),
        node("rounds-up-out", 0.605),  # 60.5 % -> 61 %
        node("above", 0.61),
        node("no-cpu", 0.5, alloc=0),
    ]
    assert p.evaluate(nodes).desired["agent-scheduler"] == names("high-edge", "low-edge", "rounds-up-in")


def test_overcommitted_node_counts_as_full() -> None:
    p = policy(AGENT)
    over = NodeView(NodeName("over"), 4000, 4400)
    assert over.util_pct == 100
    assert p.evaluate([over]).desired["agent-scheduler"] == names("over")


def test_weighted_sort_reproduces_volcanos_pipeline_example() -> None:
    # Volcano's TestPipelineFilterScoreClamp: allocation-rate [0, 0.6] x1 + warmup (label "warmup") x2.
    p = policy(scheduler("vol", "agent", band(0.0, 0.6), warmup(2, warmupLabel="warmup"), limit(5)))
    yes, no = {"warmup": "true"}, {"warmup": "false"}
    nodes = [
        node("n1", 0.10, labels=yes),
        node("n2", 0.55, labels=no),
        node("n3", 0.05, labels=yes),
        node("n4", 0.40, labels=no),
        node("n5", 0.65, labels=yes),  # outside the band
        node("n6", 0.90, labels=no),  # outside the band
        node("n7", 0.30, labels=yes),
        node("n8", 0.30, labels=no, alloc=0),  # no utilisation: filtered out
    ]
    ranked = rank(p.sharding.schedulers[0], nodes, Damping())
    assert [n.name for n in ranked] == ["n7", "n1", "n3", "n2", "n4"]
    assert p.evaluate(nodes).desired["vol"] == names("n1", "n2", "n3", "n4", "n7")


def test_high_weight_band_score_beats_low_weight_warmup() -> None:
    p = policy(scheduler("agent-scheduler", "agent", band(0.0, 1.0, weight=10), warmup(1), limit(1)))
    nodes = [node("warm-idle", 0.0, warm=True), node("cold-busy", 0.6)]
    assert p.evaluate(nodes).desired["agent-scheduler"] == names("cold-busy")


def test_warmup_without_filter_offers_every_node_warm_first() -> None:
    p = policy(scheduler("agent-scheduler", "agent", warmup(1)))
    nodes = [node("a", 0.5, warm=True), node("b", 0.5), node("c", 0.9, labels={"other": "x"})]
    assert p.evaluate(nodes).desired["agent-scheduler"] == names("a", "b", "c")
    capped = policy(scheduler("agent-scheduler", "agent", warmup(1), limit(1)))
    assert capped.evaluate(nodes).desired["agent-scheduler"] == names("a")


def test_node_limit_truncates_best_first_and_reports_shortfall() -> None:
    p = policy(scheduler("agent-scheduler", "agent", band(0.0, 1.0), limit(2, min_nodes=1)))
    nodes = [node("a", 0.4), node("b", 0.8), node("c", 0.2), node("d", 0.6)]
    result = p.evaluate(nodes)
    assert result.desired["agent-scheduler"] == names("b", "d")
    assert result.unassigned == names("a", "c")
    assert result.shortfall == {}
    short = policy(scheduler("agent-scheduler", "agent", band(0.7, 1.0), limit(10, min_nodes=3)))
    assert short.evaluate(nodes).shortfall == {"agent-scheduler": 2}


def test_earlier_scheduler_takes_first_and_never_shares() -> None:
    first = scheduler("first", "volcano", band(0.0, 1.0))
    second = scheduler("agent-scheduler", "agent", band(0.0, 1.0))
    nodes = [node("x", 0.9), node("y", 0.1)]
    result = policy(first, second).evaluate(nodes)
    assert result.desired == {"first": names("x", "y"), "agent-scheduler": ()}
    capped = scheduler("first", "volcano", band(0.0, 1.0), limit(1))
    result = policy(capped, second).evaluate(nodes)
    assert result.desired == {"first": names("x"), "agent-scheduler": names("y")}
    # Config order decides, not the type: the agent entry first takes the busiest node.
    agent_first = scheduler("agent-scheduler", "agent", band(0.0, 1.0), limit(1))
    result = policy(agent_first, scheduler("first", "volcano", band(0.0, 1.0))).evaluate(nodes)
    assert result.desired == {"agent-scheduler": names("x"), "first": names("y")}


def test_volcano_and_agent_split_by_band() -> None:
    nodes = [node(f"n{i}", i / 10) for i in range(11)]
    result = policy(VOLCANO, AGENT).evaluate(nodes)
    assert result.desired["volcano"] == names("n0", "n1", "n2", "n3", "n4", "n5", "n6")
    assert result.desired["agent-scheduler"] == names("n10", "n7", "n8", "n9")
    assert result.owner(NodeName("n7")) == "agent-scheduler"
    assert result.owner(NodeName("zz")) is None
    assert sum(len(n) for n in result.desired.values()) == 11 and result.moves == ()


def test_band_hysteresis_keeps_a_node_oscillating_at_an_edge() -> None:
    damped = policy(VOLCANO, AGENT, band_hysteresis=0.05)
    plain = policy(VOLCANO, AGENT)
    series = [0.58, 0.62, 0.59, 0.64, 0.61, 0.57, 0.63]
    for p, expect_flaps in ((damped, 0), (plain, 5)):
        holder: str | None = "volcano"
        flaps = 0
        for util in series:
            owner = p.evaluate([node("n", util, holder=holder)]).owner(NodeName("n"))
            flaps += owner != holder
            holder = owner
        assert flaps == expect_flaps
    # Beyond the margin the node does leave.
    result = damped.evaluate([node("n", 0.66, holder="volcano")])
    assert result.moves == (ShardMove(NodeName("n"), "volcano", None),)
    assert damped.evaluate([node("n", 0.66, holder="agent-scheduler")]).moves == ()
    # The margin protects incumbents only: an unheld node at 0.62 belongs to nobody.
    assert damped.evaluate([node("n", 0.62)]).unassigned == names("n")


def test_rank_hysteresis_keeps_an_incumbent_against_a_slightly_better_challenger() -> None:
    agent = scheduler("agent-scheduler", "agent", band(0.7, 1.0), limit(1))
    nodes = [node("incumbent", 0.80, holder="agent-scheduler"), node("challenger", 0.81)]
    assert policy(agent).evaluate(nodes).desired["agent-scheduler"] == names("challenger")
    assert policy(agent, rank_hysteresis=0.05).evaluate(nodes).desired["agent-scheduler"] == names(
        "incumbent"
    )
    much_better = [nodes[0], node("challenger", 0.95)]
    result = policy(agent, rank_hysteresis=0.05).evaluate(much_better)
    assert result.desired["agent-scheduler"] == names("challenger")


def test_move_budget_defers_and_converges() -> None:
    p = policy(VOLCANO, AGENT, max_moves=3)
    util = 0.9  # every node left volcano's band
    holders: dict[str, str | None] = {f"n{i}": "volcano" for i in range(10)}
    rounds = 0
    while True:
        result = p.evaluate([node(name, util, holder=h) for name, h in holders.items()])
        assert len(result.moves) <= 3
        if not result.moves:
            break
        if rounds == 0:
            assert [m.node for m in result.moves] == ["n0", "n1", "n2"]  # urgency ties broken by name
            assert len(result.deferred) == 7
            assert result.desired["volcano"] == names("n3", "n4", "n5", "n6", "n7", "n8", "n9")
        holders = {name: result.owner(NodeName(name)) for name in holders}
        rounds += 1
    assert rounds == 4
    assert set(holders.values()) == {"agent-scheduler"}


def test_unheld_nodes_join_without_spending_the_budget() -> None:
    p = policy(VOLCANO, AGENT, max_moves=0)
    nodes = [node(f"n{i:02}", (i % 10) / 10) for i in range(40)]
    result = p.evaluate(nodes)
    assert result.moves == () and result.deferred == ()
    assert len(result.unassigned) == 0


def test_zero_budget_freezes_held_nodes() -> None:
    p = policy(VOLCANO, AGENT, max_moves=0)
    result = p.evaluate([node("a", 0.9, holder="volcano"), node("b", 0.1, holder="agent-scheduler")])
    assert result.desired == {"volcano": names("a"), "agent-scheduler": names("b")}
    assert result.moves == ()
    assert {m.node for m in result.deferred} == {"a", "b"}


def test_budget_serves_band_violations_before_ranking_changes() -> None:
    agent = scheduler("agent-scheduler", "agent", band(0.7, 1.0), limit(1))
    nodes = [
        node("a-crowded", 0.75, holder="agent-scheduler"),  # still in band, displaced by rank
        node("z-leaving", 0.95, holder="volcano"),  # outside volcano's band
    ]
    result = policy(VOLCANO, agent, max_moves=1).evaluate(nodes)
    # z leaves volcano first; a keeps agent's only slot until the next sync.
    assert result.moves == (ShardMove(NodeName("z-leaving"), "volcano", None),)
    assert result.deferred == (ShardMove(NodeName("a-crowded"), "agent-scheduler", None),)
    nxt = policy(VOLCANO, agent, max_moves=1).evaluate(
        [node("a-crowded", 0.75, holder="agent-scheduler"), node("z-leaving", 0.95)]
    )
    assert nxt.desired["agent-scheduler"] == names("z-leaving")


def test_pinned_holder_may_exceed_a_lowered_limit() -> None:
    agent = scheduler("agent-scheduler", "agent", band(0.7, 1.0), limit(1))
    nodes = [node(n, 0.8, holder="agent-scheduler") for n in ("a", "b", "c")] + [node("d", 0.9)]
    result = policy(agent, max_moves=0).evaluate(nodes)
    assert result.desired["agent-scheduler"] == names("a", "b", "c")
    assert result.unassigned == names("d")


def test_holder_that_left_the_config_counts_as_no_holder() -> None:
    result = policy(VOLCANO, AGENT, max_moves=0).evaluate([node("a", 0.9, holder="retired-scheduler")])
    assert result.desired["agent-scheduler"] == names("a")
    assert result.moves == () and result.deferred == ()


def test_evaluation_is_deterministic_and_ties_break_by_name() -> None:
    agent = scheduler("agent-scheduler", "agent", band(0.0, 1.0), warmup(1), limit(3))
    nodes = [node(f"n{i:03}", 0.5, warm=i % 7 == 0, holder=None) for i in range(60)]
    expected = policy(agent).evaluate(nodes)
    assert expected.desired["agent-scheduler"] == names("n000", "n007", "n014")
    rng = random.Random(7)
    for _ in range(20):
        shuffled = nodes[:]
        rng.shuffle(shuffled)
        assert policy(agent).evaluate(shuffled) == expected


def test_duplicate_node_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="given twice"):
        policy(AGENT).evaluate([node("a", 0.8), node("a", 0.9)])


@pytest.mark.parametrize("seed", range(25))
def test_invariants_on_random_clusters(seed: int) -> None:
    rng = random.Random(seed)
    budget = rng.choice([None, 0, 1, 5, 20])
    p = policy(
        scheduler("volcano", "volcano", band(0.0, 0.6), warmup(2), limit(rng.randint(2, 40), 2)),
        scheduler("agent-scheduler", "agent", band(0.5, 1.0), warmup(5), limit(rng.randint(2, 40), 2)),
        band_hysteresis=rng.choice([0.0, 0.05]),
        rank_hysteresis=rng.choice([0.0, 0.1]),
        max_moves=budget,
    )
    holders = [None, "volcano", "agent-scheduler", "gone"]
    nodes = [
        node(f"n{i}", rng.random() * 1.1, warm=rng.random() < 0.2, holder=rng.choice(holders))
        for i in range(rng.randint(0, 80))
    ]
    result = p.evaluate(nodes)
    chosen = [n for group in result.desired.values() for n in group]
    assert len(chosen) == len(set(chosen))  # exclusive
    assert set(chosen) | set(result.unassigned) == {n.name for n in nodes}
    assert budget is None or len(result.moves) <= budget
    if budget is None:
        assert result.deferred == ()
    for n in nodes:
        if n.holder in ("volcano", "agent-scheduler") and result.owner(n.name) != n.holder:
            assert ShardMove(n.name, n.holder, result.owner(n.name)) in result.moves


@pytest.mark.parametrize("seed", range(25))
def test_resting_nodes_stay_with_their_holder_and_the_rest_is_evaluated_as_without_them(seed: int) -> None:
    """Rule 4 (minResidenceSeconds): a resting node never moves, is never a move, and the other nodes are
    placed exactly as if the resting ones had been pinned by the move budget (the same pinned second pass)."""
    rng = random.Random(seed)
    budget = rng.choice([None, 1, 5, 20])
    p = policy(
        scheduler("volcano", "volcano", band(0.0, 0.6), warmup(2), limit(rng.randint(2, 40), 2)),
        scheduler("agent-scheduler", "agent", band(0.5, 1.0), warmup(5), limit(rng.randint(2, 40), 2)),
        band_hysteresis=rng.choice([0.0, 0.05]),
        rank_hysteresis=rng.choice([0.0, 0.1]),
        max_moves=budget,
    )
    holders = [None, "volcano", "agent-scheduler", "gone"]
    nodes = [
        node(f"n{i}", rng.random() * 1.1, warm=rng.random() < 0.2, holder=rng.choice(holders))
        for i in range(rng.randint(0, 80))
    ]
    resting = {n.name for n in nodes if rng.random() < 0.3}
    result = p.evaluate(nodes, resting)
    assert budget is None or len(result.moves) <= budget
    for n in nodes:
        if n.name in resting and n.holder in ("volcano", "agent-scheduler"):
            assert result.owner(n.name) == n.holder
            assert all(m.node != n.name for m in (*result.moves, *result.deferred))
    # Resting nodes without a configured holder are not pinned (nobody to stay with): as if not resting.
    unheld = {n.name for n in nodes if n.holder not in ("volcano", "agent-scheduler")}
    assert p.evaluate(nodes, resting & unheld) == p.evaluate(nodes)
    # Nothing resting: exactly the evaluation without the argument.
    assert p.evaluate(nodes, ()) == p.evaluate(nodes)


def test_a_resting_node_keeps_its_slot_and_another_node_is_chosen() -> None:
    p = policy(
        scheduler("agent-scheduler", "agent", band(0.0, 1.0), limit(2)),
        scheduler("volcano", "volcano", band(0.0, 1.0)),
        rank_hysteresis=1.0,
    )
    # a and b were just lent to volcano; c and d are volcano's since long. The agent wants 2 nodes again.
    nodes = [node(x, 0.5, holder="volcano") for x in "abcd"]
    assert p.evaluate(nodes).desired["agent-scheduler"] == names("a", "b")
    rotated = p.evaluate(nodes, {NodeName("a"), NodeName("b")})
    assert rotated.desired["agent-scheduler"] == names("c", "d")
    assert {m.node for m in rotated.moves} == {"c", "d"}
