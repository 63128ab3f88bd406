"""Preemption on the real cluster: the standalone worker against kube-scheduler v1.36, scenario by scenario.

Every scenario runs twice on two identical sets of dedicated kwok nodes (labelled and tainted for this run, so
no other pod lands there and every scenario pod selects its set): once with ``schedulerName: default-scheduler``
(kube-scheduler's DefaultPreemption) and once with a standalone ``agent-scheduler worker``'s name. Lower-priority
pods are bound directly (``spec.nodeName``) before the preemptor is created. Both schedulers must then agree on:
the victims (which of the placed pods were deleted), the node the preemptor ends on, or, when preemption cannot
or may not help, the ``preemption: ...`` part of the FailedScheduling message. Scenarios avoid full ties (kube
breaks those at random).

Also, for the worker alone: victims get the DisruptionTarget condition and a ``Preempted`` event naming the
preemptor's UID; a nomination seen in the watch (``status.nominatedNodeName`` of a pending pod) reserves its
room against a lower-priority pod until the nominated pod binds. kwok deletes a pod with a deletionTimestamp at
once, so graceful deletes complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from common.kube import KubeClient, NotFound
from scale.cluster import Cluster
from scale.cluster import make_node as make_fleet_node
from tests.integration.support import SchedulerProcess, list_pods, priority_classes, start_worker

pytestmark = pytest.mark.integration

KUBE = "default-scheduler"
FLEET_INDEX_OFFSET = 70000
SET_LABEL = "preempt-set"
TAINT = "preempt-test"
TIMEOUT = 60.0  # a guard against hanging, not a speed requirement
PRIORITIES = {"low": 1, "low2": 2, "low3": 3, "mid": 5, "high": 100, "top": 200}
# the Priority admission plugin sets spec.preemptionPolicy from the class (a pod may not set it)
NEVER = {"mid-never": 5, "high-never": 100}


@dataclass
class Scenario:
    name: str
    nodes: list[str]  # cpu per node
    placed: list[tuple[str, int, str, str, dict[str, str]]]  # (pod, node index, class, cpu, labels)
    preemptor_cpu: str
    preemptor_class: str = "high"
    never: bool = False
    anti_affinity: dict[str, str] | None = None  # required hostname anti-affinity against these labels
    budgets: list[dict[str, str]] = field(default_factory=list)  # maxUnavailable 0 over these labels
    stagger: bool = False  # start the placed pods a second apart (start times are whole seconds)


SCENARIOS = [
    Scenario(
        "lowest-highest-victim-and-reprieve",
        ["4", "4", "4"],
        [
            ("a-low", 0, "low", "2", {}),
            ("a-low3", 0, "low3", "2", {}),
            ("b-low2", 1, "low2", "2", {}),
            ("b-low2x", 1, "low2", "2", {}),
            ("c-top", 2, "top", "4", {}),
        ],
        "2",
    ),
    Scenario(
        "budget-steers-the-node",
        ["2", "2"],
        [("guarded", 0, "low", "2", {"app": "guarded"}), ("free", 1, "low3", "2", {})],
        "2",
        budgets=[{"app": "guarded"}],
    ),
    Scenario(
        "fewest-victims-by-priority-sum",
        ["2", "2"],
        [("two-a", 0, "low", "1", {}), ("two-b", 0, "low", "1", {}), ("one", 1, "low", "2", {})],
        "2",
    ),
    Scenario(
        "anti-affinity-victim",
        ["4", "2"],
        [("blocker", 0, "low", "100m", {"app": "blocker"}), ("full", 1, "low2", "2", {})],
        "1",
        anti_affinity={"app": "blocker"},
    ),
    Scenario(
        "priority-tie-latest-start",
        ["2", "2"],
        [("older", 0, "low", "2", {}), ("newer", 1, "low", "2", {})],
        "2",
        stagger=True,
    ),
    Scenario("never-preempts", ["2"], [("held", 0, "low", "2", {})], "2", never=True),
    Scenario("no-lower-priority-victims", ["2"], [("peer", 0, "top", "2", {})], "2"),
]


@dataclass
class Outcome:
    node: int | None
    deleted: set[str]
    preemption_message: str  # the "preemption: ..." suffix, "" if the pod was nominated/bound


@pytest.fixture
async def classes(kube: KubeClient) -> AsyncIterator[dict[str, str]]:
    prefix = f"preempt-{uuid.uuid4().hex[:6]}"
    async with priority_classes(kube, prefix, {**PRIORITIES, **NEVER}, never=NEVER) as names:
        yield names


@pytest.fixture
def scheduler_name() -> str:
    return f"agent-preempt-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def worker(cluster: Cluster, tmp_path: Path, scheduler_name: str) -> Iterator[SchedulerProcess]:
    proc = start_worker(cluster, tmp_path, scheduler_name)
    yield proc
    if proc.alive():  # one test kills it on purpose
        assert proc.stop() == 0, proc.tail()


class Nodes:
    """Dedicated kwok nodes, deleted at the end."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.names: list[str] = []
        self.count = 0

    async def make(self, set_id: str, cpus: list[str]) -> list[str]:
        out: list[str] = []
        for cpu in cpus:
            name = f"pre-{set_id}-{len(out)}"
            obj = make_fleet_node(FLEET_INDEX_OFFSET + self.count, prefix=f"pre-{set_id}")
            self.count += 1
            obj["metadata"]["name"] = name
            obj["metadata"]["labels"] = {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                SET_LABEL: set_id,
            }
            obj["status"]["addresses"] = [
                a for a in obj["status"]["addresses"] if a["type"] != "Hostname"
            ] + [{"type": "Hostname", "address": name}]
            obj["spec"]["taints"] = [{"key": TAINT, "value": set_id, "effect": "NoSchedule"}]
            alloc = {"cpu": cpu, "memory": "64Gi", "pods": "20"}
            obj["status"]["allocatable"] = dict(alloc)
            obj["status"]["capacity"] = dict(alloc)
            await self.kube.post("/api/v1/nodes", obj)
            self.names.append(name)
            out.append(name)
        return out

    async def delete(self) -> None:
        for name in self.names:
            with contextlib.suppress(NotFound):
                await self.kube.delete(f"/api/v1/nodes/{name}")


@dataclass
class Rig:
    kube: KubeClient
    namespace: str
    nodes: Nodes
    classes: dict[str, str]
    worker: SchedulerProcess
    scheduler_name: str


@pytest.fixture
async def rig(
    kube: KubeClient, namespace: str, classes: dict[str, str], worker: SchedulerProcess, scheduler_name: str
) -> AsyncIterator[Rig]:
    n = Nodes(kube)
    try:
        yield Rig(kube, namespace, n, classes, worker, scheduler_name)
    finally:
        await n.delete()


def pod(
    name: str, set_id: str, klass: str, cpu: str, *, scheduler: str, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {
            "schedulerName": scheduler,
            "priorityClassName": klass,
            "nodeSelector": {SET_LABEL: set_id},
            "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {"name": "c", "image": "agent:1", "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}
            ],
        },
    }


async def get_pod(kube: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        obj: dict[str, Any] = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    except NotFound:
        return None
    return obj


async def wait_running(kube: KubeClient, namespace: str, name: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while True:
        obj = await get_pod(kube, namespace, name)
        if obj is not None and obj.get("status", {}).get("startTime"):
            return
        assert time.monotonic() < deadline, f"{name} never started"
        await asyncio.sleep(0.1)


def describe_start(obj: dict[str, Any] | None) -> str:
    """What a pod that should have started shows (for a failure's message): phase, node, conditions."""
    if obj is None:
        return "not found"
    status = obj.get("status") or {}
    conditions = ", ".join(f"{c.get('type')}={c.get('status')}" for c in status.get("conditions") or ())
    return (
        f"phase {status.get('phase')}, node {obj['spec'].get('nodeName')}, conditions [{conditions}], "
        f"resourceVersion {obj['metadata'].get('resourceVersion')}"
    )


def condition_message(obj: dict[str, Any]) -> str:
    for c in obj.get("status", {}).get("conditions") or ():
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return str(c.get("message") or "")
    return ""


async def run_scenario(rig: Rig, s: Scenario, scheduler: str) -> Outcome:
    kube, namespace, nodes, classes = rig.kube, rig.namespace, rig.nodes, rig.classes
    set_id = uuid.uuid4().hex[:6]
    names = await nodes.make(set_id, s.nodes)
    prefix = f"{set_id}-"
    for i, labels in enumerate(s.budgets):
        await kube.post(
            f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets",
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": f"{prefix}pdb-{i}"},
                "spec": {"maxUnavailable": 0, "selector": {"matchLabels": labels}},
            },
        )
    for name, index, klass, cpu, labels in s.placed:
        placed = pod(prefix + name, set_id, classes[klass], cpu, scheduler=KUBE, labels=labels)
        placed["spec"]["nodeName"] = names[index]
        await kube.post(f"/api/v1/namespaces/{namespace}/pods", placed)
        if s.stagger:
            await wait_running(kube, namespace, prefix + name)
            await asyncio.sleep(1.1)
    # kwok starts them (Running, startTime) before the preemptor arrives; start times differ by creation order
    deadline = time.monotonic() + TIMEOUT
    while True:
        pods = {p["metadata"]["name"]: p for p in await list_pods(kube, namespace)}
        if all(pods.get(prefix + n, {}).get("status", {}).get("phase") == "Running" for n, *_ in s.placed):
            break
        assert time.monotonic() < deadline, "placed pods never started: " + "; ".join(
            f"{n}: {describe_start(pods.get(prefix + n))}" for n, *_ in s.placed
        )
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.1)  # start times are whole seconds: keep the preemptor's later than every victim's
    klass = classes[s.preemptor_class + ("-never" if s.never else "")]
    preemptor = pod(prefix + "preemptor", set_id, klass, s.preemptor_cpu, scheduler=scheduler)
    if s.anti_affinity:
        preemptor["spec"]["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": s.anti_affinity},
                    }
                ]
            }
        }
    await kube.post(f"/api/v1/namespaces/{namespace}/pods", preemptor)
    deadline = time.monotonic() + TIMEOUT
    while True:
        obj = await get_pod(kube, namespace, prefix + "preemptor")
        assert obj is not None
        node = obj["spec"].get("nodeName")
        message = condition_message(obj)
        # "a terminating pod on the nominated node" is the wait between eviction and binding, not an outcome
        if node or ("preemption:" in message and "terminating pod" not in message):
            break
        assert time.monotonic() < deadline, (
            f"{scheduler}: preemptor neither bound nor refused: {obj.get('status')}"
        )
        await asyncio.sleep(0.2)
    deleted = set()
    for name, *_ in s.placed:
        victim = await get_pod(kube, namespace, prefix + name)
        if victim is None or victim["metadata"].get("deletionTimestamp"):
            deleted.add(name)
    suffix = message[message.index("preemption:") :] if not node and "preemption:" in message else ""
    if not node:
        # A preemptor left pending would preempt the next scenario's placed pods on its fresh nodes (both
        # schedulers see every node): the scenario ends with it gone.
        with contextlib.suppress(NotFound):
            await kube.delete(f"/api/v1/namespaces/{namespace}/pods/{prefix}preemptor")
    return Outcome(names.index(node) if node else None, deleted, suffix)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_same_victims_and_node_as_kube_scheduler(rig: Rig, scenario: Scenario) -> None:
    theirs = await run_scenario(rig, scenario, KUBE)
    ours = await run_scenario(rig, scenario, rig.scheduler_name)
    worker = rig.worker
    assert ours.deleted == theirs.deleted, (ours, theirs, worker.tail())
    assert ours.node == theirs.node, (ours, theirs, worker.tail())
    assert bool(ours.preemption_message) == bool(theirs.preemption_message), (ours, theirs)
    if theirs.preemption_message and "nodes are available" not in theirs.preemption_message:
        assert ours.preemption_message == theirs.preemption_message
    if scenario.never:
        assert ours.preemption_message, (ours, theirs)
        assert ours.preemption_message == "preemption: not eligible due to preemptionPolicy=Never."
        assert not ours.deleted


async def test_victims_get_disruption_target_and_preempted_event(rig: Rig) -> None:
    kube, namespace = rig.kube, rig.namespace
    s = Scenario("events", ["2"], [("victim", 0, "low", "2", {})], "2")
    # kwok deletes a terminating pod at once: watch the victim's updates to see its condition
    path = f"/api/v1/namespaces/{namespace}/pods"
    rv = (await kube.get(path))["metadata"]["resourceVersion"]
    seen: list[dict[str, Any]] = []

    async def collect() -> None:
        async for _, obj in kube.watch(path, resource_version=rv, timeout_seconds=120):
            if obj.get("metadata", {}).get("name", "").endswith("-victim"):
                seen.append(obj)

    watcher = asyncio.create_task(collect())
    try:
        out = await run_scenario(rig, s, rig.scheduler_name)
        await asyncio.sleep(1.0)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    conditions = [
        c
        for o in seen
        for c in o.get("status", {}).get("conditions") or ()
        if c["type"] == "DisruptionTarget"
    ]
    assert conditions and conditions[-1]["reason"] == "PreemptionByScheduler"
    assert conditions[-1]["status"] == "True"
    assert any(o["metadata"].get("deletionTimestamp") for o in seen)
    assert out.deleted == {"victim"} and out.node == 0
    deadline = time.monotonic() + TIMEOUT
    while True:
        events = (await kube.get(f"/api/v1/namespaces/{namespace}/events"))["items"]
        preempted = [e for e in events if e.get("reason") == "Preempted"]
        if preempted:
            break
        assert time.monotonic() < deadline, "no Preempted event"
        await asyncio.sleep(0.3)
    pods = {p["metadata"]["name"]: p for p in await list_pods(kube, namespace)}
    preemptor = next(p for n, p in pods.items() if n.endswith("-preemptor"))
    e = preempted[0]
    assert e["involvedObject"]["name"].endswith("-victim")
    assert (
        e["message"]
        == f"Preempted by pod {preemptor['metadata']['uid']} on node {preemptor['spec']['nodeName']}"
    )
    assert e["related"]["uid"] == preemptor["metadata"]["uid"]


async def test_nomination_from_the_watch_reserves_room_against_lower_priority(rig: Rig) -> None:
    kube, namespace, nodes, classes = rig.kube, rig.namespace, rig.nodes, rig.classes
    scheduler_name, worker = rig.scheduler_name, rig.worker
    set_id = uuid.uuid4().hex[:6]
    (node,) = await nodes.make(set_id, ["2"])
    # a nominated pod (as another worker, or this one before a restart, left it): gated, so not yet tried
    nominated = pod("nominated", set_id, classes["high"], "2", scheduler=scheduler_name)
    nominated["spec"]["schedulingGates"] = [{"name": "hold"}]
    await kube.post(f"/api/v1/namespaces/{namespace}/pods", nominated)
    await kube.patch(
        f"/api/v1/namespaces/{namespace}/pods/nominated/status",
        {"status": {"nominatedNodeName": node}},
        kind="merge",
    )
    low = pod("low", set_id, classes["mid-never"], "1", scheduler=scheduler_name)
    await kube.post(f"/api/v1/namespaces/{namespace}/pods", low)
    deadline = time.monotonic() + TIMEOUT
    while True:
        obj = await get_pod(kube, namespace, "low")
        assert obj is not None
        assert not obj["spec"].get("nodeName"), "a lower-priority pod took the nominated room"
        if condition_message(obj):
            break
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    # the nominated pod is released: it binds to its node, and the lower one still waits
    await kube.patch(
        f"/api/v1/namespaces/{namespace}/pods/nominated", {"spec": {"schedulingGates": None}}, kind="merge"
    )
    deadline = time.monotonic() + TIMEOUT
    while True:
        obj = await get_pod(kube, namespace, "nominated")
        assert obj is not None
        if obj["spec"].get("nodeName"):
            break
        assert time.monotonic() < deadline, worker.tail()
        await asyncio.sleep(0.2)
    assert obj["spec"]["nodeName"] == node
    low_now = await get_pod(kube, namespace, "low")
    assert low_now is not None and not low_now["spec"].get("nodeName")


async def test_worker_killed_after_evicting_the_next_one_honours_the_nomination(
    rig: Rig, cluster: Cluster, tmp_path: Path
) -> None:
    kube, namespace, classes, name = rig.kube, rig.namespace, rig.classes, rig.scheduler_name
    set_id = uuid.uuid4().hex[:6]
    first, second = await rig.nodes.make(set_id, ["2", "2"])
    # The victim on the first node stays terminating (a finalizer) until the test lets it go, so the worker
    # can be killed between eviction and binding. The second node holds a possible victim too.
    held = pod("held", set_id, classes["low"], "2", scheduler=KUBE)
    held["spec"]["nodeName"] = first
    held["metadata"]["finalizers"] = ["example.com/hold"]
    other = pod("other", set_id, classes["low2"], "2", scheduler=KUBE)
    other["spec"]["nodeName"] = second
    for obj in (held, other):
        await kube.post(f"/api/v1/namespaces/{namespace}/pods", obj)
    await asyncio.sleep(1.1)
    await kube.post(
        f"/api/v1/namespaces/{namespace}/pods", pod("preemptor", set_id, classes["high"], "2", scheduler=name)
    )
    deadline = time.monotonic() + TIMEOUT
    while True:
        victim = await get_pod(kube, namespace, "held")
        preemptor = await get_pod(kube, namespace, "preemptor")
        assert victim is not None and preemptor is not None
        if (
            victim["metadata"].get("deletionTimestamp")
            and preemptor["status"].get("nominatedNodeName") == first
        ):
            break
        assert time.monotonic() < deadline, rig.worker.tail()
        await asyncio.sleep(0.1)
    rig.worker.stop(signal.SIGKILL)
    successor = start_worker(cluster, tmp_path / "successor", name, worker_id="successor")
    try:
        # a lower-priority pod that may not preempt, and would fit where the victim was
        await kube.post(
            f"/api/v1/namespaces/{namespace}/pods",
            pod("lower", set_id, classes["mid-never"], "2", scheduler=name),
        )
        await asyncio.sleep(3.0)  # the successor has synced and tried both pods while the victim terminates
        still = await get_pod(kube, namespace, "other")
        assert still is not None and not still["metadata"].get("deletionTimestamp"), "preempted a second time"
        await kube.patch(
            f"/api/v1/namespaces/{namespace}/pods/held", {"metadata": {"finalizers": None}}, kind="merge"
        )
        deadline = time.monotonic() + TIMEOUT
        while True:
            preemptor = await get_pod(kube, namespace, "preemptor")
            assert preemptor is not None
            if preemptor["spec"].get("nodeName"):
                break
            assert time.monotonic() < deadline, successor.tail()
            await asyncio.sleep(0.2)
        assert preemptor["spec"]["nodeName"] == first
        lower = await get_pod(kube, namespace, "lower")
        assert lower is not None and not lower["spec"].get("nodeName")
    finally:
        assert successor.stop() == 0, successor.tail()
