"""The decision hot path's shortcuts give exactly what the plain computation gives: the engine's score
accumulation, the allocation fractions MostAllocated and BalancedAllocation share, NodePorts' "passes every
node" and ImageLocality's image test."""

from __future__ import annotations

import random
from collections.abc import Iterable

import pytest

from common.records import (
    DEFAULT_MEMORY_FOR_SCORING,
    DEFAULT_MILLI_CPU_FOR_SCORING,
    NodeName,
    PodRecord,
)
from tests.builders import make_node, make_pod
from tests.unit.worker.helpers import engine_over, place
from worker import engine as engine_module
from worker.cache import Cache
from worker.engine import Decision, _accumulate
from worker.framework import Code
from worker.images import ImageStates
from worker.nodeinfo import NodeInfo
from worker.plugins.images import ImageLocality
from worker.plugins.ports import NodePorts
from worker.plugins.resources import BalancedAllocation, LeastAllocated, MostAllocated


def test_accumulate_is_the_weighted_sum_float_for_float() -> None:
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(1, 20)
        totals: Iterable[float] | None = None
        expected: list[float] | None = None
        given: list[tuple[list[float], list[float]]] = []
        for _plugin in range(rng.randint(1, 6)):
            weight = rng.choice([0, 1, 1, 2, 3, 5])
            scores = [rng.choice([0.0, 100.0, rng.uniform(0, 100), 100.0 / 3]) for _ in range(n)]
            expected = (
                [weight * s for s in scores]
                if expected is None
                else [t + weight * s for t, s in zip(expected, scores, strict=True)]
            )
            given.append((scores, list(scores)))
            totals = _accumulate(totals, weight, scores, n)
        assert totals is not None
        result = list(totals)
        assert result == expected
        assert all(type(t) is float for t in result)
        assert all(scores == copy for scores, copy in given)  # the plugins' lists are left alone
        assert all(result is not scores for scores, _ in given)


def test_accumulate_refuses_a_wrong_number_of_scores() -> None:
    with pytest.raises(ValueError, match="2 scores for 3 nodes"):
        _accumulate(None, 1, [1.0, 2.0], 3)


def fractions(pod: PodRecord, nodes: list[NodeInfo]) -> list[tuple[float, float]]:
    """kube-scheduler's requested fractions with the pod added, capped at 1, computed plainly."""
    cpu = pod.requests.milli_cpu or DEFAULT_MILLI_CPU_FOR_SCORING
    memory = pod.requests.memory or DEFAULT_MEMORY_FOR_SCORING
    return [
        (
            min(1.0, (i.nonzero_cpu + cpu) / i.node.allocatable.milli_cpu),
            min(1.0, (i.nonzero_memory + memory) / i.node.allocatable.memory),
        )
        for i in nodes
    ]


def test_shared_fractions_follow_every_node_change() -> None:
    """The second plugin reuses the first's fractions only for the same pod and unchanged nodes in the same
    order; any assume, removal or other list gives fresh ones, equal to a computation from scratch."""
    rng = random.Random(3)
    eng = engine_over([make_node(f"n{i}", cpu=str(4 + i), memory=f"{8 + i}Gi").record() for i in range(6)])
    cache = eng.cache
    most, balanced, least = MostAllocated(), BalancedAllocation(), LeastAllocated()
    pods = [
        make_pod(f"p{i}").req(cpu=f"{rng.randint(1, 9) * 100}m", memory=f"{rng.randint(1, 9)}00Mi").record()
        for i in range(40)
    ]
    placed: list[str] = []
    for pod in pods:
        nodes = list(cache.nodes.values())
        rng.shuffle(nodes)
        nodes = nodes[: rng.randint(1, len(nodes))]
        for _ in range(2):
            fresh = fractions(pod, nodes)
            assert most.scores(pod, nodes) == [50.0 * (fc + fm) for fc, fm in fresh]
            assert balanced.scores(pod, nodes) == [100.0 * (1.0 - abs(fc - fm) / 2.0) for fc, fm in fresh]
            assert least.scores(pod, nodes) == [50.0 * ((1.0 - fc) + (1.0 - fm)) for fc, fm in fresh]
            # the same list object, changed in place: a node swapped out, or a node changed
            if len(nodes) > 1:
                nodes.reverse()
            filler = make_pod(f"f{len(placed)}-{rng.random()}").req(cpu="300m", memory="300Mi").record()
            if rng.random() < 0.5 and place(eng, filler) is not None:
                placed.append(filler.key)
            elif placed and rng.random() < 0.5:
                cache.remove_pod(placed.pop(rng.randrange(len(placed))))  # type: ignore[arg-type]


def test_shared_fractions_see_an_assume_between_the_two_plugins() -> None:
    eng = engine_over([make_node("a", cpu="4").record(), make_node("b", cpu="4").record()])
    pod = make_pod("p").req(cpu="1", memory="1Gi").record()
    nodes = list(eng.cache.nodes.values())
    before = MostAllocated().scores(pod, nodes)
    eng.cache.assume(make_pod("q").req(cpu="2", memory="1Gi").record(), NodeName("a"))
    after = BalancedAllocation().scores(pod, nodes)
    fresh = fractions(pod, nodes)
    assert after == [100.0 * (1.0 - abs(fc - fm) / 2.0) for fc, fm in fresh]
    assert MostAllocated().scores(pod, nodes) != before


def test_node_ports_passes_every_node_only_for_pods_without_host_ports() -> None:
    eng = engine_over([make_node(f"n{i}").record() for i in range(4)])
    rng = random.Random(5)
    for i in range(30):
        builder = make_pod(f"h{i}")
        for _ in range(rng.randint(0, 2)):
            builder = builder.host_port(rng.choice([80, 443, 8080]), rng.choice(["TCP", "UDP"]))
        place(eng, builder.record())
    plugin = NodePorts()
    plain = make_pod("plain").record()
    with_port = make_pod("port").host_port(80).record()
    assert plugin.passes_every_node(plain)
    assert not plugin.passes_every_node(with_port)
    for info in eng.cache.nodes.values():
        assert plugin.filter(plain, info) is None
    assert any(plugin.filter(with_port, info) is not None for info in eng.cache.nodes.values())


def test_engine_decides_host_port_pods_with_the_port_filter() -> None:
    # the filter is left out only for pods without host ports; a pod with one still meets it
    eng = engine_over([make_node("n").record()])
    place(eng, make_pod("a").host_port(8080).record())
    assert eng.schedule(make_pod("b").record()).node == "n"
    assert "free ports" in eng.schedule(make_pod("c").host_port(8080).record()).message


def test_holds_any_is_membership_of_some_name() -> None:
    cache = Cache()
    cache.upsert_node(make_node("n1").image(100 * 1024 * 1024, "gcr.io/a:latest").record())
    states: ImageStates = cache.images
    for names in [(), ("gcr.io/a:latest",), ("gcr.io/b:latest",), ("gcr.io/b:latest", "gcr.io/a:latest")]:
        assert states.holds_any(names) == any(name in states for name in names)
    plugin = ImageLocality()
    plugin.attach(cache)
    assert plugin.applies(make_pod("p").image("gcr.io/a:latest").record())
    assert not plugin.applies(make_pod("q").image("gcr.io/b:latest").record())


def test_successes_with_the_same_counts_share_one_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    eng = engine_over([make_node(f"n{i}", cpu="64").record() for i in range(3)])
    first = eng.schedule(make_pod("a").req(cpu="100m").record())
    second = eng.schedule(make_pod("b").req(cpu="100m").record())
    assert first == second and first is second and first.ok
    assert first == Decision(first.node, Code.SUCCESS, "", first.evaluated, first.feasible)
    monkeypatch.setattr(engine_module, "SUCCEEDED_KEPT", 2)
    for i in range(12):
        place(eng, make_pod(f"p{i}").req(cpu="30").record())  # each one moves the walk: new counts, new nodes
        assert len(eng._succeeded) <= 2
