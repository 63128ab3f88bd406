"""Input a tenant controls does not stop the standalone worker, on the real local cluster.

The worker runs as its own process (by PID) with a scheduler name of its own. Into the cluster go a pod of
about 600 KiB, a node whose status is about 600 KiB (both far above aiohttp's 128 KiB line limit, below the
API server's 3 MiB request limit), a node claiming ``cpu: 1e20`` (beyond int64 milli-units) and pods whose
quantities or placement rules are beyond what the worker accepts. Afterwards the worker is still running, the
big pod is bound, the big node is used, the hostile pods are reported unschedulable with the field named, and
ordinary pods are bound. All of it is created once the worker is watching (a first pod is bound), so it
reaches the worker as watch events. The test's nodes carry a taint of their own, so no other test's pods land
there, and are deleted afterwards.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from common.kube import KubeClient, NotFound
from common.records import MAX_TOLERATIONS
from scale.cluster import Cluster
from scale.cluster.nodes import make_node
from tests.builders import make_pod
from tests.integration.support import (
    SchedulerProcess,
    all_bound,
    create_pods,
    list_pods,
    start_worker,
    wait_for,
)

pytestmark = pytest.mark.integration

BIG = 600 * 1024
TAINT = "hostile-input-test"
TIMEOUT = 120.0  # a guard against hanging, not a speed requirement


@pytest.fixture
def scheduler_name() -> str:
    return f"agent-hostile-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def worker(cluster: Cluster, tmp_path: Path, scheduler_name: str) -> Iterator[SchedulerProcess]:
    proc = start_worker(cluster, tmp_path, scheduler_name, worker_id="hostile-worker")
    yield proc
    assert proc.stop() == 0, proc.tail()


def _node(run: str, index: int, role: str) -> dict[str, Any]:
    node = make_node(60_000 + index, prefix=f"hostile-{run}-{role}")
    node["metadata"]["labels"]["hostile-role"] = role
    node["spec"]["taints"] = [{"key": TAINT, "value": run, "effect": "NoSchedule"}]
    return node


def _hostile_nodes(run: str) -> list[dict[str, Any]]:
    big = _node(run, 0, "big")
    # Image names a kubelet would report: about 600 KiB of them.
    big["status"]["images"] = [
        {
            "names": [f"registry.example/team-{i}/image@sha256:{i:064x}", f"image-{i}:{'v' * 60}"],
            "sizeBytes": i,
        }
        for i in range(BIG // 200)
    ]
    huge_cpu = _node(run, 1, "huge-cpu")
    for key in ("capacity", "allocatable"):
        huge_cpu["status"][key]["cpu"] = "1e20"
    assert len(orjson.dumps(big)) > BIG
    return [big, huge_cpu]


class HostileNodes:
    """A node with a ~600 KiB status and a node claiming 1e20 CPUs, made by ``create`` (once the worker
    watches, so that they reach it as watch events, not in its first list); deleted after the test."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.run = uuid.uuid4().hex[:6]
        self.nodes = _hostile_nodes(self.run)

    async def create(self) -> None:
        for node in self.nodes:
            await self.kube.post("/api/v1/nodes", node)

    async def delete(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(NotFound):
                await self.kube.delete(f"/api/v1/nodes/{node['metadata']['name']}")


@pytest.fixture
async def hostile_nodes(kube: KubeClient) -> AsyncIterator[HostileNodes]:
    nodes = HostileNodes(kube)
    try:
        yield nodes
    finally:
        await nodes.delete()


def _on(role: str, run: str, name: str, namespace: str, scheduler_name: str) -> Any:
    return (
        make_pod(name, namespace)
        .scheduler(scheduler_name)
        .req(cpu="100m", memory="64Mi")
        .node_selector(**{"hostile-role": role})
        .toleration(TAINT, run, effect="NoSchedule")
    )


def _scheduled_false(pods: list[dict[str, Any]], name: str) -> str | None:
    for p in pods:
        if p["metadata"]["name"] != name:
            continue
        for c in p.get("status", {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False":
                return str(c.get("message") or "")
    return None


async def test_big_objects_and_hostile_values_leave_the_worker_scheduling(
    kube: KubeClient,
    namespace: str,
    worker: SchedulerProcess,
    scheduler_name: str,
    hostile_nodes: HostileNodes,
) -> None:
    run = hostile_nodes.run
    # Once this pod is bound the worker has listed and is watching: what follows reaches it as watch events.
    warm_up = make_pod("warm-up", namespace).scheduler(scheduler_name).req(cpu="100m").json()
    await create_pods(kube, namespace, [warm_up])
    await wait_for(kube, namespace, all_bound(1), timeout=TIMEOUT, what="the warm-up pod bound")
    await hostile_nodes.create()
    # The ~600 KiB pod: a big environment (annotations are capped at 256 KiB by the API server).
    big_pod = make_pod("big-pod", namespace).scheduler(scheduler_name).req(cpu="100m").json()
    big_pod["spec"]["containers"][0]["env"] = [
        {"name": f"VAR_{i}", "value": "x" * 190} for i in range(BIG // 200)
    ]
    assert len(orjson.dumps(big_pod)) > BIG
    on_big_node = _on("big", run, "on-big-node", namespace, scheduler_name).json()
    await create_pods(kube, namespace, [big_pod, on_big_node])
    pods = await wait_for(
        kube, namespace, all_bound(3), timeout=TIMEOUT, what="the big pod and the pod on the big node"
    )
    where = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods}
    assert where["on-big-node"] == f"hostile-{run}-big-60000"

    # Values the worker refuses, each for that pod or node only.
    on_huge_cpu = _on("huge-cpu", run, "on-huge-cpu-node", namespace, scheduler_name).json()
    huge_request = make_pod("huge-request", namespace).scheduler(scheduler_name).req(cpu="1e20").json()
    many = make_pod("many-tolerations", namespace).scheduler(scheduler_name).req(cpu="100m")
    for i in range(MAX_TOLERATIONS + 1):
        many.toleration(f"example.com/t{i}", operator="Exists")
    await create_pods(kube, namespace, [on_huge_cpu, huge_request, many.json()])
    expected = {
        "on-huge-cpu-node": "invalid allocatable",
        "huge-request": "spec.containers[0].resources.requests.cpu",
        "many-tolerations": f"limit of {MAX_TOLERATIONS}",
    }

    def reported(pods: list[dict[str, Any]]) -> bool:
        return all(_scheduled_false(pods, name) is not None for name in expected)

    pods = await wait_for(kube, namespace, reported, timeout=TIMEOUT, what="the hostile pods reported")
    for name, text in expected.items():
        message = _scheduled_false(pods, name)
        assert message is not None and text in message, (name, message)

    # Ordinary pods after all of it.
    ordinary = [
        make_pod(f"ordinary-{i}", namespace).scheduler(scheduler_name).req(cpu="100m").json()
        for i in range(20)
    ]
    await create_pods(kube, namespace, ordinary)

    def ordinary_bound(pods: list[dict[str, Any]]) -> bool:
        return (
            sum(
                1 for p in pods if p["metadata"]["name"].startswith("ordinary-") and p["spec"].get("nodeName")
            )
            == 20
        )

    await wait_for(kube, namespace, ordinary_bound, timeout=TIMEOUT, what="20 ordinary pods bound")
    assert worker.alive(), worker.tail()
    pods = await list_pods(kube, namespace)
    assert not any(p["spec"].get("nodeName") for p in pods if p["metadata"]["name"] in expected)
    log = worker.log_path.read_text()
    assert "Traceback" not in log, worker.tail(80)
    assert "relisting in" not in log, "600 KiB events are read, not skipped: " + worker.tail(80)
