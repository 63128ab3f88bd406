"""Filter semantics, case by case, through the engine with one node (so the message is the filter's)."""

import pytest

from tests.builders import make_node, make_pod
from tests.unit.worker.helpers import engine_over


def verdict(node_builder: object, pod_builder: object) -> str:
    eng = engine_over([node_builder.record()])  # type: ignore[attr-defined]
    d = eng.schedule(pod_builder.record())  # type: ignore[attr-defined]
    return "ok" if d.node else d.message


def test_untolerated_noschedule_taint() -> None:
    node = make_node("n1").taint("dedicated", "batch")
    assert verdict(node, make_pod("p")) == (
        "0/1 nodes are available: 1 node(s) had untolerated taint {dedicated: batch}."
    )
    assert verdict(node, make_pod("p").toleration("dedicated", "batch", effect="NoSchedule")) == "ok"
    assert verdict(node, make_pod("p").toleration("dedicated", operator="Exists")) == "ok"
    assert verdict(node, make_pod("p").toleration("", operator="Exists")) == "ok"
    assert verdict(node, make_pod("p").toleration("dedicated", "other")) != "ok"
    assert verdict(node, make_pod("p").toleration("dedicated", "batch", effect="NoExecute")) != "ok"


def test_prefer_no_schedule_taint_does_not_filter() -> None:
    assert verdict(make_node("n").taint("soft", "x", "PreferNoSchedule"), make_pod("p")) == "ok"


def test_noexecute_taint_filters() -> None:
    assert verdict(make_node("n").taint("k", "v", "NoExecute"), make_pod("p")) != "ok"


@pytest.mark.parametrize(
    ("expr", "fits"),
    [
        ({"key": "zone", "operator": "In", "values": ["a", "b"]}, True),
        ({"key": "zone", "operator": "In", "values": ["c"]}, False),
        ({"key": "zone", "operator": "NotIn", "values": ["a"]}, False),
        ({"key": "zone", "operator": "NotIn", "values": ["c"]}, True),
        ({"key": "zone", "operator": "Exists"}, True),
        ({"key": "gpu", "operator": "Exists"}, False),
        ({"key": "gpu", "operator": "DoesNotExist"}, True),
        ({"key": "cores", "operator": "Gt", "values": ["16"]}, True),
        ({"key": "cores", "operator": "Gt", "values": ["32"]}, False),
        ({"key": "cores", "operator": "Lt", "values": ["64"]}, True),
        ({"key": "zone", "operator": "Gt", "values": ["1"]}, False),  # non-integer label
    ],
)
def test_required_node_affinity_operators(expr: dict[str, object], fits: bool) -> None:
    node = make_node("n").label("zone", "a").label("cores", "32")
    got = verdict(node, make_pod("p").required([expr]))
    assert (got == "ok") == fits, got


def test_terms_are_ored_and_expressions_anded() -> None:
    node = make_node("n").label("zone", "a").label("pool", "x")
    both = [
        {"key": "zone", "operator": "In", "values": ["a"]},
        {"key": "pool", "operator": "In", "values": ["y"]},
    ]
    assert verdict(node, make_pod("p").required(both)) != "ok"
    other = [{"key": "pool", "operator": "In", "values": ["x"]}]
    assert verdict(node, make_pod("p").required(both, other)) == "ok"


def test_match_fields_on_node_name() -> None:
    node = make_node("n7")
    fields = [{"key": "metadata.name", "operator": "In", "values": ["n7"]}]
    assert verdict(node, make_pod("p").required(fields=fields)) == "ok"
    fields = [{"key": "metadata.name", "operator": "NotIn", "values": ["n7"]}]
    assert verdict(node, make_pod("p").required(fields=fields)) != "ok"


def test_node_selector() -> None:
    node = make_node("n").label("pool", "agents")
    assert verdict(node, make_pod("p").node_selector(pool="agents")) == "ok"
    assert verdict(node, make_pod("p").node_selector(pool="batch")) == (
        "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
    )


def test_resources_fit_reasons() -> None:
    node = make_node("n", cpu="1", memory="1Gi", pods="2")
    assert verdict(node, make_pod("p").req(cpu="2", memory="2Gi")) == (
        "0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient memory."
    )
    assert (
        verdict(node, make_pod("p").req(nvidia_gpu="1"))
        == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    )
    assert verdict(make_node("g").extended("nvidia.com/gpu", "8"), make_pod("p").req(nvidia_gpu="1")) == "ok"


def test_pod_count_limit() -> None:
    eng = engine_over([make_node("n", pods="1").record()])
    assert eng.schedule(make_pod("a").record()).node == "n"
    eng.cache.assume(make_pod("a").record(), eng.schedule(make_pod("a").record()).node)  # type: ignore[arg-type]
    assert eng.schedule(make_pod("b").record()).message == "0/1 nodes are available: 1 Too many pods."


def test_host_ports() -> None:
    eng = engine_over([make_node("n").record()])
    a = make_pod("a").host_port(8080).record()
    eng.cache.assume(a, eng.schedule(a).node)  # type: ignore[arg-type]
    assert eng.schedule(make_pod("b").host_port(8080, "UDP").record()).node == "n"
    assert "free ports" in eng.schedule(make_pod("c").host_port(8080).record()).message


def test_cordoned_and_not_ready() -> None:
    assert (
        verdict(make_node("n").cordon(), make_pod("p"))
        == "0/1 nodes are available: 1 node(s) were unschedulable."
    )
    assert (
        verdict(make_node("n").not_ready(), make_pod("p"))
        == "0/1 nodes are available: 1 node(s) were not ready."
    )


def test_malformed_pod_is_unschedulable_with_its_reason() -> None:
    got = verdict(make_node("n"), make_pod("p").req(cpu="1.5.3Gi"))
    assert "invalid pod spec" in got and "1.5.3Gi" in got
