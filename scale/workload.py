"""Agent pod shapes for benchmarks, the demo and scale runs: generated deterministically from a seed.

A *plain* agent pod is what most agent platforms send: one container, 100m–500m CPU, 128–512Mi memory, a
session label (a few pods per session), no placement rules. The *mix* adds what real clusters also have:
tolerations for the batch taint, required zone affinity, preferred pool affinity, node selectors, and a few
GPU pods.
"""

from __future__ import annotations

import random
from typing import Any

from common.wellknown import DEFAULT_SCHEDULER_NAME, SESSION_LABEL
from scale.cluster.nodes import AGENT_IMAGE, LABEL_POOL, LABEL_ZONE, ZONES

CPU_CHOICES = ("100m", "200m", "250m", "500m")
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
