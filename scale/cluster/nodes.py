"""Fake kwok nodes with realistic shapes: generated deterministically, created in parallel.

``generate_nodes(count, seed=...)`` returns complete Node objects (raw JSON dicts, the form ``KubeClient``
posts); ``create_nodes(client, nodes)`` posts them with bounded concurrency.

Invariants:
- Deterministic: node ``i`` depends only on ``(seed, i)`` (it has its own ``random.Random``), so the first 200
  nodes of a 5,000-node cluster are the 200 nodes of a 200-node cluster with the same seed. Tests and benchmarks
  may rely on shapes by name.
- Every node carries the annotation ``kwok.x-k8s.io/node: fake`` (the kwok controller manages exactly these) and
  is created *with* its status: Ready condition, capacity = allocatable, addresses, node info. The API server
  keeps a node's status on create (kubelets register that way), so a node is schedulable the moment it exists;
  kwok only keeps it alive and plays pod lifecycles on it.
- Each node gets its own ``spec.podCIDR`` (a /24 out of 10.0.0.0/8), which kwok uses to hand out pod IPs.
- Creation is idempotent: a node that already exists counts as created.

Mix (fractions are probabilities per node, so small clusters deviate a little):
- 5 % GPU nodes: 96 CPU / 680Gi / 8 ``nvidia.com/gpu``, tainted ``nvidia.com/gpu=present:NoSchedule``.
- 5 % batch nodes: 32 CPU / 128Gi, tainted ``dedicated=batch:NoSchedule``.
- the rest general purpose: 30 % 16 CPU / 64Gi, 50 % 32 CPU / 128Gi, 20 % 64 CPU / 256Gi.
- every node: 110 pods, 3 zones round-robin, ``node.volcano.sh/warmup=true`` on about 10 %.
- images (``status.images``, as a kubelet reports them, largest first): every node lists the base images
  (``BASE_IMAGES``); the warm nodes and a share ``prepulled`` of the others (default ``PREPULLED_FRACTION``)
  also list the agent images (``AGENT_IMAGES``: the sandbox image agent pods run). The share is drawn from a
  second RNG of ``(seed, i)``, so it changes no node's shape, labels or taints.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from common.backoff import Backoff
from common.events import rfc3339
from common.kube import Conflict, KubeClient, ServerError, TooManyRequests
from common.wellknown import WARM_LABEL, WARM_LABEL_VALUE

log = logging.getLogger(__name__)

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"
LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_REGION = "topology.kubernetes.io/region"
LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
LABEL_POOL = "node-pool"
GPU_RESOURCE = "nvidia.com/gpu"

REGION = "local-1"
ZONES = ("local-1a", "local-1b", "local-1c")
DEFAULT_PREFIX = "kwok-node"
DEFAULT_SEED = 0
PODS_PER_NODE = 110

GPU_FRACTION = 0.05
BATCH_FRACTION = 0.05
WARMUP_FRACTION = 0.10
PREPULLED_FRACTION = 0.20

#: the image agent pods run (``scale.workload.agent_pod``)
AGENT_IMAGE = "registry.local/agent-sandbox:1"
# (names, size in bytes) of the images pre-pulled nodes list
AGENT_IMAGES: tuple[tuple[tuple[str, ...], int], ...] = (((AGENT_IMAGE,), 2 * 1024**3),)
BASE_IMAGES: tuple[tuple[tuple[str, ...], int], ...] = ((("registry.k8s.io/pause:3.10",), 736 * 1024),)

DEFAULT_CONCURRENCY = 64
CREATE_RETRIES = 8
RETRY_INITIAL = 0.1
RETRY_MAX = 5.0


@dataclass(frozen=True, slots=True)
class NodeShape:
    """One machine type: what a node of this pool offers and how it is marked."""

    pool: str
    instance_type: str
    cpu: int
    memory_gi: int
    gpus: int = 0
    taint: tuple[str, str, str] | None = None  # (key, value, effect)


SMALL = NodeShape("general", "standard-16", 16, 64)
MEDIUM = NodeShape("general", "standard-32", 32, 128)
LARGE = NodeShape("general", "standard-64", 64, 256)
BATCH = NodeShape("batch", "standard-32", 32, 128, taint=("dedicated", "batch", "NoSchedule"))
GPU = NodeShape("gpu", "gpu-8x", 96, 680, gpus=8, taint=(GPU_RESOURCE, "present", "NoSchedule"))
GENERAL_MIX: tuple[tuple[NodeShape, float], ...] = ((SMALL, 0.3), (MEDIUM, 0.5), (LARGE, 0.2))

_NODE_IP_BASE = int(ipaddress.IPv4Address("172.16.0.1"))
_POD_CIDR_BASE = int(ipaddress.IPv4Address("10.0.0.0"))


def node_name(index: int, prefix: str = DEFAULT_PREFIX) -> str:
    return f"{prefix}-{index:05d}"


def choose_shape(rng: random.Random) -> NodeShape:
    """The shape for one node, from that node's own RNG."""
    r = rng.random()
    if r < GPU_FRACTION:
        return GPU
    if r < GPU_FRACTION + BATCH_FRACTION:
        return BATCH
    pick = rng.random()
    for shape, weight in GENERAL_MIX:
        if pick < weight:
            return shape
        pick -= weight
    return GENERAL_MIX[-1][0]


def make_node(
    index: int,
    *,
    seed: int = DEFAULT_SEED,
    prefix: str = DEFAULT_PREFIX,
    now: str | None = None,
    prepulled: float = PREPULLED_FRACTION,
) -> dict[str, Any]:
    """Node ``index`` of the deterministic fleet, as a complete Node object with Ready status.

    ``now`` (RFC 3339) stamps the conditions; the current time when omitted. ``prepulled`` is the share of
    nodes besides the warm ones that list the agent images.
    """
    rng = random.Random(f"{seed}:{index}")
    shape = choose_shape(rng)
    warm = rng.random() < WARMUP_FRACTION
    name = node_name(index, prefix)
    zone = ZONES[index % len(ZONES)]
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        LABEL_REGION: REGION,
        LABEL_ZONE: zone,
        LABEL_INSTANCE_TYPE: shape.instance_type,
        LABEL_POOL: shape.pool,
    }
    if warm:
        labels[WARM_LABEL] = WARM_LABEL_VALUE
    resources = {
        "cpu": str(shape.cpu),
        "memory": f"{shape.memory_gi}Gi",
        "pods": str(PODS_PER_NODE),
        "ephemeral-storage": "500Gi",
    }
    if shape.gpus:
        resources[GPU_RESOURCE] = str(shape.gpus)
    spec: dict[str, Any] = {
        "podCIDR": _pod_cidr(index),
        "podCIDRs": [_pod_cidr(index)],
    }
    if shape.taint:
        key, value, effect = shape.taint
        spec["taints"] = [{"key": key, "value": value, "effect": effect}]
    now = now or rfc3339()
    has_agent_images = warm or random.Random(f"{seed}:{index}:images").random() < prepulled
    images = sorted([*BASE_IMAGES, *(AGENT_IMAGES if has_agent_images else ())], key=lambda i: -i[1])
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE, "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": spec,
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "phase": "Running",
            "conditions": [
                _condition("Ready", "True", "KubeletReady", "kubelet is posting ready status", now)
            ]
            + [
                _condition(kind, "False", f"KubeletHas{reason}", f"kubelet has {reason}", now)
                for kind, reason in (
                    ("MemoryPressure", "SufficientMemory"),
                    ("DiskPressure", "NoDiskPressure"),
                    ("PIDPressure", "SufficientPID"),
                )
            ],
            "addresses": [
                {"type": "InternalIP", "address": str(ipaddress.IPv4Address(_NODE_IP_BASE + index))},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "v1.36.3-kwok",
                "kubeProxyVersion": "v1.36.3-kwok",
                "containerRuntimeVersion": "kwok",
                "kernelVersion": "kwok",
                "osImage": "kwok",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
            "images": [{"names": list(names), "sizeBytes": size} for names, size in images],
        },
    }


def generate_nodes(
    count: int,
    *,
    seed: int = DEFAULT_SEED,
    prefix: str = DEFAULT_PREFIX,
    now: str | None = None,
    prepulled: float = PREPULLED_FRACTION,
) -> list[dict[str, Any]]:
    """Nodes ``0 .. count-1`` of the deterministic fleet for ``seed`` (identical for equal arguments and ``now``)."""
    if count < 0:
        raise ValueError(f"node count must be >= 0, got {count}")
    stamp = now or rfc3339()
    return [make_node(i, seed=seed, prefix=prefix, now=stamp, prepulled=prepulled) for i in range(count)]


def _pod_cidr(index: int) -> str:
    # 65,536 /24 blocks in 10.0.0.0/8; beyond that they repeat, which kwok tolerates (IPs are cosmetic).
    block = index % 65536
    return f"{ipaddress.IPv4Address(_POD_CIDR_BASE + (block << 8))}/24"


def _condition(kind: str, status: str, reason: str, message: str, now: str) -> dict[str, str]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }


async def create_node(client: KubeClient, node: dict[str, Any]) -> bool:
    """Create one node, retrying throttling and transient errors. False when it already existed."""
    backoff = Backoff(RETRY_INITIAL, RETRY_MAX)
    for attempt in range(CREATE_RETRIES):
        try:
            await client.post("/api/v1/nodes", node)
            return True
        except Conflict:
            return False
        except (TooManyRequests, ServerError) as e:
            if attempt == CREATE_RETRIES - 1:
                raise
            log.debug("creating node %s: %s; retrying in %.1fs", node["metadata"]["name"], e, backoff.delay)
            await backoff.sleep()
    raise AssertionError("unreachable")


async def create_nodes(
    client: KubeClient, nodes: Iterable[dict[str, Any]], *, concurrency: int = DEFAULT_CONCURRENCY
) -> int:
    """Create ``nodes`` with at most ``concurrency`` requests in flight; returns how many were new.

    The first error that survives the retries cancels the rest and is raised.
    """
    queue = list(nodes)
    created = 0
    position = 0
    started = time.monotonic()

    async def worker() -> None:
        nonlocal created, position
        while position < len(queue):
            node = queue[position]
            position += 1
            if await create_node(client, node):
                created += 1

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(max(1, min(concurrency, len(queue)))):
                group.create_task(worker())
    except ExceptionGroup as group_error:
        raise group_error.exceptions[0] from group_error
    log.info(
        "created %d nodes (%d already existed) in %.1fs",
        created,
        len(queue) - created,
        time.monotonic() - started,
    )
    return created
