"""Workload arrival plans (``scale.bench.workloads``) and the churn kwok stages (``scale.bench.stages``)."""

from __future__ import annotations

import itertools
import random
import statistics
from typing import Any

import pytest
import yaml

from scale.bench.pulls import PULL_ANNOTATION, PULL_DELAY_ANNOTATION
from scale.bench.stages import BENCH_STAGES, bench_kwok_config
from scale.bench.workloads import (
    AGENT,
    BATCH,
    LIFETIME_ANNOTATION,
    NODE_ANNOTATION,
    RUN_LABEL,
    WorkloadSpec,
    arrivals,
    default_workloads,
    poisson_times,
)


def test_a_burst_arrives_at_once_with_the_agent_pod_shapes() -> None:
    plan = arrivals(WorkloadSpec(name="burst", pods=50), namespace="ns", scheduler_name="agent-scheduler")
    assert len(plan) == 50
    assert {a.at for a in plan} == {0.0}
    assert {a.kind for a in plan} == {AGENT}
    pod = plan[0].pod
    assert pod["metadata"]["namespace"] == "ns"
    assert pod["metadata"]["labels"][RUN_LABEL] == "burst"
    assert pod["spec"]["schedulerName"] == "agent-scheduler"
    cpu = pod["spec"]["containers"][0]["resources"]["requests"]["cpu"]
    assert cpu in ("100m", "200m", "250m", "500m")
    assert len({a.name for a in plan}) == 50


def test_plans_are_identical_for_every_scheduler_but_the_name() -> None:
    spec = WorkloadSpec(name="steady", pods=30, rate=10.0)
    a = arrivals(spec, namespace="x", scheduler_name="a")
    b = arrivals(spec, namespace="x", scheduler_name="b")
    assert [(p.at, p.name) for p in a] == [(p.at, p.name) for p in b]
    assert [p.pod["spec"]["containers"] for p in a] == [p.pod["spec"]["containers"] for p in b]


def test_poisson_arrivals_have_the_asked_rate() -> None:
    times = poisson_times(20000, 200.0, random.Random(1))
    assert times == sorted(times)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert statistics.mean(gaps) == pytest.approx(1 / 200.0, rel=0.03)
    assert poisson_times(3, 0.0, random.Random(1)) == [0.0, 0.0, 0.0]


def test_churn_pods_carry_a_lifetime_around_the_mean() -> None:
    plan = arrivals(
        WorkloadSpec(name="churn", pods=200, rate=50.0, lifetime_s=10.0), namespace="n", scheduler_name="s"
    )
    lifetimes = [int(a.pod["metadata"]["annotations"][LIFETIME_ANNOTATION].removesuffix("ms")) for a in plan]
    assert min(lifetimes) >= 5000 and max(lifetimes) <= 15000
    assert statistics.mean(lifetimes) == pytest.approx(10000, rel=0.1)


def test_mix_adds_batch_pods_for_the_default_scheduler() -> None:
    plan = arrivals(
        WorkloadSpec(name="mix", pods=100, rate=10.0, mix=True, batch_rate=2.0),
        namespace="n",
        scheduler_name="s",
    )
    batch = [a for a in plan if a.kind == BATCH]
    assert 10 <= len(batch) <= 30  # 2/s over the ~10 s the agent pods take
    assert all(a.pod["spec"]["schedulerName"] == "default-scheduler" for a in batch)
    assert all(a.pod["spec"]["nodeSelector"] == {"node-pool": "batch"} for a in batch)
    assert [a.at for a in plan] == sorted(a.at for a in plan)
    agent = [a for a in plan if a.kind == AGENT]
    assert any("affinity" in a.pod["spec"] or "nodeSelector" in a.pod["spec"] for a in agent)


def test_the_placer_writes_the_node_annotation() -> None:
    seen: list[str] = []

    def placer(pod: dict[str, object]) -> str | None:
        name = pod["metadata"]["name"]  # type: ignore[index]
        seen.append(str(name))
        return None if str(name).endswith("1") else "node-a"

    plan = arrivals(
        WorkloadSpec(name="burst", pods=3), namespace="n", scheduler_name="bench-noop", placer=placer
    )
    annotations = [a.pod["metadata"].get("annotations", {}) for a in plan]
    assert [x.get(NODE_ANNOTATION) for x in annotations] == ["node-a", None, "node-a"]
    assert seen == ["agent-000000", "agent-000001", "agent-000002"]


def test_default_workloads() -> None:
    quick = default_workloads(100, quick=True)
    assert set(quick) == {"backlog", "burst", "steady", "churn", "mix", "spread", "preempt"}
    assert quick["preempt"].preempt and quick["preempt"].pods == 1000
    assert quick["burst"].pods <= 500
    assert quick["backlog"].paused and not quick["burst"].paused
    assert quick["backlog"].pods == quick["burst"].pods
    full = default_workloads(1000, rate=250.0, burst=4000, pods=600)
    assert full["burst"].pods == 4000 == full["backlog"].pods
    assert full["churn"].pods == 600
    assert full["steady"].rate == 250.0
    assert full["churn"].lifetime_s > 0 and full["mix"].batch_rate > 0
    with pytest.raises(ValueError):
        WorkloadSpec(name="bad", pods=-1)


def test_the_bench_kwok_config_adds_the_lifetime_stages_to_the_clusters() -> None:
    docs = list(yaml.safe_load_all(bench_kwok_config(pod_parallelism=8)))
    names = [d["metadata"]["name"] for d in docs if d.get("kind") == "Stage"]
    assert {"pod-ready", "pod-delete", "bench-pod-expire", "bench-pod-remove"} <= set(names)
    expire = next(d for d in docs if d.get("metadata", {}).get("name") == "bench-pod-expire")
    assert LIFETIME_ANNOTATION in expire["spec"]["delay"]["durationFrom"]["expressionFrom"]
    keys = [e["key"] for e in expire["spec"]["selector"]["matchExpressions"]]
    assert any(LIFETIME_ANNOTATION in k for k in keys)
    remove = next(d for d in docs if d.get("metadata", {}).get("name") == "bench-pod-remove")
    assert remove["spec"]["next"]["delete"] is True
    assert len(BENCH_STAGES) == 3


def test_pulling_pods_wait_for_their_delay_instead_of_pod_ready() -> None:
    docs = list(yaml.safe_load_all(bench_kwok_config(pod_parallelism=8)))
    by_name = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "Stage"}
    ready_keys = [e for e in by_name["pod-ready"]["spec"]["selector"]["matchExpressions"]]
    assert {"key": f'.metadata.annotations["{PULL_ANNOTATION}"]', "operator": "DoesNotExist"} in ready_keys
    pull = by_name["bench-pod-pull"]["spec"]
    assert PULL_DELAY_ANNOTATION in pull["delay"]["durationFrom"]["expressionFrom"]
    assert any(PULL_DELAY_ANNOTATION in e["key"] for e in pull["selector"]["matchExpressions"])
    # the same Running status pod-ready writes
    assert pull["next"]["statusTemplate"] == by_name["pod-ready"]["spec"]["next"]["statusTemplate"]


def test_agent_pods_carry_the_pull_marker_only_when_pulls_are_simulated() -> None:
    plain = arrivals(WorkloadSpec(name="s", pods=3), namespace="ns", scheduler_name="x")
    assert all(PULL_ANNOTATION not in a.pod["metadata"].get("annotations", {}) for a in plain)
    spec = WorkloadSpec(name="s", pods=3, pull_delay_s=2.0, batch_rate=5.0, rate=10.0)
    pulled = arrivals(spec, namespace="ns", scheduler_name="x")
    for a in pulled:
        assert (PULL_ANNOTATION in a.pod["metadata"].get("annotations", {})) == (a.kind == "agent")


def test_preempt_workload_fills_untainted_nodes_and_sends_high_priority_pods_of_one_placeholder() -> None:
    from scale.bench.workloads import (
        PLACEHOLDER,
        PLACEHOLDER_CLASS,
        PREEMPT,
        PREEMPTOR_CLASS,
        default_workloads,
        placeholders,
        priority_classes,
    )

    def node(name: str, cpu: str, memory: str, tainted: bool = False) -> dict[str, object]:
        spec = {"taints": [{"key": "dedicated", "value": "batch", "effect": "NoSchedule"}]} if tainted else {}
        return {
            "metadata": {"name": name},
            "spec": spec,
            "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"}},
        }

    fleet = [node("a", "16", "64Gi"), node("b", "32", "64Gi"), node("c", "32", "128Gi", tainted=True)]
    pods = placeholders(fleet, namespace="fill")
    by_node: dict[str, int] = {}
    for p in pods:
        assert p["spec"]["priorityClassName"] == PLACEHOLDER_CLASS
        assert p["spec"]["containers"][0]["resources"]["requests"] == PLACEHOLDER
        by_node[p["spec"]["nodeName"]] = by_node.get(p["spec"]["nodeName"], 0) + 1
    assert by_node == {"a": 8, "b": 8}  # b is full on memory; c is tainted
    assert {pc["metadata"]["name"]: pc["value"] for pc in priority_classes()}[PREEMPTOR_CLASS] > 0
    spec = default_workloads(50, burst=20)[PREEMPT]
    assert dict(spec.placeholder) == PLACEHOLDER and spec.params()["placeholder"] == PLACEHOLDER
    plan = arrivals(spec, namespace="x", scheduler_name="s")
    assert len(plan) == 20
    for a in plan:
        assert a.pod["spec"]["priorityClassName"] == PREEMPTOR_CLASS
        assert a.pod["spec"]["containers"][0]["resources"]["requests"] == PLACEHOLDER


def test_preempt_workload_on_a_large_fleet_uses_fewer_larger_placeholders_and_preemptors_of_their_size() -> (
    None
):
    from scale.bench.workloads import (
        LARGE_FLEET,
        LARGE_PLACEHOLDER,
        PLACEHOLDER,
        PREEMPT,
        default_workloads,
        placeholders,
    )

    spec = default_workloads(LARGE_FLEET + 1)[PREEMPT]
    assert dict(spec.placeholder) == LARGE_PLACEHOLDER
    node = {
        "metadata": {"name": "a"},
        "spec": {},
        "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"}},
    }
    pods = placeholders([node], namespace="fill", requests=dict(spec.placeholder))
    assert len(pods) == 4  # 32 CPU / 8
    assert all(p["spec"]["containers"][0]["resources"]["requests"] == LARGE_PLACEHOLDER for p in pods)
    for a in arrivals(spec, namespace="x", scheduler_name="s")[:5]:
        assert a.pod["spec"]["containers"][0]["resources"]["requests"] == LARGE_PLACEHOLDER
    assert dict(default_workloads(LARGE_FLEET)[PREEMPT].placeholder) == PLACEHOLDER


def test_spread_workload_sends_sandbox_pools_with_their_inter_pod_rules() -> None:
    from scale.bench.workloads import SPREAD, WORKLOADS, default_workloads
    from scale.workload import POOL_LABEL, POOL_SIZE

    assert SPREAD in WORKLOADS
    spec = default_workloads(1000, burst=48)[SPREAD]
    assert spec.spread and spec.paused and spec.rate == 0 and spec.params()["spread"] is True
    plan = arrivals(spec, namespace="ns", scheduler_name="agent")
    assert len(plan) == 48 and all(a.at == 0 for a in plan)
    pools: dict[str, list[dict[str, Any]]] = {}
    for a in plan:
        assert a.pod["spec"]["schedulerName"] == "agent" and a.pod["metadata"]["namespace"] == "ns"
        pools.setdefault(a.pod["metadata"]["labels"][POOL_LABEL], []).append(a.pod["spec"])
    assert len(pools) == 48 // POOL_SIZE
    assert pools["pool-0"][0]["topologySpreadConstraints"][0]["whenUnsatisfiable"] == "DoNotSchedule"
    anti = pools["pool-1"][0]["affinity"]["podAntiAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" in anti
