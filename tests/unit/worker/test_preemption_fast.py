"""The arithmetic dry run and its memo (``Evaluator.arithmetic``, ``_by_arithmetic``) choose exactly what the
full dry run (every filter re-run with pods set aside) chooses: randomized worlds, compared node by node and
decision by decision, with budgets, start-time ties, pods without a start time, extended resources, pod-count
limits, nominations and pods the arithmetic must not decide (host ports, spread constraints of their own or
given by a configured DoNotSchedule default). The comparison fails when a filter lies about depending on the
pods placed (``FilterPlugin.node_pods``)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from common.records import NodeName, PodRecord
from tests.builders import make_node, make_pod
from tests.unit.worker.helpers import engine_over
from worker.budgets import Budgets
from worker.engine import Engine
from worker.framework import Profile, Registry, Status
from worker.plugins import default_profile, default_registry
from worker.plugins.ports import NodePorts
from worker.plugins.spread import PodTopologySpreadFilter
from worker.preemption import Candidate, Evaluator
from worker.settings import WorkerSettings
from worker.workloads import REPLICA_SET

NOW = 1_900_000_000.0
GPU = "example.com/gpu"
STARTS = ["2026-01-01T00:00:00Z", "2026-01-01T00:00:01Z", "2026-01-02T00:00:00Z", None]
PORT = 8080
# a configured default constraint that filters: pods a ReplicaSet selects get it without stating it
HOST_ONCE = {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule"}


def world(seed: int) -> tuple[Engine, Budgets]:
    rng = random.Random(seed)
    settings = WorkerSettings()
    if seed % 3 == 0:
        settings.scheduling.spread_defaulting = "List"
        settings.scheduling.spread_default_constraints = [HOST_ONCE]
    nodes = []
    for i in range(rng.randint(3, 12)):
        nb = make_node(
            f"n{i}", cpu=str(rng.randint(2, 8)), memory=f"{rng.randint(4, 16)}Gi", pods=str(rng.randint(3, 9))
        )
        if rng.random() < 0.3:
            nb = nb.extended(GPU, str(rng.randint(1, 4)))
        nodes.append(nb.record())
    engine = engine_over(nodes, settings=settings)
    engine.cache.workloads.upsert(
        REPLICA_SET,
        {
            "metadata": {"name": "z", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "z"}}},
        },
    )
    ports: set[str] = set()
    for j in range(rng.randint(5, 60)):
        node = rng.choice(nodes)
        info = engine.cache.nodes[node.name]
        cpu = rng.choice([100, 250, 500, 1000, 2000])
        if (
            info.requested.milli_cpu + cpu > node.allocatable.milli_cpu
            or len(info.pods) >= node.allocatable.pods
        ):
            continue
        b = make_pod(f"p{j}").req(cpu=f"{cpu}m", memory=f"{rng.choice([128, 512, 1024])}Mi")
        if GPU in node.allocatable.scalar and rng.random() < 0.5:
            b = b.req(cpu=f"{cpu}m", **{GPU: "1"})
        b = b.priority(rng.randint(0, 6)).label("app", rng.choice(["a", "b", "c", "z"])).on(node.name)
        if node.name not in ports and rng.random() < 0.15:
            ports.add(node.name)
            b = b.host_port(PORT)
        start = rng.choice(STARTS)
        if start is not None:
            b = b.started(start)
        engine.cache.upsert_pod(b.record())
    budgets = Budgets()
    budgets.replace(
        [
            {
                "metadata": {"name": f"b{k}", "namespace": "default"},
                "spec": {"selector": {"matchLabels": {"app": app}}},
                "status": {"disruptionsAllowed": rng.randint(0, 2), "disruptedPods": {}},
            }
            for k, app in enumerate(rng.sample(["a", "b", "c"], rng.randint(0, 2)))
        ]
    )
    return engine, budgets


def preemptor(rng: random.Random, i: int) -> PodRecord:
    b = make_pod(f"hi{i}").req(
        cpu=f"{rng.choice([500, 1000, 2000, 3000])}m",
        memory=f"{rng.choice([256, 1024, 4096])}Mi",
        **({GPU: "1"} if rng.random() < 0.2 else {}),
    )
    b = b.priority(rng.randint(1, 8)).label("app", "z")
    roll = rng.random()
    if roll < 0.1:
        b = b.host_port(PORT)  # the full dry run only
    elif roll < 0.2:
        b = b.spread("kubernetes.io/hostname", {"app": "z"})  # the full dry run only
    elif roll < 0.4:
        b = b.owned_by("ReplicaSet", "z")  # the full dry run only where the default constraint is configured
    return b.record()


def outcome(found: Candidate | Status) -> object:
    if isinstance(found, Status):
        return (found.code, found.reasons)
    return (found.node, [v.name for v in found.victims], found.pdb_violations)


def compare(seeds: range) -> tuple[list[tuple[Any, ...]], dict[str, int]]:
    """Every disagreement between the fast and the full evaluator over the seeds' worlds, and how often the
    fast one took each shortcut."""
    wrong: list[tuple[Any, ...]] = []
    used = {"arithmetic": 0, "memo": 0, "reused": 0}
    for seed in seeds:
        rng = random.Random(f"pods:{seed}")
        pods = [preemptor(rng, i) for i in range(4)]
        fast_engine, fast_budgets = world(seed)
        full_engine, full_budgets = world(seed)
        fast = Evaluator(
            fast_engine.cache, fast_engine, fast_budgets, rng=random.Random(seed), wall=lambda: NOW
        )
        full = Evaluator(
            full_engine.cache,
            full_engine,
            full_budgets,
            rng=random.Random(seed),
            wall=lambda: NOW,
            fast=False,
        )
        for pod in pods:
            # node by node, twice on the fast side (the second answer comes from the memo)
            for name in sorted(fast_engine.cache.nodes):
                want = outcome(full.select_victims(pod, full_engine.cache.nodes[name], NOW))
                for _ in range(2):
                    got = outcome(fast.select_victims(pod, fast_engine.cache.nodes[name], NOW))
                    if got != want:
                        wrong.append((seed, pod.name, name, got, want))
            # the whole decision: same candidate, same message (the fast side after the failed decision, whose
            # per-node verdicts it then reuses)
            fast_engine.schedule(pod)
            a, b = fast.evaluate(pod), full.evaluate(pod)
            got_v = (a.message, a.candidate and outcome(a.candidate))
            want_v = (b.message, b.candidate and outcome(b.candidate))
            if got_v != want_v:
                wrong.append((seed, pod.name, None, got_v, want_v))
            # carry it out the same way on both sides, so later pods see nominations and freed room
            for engine, verdict in ((fast_engine, a), (full_engine, b)):
                if verdict.candidate is not None:
                    engine.cache.nominate(pod, verdict.candidate.node)
                    for v in verdict.candidate.victims:
                        engine.cache.remove_pod(v.key)
        used["arithmetic"] += fast.arithmetic_runs
        used["memo"] += fast.memo_hits
        used["reused"] += fast.scans_reused
        assert full.arithmetic_runs == full.memo_hits == full.scans_reused == 0
    return wrong, used


def test_arithmetic_chooses_exactly_what_the_filters_choose() -> None:
    wrong, used = compare(range(300))
    assert wrong == []
    # the comparison did exercise every shortcut
    assert used["arithmetic"] > 1000 and used["memo"] > 1000 and used["reused"] > 100


@pytest.mark.parametrize("liar", [NodePorts, PodTopologySpreadFilter])
def test_the_comparison_catches_a_filter_that_lies_about_the_pods(
    liar: type[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filter claiming its verdict ignores the pods placed (so the arithmetic skips it) when it does not:
    the arithmetic then keeps pods the filter needs gone, and the comparison must see it."""
    monkeypatch.setattr(liar, "node_pods", lambda self, pod: False)
    wrong, _ = compare(range(300))
    assert wrong


def test_a_default_do_not_schedule_constraint_is_not_decided_by_arithmetic() -> None:
    """A pod stating no constraint that a ReplicaSet selects gets the configured DoNotSchedule default: removing
    a lower-priority pod of another app frees the room on n0 but not the skew (n0 already holds one of the
    ReplicaSet's pods, n1 none), so n0 is no candidate; arithmetic alone would name the victim."""
    settings = WorkerSettings()
    settings.scheduling.spread_defaulting = "List"
    settings.scheduling.spread_default_constraints = [HOST_ONCE]
    engine = engine_over(
        [make_node("n0", cpu="1").record(), make_node("n1", cpu="1").record()], settings=settings
    )
    engine.cache.workloads.upsert(
        REPLICA_SET,
        {
            "metadata": {"name": "z", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "z"}}},
        },
    )
    engine.cache.upsert_pod(make_pod("mine").req(cpu="500m").priority(9).label("app", "z").on("n0").record())
    engine.cache.upsert_pod(make_pod("other").req(cpu="500m").priority(1).label("app", "a").on("n0").record())
    engine.cache.upsert_pod(make_pod("full").req(cpu="1").priority(9).label("app", "a").on("n1").record())
    pod = make_pod("hi").req(cpu="500m").priority(5).label("app", "z").owned_by("ReplicaSet", "z").record()
    ev = Evaluator(engine.cache, engine, Budgets(), wall=lambda: NOW)
    assert not ev.arithmetic(pod)
    found = ev.select_victims(pod, engine.cache.nodes[NodeName("n0")], NOW)
    assert isinstance(found, Status) and ev.arithmetic_runs == 0
    engine.schedule(pod)
    assert ev.evaluate(pod).candidate is None


def test_a_filter_that_does_not_declare_node_pods_is_refused() -> None:
    class Undeclared:
        name = "Undeclared"
        static = False

        def filter(self, pod: PodRecord, node: object) -> Status | None:
            return None

    registry = default_registry()
    registry.register("Undeclared", lambda _: Undeclared())
    profile: Profile = default_profile()
    profile.filters.append("Undeclared")
    with pytest.raises(ValueError, match=r"\['Undeclared'\] do not declare node_pods"):
        registry.build(profile)
    assert isinstance(registry, Registry)


def test_memo_follows_a_start_time_that_arrives() -> None:
    """A placed pod's start time arriving (the kubelet's status update, its record otherwise the same) changes
    the order in which victims are spared: the memo of the node's dry run is not used after it."""
    engine = engine_over([make_node("n0", cpu="2").record()])
    engine.cache.upsert_pod(
        make_pod("a").req(cpu="1").priority(1).on("n0").started("2030-01-01T00:00:00Z").record()
    )
    engine.cache.upsert_pod(make_pod("b").req(cpu="1").priority(1).on("n0").record())  # not started yet
    ev = Evaluator(engine.cache, engine, Budgets(), wall=lambda: NOW)
    pod = make_pod("hi").req(cpu="1").priority(10).record()
    info = engine.cache.nodes[NodeName("n0")]
    first = ev.select_victims(pod, info, NOW)
    assert isinstance(first, Candidate) and [v.name for v in first.victims] == ["b"]  # counts as started now
    engine.cache.upsert_pod(
        make_pod("b").req(cpu="1").priority(1).on("n0").started("2020-01-01T00:00:00Z").record()
    )
    again = ev.select_victims(pod, info, NOW)
    assert isinstance(again, Candidate) and [v.name for v in again.victims] == ["a"]  # now "b" is the older
    assert ev.memo_hits == 0


def test_memo_follows_the_clock_for_pods_without_a_start_time() -> None:
    engine = engine_over([make_node("n0", cpu="2").record()])
    engine.cache.upsert_pod(
        make_pod("old").req(cpu="1").priority(1).on("n0").started("2026-01-01T00:00:00Z").record()
    )
    engine.cache.upsert_pod(
        make_pod("new").req(cpu="1").priority(1).on("n0").record()
    )  # no start time: "now"
    ev = Evaluator(engine.cache, engine, Budgets(), wall=lambda: NOW)
    pod = make_pod("hi").req(cpu="1").priority(5).record()
    info = engine.cache.nodes[NodeName("n0")]
    first = ev.select_victims(pod, info, NOW)
    assert isinstance(first, Candidate) and [v.name for v in first.victims] == ["new"]  # the older one stays
    assert ev.select_victims(pod, info, NOW + 1) == first and ev.memo_hits == 1
    # a clock before the known start: "new" now counts as the older one, the answer changes
    early = 1_700_000_000.0
    again = ev.select_victims(pod, info, early)
    assert isinstance(again, Candidate) and [v.name for v in again.victims] == ["old"]
    assert ev.memo_hits == 1
