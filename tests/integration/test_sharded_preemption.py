"""Preemption across shards (issue 12 item 3) on the real cluster: a coordinator and three workers.

Dedicated kwok nodes of 256 CPUs (larger than any fleet node, tainted so that only the test's pods go there)
are shared out among the workers; a tiny probe pod bound on each by the scheduler shows, through the workers'
audit trails, which worker owns which node. Two nodes owned by different workers are kept:
- ``open``: free, but tainted again after its probe was bound (the preemptor does not tolerate that taint): its
  owner is the only worker whose capacity summary fits the preemptor, so the leader tries it first, and it says
  no without a candidate (a taint is not cured by evicting pods);
- ``target``: full: a low-priority pod of 150 CPUs and a middle-priority pod of 100 CPUs (bound directly), and
  its probe. Its owner's summary rules the preemptor out, so only the leader asking it for a candidate finds it.
The preemptor (150 CPUs, high priority, selecting the two nodes) must end bound on ``target``, by the worker
that owns it, with the low-priority pod deleted (the fewest, lowest-priority victims: the middle one is
reprieved), and no other pod evicted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from common.kube import KubeClient, NotFound
from tests.integration.support import list_pods
from tests.integration.test_coordinator import (  # the harness of the coordinator tests
    Deployment,
    deployment,  # noqa: F401 - the fixture, used by name
    lease_etcd,  # noqa: F401 - the fixture, used by name
    started,
)
from tests.integration.test_preemption import SET_LABEL, TAINT, Nodes

pytestmark = pytest.mark.integration

TIMEOUT = 90.0  # a guard against hanging, not a speed requirement
ROLE = "i12x-role"
CLOSED = "i12x-closed"
PRIORITIES = {"low": 10, "mid": 100, "high": 1000}


@pytest.fixture
async def classes(kube: KubeClient) -> AsyncIterator[dict[str, str]]:
    run = uuid.uuid4().hex[:6]
    names = {k: f"i12x-{run}-{k}" for k in PRIORITIES}
    for k, value in PRIORITIES.items():
        body = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": names[k]},
            "value": value,
        }
        await kube.post("/apis/scheduling.k8s.io/v1/priorityclasses", body)
    try:
        yield names
    finally:
        for name in names.values():
            with contextlib.suppress(NotFound):
                await kube.delete(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")


def pod(name: str, klass: str, cpu: str, *, scheduler: str, selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "priorityClassName": klass,
            "nodeSelector": dict(selector),
            "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "c", "image": "agent:1", "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}
            ],
        },
    }


async def poll(what: str, check: Any) -> Any:
    deadline = time.monotonic() + TIMEOUT
    while True:
        found = await check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def test_preemption_on_another_workers_shard(
    kube: KubeClient,
    namespace: str,
    deployment: Deployment,  # noqa: F811 - the imported fixture
    classes: dict[str, str],
) -> None:
    d = deployment
    d.coordinator("coord-a")
    for w in ("w1", "w2", "w3"):
        d.worker(w)
    await started(d, 3)
    nodes = Nodes(kube)
    try:
        set_id = uuid.uuid4().hex[:6]
        names = await nodes.make(set_id, ["256"] * 6)
        ns = f"/api/v1/namespaces/{namespace}/pods"
        # which worker owns which node: each binds a probe pinned to one node
        for i, node in enumerate(names):
            probe = pod(
                f"probe-{i}",
                classes["mid"],
                "100m",
                scheduler=d.scheduler_name,
                selector={"kubernetes.io/hostname": node},
            )
            await kube.post(ns, probe)

        async def owners() -> dict[str, str] | None:
            by_pod = {line["pod"]: line for line in d.trails()}
            found = {}
            for i, node in enumerate(names):
                line = by_pod.get(f"{namespace}/probe-{i}")
                if line is None:
                    return None
                assert line["node"] == node
                found[node] = line["worker"]
            return found

        owner: dict[str, str] = await poll("the probes bound", owners)
        assert len(set(owner.values())) >= 2, f"every dedicated node went to one worker: {owner}"
        target = names[0]
        open_node = next(n for n in names if owner[n] != owner[target])
        # the other dedicated nodes leave (with their probes): no room for the preemptor but on these two
        removed = {f"probe-{i}" for i, node in enumerate(names) if node not in (target, open_node)}
        for i, node in enumerate(names):
            if node not in (target, open_node):
                await kube.delete(f"{ns}/probe-{i}")
                await kube.delete(f"/api/v1/nodes/{node}")
        await kube.patch(
            f"/api/v1/nodes/{open_node}",
            {
                "metadata": {"labels": {ROLE: "yes"}},
                "spec": {
                    "taints": [
                        {"key": TAINT, "value": set_id, "effect": "NoSchedule"},
                        {"key": CLOSED, "value": "yes", "effect": "NoSchedule"},
                    ]
                },
            },
            kind="merge",
        )
        await kube.patch(f"/api/v1/nodes/{target}", {"metadata": {"labels": {ROLE: "yes"}}}, kind="merge")
        for name, klass, cpu in (("low", "low", "150"), ("mid", "mid", "100")):
            obj = pod(name, classes[klass], cpu, scheduler="default-scheduler", selector={SET_LABEL: set_id})
            obj["spec"]["nodeName"] = target
            await kube.post(ns, obj)

        async def running() -> bool:
            pods = {p["metadata"]["name"]: p for p in await list_pods(kube, namespace)}
            return all(pods.get(n, {}).get("status", {}).get("phase") == "Running" for n in ("low", "mid"))

        await poll("the placed pods running", running)
        before = {p["metadata"]["name"] for p in await list_pods(kube, namespace)} - removed
        preemptor = pod(
            "preemptor", classes["high"], "150", scheduler=d.scheduler_name, selector={ROLE: "yes"}
        )
        await kube.post(ns, preemptor)

        async def bound() -> dict[str, Any] | None:
            obj: dict[str, Any] = await kube.get(f"{ns}/preemptor")
            return obj if obj["spec"].get("nodeName") else None

        try:
            placed = await poll("the preemptor bound", bound)
        except AssertionError:
            obj = await kube.get(f"{ns}/preemptor")
            logs = {n: p.tail(20) for n, p in d.procs.items()}
            raise AssertionError((obj.get("status"), logs)) from None
        assert placed["spec"]["nodeName"] == target
        bound_by = [line["worker"] for line in d.trails() if line["pod"] == f"{namespace}/preemptor"]
        assert bound_by == [owner[target]], bound_by
        assert owner[open_node] != owner[target]
        # the leader chose the candidate of the target's owner, once
        leader_log = d.procs["coord-a"].log_path.read_text()
        assert leader_log.count(f"preemptor: preempting on {target} ({owner[target]})") == 1, leader_log[
            -3000:
        ]
        after = {
            p["metadata"]["name"]
            for p in await list_pods(kube, namespace)
            if not p["metadata"].get("deletionTimestamp")
        } - removed
        # the lowest-priority victim alone; the middle one reprieved, both probes untouched
        assert before - after == {"low"}, (before, after)
        assert {"mid", "preemptor"} <= after
    finally:
        await nodes.delete()
