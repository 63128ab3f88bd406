"""Pods and nodes a tenant (or a broken controller) can send: each becomes a parse error for that pod, or no
capacity for that node, with a reason naming the field; parsing itself never raises. And the bounded pod
rules: counts above the documented limits are refused, and the indexed matching agrees with the plain one."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from common import records
from common.records import (
    MAX_HOST_PORTS,
    MAX_REQUIREMENTS,
    MAX_SELECTOR_TERMS,
    MAX_TOLERATIONS,
    MAX_VALUES,
    Requirement,
    Taint,
    Toleration,
    TolerationIndex,
    node_from_json,
    pod_from_json,
)
from tests.builders import make_node, make_pod


def _id(value: Any) -> str:
    """A short test id, also for ints that ``str()`` refuses to convert."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"int-of-{value.bit_length()}-bits"
    return repr(value)[:30]


OUT_OF_RANGE = ["1e999999", "1e20", "9" * 30, "8Ei", "1" * 5000, "1e2147483648", "NaN", "Infinity"]


@pytest.mark.parametrize("value", OUT_OF_RANGE, ids=_id)
def test_a_container_quantity_out_of_range_is_a_parse_error_naming_the_field(value: str) -> None:
    pod = make_pod("a").req(cpu=value).record()
    assert pod.parse_error is not None
    assert "spec.containers[0].resources.requests.cpu" in pod.parse_error


@pytest.mark.parametrize("value", [10**30, 10**5000, float("inf"), float("nan"), 1e300, -(10**30)], ids=_id)
def test_numbers_instead_of_strings_are_parse_errors(value: Any) -> None:
    # Only a peer that does not speak through the API server can send these (the API server sends strings).
    b = make_pod("a")
    b.spec["containers"][0]["resources"]["requests"]["memory"] = value
    pod = b.record()
    assert pod.parse_error is not None and "requests.memory" in pod.parse_error


@pytest.mark.parametrize(
    ("where", "path"),
    [
        ("init", "spec.initContainers[0].resources.requests.cpu"),
        ("overhead", "spec.overhead.cpu"),
        ("pod-level", "spec.resources.requests.cpu"),
    ],
)
def test_every_request_list_names_its_field(where: str, path: str) -> None:
    b = make_pod("a").req(cpu="1")
    if where == "init":
        b.init_container(cpu="1e999999")
    elif where == "overhead":
        b.spec["overhead"] = {"cpu": "1e999999"}
    else:
        b.spec["resources"] = {"requests": {"cpu": "1e999999"}}
    pod = b.record()
    assert pod.parse_error is not None and path in pod.parse_error


def test_requests_that_each_fit_int64_may_sum_beyond_it_without_harm() -> None:
    b = make_pod("a").req(memory="7Ei")
    b.spec["containers"].append({"name": "b", "resources": {"requests": {"memory": "7Ei"}}})
    pod = b.record()
    assert pod.parse_error is None and pod.requests.memory == 14 * 2**60


@pytest.mark.parametrize(
    "value", [*OUT_OF_RANGE, "-1", "thirty-two", 10**5000, float("inf"), None, [1]], ids=_id
)
def test_a_node_with_hostile_allocatable_has_no_capacity(value: Any) -> None:
    obj = make_node("n").json()
    obj["status"]["allocatable"]["cpu"] = value
    rec = node_from_json(obj)
    assert rec.allocatable.milli_cpu == 0 and rec.allocatable.memory == 0
    assert rec.allocatable_error is not None and "status.allocatable.cpu" in rec.allocatable_error


def test_a_node_allocatable_at_the_int64_edge_is_kept() -> None:
    rec = make_node("n", cpu="9223372036854775807m", memory="7Ei").record()
    assert rec.allocatable_error is None
    assert rec.allocatable.milli_cpu == 2**63 - 1 and rec.allocatable.memory == 7 * 2**60


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"containers": [{"ports": [{"hostPort": float("inf")}]}]}, id="host-port-inf"),
        pytest.param({"containers": [{"ports": [{"hostPort": "1" * 5000}]}]}, id="host-port-5000-digits"),
        pytest.param({"containers": [{"ports": [{"hostPort": 70000}]}]}, id="host-port-above-65535"),
        pytest.param({"containers": "x"}, id="containers-string"),
        pytest.param({"containers": [5]}, id="container-int"),
        pytest.param({"tolerations": {"key": "a"}}, id="tolerations-map"),
        pytest.param({"tolerations": [5]}, id="toleration-int"),
        pytest.param(
            {
                "affinity": {
                    "nodeAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": float("nan")}]
                    }
                }
            },
            id="weight-nan",
        ),
        pytest.param(
            {
                "affinity": {
                    "nodeAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": float("inf")}]
                    }
                }
            },
            id="weight-inf",
        ),
        pytest.param(
            {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": {"a": 1}}}},
            id="preferred-map",
        ),
        pytest.param(
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": "x"}
                    }
                }
            },
            id="terms-string",
        ),
        pytest.param(
            {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [1]}}},
            id="required-list",
        ),
        pytest.param({"affinity": "x"}, id="affinity-string"),
        pytest.param({"nodeSelector": ["a"]}, id="selector-list"),
    ],
)
def test_garbage_specs_are_parse_errors(spec: dict[str, Any]) -> None:
    pod = pod_from_json({"metadata": {"name": "x"}, "spec": spec})
    assert pod.parse_error is not None


def test_gt_with_a_value_of_thousands_of_digits_matches_nothing_and_does_not_raise() -> None:
    huge = "9" * 5000
    pod = make_pod("a").required([{"key": "rank", "operator": "Gt", "values": [huge]}]).record()
    assert pod.parse_error is not None and "integer" in pod.parse_error
    req = Requirement("rank", "Lt", ("5",))
    assert not req.matches({"rank": huge}) and not req.matches({"rank": "-" + huge})
    assert req.matches({"rank": "000000000000000000000000000004"}), "leading zeros are read as Go reads them"


# ----- limits --------------------------------------------------------------------------------------------


def _expr(i: int) -> dict[str, Any]:
    return {"key": f"k{i}", "operator": "In", "values": [f"v{i}"]}


def test_tolerations_up_to_the_limit_are_taken_one_more_is_refused() -> None:
    b = make_pod("a")
    b.spec["tolerations"] = [{"key": f"t{i}", "operator": "Exists"} for i in range(MAX_TOLERATIONS)]
    assert b.record().parse_error is None and len(b.record().tolerations) == MAX_TOLERATIONS
    b.spec["tolerations"].append({"key": "one-more", "operator": "Exists"})
    error = b.record().parse_error
    assert error is not None and "spec.tolerations" in error and str(MAX_TOLERATIONS) in error


def test_required_terms_beyond_the_limit_are_refused() -> None:
    ok = make_pod("a").required(*[[_expr(i)] for i in range(MAX_SELECTOR_TERMS)]).record()
    assert ok.parse_error is None and ok.required_terms is not None
    assert len(ok.required_terms) == MAX_SELECTOR_TERMS
    pod = make_pod("a").required(*[[_expr(i)] for i in range(MAX_SELECTOR_TERMS + 1)]).record()
    assert pod.parse_error is not None and "nodeSelectorTerms" in pod.parse_error
    assert str(MAX_SELECTOR_TERMS) in pod.parse_error


def test_requirements_beyond_the_limit_are_refused_even_in_one_term() -> None:
    ok = make_pod("a").required([_expr(i) for i in range(MAX_REQUIREMENTS)]).record()
    assert ok.parse_error is None
    pod = make_pod("a").required([_expr(i) for i in range(MAX_REQUIREMENTS + 1)]).record()
    assert pod.parse_error is not None and str(MAX_REQUIREMENTS) in pod.parse_error


def test_preferred_terms_and_their_requirements_are_bounded_too() -> None:
    b = make_pod("a")
    for i in range(MAX_SELECTOR_TERMS + 1):
        b.preferred(1, [_expr(i)])
    error = b.record().parse_error
    assert error is not None and "preferredDuringScheduling" in error
    c = make_pod("a").preferred(1, [_expr(i) for i in range(MAX_REQUIREMENTS + 1)])
    assert c.record().parse_error is not None


def test_values_beyond_the_limit_are_refused() -> None:
    values = [f"z{i}" for i in range(MAX_VALUES)]
    ok = make_pod("a").required([{"key": "zone", "operator": "In", "values": values}]).record()
    assert ok.parse_error is None
    pod = (
        make_pod("a").required([{"key": "zone", "operator": "In", "values": [*values, "one-more"]}]).record()
    )
    assert pod.parse_error is not None and str(MAX_VALUES) in pod.parse_error


def test_host_ports_beyond_the_limit_are_refused() -> None:
    b = make_pod("a")
    for port in range(1, MAX_HOST_PORTS + 1):
        b.host_port(port)
    assert b.record().parse_error is None
    b.host_port(MAX_HOST_PORTS + 1)
    error = b.record().parse_error
    assert error is not None and str(MAX_HOST_PORTS) in error


def test_limits_are_far_above_what_real_pods_use() -> None:
    # The documented choice: generous bounds, so no real workload meets them.
    assert MAX_TOLERATIONS >= 1000 and MAX_SELECTOR_TERMS >= 100 and MAX_REQUIREMENTS >= MAX_SELECTOR_TERMS
    assert MAX_VALUES >= 10_000 and MAX_HOST_PORTS >= 100
    assert records.__doc__ is not None and "MAX_TOLERATIONS" in records.__doc__


# ----- indexed matching agrees with the plain rules ------------------------------------------------------

KEYS = ["", "a", "b"]
VALUES = ["", "x", "y"]
EFFECTS = ["", "NoSchedule", "PreferNoSchedule", "NoExecute"]
ALL_TOLERATIONS = [
    Toleration(k, op, v if op == "Equal" else "", e)
    for k, op, v, e in itertools.product(KEYS, ("Equal", "Exists"), VALUES, EFFECTS)
]
ALL_TAINTS = [Taint(k, v, e) for k, v, e in itertools.product(KEYS[1:], VALUES, EFFECTS[1:])]


def test_the_toleration_index_answers_as_the_tolerations_themselves() -> None:
    rng = random.Random(7)
    sets = [(), *[(t,) for t in ALL_TOLERATIONS]]
    sets += [tuple(rng.sample(ALL_TOLERATIONS, rng.randint(2, 8))) for _ in range(300)]
    for tolerations in sets:
        index = TolerationIndex(tolerations)
        for taint in ALL_TAINTS:
            assert index.tolerates(taint) == any(t.tolerates(taint) for t in tolerations), (
                tolerations,
                taint,
            )


def test_in_and_notin_use_the_value_set_and_keep_equality_by_values() -> None:
    a = Requirement("zone", "In", ("a", "b"))
    assert a == Requirement("zone", "In", ("a", "b")) and hash(a) == hash(
        Requirement("zone", "In", ("a", "b"))
    )
    assert a.value_set == frozenset({"a", "b"})
    assert a.matches({"zone": "b"}) and not a.matches({"zone": "c"}) and not a.matches({})
    n = Requirement("zone", "NotIn", ("a",))
    assert n.matches({}) and n.matches({"zone": "b"}) and not n.matches({"zone": "a"})
