"""The share workload's plan (``scale.bench.share``): waves, lifetimes, the batch backlog, determinism."""

from __future__ import annotations

import pytest

from scale.bench.share import MIN_SIMULATED_S, ShareSpec, agent_demand, share_plan
from scale.bench.workloads import LIFETIME_ANNOTATION


def ms(value: str) -> float:
    assert value.endswith("ms")
    return float(value[:-2])


def test_agents_arrive_in_bursts_with_quiet_periods_between() -> None:
    spec = ShareSpec()
    plan = share_plan(spec, namespace="ns", scheduler_name="agent")
    times = [a.at for a in plan.agents]
    assert times == sorted(times) and plan.agents
    for t in times:  # within a burst window of its period, in real seconds
        simulated = t * spec.compression
        assert simulated % spec.wave_period_s < spec.wave_burst_s
    waves = {int(t * spec.compression // spec.wave_period_s) for t in times}
    assert waves == set(range(int(MIN_SIMULATED_S // spec.wave_period_s)))  # every period has its burst
    expected = spec.wave_rate * spec.wave_burst_s * len(waves)
    assert 0.8 * expected < len(times) < 1.2 * expected
    assert max(times) < spec.simulated_s / spec.compression


def test_lifetimes_span_seconds_to_minutes_compressed() -> None:
    spec = ShareSpec()
    plan = share_plan(spec, namespace="ns", scheduler_name="agent")
    lives = [ms(a.pod["metadata"]["annotations"][LIFETIME_ANNOTATION]) for a in plan.agents]
    low, high = spec.lifetime_min_s / spec.compression * 1000, spec.lifetime_max_s / spec.compression * 1000
    assert all(low - 1 <= x <= high + 1 for x in lives)
    assert min(lives) < 2 * low and max(lives) > high / 2  # both ends are used
    assert all(a.pod["spec"]["schedulerName"] == "agent" for a in plan.agents)


def test_batch_backlog_is_queued_at_the_start_for_the_default_scheduler() -> None:
    spec = ShareSpec(batch_backlog=50)
    plan = share_plan(spec, namespace="ns", scheduler_name="agent")
    assert len(plan.batch_backlog) == 50 and all(a.at == 0 for a in plan.batch_backlog)
    pod = plan.batch_backlog[0].pod
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    assert ms(pod["metadata"]["annotations"][LIFETIME_ANNOTATION]) == 24000.0


def test_plan_is_deterministic_and_bad_specs_are_refused() -> None:
    a = share_plan(ShareSpec(seed=3), namespace="ns", scheduler_name="x")
    b = share_plan(ShareSpec(seed=3), namespace="ns", scheduler_name="x")
    assert [(x.at, x.pod) for x in a.agents] == [(x.at, x.pod) for x in b.agents]
    with pytest.raises(ValueError):
        ShareSpec(simulated_s=60)
    with pytest.raises(ValueError):
        ShareSpec(wave_burst_s=200)
    with pytest.raises(ValueError):
        ShareSpec(scheduled_free_cpu_low=8, scheduled_free_cpu_high=4)
    with pytest.raises(ValueError):
        ShareSpec(scheduled_nodes_high=3, scheduled_nodes_low=4)
    with pytest.raises(ValueError):
        ShareSpec(scheduled_nodes_high=3, scheduled_nodes_low=0)
    with pytest.raises(ValueError):
        ShareSpec(tuned_residence_s=-1)


def test_agent_demand_follows_the_waves() -> None:
    spec = ShareSpec(lifetime_max_s=60.0)
    demand = agent_demand(spec)
    assert len(demand) == 600 and min(demand) >= 0
    period = int(spec.wave_period_s)
    # lifetimes end within 60 s of a burst's end: the last seconds before every wave are quiet
    assert all(demand[k * period - 1] == 0 for k in range(1, 5))
    assert max(demand) > 5 * sum(demand) / len(demand) / 2  # high peak-to-mean
