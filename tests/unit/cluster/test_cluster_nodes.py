"""The node fleet: deterministic, realistic, and complete enough for kube-scheduler and kwok."""

from __future__ import annotations

from collections import Counter

import pytest

from common.quantity import parse_milli, parse_units
from common.wellknown import WARM_LABEL, WARM_LABEL_VALUE
from scale.cluster.nodes import (
    GPU_RESOURCE,
    KWOK_ANNOTATION,
    LABEL_INSTANCE_TYPE,
    LABEL_POOL,
    LABEL_ZONE,
    ZONES,
    generate_nodes,
    make_node,
)

NOW = "2026-01-01T00:00:00Z"


def test_same_seed_same_fleet_and_prefix_stable() -> None:
    assert generate_nodes(50, seed=7, now=NOW) == generate_nodes(50, seed=7, now=NOW)
    small = generate_nodes(200, seed=3, now=NOW)
    large = generate_nodes(1000, seed=3, now=NOW)
    assert large[:200] == small, "node i depends only on (seed, i)"


def test_other_seed_other_shapes() -> None:
    a = [n["metadata"]["labels"][LABEL_INSTANCE_TYPE] for n in generate_nodes(200, seed=1)]
    b = [n["metadata"]["labels"][LABEL_INSTANCE_TYPE] for n in generate_nodes(200, seed=2)]
    assert a != b


def test_names_ips_and_pod_cidrs_are_unique() -> None:
    nodes = generate_nodes(5000)
    assert len({n["metadata"]["name"] for n in nodes}) == 5000
    assert len({n["spec"]["podCIDR"] for n in nodes}) == 5000
    assert len({n["status"]["addresses"][0]["address"] for n in nodes}) == 5000


def test_mix_of_shapes_labels_and_taints() -> None:
    nodes = generate_nodes(5000, seed=0)
    pools = Counter(n["metadata"]["labels"][LABEL_POOL] for n in nodes)
    assert 0.035 < pools["gpu"] / 5000 < 0.065
    assert 0.035 < pools["batch"] / 5000 < 0.065
    cpus = Counter(
        n["status"]["allocatable"]["cpu"] for n in nodes if n["metadata"]["labels"][LABEL_POOL] == "general"
    )
    assert set(cpus) == {"16", "32", "64"}
    warm = sum(1 for n in nodes if n["metadata"]["labels"].get(WARM_LABEL) == WARM_LABEL_VALUE)
    assert 0.08 < warm / 5000 < 0.12
    zones = Counter(n["metadata"]["labels"][LABEL_ZONE] for n in nodes)
    assert set(zones) == set(ZONES) and max(zones.values()) - min(zones.values()) <= 1
    for node in nodes:
        pool = node["metadata"]["labels"][LABEL_POOL]
        taints = node["spec"].get("taints") or []
        if pool == "gpu":
            assert node["status"]["allocatable"][GPU_RESOURCE] == "8"
            assert taints == [{"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}]
        elif pool == "batch":
            assert taints == [{"key": "dedicated", "value": "batch", "effect": "NoSchedule"}]
        else:
            assert not taints and GPU_RESOURCE not in node["status"]["allocatable"]


def test_node_is_ready_kwok_managed_and_parseable() -> None:
    node = make_node(12, seed=0)
    assert node["metadata"]["name"] == "kwok-node-00012"
    assert node["metadata"]["annotations"][KWOK_ANNOTATION] == "fake"
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True"
    allocatable = node["status"]["allocatable"]
    assert parse_milli(allocatable["cpu"]) >= 16000
    assert parse_units(allocatable["memory"]) >= 64 * 2**30
    assert parse_units(allocatable["pods"]) == 110
    assert node["status"]["capacity"] == allocatable


def test_prefix_and_negative_count() -> None:
    assert make_node(3, prefix="pool-a")["metadata"]["name"] == "pool-a-00003"
    assert generate_nodes(0) == []
    with pytest.raises(ValueError):
        generate_nodes(-1)
