"""The local cluster is real: kube-scheduler binds pods to kwok nodes, kwok runs them, kube-controller-manager
runs workloads, binds volumes and collects garbage, and ``down`` leaves nothing.

The tests that take ``kube`` use the session cluster (``tests/conftest.py``); the last two start clusters of their
own beside it, which also shows that two clusters run side by side on free ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agent_scheduler import cli
from common.kube import KubeClient, NotFound
from scale.cluster import Cluster, DirectoryInUse, make_node, start_cluster
from scale.cluster.processes import ProcessRecord

pytestmark = pytest.mark.integration

PODS = 500
SESSION_NODES = 500  # tests/conftest.py CLUSTER_NODES
CREATE_CONCURRENCY = 50


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "harness"}},
        "spec": {
            "containers": [
                {
                    "name": "agent",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                }
            ]
        },
    }


async def _create_pods(kube: KubeClient, namespace: str, count: int) -> None:
    names = iter(range(count))

    async def worker() -> None:
        for i in names:
            await kube.post(f"/api/v1/namespaces/{namespace}/pods", _pod(f"pod-{i:04d}"))

    await asyncio.gather(*(worker() for _ in range(CREATE_CONCURRENCY)))


async def _list_pods(kube: KubeClient, namespace: str) -> list[dict[str, Any]]:
    page = await kube.get(f"/api/v1/namespaces/{namespace}/pods")
    items: list[dict[str, Any]] = page.get("items") or []
    return items


async def test_kube_scheduler_binds_every_pod_and_kwok_runs_them(
    cluster: Cluster, kube: KubeClient, namespace: str
) -> None:
    nodes = (await kube.get("/api/v1/nodes")).get("items") or []
    assert len(nodes) >= SESSION_NODES
    tainted = {n["metadata"]["name"] for n in nodes if n.get("spec", {}).get("taints")}
    fake = {
        n["metadata"]["name"]
        for n in nodes
        if n["metadata"]["annotations"].get("kwok.x-k8s.io/node") == "fake"
    }

    await _create_pods(kube, namespace, PODS)

    deadline = time.monotonic() + 120
    while True:
        pods = await _list_pods(kube, namespace)
        running = [p for p in pods if p.get("status", {}).get("phase") == "Running"]
        if len(running) == PODS or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)

    assert len(pods) == PODS
    unbound = [p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName")]
    assert not unbound, f"{len(unbound)} pods not bound, e.g. {unbound[:5]}"
    assert len(running) == PODS, f"only {len(running)}/{PODS} Running"
    placed = {p["spec"]["nodeName"] for p in pods}
    assert placed <= fake, "every pod runs on a kwok node"
    assert not placed & tainted, "no pod lands on a tainted node it does not tolerate"
    assert all(p["status"].get("podIP") for p in running), "kwok assigns pod IPs"


async def test_kwok_starts_a_pod_bound_to_a_node_before_the_node_exists(
    cluster: Cluster, kube: KubeClient, namespace: str
) -> None:
    """kwok skips a pod whose node it does not manage yet; it must list the node's pods once it takes the node.

    The pod is created first, so kwok always handles its ADDED event before the node's: the order a node and a
    pod bound to it right after sometimes arrive in (``scale.cluster.stages.KWOK_CONFIGURATION``)."""
    name = f"late-{namespace[-6:]}"
    pod = _pod(name)
    pod["spec"]["nodeName"] = name
    await kube.post(f"/api/v1/namespaces/{namespace}/pods", pod)
    await asyncio.sleep(1.0)  # kwok has seen the pod and skipped it: its node does not exist
    node = make_node(SESSION_NODES + 90_000, prefix="late")
    node["metadata"]["name"] = name
    node["metadata"]["labels"]["kubernetes.io/hostname"] = name
    await kube.post("/api/v1/nodes", node)
    try:

        async def started() -> bool:
            obj = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
            return bool(obj.get("status", {}).get("startTime"))

        await _wait(f"kwok to start {name}", started, timeout=60.0)
    finally:
        with contextlib.suppress(NotFound):
            await kube.delete(f"/api/v1/nodes/{name}")


async def _wait(what: str, check: Callable[[], Awaitable[Any]], timeout: float = 120.0) -> Any:
    """Poll ``check`` until it returns something truthy; a guard against hanging, not a speed requirement."""
    deadline = time.monotonic() + timeout
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.5)


def _deployment(name: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {
                            "name": "agent",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"requests": {"cpu": "10m"}},
                        }
                    ]
                },
            },
        },
    }


async def test_controller_manager_runs_workloads_binds_volumes_and_collects_garbage(
    kube: KubeClient, namespace: str
) -> None:
    ns = f"/api/v1/namespaces/{namespace}"
    apps = f"/apis/apps/v1/namespaces/{namespace}"
    pv_name = f"pv-{namespace}"
    await kube.post(f"{apps}/deployments", _deployment("web", 3))
    await kube.post(
        "/api/v1/persistentvolumes",
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv_name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "hostPath": {"path": f"/tmp/{pv_name}"},
                # only this test's claim may take it (the PV binder could pick any matching claim)
                "claimRef": {"namespace": namespace, "name": "workspace"},
            },
        },
    )
    try:
        await kube.post(
            f"{ns}/persistentvolumeclaims",
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "workspace"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "",
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            },
        )

        # the Deployment makes a ReplicaSet, the ReplicaSet makes pods, kube-scheduler binds them
        async def bound_pods() -> list[dict[str, Any]]:
            pods = await _list_pods(kube, namespace)
            return pods if len(pods) == 3 and all(p["spec"].get("nodeName") for p in pods) else []

        pods = await _wait("3 Deployment pods bound", bound_pods)
        owners = {ref["kind"] for p in pods for ref in p["metadata"].get("ownerReferences") or ()}
        assert owners == {"ReplicaSet"}

        # the PV binder binds the pre-created PV to the claim (Immediate binding)
        async def claim_bound() -> bool:
            claim = await kube.get(f"{ns}/persistentvolumeclaims/workspace")
            return bool(claim.get("status", {}).get("phase") == "Bound")

        await _wait("the claim Bound", claim_bound)
        pv = await kube.get(f"/api/v1/persistentvolumes/{pv_name}")
        assert pv["status"]["phase"] == "Bound"
        claim = await kube.get(f"{ns}/persistentvolumeclaims/workspace")
        assert claim["spec"]["volumeName"] == pv_name

        # deleting the Deployment (background propagation): the garbage collector removes its ReplicaSet and pods
        await kube.delete(f"{apps}/deployments/web", {"propagationPolicy": "Background"})

        async def collected() -> bool:
            sets = (await kube.get(f"{apps}/replicasets")).get("items") or []
            return not sets and not await _list_pods(kube, namespace)

        await _wait("the ReplicaSet and its pods garbage-collected", collected)
    finally:
        # the claim first: the PV's protection finalizer lets it go once it is no longer Bound
        with contextlib.suppress(NotFound):
            await kube.delete(f"{ns}/persistentvolumeclaims/workspace")
        await kube.delete(f"/api/v1/persistentvolumes/{pv_name}")


def _alive(record: ProcessRecord) -> bool:
    """Independent of the package under test: the PID exists, is not a zombie, and was started at the recorded
    kernel tick (field 22 of ``/proc/PID/stat``, after the command name's closing parenthesis: a clock step
    does not move it, as it moves psutil's ``create_time()``)."""
    assert record.start_ticks is not None, "every record this test makes has its start ticks"
    try:
        with open(f"/proc/{record.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    # fields[0] is field 3 (the state): field 22 is fields[19]
    return fields[0] != "Z" and int(fields[19]) == record.start_ticks


@pytest.mark.slow
def test_cluster_down_leaves_no_process(tmp_path: Path) -> None:
    directory = tmp_path / "own"
    handle = start_cluster(directory, nodes=10, with_kube_scheduler=True)
    try:
        records = handle.processes
        assert [r.name for r in records] == [
            "etcd",
            "kube-apiserver",
            "kwok",
            "kube-controller-manager",
            "kube-scheduler",
        ]
        assert all(_alive(r) for r in records)
        assert Cluster.open(directory).count_nodes() == 10

        assert cli.main(["cluster", "down", "--dir", str(directory)]) == 0

        assert not [r.name for r in records if _alive(r)]
        assert not directory.exists()
    finally:
        handle.stop()  # no-op when down worked; reaps and cleans up when an assertion failed


@pytest.mark.slow
def test_leftover_directory_needs_force(tmp_path: Path) -> None:
    directory = tmp_path / "leftover"
    first = start_cluster(directory)
    try:
        with pytest.raises(DirectoryInUse, match="--force") as info:
            start_cluster(directory)
        assert info.value.running

        second = start_cluster(directory, force=True)
        try:
            assert not [r.name for r in first.processes if _alive(r)], "--force stopped the earlier processes"
            assert all(_alive(r) for r in second.processes)
        finally:
            second.stop()
    finally:
        first.stop()
    assert not directory.exists()
