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

Then the same with the target's owner killed between eviction and binding (the victim held terminating by a
finalizer): the nomination, in the pod's status, is honoured by the node's next owner, which does not preempt
again and binds the preemptor there once the victim is gone.

And with the leader killed at that point instead: the standby, leading, dispatches the preemptor again (to the
target's owner, where the dispatch stays in flight); no worker preempts a second time, and the owner binds it once
the victim is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from common.kube import KubeClient, NotFound
from tests.integration.support import list_pods, priority_classes
from tests.integration.test_coordinator import (  # the harness of the coordinator tests
    Deployment,
    deployment,  # noqa: F401 - the fixture, used by name
    lease_etcd,  # noqa: F401 - the fixture, used by name
    nodes_of,
    settled,
    started,
)
from tests.integration.test_preemption import SET_LABEL, TAINT, Nodes

pytestmark = pytest.mark.integration

TIMEOUT = 90.0  # a guard against hanging, not a speed requirement
ROLE = "xshard-role"
HOLD = "example.com/xshard-hold"
CLOSED = "xshard-closed"
PRIORITIES = {"low": 10, "mid": 100, "high": 1000}


@pytest.fixture
async def classes(kube: KubeClient) -> AsyncIterator[dict[str, str]]:
    async with priority_classes(kube, f"xshard-{uuid.uuid4().hex[:6]}", PRIORITIES) as names:
        yield names


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


@dataclass
class Stage:
    namespace: str
    target: str
    open_node: str
    owner: dict[str, str]
    removed: set[str]
    before: set[str]


async def stage(
    kube: KubeClient,
    namespace: str,
    d: Deployment,
    classes: dict[str, str],
    nodes: Nodes,
    *,
    hold: bool = False,
) -> Stage:
    """Start the deployment, find the nodes' owners, set ``open`` and ``target`` up (see the module docstring).
    ``hold``: the low-priority pod carries a finalizer, so it stays terminating until the test lets it go."""
    d.coordinator("coord-a")
    for w in ("w1", "w2", "w3"):
        d.worker(w)
    await started(d, 3)
    # Balanced first: while the shard map still moves nodes from the first worker to the later ones, the new
    # nodes (free, placed for balance) can all go to one worker, and the staging needs two owners.
    await settled(d, kube)
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
        if hold and name == "low":
            obj["metadata"]["finalizers"] = [HOLD]
        await kube.post(ns, obj)

    async def running() -> bool:
        pods = {p["metadata"]["name"]: p for p in await list_pods(kube, namespace)}
        return all(pods.get(n, {}).get("status", {}).get("phase") == "Running" for n in ("low", "mid"))

    await poll("the placed pods running", running)
    before = {p["metadata"]["name"] for p in await list_pods(kube, namespace)} - removed
    return Stage(namespace, target, open_node, owner, removed, before)


async def remaining(kube: KubeClient, st: Stage) -> set[str]:
    return {
        p["metadata"]["name"]
        for p in await list_pods(kube, st.namespace)
        if not p["metadata"].get("deletionTimestamp")
    } - st.removed


async def test_preemption_on_another_workers_shard(
    kube: KubeClient,
    namespace: str,
    deployment: Deployment,  # noqa: F811 - the imported fixture
    classes: dict[str, str],
) -> None:
    d = deployment
    nodes = Nodes(kube)
    try:
        st = await stage(kube, namespace, d, classes, nodes)
        ns = f"/api/v1/namespaces/{namespace}/pods"
        preemptor = pod(
            "preemptor", classes["high"], "150", scheduler=d.scheduler_name, selector={ROLE: "yes"}
        )
        await kube.post(ns, preemptor)
        placed = await wait_bound(kube, d, namespace)
        assert placed["spec"]["nodeName"] == st.target
        bound_by = await binders(d, namespace)
        assert bound_by == [st.owner[st.target]], bound_by
        assert st.owner[st.open_node] != st.owner[st.target]
        # the leader chose the candidate of the target's owner, once
        leader_log = d.procs["coord-a"].log_path.read_text()
        wanted = f"preemptor: preempting on {st.target} ({st.owner[st.target]})"
        assert leader_log.count(wanted) == 1, leader_log[-3000:]
        after = await remaining(kube, st)
        # the lowest-priority victim alone; the middle one reprieved, both probes untouched
        assert st.before - after == {"low"}, (st.before, after)
        assert {"mid", "preemptor"} <= after
    finally:
        await nodes.delete()


async def wait_bound(kube: KubeClient, d: Deployment, namespace: str) -> dict[str, Any]:
    async def bound() -> dict[str, Any] | None:
        obj: dict[str, Any] = await kube.get(f"/api/v1/namespaces/{namespace}/pods/preemptor")
        return obj if obj["spec"].get("nodeName") else None

    try:
        placed: dict[str, Any] = await poll("the preemptor bound", bound)
    except AssertionError:
        obj = await kube.get(f"/api/v1/namespaces/{namespace}/pods/preemptor")
        logs = {n: p.tail(20) for n, p in d.procs.items()}
        raise AssertionError((obj.get("status"), logs)) from None
    return placed


async def binders(d: Deployment, namespace: str) -> list[str]:
    """The workers whose audit trail logs the preemptor's binding. A worker writes the line once its binding
    POST has returned, which can be after a watch has shown the pod bound: wait for the first line."""

    async def logged() -> list[str]:
        return [line["worker"] for line in d.trails() if line["pod"] == f"{namespace}/preemptor"]

    found: list[str] = await poll("the preemptor's binding in an audit trail", logged)
    return found


async def preempt_and_hold(kube: KubeClient, d: Deployment, classes: dict[str, str], st: Stage) -> str:
    """Create the preemptor and wait until it is nominated to the target and its victim (held by a finalizer:
    ``stage(hold=True)``) is terminating; returns the pods' API path."""
    ns = f"/api/v1/namespaces/{st.namespace}/pods"
    preemptor = pod("preemptor", classes["high"], "150", scheduler=d.scheduler_name, selector={ROLE: "yes"})
    await kube.post(ns, preemptor)

    async def nominated() -> bool:
        obj = await kube.get(f"{ns}/preemptor")
        low = await kube.get(f"{ns}/low")
        return bool(
            obj["status"].get("nominatedNodeName") == st.target and low["metadata"].get("deletionTimestamp")
        )

    await poll("the preemptor nominated and the victim terminating", nominated)
    return ns


async def test_the_nomination_survives_the_preempting_workers_death(
    kube: KubeClient,
    namespace: str,
    deployment: Deployment,  # noqa: F811 - the imported fixture
    classes: dict[str, str],
) -> None:
    """The target's owner is SIGKILLed between eviction and binding (the victim held terminating by a
    finalizer): the node's next owner sees ``nominatedNodeName``, does not preempt again (the middle pod
    stays), and binds the preemptor to the target once the victim is gone."""
    d = deployment
    nodes = Nodes(kube)
    try:
        st = await stage(kube, namespace, d, classes, nodes, hold=True)
        ns = await preempt_and_hold(kube, d, classes, st)
        d.procs[st.owner[st.target]].stop(signal.SIGKILL)

        await d.wait_status(lambda s: len(nodes_of(s)) == 2, "the dead worker's nodes handed over")
        await asyncio.sleep(2)  # the new owner catches up with the target and sees the nomination
        assert not (await kube.get(f"{ns}/preemptor"))["spec"].get("nodeName")
        await kube.patch(f"{ns}/low", {"metadata": {"finalizers": None}}, kind="merge")
        placed = await wait_bound(kube, d, namespace)
        assert placed["spec"]["nodeName"] == st.target
        bound_by = await binders(d, namespace)
        assert bound_by and st.owner[st.target] not in bound_by, bound_by
        after = await remaining(kube, st)
        assert st.before - after == {"low"}, (st.before, after)
        assert {"mid", "preemptor"} <= after
    finally:
        with contextlib.suppress(NotFound):
            await kube.patch(
                f"/api/v1/namespaces/{namespace}/pods/low", {"metadata": {"finalizers": None}}, kind="merge"
            )
        await nodes.delete()


async def test_a_leader_failover_while_the_preemptor_waits_for_its_victim(
    kube: KubeClient,
    namespace: str,
    deployment: Deployment,  # noqa: F811 - the imported fixture
    classes: dict[str, str],
) -> None:
    """The leader is SIGKILLed after the preemption was carried out (the victim held terminating by a
    finalizer, the preemptor nominated to the target): the standby leads, knows nothing of the first term's
    dispatch and dispatches the preemptor again. No worker preempts a second time (the middle pod stays, no
    other pod is evicted); the preemptor is bound on the target, by its owner, once the victim is gone."""
    d = deployment
    nodes = Nodes(kube)
    try:
        st = await stage(kube, namespace, d, classes, nodes, hold=True)
        d.coordinator("coord-b")  # the standby
        ns = await preempt_and_hold(kube, d, classes, st)
        d.procs["coord-a"].stop(signal.SIGKILL)
        await d.wait_status(lambda s: s["leader"] == "coord-b", "coord-b leading")
        metrics_url = f"http://{(await d.status())['leader_address']}/metrics"
        owner = st.owner[st.target]

        async def in_flight_to_the_owner() -> bool:
            # the new leader's watch listed the pending preemptor and sent it (to the owner of its nominated
            # node, or first elsewhere): a dispatch to the owner stays in flight (the owner answers RESULT
            # waiting; the metric shows the dispatch, not that answer)
            timeout = aiohttp.ClientTimeout(total=10)
            async with aiohttp.ClientSession(timeout=timeout) as http, http.get(metrics_url) as resp:
                text = await resp.text()
            return f'agent_scheduler_coordinator_in_flight_dispatches{{worker="{owner}"}} 1.0' in text

        await poll("the preemptor dispatched again, to the target's owner", in_flight_to_the_owner)
        await asyncio.sleep(2)  # any worker that would preempt again has had its turn
        obj = await kube.get(f"{ns}/preemptor")
        assert not obj["spec"].get("nodeName") and obj["status"].get("nominatedNodeName") == st.target
        assert await remaining(kube, st) == (st.before - {"low"}) | {"preemptor"}, "a second preemption"
        await kube.patch(f"{ns}/low", {"metadata": {"finalizers": None}}, kind="merge")
        placed = await wait_bound(kube, d, namespace)
        assert placed["spec"]["nodeName"] == st.target
        bound_by = await binders(d, namespace)
        assert bound_by == [owner], bound_by
        after = await remaining(kube, st)
        assert st.before - after == {"low"}, (st.before, after)
        assert {"mid", "preemptor"} <= after
        # one preemption in all: none for the second term's dispatch
        preemptions = [
            (name, line)
            for name, p in d.procs.items()
            if name.startswith("w")
            for line in p.log_path.read_text().splitlines()
            if "preempting" in line and f"for {namespace}/preemptor" in line
        ]
        assert [name for name, _ in preemptions] == [owner], preemptions
    finally:
        with contextlib.suppress(NotFound):
            await kube.patch(
                f"/api/v1/namespaces/{namespace}/pods/low", {"metadata": {"finalizers": None}}, kind="merge"
            )
        await nodes.delete()
