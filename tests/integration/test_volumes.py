"""Volumes on the real cluster: a standalone worker, kube-controller-manager's PV controller, and the test
provisioner (``scale.testprovisioner``, started and stopped by PID here).

One test, several pods, each checking one of kube-scheduler's VolumeBinding/VolumeRestrictions outcomes:
- a claim that does not exist: pending, ``persistentvolumeclaim "absent" not found``;
- an unbound claim of an Immediate class nothing can satisfy: pending, ``pod has unbound immediate
  PersistentVolumeClaims``;
- a claim the PV controller bound to a PV with node affinity to one node: the pod lands on that node;
- a WaitForFirstConsumer claim with one matching local PV (node affinity to one node): the worker writes the PV's
  claimRef, the PV controller binds, the pod lands on that node;
- a WaitForFirstConsumer claim of a class this test's provisioner serves, together with a second such claim:
  the worker annotates both with the selected node, the provisioner makes PVs in that node's zone, the PV
  controller binds them, and the pod is bound only then (both claims bound when the pod is);
- a ReadWriteOncePod claim already used by a bound pod: a second pod using it stays pending with kube's reason.

Then a CSINode attach limit (NodeVolumeLimits), and the same claims under a coordinator with two workers:
volume filters are node-local, and the claim writes carry resourceVersions, so a shard decides them alone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common.kube import KubeClient, NotFound
from scale.cluster import Cluster
from tests.builders import make_pod
from tests.integration import test_coordinator as coordinated
from tests.integration import volumes
from tests.integration.support import SchedulerProcess, create_pods, list_pods, start_worker, wait_for
from tests.integration.volumes import HOST, ZONE, claim, local_pv, mount

pytestmark = pytest.mark.integration

# the coordinator test's fixtures: a lease etcd for the module, a coordinator/worker deployment per test
lease_etcd = coordinated.lease_etcd
deployment = coordinated.deployment

SELECTED_NODE = "volume.kubernetes.io/selected-node"

# the storage fixtures: this run's StorageClasses, and the test provisioner (started and stopped by PID)
run = volumes.run
provisioner = volumes.provisioner
storage = volumes.storage


@pytest.fixture
def worker(cluster: Cluster, tmp_path: Path, run: str) -> Iterator[SchedulerProcess]:
    proc = start_worker(cluster, tmp_path, f"agent-vol-{run}", worker_id="volume-worker")
    yield proc
    assert proc.stop() == 0, proc.tail()


def pod_with(name: str, namespace: str, scheduler: str, *claims: str) -> dict[str, Any]:
    return mount(make_pod(name, namespace).scheduler(scheduler).req(cpu="100m").json(), *claims)


def _pending_message(pod: dict[str, Any]) -> str | None:
    for c in pod.get("status", {}).get("conditions") or ():
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return str(c.get("message") or "")
    return None


async def _plain_nodes(kube: KubeClient) -> list[dict[str, Any]]:
    """Fleet nodes without taints, in two different zones first."""
    nodes = [
        n
        for n in (await kube.get("/api/v1/nodes"))["items"]
        if not n["spec"].get("taints")
        and not n["spec"].get("unschedulable")
        and ZONE in n["metadata"]["labels"]
    ]
    return sorted(nodes, key=lambda n: n["metadata"]["name"])


async def _claim_phase(kube: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = await kube.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}")
    return obj


async def test_volume_binding_outcomes_on_the_real_cluster(
    kube: KubeClient,
    namespace: str,
    run: str,
    storage: dict[str, str],
    worker: SchedulerProcess,
) -> None:
    scheduler = f"agent-vol-{run}"
    nodes = await _plain_nodes(kube)
    pinned, static_node = nodes[0]["metadata"]["name"], nodes[1]["metadata"]["name"]
    claims_path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims"

    # a PV pinned to one node, bound by the PV controller to an Immediate claim (no class: static binding)
    await kube.post(
        "/api/v1/persistentvolumes", local_pv(f"bound-{run}", storage["immediate"], key=HOST, value=pinned)
    )
    await kube.post(claims_path, claim("bound", storage["immediate"]))
    await kube.post(claims_path, claim("nothing", storage["immediate"], size="500Gi"))  # no PV that big
    # WaitForFirstConsumer with one local PV on another node
    await kube.post(
        "/api/v1/persistentvolumes", local_pv(f"static-{run}", storage["local"], key=HOST, value=static_node)
    )
    await kube.post(claims_path, claim("static", storage["local"]))
    # WaitForFirstConsumer provisioned on demand, two claims for one pod
    await kube.post(claims_path, claim("dyn-a", storage["dynamic"]))
    await kube.post(claims_path, claim("dyn-b", storage["dynamic"]))
    # ReadWriteOncePod, provisioned
    await kube.post(claims_path, claim("solo", storage["dynamic"], modes=("ReadWriteOncePod",)))

    for _ in range(120):  # the PV controller binds "bound" (Immediate) on its own
        if (await _claim_phase(kube, namespace, "bound")).get("status", {}).get("phase") == "Bound":
            break
        await asyncio.sleep(0.5)
    else:
        raise AssertionError("the PV controller did not bind the Immediate claim")

    await create_pods(
        kube,
        namespace,
        [
            pod_with("missing", namespace, scheduler, "absent"),
            pod_with("immediate", namespace, scheduler, "nothing"),
            pod_with("on-bound-pv", namespace, scheduler, "bound"),
            pod_with("wffc-static", namespace, scheduler, "static"),
            pod_with("wffc-dynamic", namespace, scheduler, "dyn-a", "dyn-b"),
            pod_with("solo-1", namespace, scheduler, "solo"),
        ],
    )
    placed = ("on-bound-pv", "wffc-static", "wffc-dynamic", "solo-1")
    pending = ("missing", "immediate")

    def settled(pods: list[dict[str, Any]]) -> bool:
        by = {p["metadata"]["name"]: p for p in pods}
        return all(by.get(n, {}).get("spec", {}).get("nodeName") for n in placed) and all(
            n in by and _pending_message(by[n]) for n in pending
        )

    try:
        pods = await wait_for(kube, namespace, settled, timeout=180, what="volume pods placed or pending")
    except AssertionError as e:
        states = {
            p["metadata"]["name"]: p["spec"].get("nodeName") or _pending_message(p)
            for p in await list_pods(kube, namespace)
        }
        raise AssertionError(f"{e}: {states}\n{worker.tail(60)}") from None
    by = {p["metadata"]["name"]: p for p in pods}
    assert 'persistentvolumeclaim "absent" not found' in (_pending_message(by["missing"]) or "")
    assert "pod has unbound immediate PersistentVolumeClaims" in (_pending_message(by["immediate"]) or "")
    assert by["on-bound-pv"]["spec"]["nodeName"] == pinned
    assert by["wffc-static"]["spec"]["nodeName"] == static_node
    static = await _claim_phase(kube, namespace, "static")
    assert static["spec"].get("volumeName") == f"static-{run}"

    node = by["wffc-dynamic"]["spec"]["nodeName"]
    zone = next(n for n in nodes if n["metadata"]["name"] == node)["metadata"]["labels"][ZONE]
    for name in ("dyn-a", "dyn-b"):
        c = await _claim_phase(kube, namespace, name)
        assert c["metadata"]["annotations"].get(SELECTED_NODE) == node
        assert c["status"].get("phase") == "Bound", c
        pv = await kube.get(f"/api/v1/persistentvolumes/{c['spec']['volumeName']}")
        terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
        assert terms[0]["matchExpressions"][0]["values"] == [zone]

    solo = await _claim_phase(kube, namespace, "solo")
    assert solo["metadata"]["annotations"]["agent-scheduler.io/read-write-once-pod"] == (
        f"{namespace}/solo-1/{by['solo-1']['metadata']['uid']}"
    )
    # a second user of the ReadWriteOncePod claim stays pending with kube's reason
    await create_pods(kube, namespace, [pod_with("solo-2", namespace, scheduler, "solo")])
    pods = await wait_for(
        kube,
        namespace,
        lambda ps: any(p["metadata"]["name"] == "solo-2" and _pending_message(p) for p in ps),
        timeout=60,
        what="the second ReadWriteOncePod user pending",
    )
    solo2 = next(p for p in pods if p["metadata"]["name"] == "solo-2")
    assert "ReadWriteOncePod access mode" in (_pending_message(solo2) or "")
    assert not solo2["spec"].get("nodeName")

    # the missing claim appears (and binds): the pending pod is placed
    await kube.post(
        "/api/v1/persistentvolumes", local_pv(f"late-{run}", storage["immediate"], key=HOST, value=pinned)
    )
    await kube.post(claims_path, claim("absent", storage["immediate"]))
    pods = await wait_for(
        kube,
        namespace,
        lambda ps: any(p["metadata"]["name"] == "missing" and p["spec"].get("nodeName") for p in ps),
        timeout=120,
        what="the pod whose claim appeared",
    )
    assert next(p for p in pods if p["metadata"]["name"] == "missing")["spec"]["nodeName"] == pinned
    assert len(await list_pods(kube, namespace)) == 7


async def test_csi_attach_limit_from_csinode(
    kube: KubeClient,
    namespace: str,
    run: str,
    storage: dict[str, str],
    worker: SchedulerProcess,
) -> None:
    """A node whose CSINode allows one volume of the provisioner's driver: the first pod pinned there gets it,
    the second stays pending with ``node(s) exceed max volume count``."""
    scheduler = f"agent-vol-{run}"
    node = (await _plain_nodes(kube))[2]["metadata"]["name"]
    csinode = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSINode",
        "metadata": {"name": node},
        "spec": {"drivers": [{"name": storage["driver"], "nodeID": node, "allocatable": {"count": 1}}]},
    }
    claims_path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims"
    await kube.post("/apis/storage.k8s.io/v1/csinodes", csinode)
    try:
        for name in ("one", "two"):
            await kube.post(claims_path, claim(name, storage["dynamic"]))
        pods = []
        for name in ("one", "two"):
            pod = pod_with(f"pod-{name}", namespace, scheduler, name)
            pod["spec"]["nodeSelector"] = {HOST: node}
            pods.append(pod)
        await create_pods(kube, namespace, pods[:1])
        await wait_for(
            kube, namespace, lambda ps: bool(ps and ps[0]["spec"].get("nodeName")), timeout=60, what="one"
        )
        await create_pods(kube, namespace, pods[1:])
        listed = await wait_for(
            kube,
            namespace,
            lambda ps: any(p["metadata"]["name"] == "pod-two" and _pending_message(p) for p in ps),
            timeout=60,
            what="the second pod pending",
        )
        two = next(p for p in listed if p["metadata"]["name"] == "pod-two")
        assert "node(s) exceed max volume count" in (_pending_message(two) or ""), two["status"]
        assert not two["spec"].get("nodeName")
    finally:
        with contextlib.suppress(NotFound):
            await kube.delete(f"/apis/storage.k8s.io/v1/csinodes/{node}")


async def test_claims_under_a_coordinator(
    kube: KubeClient, namespace: str, run: str, storage: dict[str, str], deployment: coordinated.Deployment
) -> None:
    """Coordinator + two workers: a missing claim is reported pending with kube's reason (every shard says no),
    a WaitForFirstConsumer local PV pins its pod to the PV's node (whichever shard owns it), and provisioned
    claims are bound before their pods."""
    d = deployment
    d.coordinator("coord-a")
    d.worker("w1")
    d.worker("w2")
    await coordinated.started(d, 2)
    node = (await _plain_nodes(kube))[3]["metadata"]["name"]
    claims_path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims"
    await kube.post(
        "/api/v1/persistentvolumes", local_pv(f"co-static-{run}", storage["local"], key=HOST, value=node)
    )
    await kube.post(claims_path, claim("static", storage["local"]))
    dynamic = [f"dyn-{i}" for i in range(6)]
    for name in dynamic:
        await kube.post(claims_path, claim(name, storage["dynamic"]))
    pods = [
        pod_with("missing", namespace, d.scheduler_name, "absent"),
        pod_with("static", namespace, d.scheduler_name, "static"),
        *(pod_with(f"pod-{c}", namespace, d.scheduler_name, c) for c in dynamic),
    ]
    await create_pods(kube, namespace, pods)
    placed = ["static", *(f"pod-{c}" for c in dynamic)]

    def settled(ps: list[dict[str, Any]]) -> bool:
        by = {p["metadata"]["name"]: p for p in ps}
        return all(by.get(n, {}).get("spec", {}).get("nodeName") for n in placed) and bool(
            "missing" in by and _pending_message(by["missing"])
        )

    listed = await wait_for(kube, namespace, settled, timeout=120, what="claims placed under a coordinator")
    by = {p["metadata"]["name"]: p for p in listed}
    assert by["static"]["spec"]["nodeName"] == node
    assert 'persistentvolumeclaim "absent" not found' in (_pending_message(by["missing"]) or "")
    for c in dynamic:
        obj = await _claim_phase(kube, namespace, c)
        assert obj["status"].get("phase") == "Bound"
        assert obj["metadata"]["annotations"][SELECTED_NODE] == by[f"pod-{c}"]["spec"]["nodeName"]
    workers = {t["worker"] for t in d.trails() if t["pod"].startswith(namespace + "/")}
    assert workers <= {"w1", "w2"} and workers
