"""Agent pod shapes for benchmarks, the demo and scale runs: generated deterministically from a seed.

A *plain* agent pod is what most agent platforms send: one container, 100m–500m CPU, 128–512Mi memory, a
session label (a few pods per session), no placement rules. The *mix* adds what real clusters also have:
tolerations for the batch taint, required zone affinity, preferred pool affinity, node selectors, and a few
GPU pods.

*Interpod* pods (``interpod_pod``) come in sandbox pools of ``POOL_SIZE``, each pool with one kind of inter-pod
rule: a third spread over zones (maxSkew 1, DoNotSchedule), a third with required anti-affinity on the hostname
against their pool, a third with a zone spread (maxSkew 2, ScheduleAnyway) and preferred hostname anti-affinity.
``pool_rule_violations`` checks placements against the hard rules of the first two kinds: the zone skew of a
spread pool (its pods are only ever added, so every placement keeping the skew keeps the end state's too) and two
pods of an anti-affinity pool on one node.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from common.wellknown import DEFAULT_SCHEDULER_NAME, SESSION_LABEL
from scale.cluster.nodes import AGENT_IMAGE, LABEL_POOL, LABEL_ZONE, ZONES

CPU_CHOICES = ("100m", "200m", "250m", "500m")
POOL_SIZE = 8
POOL_LABEL = "pool"
HOSTNAME = "kubernetes.io/hostname"
MEMORY_CHOICES = ("128Mi", "256Mi", "512Mi")


def agent_pod(
    index: int,
    *,
    namespace: str = "default",
    scheduler_name: str = DEFAULT_SCHEDULER_NAME,
    mix: bool = False,
    seed: int = 0,
    prefix: str = "agent",
    pods_per_session: int = 4,
) -> dict[str, Any]:
    rng = random.Random(f"{seed}:{index}")
    name = f"{prefix}-{index:06d}"
    container: dict[str, Any] = {
        "name": "sandbox",
        "image": AGENT_IMAGE,
        "resources": {"requests": {"cpu": rng.choice(CPU_CHOICES), "memory": rng.choice(MEMORY_CHOICES)}},
    }
    spec: dict[str, Any] = {
        "schedulerName": scheduler_name,
        "containers": [container],
        "terminationGracePeriodSeconds": 0,
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
        ],
    }
    if mix:
        kind = index % 5
        if kind == 1:
            spec["tolerations"].append(
                {"key": "dedicated", "operator": "Equal", "value": "batch", "effect": "NoSchedule"}
            )
            spec["affinity"] = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": LABEL_ZONE, "operator": "In", "values": [ZONES[index % 3]]}
                                ]
                            }
                        ]
                    },
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 20,
                            "preference": {
                                "matchExpressions": [
                                    {"key": LABEL_POOL, "operator": "In", "values": ["batch"]}
                                ]
                            },
                        }
                    ],
                }
            }
        elif kind == 2:
            spec["nodeSelector"] = {LABEL_ZONE: ZONES[(index // 5) % 3]}
        elif kind == 3:
            spec["affinity"] = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": LABEL_POOL, "operator": "NotIn", "values": ["gpu"]}
                                ]
                            }
                        ]
                    }
                }
            }
        elif kind == 4 and index % 50 == 4:
            container["resources"]["requests"]["nvidia.com/gpu"] = "1"
            container["resources"]["limits"] = {"nvidia.com/gpu": "1"}
            spec["tolerations"].append(
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app": "agent", SESSION_LABEL: f"s-{index // max(1, pods_per_session)}"},
        },
        "spec": spec,
    }


def interpod_pod(
    index: int,
    *,
    namespace: str = "default",
    scheduler_name: str = DEFAULT_SCHEDULER_NAME,
    seed: int = 0,
) -> dict[str, Any]:
    """An agent pod of sandbox pool ``index // POOL_SIZE``, with that pool's inter-pod rules."""
    pod = agent_pod(index, namespace=namespace, scheduler_name=scheduler_name, seed=seed)
    pool = index // POOL_SIZE
    selector = {"matchLabels": {POOL_LABEL: f"pool-{pool}"}}
    pod["metadata"].setdefault("labels", {})[POOL_LABEL] = f"pool-{pool}"
    spec = pod["spec"]
    kind = pool % 3
    if kind == 0:
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": LABEL_ZONE,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": selector,
            }
        ]
    elif kind == 1:
        spec["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": HOSTNAME, "labelSelector": selector}
                ]
            }
        }
    else:
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 2,
                "topologyKey": LABEL_ZONE,
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": selector,
            }
        ]
        spec["affinity"] = {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 50, "podAffinityTerm": {"topologyKey": HOSTNAME, "labelSelector": selector}}
                ]
            }
        }
    return pod


def pool_rule_violations(placed: Iterable[tuple[str, str]], zone_of: Mapping[str, str]) -> dict[str, int]:
    """Hard-rule violations among placed interpod pods: ``placed`` is (pool label value, node) per bound pod,
    ``zone_of`` each node's zone. Returns the spread pools whose zone counts differ by more than 1 (every zone
    of ``ZONES`` counts, with 0 pods too: each has untainted nodes in every fleet), the anti-affinity pools
    with two pods on one node, and how many pools of each kind were checked."""
    by_pool: dict[str, list[str]] = {}
    for pool, node in placed:
        by_pool.setdefault(pool, []).append(node)
    out = {"spread_pools": 0, "skew_violations": 0, "anti_affinity_pools": 0, "anti_affinity_violations": 0}
    for pool, nodes in by_pool.items():
        kind = int(pool.removeprefix("pool-")) % 3
        if kind == 0:
            out["spread_pools"] += 1
            zones = Counter(zone_of.get(n, "") for n in nodes)
            counts = [zones.get(z, 0) for z in ZONES]
            if max(counts) - min(counts) > 1 or sum(counts) != len(nodes):
                out["skew_violations"] += 1
        elif kind == 1:
            out["anti_affinity_pools"] += 1
            if len(set(nodes)) != len(nodes):
                out["anti_affinity_violations"] += 1
    return out
