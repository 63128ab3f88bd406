"""The standalone worker against the real local cluster: bursts, capacity, explanations, gates, watch cuts.

Each test starts ``agent-scheduler worker --standalone`` as its own process (by PID) with a scheduler name of
its own, so tests cannot take each other's pods, and checks what the API server reports afterwards.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from common.kube import KubeClient
from scale.cluster import Cluster
from scale.cluster.config import kubeconfig_document
from scale.workload import agent_pod
from tests.builders import make_pod
from tests.conftest import delete_namespace
from tests.integration.support import (
    CuttableProxy,
    SchedulerProcess,
    all_bound,
    audit_capacity,
    create_pods,
    list_pods,
    start_worker,
    wait_for,
)

pytestmark = pytest.mark.integration

BOUND_TIMEOUT = 180.0  # a guard against hanging, not a speed requirement


@pytest.fixture
def scheduler_name() -> str:
    return f"agent-test-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def worker(cluster: Cluster, tmp_path: Path, scheduler_name: str) -> Iterator[SchedulerProcess]:
    proc = start_worker(cluster, tmp_path, scheduler_name)
    yield proc
    assert proc.stop() == 0, proc.tail()


@pytest.mark.slow
async def test_burst_of_2000_agent_pods_all_bound_without_overcommit(
    kube: KubeClient, namespace: str, worker: SchedulerProcess, scheduler_name: str
) -> None:
    pods = [
        agent_pod(i, namespace=namespace, scheduler_name=scheduler_name, mix=i % 4 == 0) for i in range(2000)
    ]
    await create_pods(kube, namespace, pods)
    bound = await wait_for(kube, namespace, all_bound(2000), timeout=BOUND_TIMEOUT, what="2000 pods bound")
    assert len({p["metadata"]["uid"] for p in bound}) == 2000
    audit = await audit_capacity(kube)
    assert audit.overcommitted == []
    # the engine binpacks: far fewer nodes than pods are used
    used = {p["spec"]["nodeName"] for p in bound}
    assert len(used) < 400, len(used)
    assert worker.alive(), worker.tail()


async def test_unschedulable_pod_gets_condition_and_one_event(
    kube: KubeClient, namespace: str, worker: SchedulerProcess, scheduler_name: str
) -> None:
    pod = make_pod("too-big", namespace).scheduler(scheduler_name).req(cpu="1000").json()
    await create_pods(kube, namespace, [pod])

    def has_condition(pods: list[dict[str, Any]]) -> bool:
        conds = pods[0].get("status", {}).get("conditions") or []
        return any(c.get("type") == "PodScheduled" and c.get("status") == "False" for c in conds)

    pods = await wait_for(kube, namespace, has_condition, timeout=60, what="PodScheduled=False")
    cond = next(c for c in pods[0]["status"]["conditions"] if c["type"] == "PodScheduled")
    assert cond["reason"] == "Unschedulable"
    assert cond["message"].startswith("0/") and "Insufficient cpu" in cond["message"]
    await asyncio.sleep(3)  # the pod is retried meanwhile (backoff); the report must not repeat
    events = (await kube.get(f"/api/v1/namespaces/{namespace}/events"))["items"]
    failed = [
        e for e in events if e["reason"] == "FailedScheduling" and e["involvedObject"]["name"] == "too-big"
    ]
    assert len(failed) == 1, failed
    assert failed[0]["message"] == cond["message"]
    assert failed[0]["type"] == "Warning"


async def test_gated_pod_waits_until_ungated(
    kube: KubeClient, namespace: str, worker: SchedulerProcess, scheduler_name: str
) -> None:
    gated = (
        make_pod("gated", namespace)
        .scheduler(scheduler_name)
        .req(cpu="100m")
        .gate("example.com/quota")
        .json()
    )
    free = make_pod("free", namespace).scheduler(scheduler_name).req(cpu="100m").json()
    await create_pods(kube, namespace, [gated, free])
    await wait_for(
        kube,
        namespace,
        lambda pods: any(p["metadata"]["name"] == "free" and p["spec"].get("nodeName") for p in pods),
        timeout=60,
        what="the ungated pod bound",
    )
    await asyncio.sleep(2)
    pods = {p["metadata"]["name"]: p for p in await list_pods(kube, namespace)}
    assert not pods["gated"]["spec"].get("nodeName")
    await kube.patch(f"/api/v1/namespaces/{namespace}/pods/gated", {"spec": {"schedulingGates": None}})
    await wait_for(kube, namespace, all_bound(2), timeout=60, what="the ungated pod bound")


async def test_scheduled_event_on_success(
    kube: KubeClient, namespace: str, worker: SchedulerProcess, scheduler_name: str
) -> None:
    await create_pods(
        kube, namespace, [make_pod("p", namespace).scheduler(scheduler_name).req(cpu="100m").json()]
    )
    pods = await wait_for(kube, namespace, all_bound(1), timeout=60, what="pod bound")
    node = pods[0]["spec"]["nodeName"]
    for _ in range(40):
        events = (await kube.get(f"/api/v1/namespaces/{namespace}/events"))["items"]
        scheduled = [e for e in events if e["reason"] == "Scheduled"]
        if scheduled:
            break
        await asyncio.sleep(0.25)
    assert len(scheduled) == 1 and scheduled[0]["message"] == f"Successfully assigned {namespace}/p to {node}"


@pytest.mark.slow
async def test_watch_cut_mid_burst_loses_and_duplicates_nothing(
    kube: KubeClient, cluster: Cluster, namespace: str, scheduler_name: str, tmp_path: Path
) -> None:
    url = urlparse(cluster.server)
    proxy = CuttableProxy(url.hostname or "127.0.0.1", url.port or 443)
    port = await proxy.start()
    kubeconfig = tmp_path / "proxied.kubeconfig"
    kubeconfig.write_text(
        kubeconfig_document(
            server=f"https://127.0.0.1:{port}",
            ca_pem=cluster.ca_file.read_bytes(),
            token=cluster.token,
            user="admin",
        )
    )
    proc = start_worker(cluster, tmp_path, scheduler_name, kubeconfig=kubeconfig)
    try:
        pods = [agent_pod(i, namespace=namespace, scheduler_name=scheduler_name) for i in range(1000)]
        creating = asyncio.create_task(create_pods(kube, namespace, pods, concurrency=8))
        cut_connections = 0
        while not creating.done() or proxy.cuts < 3:
            await asyncio.sleep(0.7)
            cut_connections += proxy.cut()
        await creating
        bound = await wait_for(
            kube, namespace, all_bound(1000), timeout=BOUND_TIMEOUT, what="1000 pods bound"
        )
        assert len({p["metadata"]["uid"] for p in bound}) == 1000
        audit = await audit_capacity(kube)
        assert audit.overcommitted == []
        assert proxy.cuts >= 3 and cut_connections >= proxy.cuts  # the watches really were cut
        assert proc.alive(), proc.tail()
    finally:
        # stopped from a thread: the proxy runs on this event loop, and the worker's last requests (bindings
        # whose answers a cut lost, retried as it drains) must still get through while it stops
        code = await asyncio.to_thread(proc.stop)
        await proxy.stop()
    assert code == 0, proc.tail()


async def test_a_namespace_labelled_lets_in_a_pod_waiting_for_affinity_by_namespace_selector(
    kube: KubeClient, namespace: str, worker: SchedulerProcess, scheduler_name: str
) -> None:
    """The worker's Namespace watch: a required podAffinity selecting namespaces by label waits while no
    namespace with that label holds a matching pod, and is placed beside it once that namespace is labelled."""
    other = f"{namespace}-db"
    await kube.post(
        "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other}}
    )
    try:
        db = make_pod("db", other).scheduler(scheduler_name).req(cpu="100m").label("app", "db").json()
        await create_pods(kube, other, [db])
        (placed,) = await wait_for(kube, other, all_bound(1), timeout=BOUND_TIMEOUT, what="db bound")
        web = make_pod("web", namespace).scheduler(scheduler_name).req(cpu="100m")
        web.pod_affinity(
            "kubernetes.io/hostname", {"app": "db"}, namespace_selector={"matchLabels": {"team": "db"}}
        )
        await create_pods(kube, namespace, [web.json()])

        def waiting(pods: list[dict[str, Any]]) -> bool:
            conds = pods[0].get("status", {}).get("conditions") or []
            return any(c.get("type") == "PodScheduled" and c.get("status") == "False" for c in conds)

        (pending,) = await wait_for(kube, namespace, waiting, timeout=60, what="web unschedulable")
        assert not pending["spec"].get("nodeName")
        await kube.patch(f"/api/v1/namespaces/{other}", {"metadata": {"labels": {"team": "db"}}})
        (bound,) = await wait_for(kube, namespace, all_bound(1), timeout=BOUND_TIMEOUT, what="web bound")
        assert bound["spec"]["nodeName"] == placed["spec"]["nodeName"]
        assert worker.alive(), worker.tail()
    finally:
        await delete_namespace(kube, other)


async def test_the_api_server_takes_a_binding_with_its_deadline(kube: KubeClient, namespace: str) -> None:
    # The binder sends its attempt's deadline as the request's `timeout` (the server's deadline for it):
    # kube-apiserver must accept it on the binding subresource and apply the binding within it.
    pod = make_pod("deadline").scheduler("nobody").obj
    pod["metadata"]["namespace"] = namespace
    created = await kube.post(f"/api/v1/namespaces/{namespace}/pods", pod)
    nodes = (await kube.get("/api/v1/nodes"))["items"]
    node = nodes[0]["metadata"]["name"]
    await kube.bind(namespace, "deadline", created["metadata"]["uid"], node, timeout=5.0)
    bound = await kube.get(f"/api/v1/namespaces/{namespace}/pods/deadline")
    assert bound["spec"]["nodeName"] == node
