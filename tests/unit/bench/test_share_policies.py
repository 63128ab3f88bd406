"""The share run's pure parts (``scale.bench.share_run`` / ``share_report``): the three configurations parse with
the coordinator's own policy code, and the goal verdict."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from common.records import NodeName
from coordinator.nodeshards.policy import NodeView, parse_configmap
from scale.bench.share import ShareSpec, scheduled_levels, scheduled_targets
from scale.bench.share_report import verdict
from scale.bench.share_run import (
    KNOWN,
    SCHEDULED,
    STATIC,
    TUNED,
    VOLCANO,
    _yaml,
    policies,
    scheduled_sharding,
    share_node,
    tolerate,
    tuned_sharding,
)


def _parsed(name: str, nodes: int = 12, agent_nodes: int = 4) -> Any:
    p = policies(ShareSpec(), nodes=nodes, agent_nodes=agent_nodes, agent="a", batch="b")[name]
    data = {"sharding.yaml": p.sharding}
    if p.settings:
        data["agent-scheduler.yaml"] = p.settings
    return parse_configmap(data)


def test_every_configuration_is_a_valid_sharding_configmap() -> None:
    for name in KNOWN:
        policy = _parsed(name)
        assert [s.name for s in policy.sharding.schedulers] == ["a", "b"]
        assert policy.sharding.shard_sync_period_seconds < 60  # compressed like every other time


def test_static_split_gives_the_agent_its_nodes_and_then_never_moves() -> None:
    policy = _parsed(STATIC)
    idle = [NodeView(f"n{i:02d}", 4000, 0) for i in range(12)]  # type: ignore[arg-type]
    first = policy.evaluate(idle)
    assert len(first.desired["a"]) == 4 and len(first.desired["b"]) == 8
    owners = first.owners
    busy = [NodeView(n.name, 4000, 4000 if owners[n.name] == "b" else 0, {}, owners[n.name]) for n in idle]
    assert policy.evaluate(busy).moves == ()


def test_volcano_example_is_shipped_semantics_renamed() -> None:
    policy = _parsed(VOLCANO)
    agent = policy.sharding.schedulers[0]
    assert agent.filters[0].describe() == "util 0.70-1.00"  # as shipped: agents only on busy nodes


def test_tuned_releases_idle_agent_nodes_beyond_its_free_cpu_target() -> None:
    policy = _parsed(TUNED)
    spec = ShareSpec()
    per_node = 4000
    need = int(spec.tuned_free_cpu * 1000 // per_node) + 1
    # a few more than needed (within one sync's move budget), all idle and held by the agent shard
    idle = [NodeView(f"n{i:02d}", per_node, 0, {}, "a") for i in range(need + 3)]  # type: ignore[arg-type]
    result = policy.evaluate(idle)
    assert len(result.desired["a"]) <= need and len(result.moves) <= spec.tuned_max_moves
    assert all(m.target == "b" for m in result.moves)


def test_scheduled_is_the_tuned_policy_with_its_target_raised_ahead_of_each_wave() -> None:
    spec = ShareSpec(
        wave_period_s=120, wave_burst_s=20, scheduled_lead_s=50, scheduled_hold_s=10, compression=10
    )
    scheduled, tuned = _parsed(SCHEDULED), _parsed(TUNED)
    assert scheduled.sharding.shard_sync_period_seconds == tuned.sharding.shard_sync_period_seconds
    # the first wave starts under the high target; each later one gets it lead_s earlier; low hold_s after
    # each burst; lead + hold never exceed the quiet part of a period
    assert scheduled_targets(ShareSpec(scheduled_lead_s=90, scheduled_hold_s=30))[:2] == [
        (5.0, 4.0),
        (5.0, 28.0),
    ]
    targets = scheduled_targets(spec)
    assert targets[:3] == [(3.0, 4.0), (7.0, 28.0), (15.0, 4.0)]
    assert [t for t, _ in targets] == sorted(t for t, _ in targets)
    assert len(targets) == 2 * 5  # five waves in 600 s, and the sixth's high switch before the end
    assert targets[-1] == (spec.real(600 - 50), 28.0)
    # every switch is a valid policy for the coordinator, differing only in the target
    for _, cores in targets:
        doc = tuned_sharding(spec, cores, agent="a", batch="b")
        assert doc["schedulerConfigs"][0]["policies"][1]["arguments"] == {"minFreeCPU": cores}


ROTATING = ShareSpec(
    compression=5,
    batch_runtime_s=40,
    lifetime_max_s=60,
    tuned_sync_s=20,
    tuned_max_moves=8,
    tuned_rank_hysteresis=2.0,  # above any score difference (one weight-1 scorer): incumbents always win
    tuned_residence_s=60,
    scheduled_nodes_high=7,
    scheduled_nodes_low=1,
    scheduled_lead_s=50,
    scheduled_hold_s=10,
)
# Waves twice as far apart: the agent gives its nodes back after 60 s, a lent node stays with batch 200 s (more
# than the 150 s gap between an agent stint's end and the next wave's lead).
ROTATING_LONG = dataclasses.replace(
    ROTATING, simulated_s=960, wave_period_s=240, scheduled_hold_s=20, tuned_batch_residence_s=200
)


@pytest.mark.parametrize("spec", [ROTATING, ROTATING_LONG], ids=["period-120", "period-240"])
def test_scheduled_node_counts_with_residence_rotate_the_lent_nodes_one_move_per_node_per_wave(
    spec: ShareSpec,
) -> None:
    """The committed scheduled configuration, evaluated as the coordinator does (on every switch and every sync,
    resting nodes = moved less than minResidenceSeconds ago) on 16 nodes where every batch node is full: the
    agent shard has its 7 nodes at each wave's start, and no node moves twice in one wave period."""
    settings = policies(spec, nodes=16, agent_nodes=7, agent="a", batch="b")[SCHEDULED].settings
    level = {
        up: parse_configmap(
            {
                "sharding.yaml": _yaml(scheduled_sharding(spec, up, agent="a", batch="b")),
                "agent-scheduler.yaml": settings,
            }
        )
        for up in (True, False)
    }
    shards = level[True].settings.shards
    assert shards.residence("a") == spec.real(60)
    period, sync = spec.real(spec.wave_period_s), spec.real(spec.tuned_sync_s)
    switches = scheduled_levels(spec)
    times = sorted(
        {t for t, _ in switches} | {k * sync for k in range(int(spec.real(spec.simulated_s) / sync))}
    )
    holders: dict[NodeName, str] = {}
    moved_at: dict[NodeName, list[float]] = {}
    moved_to: dict[NodeName, str | None] = {}
    high = True
    agent_at_wave_start: list[int] = []
    for t in times:
        high = next((up for at, up in reversed(switches) if at <= t), True)
        views = [
            NodeView(
                NodeName(f"n{i:02d}"),
                4000,
                4000 if holders.get(NodeName(f"n{i:02d}")) == "b" else 0,  # batch nodes full, agents' idle
                {},
                holders.get(NodeName(f"n{i:02d}")),
            )
            for i in range(16)
        ]
        resting = {n for n, ts in moved_at.items() if t - ts[-1] < shards.residence(moved_to[n])}
        result = level[high].evaluate(views, resting)
        for move in result.moves:
            moved_at.setdefault(move.node, []).append(t)
            moved_to[move.node] = move.target
        holders = dict(result.owners)
        if t % period == 0:
            agent_at_wave_start.append(len(result.desired["a"]))
    assert agent_at_wave_start == [7] * round(spec.simulated_s / spec.wave_period_s)
    assert moved_at  # nodes were lent between waves
    for node, ts in moved_at.items():
        windows = [int(x // period) for x in ts]
        assert len(windows) == len(set(windows)), (node, ts)  # at most one move per wave period


def test_scheduled_node_counts_without_residence_move_nodes_twice_per_wave() -> None:
    """The same switches without minResidenceSeconds take back the nodes they just lent (what the rotation
    test guards against)."""
    spec = ShareSpec(
        scheduled_nodes_high=7, scheduled_nodes_low=1, tuned_max_moves=8, tuned_rank_hysteresis=2.0
    )
    parsed = {
        up: parse_configmap(
            {
                "sharding.yaml": _yaml(scheduled_sharding(spec, up, agent="a", batch="b")),
                "agent-scheduler.yaml": policies(spec, nodes=16, agent_nodes=7, agent="a", batch="b")[
                    SCHEDULED
                ].settings,
            }
        )
        for up in (True, False)
    }
    views = [NodeView(NodeName(f"n{i:02d}"), 4000, 0, {}, None) for i in range(16)]
    first = parsed[True].evaluate(views)
    lent = parsed[False].evaluate([NodeView(v.name, 4000, 1000, {}, first.owner(v.name)) for v in views])
    back = parsed[True].evaluate([NodeView(v.name, 4000, 1000, {}, lent.owner(v.name)) for v in views])
    assert back.desired["a"] == first.desired["a"]  # the lent nodes come straight back


def test_nodes_and_pods_of_a_configuration_carry_its_taint_and_toleration() -> None:
    node = share_node(2, 7, 4)
    assert node["metadata"]["name"] == "share-2-007" and node["status"]["allocatable"]["cpu"] == "4"
    assert node["spec"]["taints"][0]["value"] == "2"
    pod = tolerate({"spec": {"nodeSelector": {"x": "y"}}}, 2)
    assert "nodeSelector" not in pod["spec"] and pod["spec"]["tolerations"][0]["value"] == "2"


def _conf(**changes: Any) -> dict[str, Any]:
    base = {
        "cpu_alloc_mean": 0.6,
        "agent_unbound": 0,
        "agent_bound_p99_real_s": 1.0,
        "batch_wait_censored_mean_s": 100.0,
        "max_moves_node_wave": 0,
        "violations": [],
    }
    return base | changes


def test_verdict_needs_every_part_of_the_goal() -> None:
    static = _conf()
    assert verdict(static, _conf(cpu_alloc_mean=0.76, max_moves_node_wave=1))[0]
    assert not verdict(static, _conf(cpu_alloc_mean=0.74))[0]  # +14 points
    assert not verdict(static, _conf(cpu_alloc_mean=0.8, agent_bound_p99_real_s=1.5))[0]
    assert not verdict(static, _conf(cpu_alloc_mean=0.8, batch_wait_censored_mean_s=120.0))[0]
    assert not verdict(static, _conf(cpu_alloc_mean=0.8, max_moves_node_wave=2))[0]
    assert not verdict(static, _conf(cpu_alloc_mean=0.8, violations=["x"]))[0]
