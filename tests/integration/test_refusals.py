"""Pods using a placement field the engine does not implement are refused, never bound, on the real cluster;
the inter-pod rules a standalone worker implements are honoured.

A standalone worker (its own process, its own scheduler name) gets an ordinary pod and three pods whose rules it
cannot honour yet: a pod anti-affinity selecting namespaces by label, a claim that does not exist, and a DRA
resource claim. The ordinary pod is bound; each other one stays pending with PodScheduled=False, a message naming
its field, and exactly one FailedScheduling event.

Then the inter-pod rules, as kube-scheduler places them: three pods with required anti-affinity on the hostname
against each other, allowed two nodes: two are bound to different nodes, the third stays pending; three pods
spread over zones with maxSkew 1: one per zone; a pod with required affinity to a label no pod has: pending.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common.kube import KubeClient
from scale.cluster import Cluster
from tests.builders import make_pod
from tests.integration.support import SchedulerProcess, create_pods, list_pods, start_worker, wait_for

pytestmark = pytest.mark.integration

REMEDY = (
    "which agent-scheduler does not support yet; use the default scheduler (spec.schedulerName) for this pod"
)


@pytest.fixture
def scheduler_name() -> str:
    return f"agent-refuse-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def worker(cluster: Cluster, tmp_path: Path, scheduler_name: str) -> Iterator[SchedulerProcess]:
    proc = start_worker(cluster, tmp_path, scheduler_name, worker_id="refusal-worker")
    yield proc
    assert proc.stop() == 0, proc.tail()


def _pods(
    namespace: str, scheduler_name: str
) -> tuple[dict[str, Any], dict[str, tuple[dict[str, Any], str]]]:
    def pod(name: str) -> Any:
        return make_pod(name, namespace).scheduler(scheduler_name).req(cpu="100m").label("app", "refused")

    disk = pod("disk")
    disk.spec["volumes"] = [{"name": "workspace", "gcePersistentDisk": {"pdName": "absent"}}]
    dra = pod("dra")
    dra.spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "gpu-0"}]
    refused = {
        "disk": (disk.json(), 'spec.volumes[0].gcePersistentDisk (volume "workspace")'),
        "dra": (dra.json(), "spec.resourceClaims"),
    }
    return pod("ordinary").json(), refused


def _scheduled_false(pod: dict[str, Any]) -> dict[str, Any] | None:
    for c in pod.get("status", {}).get("conditions") or ():
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return dict(c)
    return None


async def test_pods_using_unsupported_fields_stay_pending_with_the_field_named(
    kube: KubeClient, namespace: str, worker: SchedulerProcess, scheduler_name: str
) -> None:
    ordinary, refused = _pods(namespace, scheduler_name)
    await create_pods(kube, namespace, [ordinary] + [obj for obj, _ in refused.values()])

    def settled(pods: list[dict[str, Any]]) -> bool:
        by_name = {p["metadata"]["name"]: p for p in pods}
        return bool(by_name.get("ordinary", {}).get("spec", {}).get("nodeName")) and all(
            name in by_name and _scheduled_false(by_name[name]) for name in refused
        )

    await wait_for(kube, namespace, settled, timeout=120, what="the ordinary pod bound, the others refused")
    await asyncio.sleep(5)  # the worker keeps running meanwhile: nothing may be bound or reported again

    pods = {p["metadata"]["name"]: p for p in await list_pods(kube, namespace)}
    events = (await kube.get(f"/api/v1/namespaces/{namespace}/events"))["items"]
    for name, (_, field) in refused.items():
        pod = pods[name]
        assert not pod["spec"].get("nodeName"), f"{name} was bound"
        cond = _scheduled_false(pod)
        assert cond is not None and cond["reason"] == "Unschedulable"
        assert cond["message"] == f"pod uses {field}, {REMEDY}", cond["message"]
        failed = [
            e for e in events if e["reason"] == "FailedScheduling" and e["involvedObject"]["name"] == name
        ]
        assert len(failed) == 1, (name, failed)
        assert failed[0]["message"] == cond["message"] and failed[0]["type"] == "Warning"
        assert failed[0].get("count", 1) == 1
    assert pods["ordinary"]["spec"]["nodeName"]
    assert worker.alive(), worker.tail()


ZONE = "topology.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"


async def test_inter_pod_rules_are_honoured_by_the_standalone_worker(
    kube: KubeClient, namespace: str, worker: SchedulerProcess, scheduler_name: str
) -> None:
    nodes = (await kube.get("/api/v1/nodes"))["items"]
    two = sorted(n["metadata"]["name"] for n in nodes if ZONE in n["metadata"].get("labels", {}))[:2]
    zone_of = {n["metadata"]["name"]: n["metadata"]["labels"].get(ZONE) for n in nodes}
    zones = {zone_of[n["metadata"]["name"]] for n in nodes} - {None}

    def pod(name: str, app: str) -> Any:
        return make_pod(name, namespace).scheduler(scheduler_name).req(cpu="100m").label("app", app)

    anti = [
        pod(f"anti-{i}", "anti")
        .pod_affinity(HOSTNAME, {"app": "anti"}, anti=True)
        .required([{"key": HOSTNAME, "operator": "In", "values": two}])
        for i in range(3)
    ]
    spread = [pod(f"spread-{i}", "spread").spread(ZONE, {"app": "spread"}) for i in range(len(zones))]
    lonely = pod("lonely", "lonely").pod_affinity(ZONE, {"app": "absent"})
    # one at a time, as the rules need each earlier pod placed (the worker queues them in creation order anyway)
    for p in [*anti, *spread, lonely]:
        await create_pods(kube, namespace, [p.json()])

    def settled(pods: list[dict[str, Any]]) -> bool:
        by_name = {p["metadata"]["name"]: p for p in pods}
        decided = [
            n
            for n, p in by_name.items()
            if p.get("spec", {}).get("nodeName") or _scheduled_false(p) is not None
        ]
        return len(decided) == len(anti) + len(spread) + 1

    await wait_for(kube, namespace, settled, timeout=120, what="every inter-pod pod bound or refused")
    await asyncio.sleep(2)
    pods = {p["metadata"]["name"]: p for p in await list_pods(kube, namespace)}
    anti_nodes = [pods[f"anti-{i}"]["spec"].get("nodeName") for i in range(3)]
    bound = sorted(n for n in anti_nodes if n)
    assert bound == two, anti_nodes
    waiting = [pods[f"anti-{i}"] for i in range(3) if not anti_nodes[i]]
    assert len(waiting) == 1
    cond = _scheduled_false(waiting[0])
    assert cond is not None and "didn't match pod anti-affinity rules" in cond["message"], cond
    spread_zones = sorted(zone_of[pods[f"spread-{i}"]["spec"]["nodeName"]] for i in range(len(zones)))
    assert spread_zones == sorted(zones)
    assert not pods["lonely"]["spec"].get("nodeName")
    cond = _scheduled_false(pods["lonely"])
    assert cond is not None and "didn't match pod affinity rules" in cond["message"], cond
    assert worker.alive(), worker.tail()
