"""Pods built to be expensive: at the parse limits of ``common.records`` one decision stays cheap (the
filters use indexes and remember per-node verdicts for the pod being decided), beyond them the pod is
unschedulable with a reason naming the field, and nothing of either leaks into the next pod's decision."""

from __future__ import annotations

import random
import time
from typing import Any

from common.records import MAX_REQUIREMENTS, MAX_SELECTOR_TERMS, MAX_TOLERATIONS, NodeRecord
from tests.builders import make_node, make_pod
from tests.unit.worker.helpers import engine_over
from worker.nodeinfo import NodeInfo
from worker.plugins.ports import NodePorts

NODES = 2000


def _fleet() -> list[NodeRecord]:
    nodes = []
    for i in range(NODES):
        b = make_node(f"n{i}", cpu="16").label("zone", f"z{i % 3}")
        if i % 10 == 0:
            b.taint("dedicated", "batch")
        nodes.append(b.record())
    return nodes


def _terms_that_never_match() -> list[list[dict[str, Any]]]:
    return [
        [{"key": "zone", "operator": "In", "values": [f"nowhere-{i}"]}] for i in range(MAX_SELECTOR_TERMS)
    ]


def _timed(engine: Any, pod: Any) -> tuple[Any, float]:
    t0 = time.process_time()
    decision = engine.schedule(pod)
    return decision, time.process_time() - t0


def test_a_pod_at_the_affinity_limits_that_fits_nowhere_costs_a_bounded_decision() -> None:
    engine = engine_over(_fleet())
    pod = make_pod("hostile").req(cpu="100m").required(*_terms_that_never_match()).record()
    assert pod.parse_error is None
    decision, cpu = _timed(engine, pod)
    assert decision.node is None and "didn't match Pod's node affinity/selector" in decision.message
    # Measured about 40 ms on a 2-core machine for 2,000 nodes; a bound far above it, and far below the
    # seconds such a pod cost before the limits and indexes.
    assert cpu < 1.0, f"one decision took {cpu:.2f} s of CPU"


def test_a_pod_at_the_toleration_limit_costs_a_bounded_decision_and_is_still_judged_right() -> None:
    engine = engine_over(_fleet())
    b = make_pod("hostile").req(cpu="100m").node_selector(zone="nowhere")
    for i in range(MAX_TOLERATIONS - 1):
        b.toleration("dedicated", f"not-batch-{i}")
    decision, cpu = _timed(engine, b.record())
    assert (
        decision.node is None and "200 node(s) had untolerated taint {dedicated: batch}" in decision.message
    )
    assert cpu < 1.0, f"one decision took {cpu:.2f} s of CPU"
    b.toleration("dedicated", "batch")  # the 1,000th tolerates the taint: the index must see it
    tolerant = b.record()
    assert tolerant.parse_error is None and len(tolerant.tolerations) == MAX_TOLERATIONS
    assert "untolerated taint" not in engine.schedule(tolerant).message


def test_pods_beyond_the_limits_are_unschedulable_with_the_field_and_limit_named() -> None:
    engine = engine_over(_fleet()[:10])
    too_many_terms = make_pod("t").required(*_terms_that_never_match(), [{"key": "a", "operator": "Exists"}])
    too_many_reqs = make_pod("r").required(
        [{"key": f"k{i}", "operator": "Exists"} for i in range(MAX_REQUIREMENTS + 1)]
    )
    too_many_tolerations = make_pod("o")
    for i in range(MAX_TOLERATIONS + 1):
        too_many_tolerations.toleration(f"k{i}", operator="Exists")
    for builder, field, limit in (
        (too_many_terms, "nodeSelectorTerms", MAX_SELECTOR_TERMS),
        (too_many_reqs, "nodeSelectorTerms", MAX_REQUIREMENTS),
        (too_many_tolerations, "spec.tolerations", MAX_TOLERATIONS),
    ):
        decision = engine.schedule(builder.record())
        assert decision.node is None and field in decision.message and str(limit) in decision.message


def test_a_remembered_affinity_verdict_does_not_carry_over_to_another_pod_or_a_relabelled_node() -> None:
    nodes = [make_node(f"n{i}").label("zone", "a").record() for i in range(3)]
    engine = engine_over(nodes)
    # Enough requirements that the filter remembers verdicts (a single term, so all must hold).
    exprs = [{"key": "zone", "operator": "NotIn", "values": [f"x{i}"]} for i in range(20)]
    fits = make_pod("fits").required([*exprs, {"key": "zone", "operator": "In", "values": ["a"]}]).record()
    misses = (
        make_pod("misses").required([*exprs, {"key": "zone", "operator": "In", "values": ["b"]}]).record()
    )
    assert engine.schedule(fits).node is not None
    assert engine.schedule(misses).node is None
    assert engine.schedule(fits).node is not None
    for i in range(3):  # every node now in zone b: the same pod object must be judged on the new labels
        engine.cache.upsert_node(make_node(f"n{i}").label("zone", "b").record())
    assert engine.schedule(misses).node is not None
    assert engine.schedule(fits).node is None


def test_a_huge_quantity_in_a_pod_or_a_node_stops_neither_the_engine_nor_other_pods() -> None:
    nodes = [make_node("huge", cpu="1e20").record(), make_node("ok", cpu="4").record()]
    assert nodes[0].allocatable_error is not None
    engine = engine_over(nodes)
    bad = make_pod("bad").req(cpu="1e999999").record()
    decision = engine.schedule(bad)
    assert decision.node is None and "spec.containers[0].resources.requests.cpu" in decision.message
    assert engine.schedule(make_pod("good").req(cpu="1").record()).node == "ok"


def _ports_pod(name: str, ports: list[tuple[str, int, str]]) -> Any:
    b = make_pod(name)
    b.spec["containers"][0]["ports"] = [
        {"containerPort": port, "hostPort": port, "protocol": proto, "hostIP": ip}
        for proto, port, ip in ports
    ]
    return b.record()


def test_the_host_port_index_judges_as_the_pairwise_rule() -> None:
    rng = random.Random(3)
    choices = [
        (proto, port, ip)
        for proto in ("TCP", "UDP")
        for port in (80, 443, 8080)
        for ip in ("", "0.0.0.0", "10.0.0.1", "10.0.0.2", "::")
    ]
    plugin = NodePorts()
    for trial in range(300):
        info = NodeInfo(make_node(f"n{trial % 7}").record())
        for j in range(rng.randint(1, 12)):
            info.add_pod(_ports_pod(f"used-{j}", rng.sample(choices, rng.randint(1, 5))))
        pod = _ports_pod("want", rng.sample(choices, rng.randint(1, 8)))
        expected = any(w.conflicts(u) for w in pod.host_ports for u in info.ports)
        assert (plugin.filter(pod, info) is not None) == expected, (pod.host_ports, info.ports)


def test_the_host_port_index_follows_the_nodes_changes() -> None:
    plugin = NodePorts()
    info = NodeInfo(make_node("n").record())
    for j in range(10):
        info.add_pod(_ports_pod(f"used-{j}", [("TCP", 1000 + k, "") for k in range(10 * j, 10 * j + 10)]))
    want = _ports_pod("want", [("TCP", 1005, "10.0.0.1"), ("TCP", 5000, "")])
    assert plugin.filter(want, info) is not None
    info.remove_pod(_ports_pod("used-0", []).key)  # frees 1000..1009
    assert plugin.filter(want, info) is None
    # A new NodeInfo of the same name that reached the same generation: its own ports count, not the index
    # of the old one.
    again = NodeInfo(make_node("n").record())
    for j in range(info.generation):
        again.add_pod(
            _ports_pod(
                f"other-{j}",
                [("TCP", 5000, "")] if j == 0 else [("UDP", 7000 + 10 * j + k, "") for k in range(5)],
            )
        )
    assert again.generation == info.generation
    assert len(want.host_ports) * len(again.ports) > 64, "large enough that the index is used"
    assert plugin.filter(want, again) is not None
