"""Differential test: the engine's feasibility verdicts against the real kube-scheduler's.

The claim under test: for the rules the engine implements (cordoned nodes, taints and tolerations, nodeSelector
and required node affinity, resources with init containers, sidecars and overhead, host ports), every node the
engine picks is one kube-scheduler finds feasible, and whenever kube-scheduler can place a pod the engine can too.

Setup. ``DIFF_NODES`` dedicated kwok nodes (random labels, taints, allocatable shapes, some cordoned) are
created beside the session's fleet and deleted at the end. Every node carries the label ``diff-pool=<run>`` and
the taint ``diff-test=<run>:NoSchedule``; every generated pod tolerates that taint and ANDs
``diff-pool In [<run>]`` into each of its required node-affinity terms. So kube-scheduler considers only the
dedicated nodes for these pods, and no other test's pods land on them.

Every case, one after the other (so both schedulers decide over exactly the same state):
1. A random pod (seeded: ``DIFF_SEED``, case number) is parsed as the API server returns it after defaulting
   (a dry-run create), and the engine decides on it over a cache holding the same nodes and the same bound
   pods; its per-node verdict (``filter_all``) is recorded for every dedicated node.
2. Probes: clones of the pod pinned to one node each (``matchFields metadata.name In [node]`` ANDed into every
   term) ask kube-scheduler about single nodes: always the engine's pick, then one node per kind of engine
   verdict in turn (feasible, cordoned, taint, affinity, resources, pod count, host ports, ...), so that rare
   verdicts are checked whenever they occur. Probes on different nodes cannot affect one another, so they run
   at once, and each is deleted again: the state is unchanged. Each probe's outcome must equal the engine's
   verdict on that node.
3. The pod itself is created unpinned. Bound to N: the engine must have found a node, and N must be feasible to
   the engine. Unschedulable: the engine must have found none. Bound pods stay (capacity fills up, as it would
   in a real cluster); now and then an earlier pod is deleted again so that capacity is also freed.

Known, intended difference, kept out of the generated cases: the engine rejects nodes whose Ready condition is
not True, which kube-scheduler leaves to the ``node.kubernetes.io/not-ready`` taint that the node lifecycle
controller adds. No such controller runs here, and kwok makes its nodes Ready anyway, so all dedicated nodes are
Ready.

At the end, the pods the API server shows on the dedicated nodes must be exactly the ones the engine's cache
holds, so both really did see the same state.

Inter-pod rules (pod affinity and anti-affinity, topology spread) are compared by a second test, over sequences
of pods: every case is a pod with random labels and random rules on the hostname, ``zone`` or ``tier`` keys
(required and preferred affinity and anti-affinity, ``matchLabelKeys``/``mismatchLabelKeys``, spread constraints
with DoNotSchedule or ScheduleAnyway, ``minDomains``, both node inclusion policies), or a plain pod with labels
that earlier and later rules select. Earlier pods stay where kube-scheduler bound them (now and then one is
deleted again), so each case is decided over the placements of the ones before. Probes pinned to single nodes
would change the counts these rules read (a probe is a pod too), so this test does not probe every kind of
verdict: the engine
decides, then the pod is created unpinned, and both must agree on whether it fits; when kube-scheduler binds
it to N, the engine must find N feasible (a placement kube-scheduler makes satisfies the engine's hard
constraints). The engine's own pick is checked by one pinned probe first, deleted and settled before the pod
itself is created, unless the pod has a hard spread constraint honouring node affinity (pinning would change
which domains it counts). ``DIFF_INTERPOD_CASES`` (default 500) sets the number of cases.

ImageLocality is compared by a third test, where image locality alone decides: ``DIFF_IMAGE_NODES`` (default 8)
dedicated nodes identical in every way but ``status.images`` (random subsets of a catalogue, with tagged,
``:latest`` and digest names, sizes scaled to the cluster's node count so the spread-scaled sums cover the
whole score range), kept empty (each pod is deleted, and the deletion settled, before the next case), so every
other score kube-scheduler and the engine compute is equal on them. Each case is a pod of one to three
containers (sometimes an init container) whose images are tagged, untagged (normalized to ``:latest``),
digests, or on no node; kube-scheduler must bind it to a node of the engine's highest ImageLocality score, and
the engine must pick one too. The engine's cache holds every node of the cluster, as kube-scheduler's snapshot
does (the spread ratio divides by all of them). ``DIFF_IMAGE_CASES`` (default 60) sets the number of cases.

Two more tests use the same machinery: ``namespaceSelector`` terms (``DIFF_NAMESPACE_CASES``, default 150: pods
of other namespaces bound directly, namespaces relabelled between cases), and kube-scheduler's default topology
spread constraints (``DIFF_SPREAD_STEPS``, default 60: pods of a Service, a ReplicaSet and a StatefulSet on
identical nodes, where the spread score decides the placement); see their sections below.

Knobs: ``DIFF_CASES`` (default 500), ``DIFF_SEED`` (default 1; also seeds the nodes), ``DIFF_NODES`` (default
30), ``DIFF_PROBES`` (single-node probes per case, default 4; ``DIFF_NODES`` or more probes every node in every
case), ``DIFF_REPORT`` (a file to write every disagreement to, in full; the failure shows the first three).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import json
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from common.kube import Gone, KubeClient, NotFound, ServerError
from common.records import NodeName, PodKey, PodRecord, node_from_json, pod_from_json
from scale.cluster import make_node as make_fleet_node
from tests.conftest import delete_namespace
from tests.integration.volumes import claim
from worker.cache import Cache
from worker.scheduler import build_engine
from worker.settings import WorkerSettings

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CASES = int(os.environ.get("DIFF_CASES", "500"))
INTERPOD_CASES = int(os.environ.get("DIFF_INTERPOD_CASES", "500"))
SEED = int(os.environ.get("DIFF_SEED", "1"))
NODES = int(os.environ.get("DIFF_NODES", "30"))
PROBES = int(os.environ.get("DIFF_PROBES", "4"))  # single-node probes per case; >= DIFF_NODES probes all
REPORT = os.environ.get("DIFF_REPORT", "")  # a file to write every disagreement to, in full
DECISION_TIMEOUT = 30.0  # seconds for kube-scheduler to bind a pod or mark it unschedulable
DELETE_EARLIER_POD = 0.4  # chance per case to delete an earlier bound pod (frees capacity)
PLAIN_PODS = 0.25  # share of plain agent pods (they fill the nodes up); the rest have random rules
SHOW_DISAGREEMENTS = 3  # cases printed in full in the failure message

FLEET_INDEX_OFFSET = 60000
POOL_LABEL = "diff-pool"
ISOLATION_TAINT = "diff-test"
RUNTIME_CLASS_OVERHEAD = {"cpu": "250m", "memory": "128Mi"}
GPU = "nvidia.com/gpu"
FOO = "example.com/foo"

# ----- generated nodes ---------------------------------------------------------------------------------------

# Label keys and the values nodes may carry. "gen" holds integers for Gt/Lt, plus forms that are valid label
# values but not integers to kube-scheduler ("1_0" is one to Python's int(), "x" to nobody); "flag" is empty.
NODE_LABELS: dict[str, list[str]] = {
    "zone": ["a", "b", "c"],
    "tier": ["gold", "silver", "bronze"],
    "gen": ["1", "2", "3", "10", "007", "1_0", "x"],
    "gpu-type": ["a100", "h100"],
    "flag": [""],
    "team.example.com/owner": ["ml", "web"],
}
# Values pods ask for that no node has.
MISSING_VALUES = ["d", "none"]

# (key, value, effect); the key of a taint is unique per effect on one node.
TAINTS = [
    ("dedicated", "batch", "NoSchedule"),
    ("dedicated", "agents", "NoExecute"),
    ("gpu", "", "NoSchedule"),
    ("spot", "true", "PreferNoSchedule"),
    ("maint", "", "NoExecute"),
    ("team.example.com/x", "y", "NoSchedule"),
]
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


def generate_node(rng: random.Random, index: int, run: str) -> dict[str, Any]:
    """A complete kwok node (the fleet's template) with a random shape, labels and taints."""
    name = f"diff-{run}-{index:02d}"
    # The fleet's node, far from the fleet's index range so that its addresses and pod CIDR do not collide.
    obj = make_fleet_node(FLEET_INDEX_OFFSET + index, prefix=f"diff-{run}")
    obj["metadata"]["name"] = name
    obj["status"]["addresses"] = [a for a in obj["status"]["addresses"] if a["type"] != "Hostname"] + [
        {"type": "Hostname", "address": name}
    ]
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", POOL_LABEL: run}
    for key, values in NODE_LABELS.items():
        if rng.random() < 0.6:
            labels[key] = rng.choice(values)
    obj["metadata"]["labels"] = labels
    taints = [{"key": ISOLATION_TAINT, "value": run, "effect": "NoSchedule"}]
    for key, value, effect in rng.sample(TAINTS, rng.choice([0, 0, 0, 1, 1, 2])):
        if any(t["key"] == key and t["effect"] == effect for t in taints):
            continue
        taints.append({"key": key, "value": value, "effect": effect})
    obj["spec"]["taints"] = taints
    if rng.random() < 0.1:
        obj["spec"]["unschedulable"] = True
    alloc = {
        "cpu": rng.choice(["1", "1500m", "2", "2.5", "4", "8", "16"]),
        "memory": rng.choice(["2Gi", "3000Mi", "4Gi", "7.5Gi", "8Gi", "16Gi", "32Gi"]),
        "pods": rng.choice(["3", "5", "10", "30"]),
    }
    if rng.random() < 0.8:
        alloc["ephemeral-storage"] = rng.choice(["10Gi", "50Gi"])
    if rng.random() < 0.3:
        alloc[GPU] = rng.choice(["1", "2", "4", "8"])
    if rng.random() < 0.15:
        alloc[FOO] = rng.choice(["1", "3"])
    obj["status"]["allocatable"] = dict(alloc)
    obj["status"]["capacity"] = dict(alloc)
    return obj


# ----- generated pods ----------------------------------------------------------------------------------------


def _toleration(rng: random.Random) -> dict[str, Any]:
    r = rng.random()
    if r < 0.1:  # the cordon taint, in forms that do and do not tolerate it
        t: dict[str, Any] = {"key": UNSCHEDULABLE_TAINT}
        t.update(
            rng.choice([{"operator": "Exists"}, {"operator": "Equal"}, {"operator": "Equal", "value": "x"}])
        )
        effect = rng.choice(["", "NoSchedule", "NoExecute"])
    elif r < 0.17:  # an empty key tolerates every taint (of the effect, if one is given)
        t = {"operator": "Exists"}
        effect = rng.choice(["", "NoSchedule", "NoSchedule", "NoExecute"])
    else:
        key, value, effect = rng.choice(TAINTS)
        form = rng.random()
        if form < 0.4:
            t = {"key": key, "operator": "Equal", "value": value} if value else {"key": key}
        elif form < 0.6:
            t = {"key": key, "operator": "Exists"}
        elif form < 0.8:
            t = {"key": key, "operator": "Equal", "value": "wrong"}
        else:
            t = {"key": key, "operator": "Exists"}
            effect = rng.choice(["NoSchedule", "NoExecute", "PreferNoSchedule"])
        if rng.random() < 0.4:
            effect = ""
    if effect:
        t["effect"] = effect
    return t


def _label_value(rng: random.Random, key: str) -> str:
    return rng.choice(NODE_LABELS[key] + MISSING_VALUES)


def _expression(rng: random.Random, *, valid: bool = False) -> dict[str, Any]:
    key = rng.choice(list(NODE_LABELS))
    op = rng.choice(["In", "In", "In", "NotIn", "NotIn", "Exists", "Exists", "DoesNotExist", "Gt", "Lt"])
    if op in ("Exists", "DoesNotExist"):
        return {"key": key, "operator": op}
    if op in ("In", "NotIn"):
        values = sorted({_label_value(rng, key) for _ in range(rng.choice([1, 1, 2]))})
        return {"key": key, "operator": op, "values": values}
    if rng.random() < 0.7:
        key = "gen"
    # Integers, and label values the API server accepts but that are no integers to kube-scheduler ("1_0" is
    # one to Python's int()): such a term matches no node, while the pod's other terms still count.
    value = rng.choice(["0", "1", "2", "3", "5", "9", "10", "007"])
    if not valid and rng.random() < 0.1:
        value = rng.choice(["1_0", "abc"])
    return {"key": key, "operator": op, "values": [value]}


def _term(rng: random.Random, run: str, nodes: list[str]) -> dict[str, Any]:
    exprs = [_expression(rng) for _ in range(rng.choice([0, 0, 1, 1, 2]))]
    exprs.append({"key": POOL_LABEL, "operator": "In", "values": [run]})
    term: dict[str, Any] = {"matchExpressions": exprs}
    if rng.random() < 0.12:
        op = rng.choice(["In", "NotIn"])
        term["matchFields"] = [{"key": "metadata.name", "operator": op, "values": [rng.choice(nodes)]}]
    return term


# Quantities in several spellings (the API server keeps them as written when canonical, else rewrites them).
_CPU = ["50m", "100m", "0.25", "500m", "1", "1200m", "2.5", "3", "20"]
_MEMORY = ["64Mi", "256Mi", "500M", "1e9", "1.5Gi", "3Gi", "1000500m", "40Gi"]
_STORAGE = ["1Gi", "20Gi", "100Gi"]


def _resources(rng: random.Random) -> dict[str, Any]:
    requests: dict[str, str] = {}
    if rng.random() < 0.8:
        requests["cpu"] = rng.choice(_CPU)
    if rng.random() < 0.7:
        requests["memory"] = rng.choice(_MEMORY)
    if rng.random() < 0.1:
        requests["ephemeral-storage"] = rng.choice(_STORAGE)
    extended: dict[str, str] = {}
    if rng.random() < 0.12:
        extended[GPU] = rng.choice(["1", "1", "2", "3", "9"])
    if rng.random() < 0.05:
        extended[FOO] = rng.choice(["1", "2"])
    form = rng.random()
    if form < 0.6:
        res: dict[str, Any] = {"requests": requests}
    elif form < 0.8:  # limits only: the API server defaults the requests to them
        res = {"limits": dict(requests)}
    else:
        res = {"requests": requests, "limits": {k: v for k, v in requests.items() if k != "cpu"}}
    if extended:  # extended resources may not be overcommitted: requests equal limits
        res.setdefault("requests", {}).update(extended)
        res.setdefault("limits", {}).update(extended)
    return res


def _ports(rng: random.Random, used: set[tuple[str, str, int]]) -> list[dict[str, Any]]:
    """Maybe one host port; ``used`` keeps the pod's own ports distinct (the API server rejects duplicates)."""
    if rng.random() > 0.3:
        return []
    port = rng.choice([8080, 8081])
    protocol = rng.choice(["TCP", "TCP", "UDP"])
    host_ip = rng.choice(["", "", "127.0.0.1", "10.0.0.1", "::"])
    if (protocol, host_ip, port) in used:
        return []
    used.add((protocol, host_ip, port))
    p: dict[str, Any] = {"containerPort": port, "hostPort": port, "protocol": protocol}
    if host_ip:
        p["hostIP"] = host_ip
    return [p]


def _pod_level_resources(rng: random.Random, spec: dict[str, Any]) -> None:
    """Pod-level requests (``spec.resources``) for cpu and/or memory, which replace the containers' sum. The
    API server wants them at least that sum, so the containers get small requests for these two."""
    for c in spec["containers"] + spec.get("initContainers", []):
        res = c["resources"]
        for part in ("requests", "limits"):
            for name in ("cpu", "memory"):
                res.get(part, {}).pop(name, None)
        res.setdefault("requests", {}).update(cpu=rng.choice(["100m", "250m"]), memory="128Mi")
    requests: dict[str, str] = {}
    if rng.random() < 0.8:
        requests["cpu"] = rng.choice(["2", "6", "12"])
    if rng.random() < 0.6 or not requests:
        requests["memory"] = rng.choice(["2Gi", "8Gi", "20Gi"])
    spec["resources"] = {"requests": requests}


def _container(rng: random.Random, name: str, used_ports: set[tuple[str, str, int]]) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "registry.k8s.io/pause:3.10", "resources": _resources(rng)}
    ports = _ports(rng, used_ports)
    if ports:
        c["ports"] = ports
    return c


def plain_pod(rng: random.Random, name: str, run: str) -> dict[str, Any]:
    """The common agent pod: small requests, no placement rules beyond the dedicated pool."""
    requests = {"cpu": rng.choice(["100m", "250m", "500m"]), "memory": rng.choice(["128Mi", "512Mi"])}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "differential"}},
        "spec": {
            "schedulerName": "default-scheduler",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "c0", "image": "registry.k8s.io/pause:3.10", "resources": {"requests": requests}}
            ],
            "tolerations": [
                {"key": ISOLATION_TAINT, "operator": "Equal", "value": run, "effect": "NoSchedule"}
            ],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": [run]}]}
                        ]
                    }
                }
            },
        },
    }


def generate_pod(rng: random.Random, name: str, run: str, nodes: list[str]) -> dict[str, Any]:
    """A plain agent pod (a quarter of them) or one with random rules, requests and ports."""
    if rng.random() < PLAIN_PODS:
        return plain_pod(rng, name, run)
    ports: set[tuple[str, str, int]] = set()
    spec: dict[str, Any] = {
        "schedulerName": "default-scheduler",
        "terminationGracePeriodSeconds": 0,
        "containers": [_container(rng, f"c{i}", ports) for i in range(rng.choice([1, 1, 2, 3]))],
        "tolerations": [{"key": ISOLATION_TAINT, "operator": "Equal", "value": run, "effect": "NoSchedule"}]
        + [_toleration(rng) for _ in range(rng.choice([0, 1, 2, 2, 3]))],
    }
    for i in range(rng.choice([0, 0, 0, 1, 2])):
        init = _container(rng, f"init{i}", ports)
        if rng.random() < 0.5:
            init["restartPolicy"] = "Always"  # a sidecar
        spec["initContainers"] = [*spec.get("initContainers", []), init]
    if rng.random() < 0.15:
        spec["runtimeClassName"] = f"diff-{run}"
    if rng.random() < 0.1:
        _pod_level_resources(rng, spec)
    if rng.random() < 0.2:
        keys = rng.sample(list(NODE_LABELS), rng.choice([1, 1, 2]))
        spec["nodeSelector"] = {k: _label_value(rng, k) for k in keys}
        if rng.random() < 0.1:
            spec["nodeSelector"]["kubernetes.io/hostname"] = rng.choice(nodes)
    terms = [_term(rng, run, nodes) for _ in range(rng.choice([1, 1, 2, 3]))]
    affinity: dict[str, Any] = {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
    }
    if rng.random() < 0.2:
        # Valid terms only: kube-scheduler fails the scoring of a pod whose preferred terms do not parse (an
        # error, not a feasibility verdict), so there is nothing to compare.
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {
                "weight": rng.randint(1, 100),
                "preference": {"matchExpressions": [_expression(rng, valid=True)]},
            }
        ]
    spec["affinity"] = {"nodeAffinity": affinity}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "differential"}},
        "spec": spec,
    }


def pinned(pod: dict[str, Any], name: str, node: str) -> dict[str, Any]:
    """A clone of ``pod`` that fits only ``node``: every required term also asks for the node's name, so each
    term matches the node exactly when the original term does, and no other node."""
    clone = copy.deepcopy(pod)
    clone["metadata"] = {"name": name, "labels": dict(pod["metadata"].get("labels") or {})}
    required = clone["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    for term in required["nodeSelectorTerms"]:
        term.setdefault("matchFields", []).append(
            {"key": "metadata.name", "operator": "In", "values": [node]}
        )
    return clone


# ----- kube-scheduler's outcomes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    node: str | None  # where kube-scheduler bound the pod; None when it did not
    reason: str  # "" when bound; else the PodScheduled=False reason ("Unschedulable", "SchedulerError")
    message: str
    obj: dict[str, Any]


def _outcome(obj: dict[str, Any]) -> Outcome | None:
    node = (obj.get("spec") or {}).get("nodeName")
    if node:
        return Outcome(node, "", "", obj)
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return Outcome(None, c.get("reason") or "", c.get("message") or "", obj)
    return None


class Outcomes:
    """One watch on the test namespace; ``expect(name)`` before creating a pod, then await its outcome."""

    def __init__(self, kube: KubeClient, namespace: str) -> None:
        self.kube = kube
        self.path = f"/api/v1/namespaces/{namespace}/pods"
        self.waiters: dict[str, asyncio.Future[Outcome]] = {}
        self.failed: BaseException | None = None

    def expect(self, name: str) -> asyncio.Future[Outcome]:
        if self.failed is not None:
            raise AssertionError("the namespace watch failed") from self.failed
        fut: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self.waiters[name] = fut
        return fut

    def _see(self, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        fut = self.waiters.get(name)
        if fut is None or fut.done():
            return
        out = _outcome(obj)
        if out is not None:
            fut.set_result(out)
            del self.waiters[name]

    async def run(self) -> None:
        try:
            await self._watch()
        except Exception as e:  # nobody awaits this task: hand the failure to whoever waits for a pod
            self.failed = e
            for fut in self.waiters.values():
                if not fut.done():
                    fut.set_exception(e)
            raise

    async def _watch(self) -> None:
        rv = ""
        while True:
            if not rv:
                listing = await self.kube.get(self.path)
                rv = listing["metadata"]["resourceVersion"]
                for obj in listing.get("items") or ():
                    self._see(obj)
            try:
                async for kind, obj in self.kube.watch(self.path, resource_version=rv, timeout_seconds=120):
                    rv = obj.get("metadata", {}).get("resourceVersion") or rv
                    if kind in ("ADDED", "MODIFIED"):
                        self._see(obj)
            except Gone:
                rv = ""
            except ServerError:
                await asyncio.sleep(0.2)


# ----- the test ----------------------------------------------------------------------------------------------


def _category(verdict: str | None) -> str:
    """A short name for the engine's verdict on a node, for the coverage summary."""
    if verdict is None:
        return "feasible"
    for needle, name in (
        ("invalid pod spec", "invalid"),
        ("existing pods anti-affinity", "existing-anti-affinity"),
        ("pod anti-affinity", "anti-affinity"),
        ("pod affinity", "pod-affinity"),
        ("spread constraints (missing", "spread-missing-label"),
        ("spread constraints", "spread-skew"),
        ("taint", "taint"),
        ("affinity", "affinity"),
        ("unschedulable", "cordoned"),
        ("ports", "ports"),
        ("Too many pods", "pods"),
        ("Insufficient", "resources"),
    ):
        if needle in verdict:
            return name
    return verdict


@dataclass
class Tally:
    cases: int = 0
    bound: int = 0
    unschedulable: int = 0
    probes: int = 0
    deleted: int = 0
    with_overhead: int = 0
    # engine verdict category -> [kube-scheduler agreed, disagreed], over all probes
    probe_verdicts: dict[str, list[int]] = field(default_factory=dict)
    disagreements: list[str] = field(default_factory=list)

    def summary(self, elapsed: float) -> str:
        per_kind = ", ".join(f"{k} {v[0]}/{v[0] + v[1]}" for k, v in sorted(self.probe_verdicts.items()))
        return (
            f"{self.cases} cases in {elapsed:.0f}s: {self.bound} bound, {self.unschedulable} unschedulable, "
            f"{self.deleted} bound pods deleted again, {self.with_overhead} with overhead; {self.probes} "
            f"single-node probes, kube-scheduler agreeing per engine verdict: {per_kind}; "
            f"{len(self.disagreements)} disagreements"
        )


@pytest.fixture
async def diff_nodes(kube: KubeClient) -> AsyncIterator[str]:
    """Creates the dedicated nodes and the RuntimeClass with overhead; yields the run's id; deletes both."""
    run = uuid.uuid4().hex[:6]
    rng = random.Random(f"nodes:{SEED}")
    nodes = [generate_node(rng, i, run) for i in range(NODES)]
    runtime_class = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": f"diff-{run}"},
        "handler": "runc",
        "overhead": {"podFixed": RUNTIME_CLASS_OVERHEAD},
    }
    try:
        await kube.post("/apis/node.k8s.io/v1/runtimeclasses", runtime_class)
        await asyncio.gather(*(kube.post("/api/v1/nodes", n) for n in nodes))
        yield run
    finally:
        for n in nodes:
            with contextlib.suppress(NotFound):
                await kube.delete(f"/api/v1/nodes/{n['metadata']['name']}")
        with contextlib.suppress(NotFound):
            await kube.delete(f"/apis/node.k8s.io/v1/runtimeclasses/diff-{run}")


def _relevant(node: dict[str, Any]) -> dict[str, Any]:
    """The node without the parts no scheduler looks at (managed fields, addresses, node info)."""
    out = copy.deepcopy(node)
    out["metadata"].pop("managedFields", None)
    for key in ("addresses", "nodeInfo", "daemonEndpoints"):
        out.get("status", {}).pop(key, None)
    return out


class Differential:
    """Both schedulers over the same nodes and the same bound pods; one case at a time."""

    def __init__(self, kube: KubeClient, namespace: str, run: str, nodes: list[dict[str, Any]]) -> None:
        self.kube = kube
        self.namespace = namespace
        self.run = run
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.diff = sorted(
            n for n, obj in self.nodes.items() if obj["metadata"]["labels"].get(POOL_LABEL) == run
        )
        # The engine sees the fleet too: it must reject those nodes for these pods, as kube-scheduler does.
        self.cache = Cache()
        for obj in nodes:
            self.cache.upsert_node(node_from_json(obj))
        self.engine = build_engine(WorkerSettings(), self.cache)
        self.outcomes = Outcomes(kube, namespace)
        self.bound: list[str] = []  # our pods kube-scheduler bound and that still exist
        self.tally = Tally()

    def verdict(self, pod: PodRecord, node: str) -> str | None:
        """None when the engine finds the node feasible for the pod, else why not."""
        if pod.parse_error is not None:
            return pod.parse_error
        st = self.engine.filter_all(pod, self.cache.nodes[NodeName(node)])
        return None if st is None else ", ".join(st.reasons) or st.code.name

    async def decide(self, obj: dict[str, Any]) -> Outcome:
        """Create the pod and wait until kube-scheduler has bound it or reported why not."""
        fut = self.outcomes.expect(obj["metadata"]["name"])
        await self.kube.post(f"/api/v1/namespaces/{self.namespace}/pods", obj)
        return await asyncio.wait_for(fut, DECISION_TIMEOUT)

    async def delete(self, name: str) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods/{name}"
        with contextlib.suppress(NotFound):
            await self.kube.delete(path, params={"gracePeriodSeconds": "0"})

    async def probe(self, pod: dict[str, Any], name: str, node: str) -> Outcome:
        """kube-scheduler's verdict on one node: a pinned clone, deleted again once decided."""
        clone = pinned(pod, name, node)
        try:
            return await self.decide(clone)
        finally:
            await self.delete(name)

    def probe_nodes(self, rng: random.Random, pick: str | None, verdicts: dict[str, str | None]) -> list[str]:
        """The nodes to ask kube-scheduler about: the engine's pick, then one node per kind of engine verdict
        in turn (feasible, each kind of rejection), so that rare verdicts are always checked."""
        if len(self.diff) <= PROBES:
            return list(self.diff)
        chosen: list[str] = [pick] if pick is not None and pick in verdicts else []
        kinds: dict[str, list[str]] = {}
        for node in self.diff:
            if node not in chosen:
                kinds.setdefault(_category(verdicts[node]), []).append(node)
        for pool in kinds.values():
            rng.shuffle(pool)
        while len(chosen) < PROBES and any(kinds.values()):
            for pool in sorted(kinds.values(), key=len):
                if pool and len(chosen) < PROBES:
                    chosen.append(pool.pop())
        return chosen

    async def case(self, case: int) -> None:
        rng = random.Random(f"{SEED}:{case}")
        name = f"c{case:04d}"
        pod = generate_pod(rng, name, self.run, self.diff)
        # What the API server makes of it: defaulted requests, the RuntimeClass's overhead.
        dry = await self.kube.post(f"/api/v1/namespaces/{self.namespace}/pods", pod, params={"dryRun": "All"})
        record = pod_from_json(dry)
        self.tally.with_overhead += bool(dry["spec"].get("overhead"))
        decision = self.engine.schedule(record)
        verdicts = {n: self.verdict(record, n) for n in self.diff}
        problems: list[str] = []
        involved: set[str] = set()
        if decision.node is not None:
            involved.add(decision.node)
            if decision.node not in verdicts:
                problems.append(f"engine picked {decision.node}, which is not a dedicated node")
            elif verdicts[decision.node] is not None:
                problems.append(f"engine picked {decision.node} but filter_all rejects it")
        elif any(v is None for v in verdicts.values()):
            problems.append("engine found no node, but filter_all accepts some")

        # Pinned probes on single nodes. Probes on different nodes cannot affect one another (no filter here
        # looks at other nodes), so they run at once.
        probed = self.probe_nodes(rng, decision.node, verdicts)
        results = await asyncio.gather(
            *(self.probe(pod, f"{name}-p{i:02d}", node) for i, node in enumerate(probed))
        )
        for node, out in zip(probed, results, strict=True):
            self.tally.probes += 1
            kube_ok = out.node == node
            engine_ok = verdicts[node] is None
            counts = self.tally.probe_verdicts.setdefault(_category(verdicts[node]), [0, 0])
            counts[kube_ok != engine_ok] += 1
            if out.node is not None and out.node != node:
                problems.append(f"probe pinned to {node} was bound to {out.node}")
            elif out.node is None and out.reason != "Unschedulable":
                problems.append(f"probe on {node}: kube-scheduler {out.reason}: {out.message}")
            elif kube_ok != engine_ok:
                involved.add(node)
                problems.append(
                    f"node {node}: kube-scheduler {'accepts' if kube_ok else 'rejects'} "
                    f"({out.message or 'bound'}); engine {'accepts' if engine_ok else 'rejects'} "
                    f"({verdicts[node] or 'feasible'})"
                )

        # The pod itself, unpinned, over the same state.
        out = await self.decide(pod)
        if out.node is not None:
            self.tally.bound += 1
            involved.add(out.node)
            if decision.node is None:
                problems.append(f"kube-scheduler bound it to {out.node}; the engine found no node")
            elif verdicts.get(out.node) is not None:
                problems.append(f"kube-scheduler bound it to {out.node}; engine: {verdicts.get(out.node)}")
            self.cache.upsert_pod(pod_from_json(out.obj))  # it stays: capacity fills up
            self.bound.append(name)
        else:
            self.tally.unschedulable += 1
            if out.reason != "Unschedulable":
                problems.append(f"kube-scheduler {out.reason}: {out.message}")
            elif decision.node is not None:
                problems.append(
                    f"kube-scheduler: unschedulable ({out.message}); the engine picked {decision.node}"
                )
            await self.delete(name)
        self.tally.cases += 1
        if problems:
            self.tally.disagreements.append(self.report(case, problems, pod, dry, involved))

        if self.bound and rng.random() < DELETE_EARLIER_POD:
            victim = self.bound.pop(rng.randrange(len(self.bound)))
            await self.delete(victim)
            self.cache.remove_pod(PodKey(f"{self.namespace}/{victim}"))
            self.tally.deleted += 1

    def report(
        self,
        case: int,
        problems: list[str],
        pod: dict[str, Any],
        read_back: dict[str, Any],
        involved: set[str],
    ) -> str:
        lines = [f"case {case} (DIFF_SEED={SEED}):", *(f"  - {p}" for p in problems)]
        lines.append("  pod as generated: " + json.dumps(pod, sort_keys=True))
        lines.append("  pod spec after defaulting: " + json.dumps(read_back.get("spec"), sort_keys=True))
        for node in sorted(involved):
            info = self.cache.nodes.get(NodeName(node))
            lines.append(f"  node {node}: " + json.dumps(_relevant(self.nodes[node]), sort_keys=True))
            lines.append(f"    pods there: {sorted(info.pods) if info is not None else []}")
        return "\n".join(lines)


def _write_report(path: str, parts: list[str]) -> None:
    Path(path).write_text("\n\n".join(parts) + "\n")


@contextlib.asynccontextmanager
async def watching(outcomes: Outcomes) -> AsyncIterator[None]:
    """The test namespace's outcome watch runs for the body, and is cancelled after it, whatever happens."""
    watcher = asyncio.create_task(outcomes.run())
    try:
        yield
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def load_bound(kube: KubeClient, cache: Cache) -> None:
    """Every pod already bound anywhere into the engine's cache (other namespaces' pods count for the rules)."""
    for obj in (await kube.get("/api/v1/pods"))["items"]:
        placed = pod_from_json(obj)
        if placed.node_name and not placed.terminal:
            cache.upsert_pod(placed)


def conclude(summary: str, disagreements: list[str], *, report: bool = True) -> None:
    """Print the summary (and write it with every disagreement to ``DIFF_REPORT`` when ``report``); fail on
    any disagreement, showing the first few."""
    print(summary)
    if REPORT and report:
        _write_report(REPORT, [summary, *disagreements])
    shown = "\n\n".join(disagreements[:SHOW_DISAGREEMENTS])
    assert not disagreements, f"{summary}\n\n{shown}"


async def test_engine_agrees_with_kube_scheduler_on_feasibility(
    kube: KubeClient, namespace: str, diff_nodes: str
) -> None:
    started = time.monotonic()
    # The nodes as the API server stores them (kwok may have touched their status).
    nodes = (await kube.get("/api/v1/nodes"))["items"]
    d = Differential(kube, namespace, diff_nodes, nodes)
    assert len(d.diff) == NODES
    async with watching(d.outcomes):
        for case in range(CASES):
            await d.case(case)
    # Both schedulers saw the same pods on the dedicated nodes: nobody else's, and none lost.
    pods = (await kube.get("/api/v1/pods"))["items"]
    on_diff = {
        f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        for p in pods
        if p["spec"].get("nodeName") in d.diff
    }
    cached = {key for n in d.diff for key in d.cache.nodes[NodeName(n)].pods}
    assert on_diff == cached, (sorted(on_diff - cached), sorted(cached - on_diff))
    summary = d.tally.summary(time.monotonic() - started)
    conclude(summary, d.tally.disagreements)
    # The generator must keep producing both outcomes, or the comparison says little.
    assert d.tally.bound > CASES // 5 and d.tally.unschedulable > CASES // 10, summary
    assert d.tally.with_overhead > 0, summary


# ----- inter-pod rules ----------------------------------------------------------------------------------------

HOSTNAME = "kubernetes.io/hostname"
TOPOLOGY_KEYS = [HOSTNAME, HOSTNAME, "zone", "zone", "tier"]
GROUPS = ["a", "b", "c"]
SETTLE_AFTER_DELETE = 0.2  # seconds for kube-scheduler's cache to see a deleted pod before the next case


def _pod_selector(rng: random.Random) -> dict[str, Any]:
    r = rng.random()
    if r < 0.65:
        return {"matchLabels": {"grp": rng.choice(GROUPS)}}
    if r < 0.8:
        return {
            "matchExpressions": [{"key": "grp", "operator": "In", "values": sorted(rng.sample(GROUPS, 2))}]
        }
    if r < 0.87:
        return {"matchExpressions": [{"key": "grp", "operator": "Exists"}]}
    if r < 0.94:
        return {"matchExpressions": [{"key": "grp", "operator": "NotIn", "values": [rng.choice(GROUPS)]}]}
    return {"matchLabels": {"grp": "absent"}}  # no pod has it


def _affinity_term(rng: random.Random) -> dict[str, Any]:
    term: dict[str, Any] = {"topologyKey": rng.choice(TOPOLOGY_KEYS), "labelSelector": _pod_selector(rng)}
    r = rng.random()
    if r < 0.12:
        term["matchLabelKeys"] = ["ver"]
    elif r < 0.2:
        term["mismatchLabelKeys"] = ["ver"]
    return term


def _spread_constraints(rng: random.Random) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for _ in range(rng.choice([1, 1, 1, 2])):
        key = rng.choice(TOPOLOGY_KEYS)
        when = "DoNotSchedule" if rng.random() < 0.8 else "ScheduleAnyway"
        if (key, when) in seen:
            continue  # the API server refuses a repeated (topologyKey, whenUnsatisfiable)
        seen.add((key, when))
        c: dict[str, Any] = {
            "maxSkew": rng.choice([1, 1, 2, 3]),
            "topologyKey": key,
            "whenUnsatisfiable": when,
            "labelSelector": _pod_selector(rng),
        }
        if when == "DoNotSchedule" and rng.random() < 0.2:
            c["minDomains"] = rng.choice([2, 3, 5, 40])
        for policy in ("nodeAffinityPolicy", "nodeTaintsPolicy"):
            if rng.random() < 0.3:
                c[policy] = rng.choice(["Honor", "Ignore"])
        if rng.random() < 0.12:
            c["matchLabelKeys"] = ["ver"]
        out.append(c)
    return out


def inter_pod_pod(rng: random.Random, name: str, run: str) -> dict[str, Any]:
    """A small pod with random group labels and, mostly, random inter-pod rules."""
    pod = plain_pod(rng, name, run)
    labels = pod["metadata"]["labels"]
    if rng.random() < 0.85:
        labels["grp"] = rng.choice(GROUPS)
    if rng.random() < 0.5:
        labels["ver"] = rng.choice(["1", "2"])
    spec = pod["spec"]
    if rng.random() < 0.1:
        spec["nodeSelector"] = {"zone": rng.choice(NODE_LABELS["zone"])}
    if rng.random() < 0.1:
        spec["tolerations"].append(_toleration(rng))
    if rng.random() < 0.2:
        return pod  # a plain pod: something for the rules to count
    affinity = spec["affinity"]
    for kind in ("podAffinity", "podAntiAffinity"):
        chance = 0.3 if kind == "podAffinity" else 0.45
        block: dict[str, Any] = {}
        if rng.random() < chance:
            block["requiredDuringSchedulingIgnoredDuringExecution"] = [
                _affinity_term(rng) for _ in range(rng.choice([1, 1, 2]))
            ]
        if rng.random() < 0.2:
            block["preferredDuringSchedulingIgnoredDuringExecution"] = [
                {"weight": rng.randint(1, 100), "podAffinityTerm": _affinity_term(rng)}
            ]
        if block:
            affinity[kind] = block
    if rng.random() < 0.5:
        spec["topologySpreadConstraints"] = _spread_constraints(rng)
    return pod


def _pinning_keeps_verdicts(pod: dict[str, Any]) -> bool:
    """A probe is pinned through node affinity, which a spread constraint honours by default (only the pinned
    node's domain would count): probe only pods whose hard spread constraints all ignore node affinity."""
    return all(
        c.get("whenUnsatisfiable") != "DoNotSchedule" or c.get("nodeAffinityPolicy") == "Ignore"
        for c in pod["spec"].get("topologySpreadConstraints") or ()
    )


class InterPodDifferential(Differential):
    def __init__(self, kube: KubeClient, namespace: str, run: str, nodes: list[dict[str, Any]]) -> None:
        super().__init__(kube, namespace, run, nodes)
        # the engine's per-node verdicts over all cases, by kind: what the comparison exercised
        self.verdict_kinds: Counter[str] = Counter()
        self.probes = 0

    def generate(self, rng: random.Random, name: str) -> dict[str, Any]:
        return inter_pod_pod(rng, name, self.run)

    async def inter_case(self, case: int, *, seed: str = "interpod") -> None:
        rng = random.Random(f"{seed}:{SEED}:{case}")
        name = f"i{case:04d}"
        pod = self.generate(rng, name)
        dry = await self.kube.post(f"/api/v1/namespaces/{self.namespace}/pods", pod, params={"dryRun": "All"})
        record = pod_from_json(dry)
        decision = self.engine.schedule(record)
        verdicts = {n: self.verdict(record, n) for n in self.diff}
        problems: list[str] = []
        involved: set[str] = set()
        if record.parse_error is not None:
            problems.append(f"engine refuses the pod: {record.parse_error}")
        if decision.node is not None:
            involved.add(decision.node)
            if verdicts.get(decision.node, "not a dedicated node") is not None:
                problems.append(
                    f"engine picked {decision.node}, which filter_all rejects or is not dedicated"
                )
        elif any(v is None for v in verdicts.values()):
            problems.append("engine found no node, but filter_all accepts some")
        if decision.node is not None and decision.node in verdicts and _pinning_keeps_verdicts(pod):
            # kube-scheduler's verdict on the engine's pick, asked alone and settled before the pod itself
            self.probes += 1
            probe = await self.probe(pod, f"{name}-p", decision.node)
            await asyncio.sleep(SETTLE_AFTER_DELETE)
            if probe.node != decision.node:
                problems.append(
                    f"engine picked {decision.node}; kube-scheduler pinned there: {probe.reason} {probe.message}"
                )
        out = await self.decide(pod)
        if out.node is not None:
            self.tally.bound += 1
            involved.add(out.node)
            if decision.node is None:
                problems.append(f"kube-scheduler bound it to {out.node}; the engine found no node")
            elif verdicts.get(out.node) is not None:
                problems.append(f"kube-scheduler bound it to {out.node}; engine: {verdicts.get(out.node)}")
            self.cache.upsert_pod(pod_from_json(out.obj))
            self.bound.append(name)
        else:
            self.tally.unschedulable += 1
            if out.reason != "Unschedulable":
                problems.append(f"kube-scheduler {out.reason}: {out.message}")
            elif decision.node is not None:
                problems.append(
                    f"kube-scheduler: unschedulable ({out.message}); the engine picked {decision.node}"
                )
            await self.delete(name)
        self.verdict_kinds.update(_category(v) for v in verdicts.values())
        self.tally.cases += 1
        if problems:
            self.tally.disagreements.append(self.report(case, problems, pod, dry, involved))
        if self.bound and rng.random() < DELETE_EARLIER_POD:
            victim = self.bound.pop(rng.randrange(len(self.bound)))
            await self.delete(victim)
            self.cache.remove_pod(PodKey(f"{self.namespace}/{victim}"))
            self.tally.deleted += 1
            await asyncio.sleep(SETTLE_AFTER_DELETE)


async def test_engine_agrees_with_kube_scheduler_on_inter_pod_rules(
    kube: KubeClient, namespace: str, diff_nodes: str
) -> None:
    started = time.monotonic()
    nodes = (await kube.get("/api/v1/nodes"))["items"]
    d = InterPodDifferential(kube, namespace, diff_nodes, nodes)
    await load_bound(kube, d.cache)
    async with watching(d.outcomes):
        for case in range(INTERPOD_CASES):
            await d.inter_case(case)
    summary = (
        f"{d.tally.cases} inter-pod cases in {time.monotonic() - started:.0f}s: {d.tally.bound} bound, "
        f"{d.tally.unschedulable} unschedulable, {d.tally.deleted} bound pods deleted again, {d.probes} of the "
        f"engine's picks confirmed by a pinned probe; engine verdicts "
        f"per node: {dict(sorted(d.verdict_kinds.items()))}; {len(d.tally.disagreements)} disagreements"
    )
    conclude(summary, d.tally.disagreements)
    assert d.tally.bound > INTERPOD_CASES // 5 and d.tally.unschedulable > INTERPOD_CASES // 10, summary


# ----- image locality ------------------------------------------------------------------------------------------

IMAGE_CASES = int(os.environ.get("DIFF_IMAGE_CASES", "60"))
IMAGE_NODES = int(os.environ.get("DIFF_IMAGE_NODES", "8"))
IMAGE_CATALOGUE = 8
MIB = 1024 * 1024


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def image_catalogue(rng: random.Random, run: str, total_nodes: int) -> list[tuple[str, list[str], int]]:
    """(repository, names a node lists, size): sizes scaled so that size x holders / all nodes spans the
    score's range (23 MiB .. 1000 MiB per container) for the few dedicated nodes that hold an image."""
    out = []
    for i in range(IMAGE_CATALOGUE):
        repo = f"registry.diff.example/{run}/img{i}"
        names = [f"{repo}:v1", f"{repo}@{_digest(repo)}"]
        if rng.random() < 0.5:
            names.insert(0, f"{repo}:latest")
        # about 3 of the dedicated nodes hold each image: size x 3 / all nodes is this "per holder" amount
        per_holder = rng.randint(10, 900) * MIB
        out.append((repo, names, per_holder * total_nodes // 3))
    return out


def image_node(
    rng: random.Random, index: int, run: str, catalogue: list[tuple[str, list[str], int]]
) -> dict[str, Any]:
    name = f"diffimg-{run}-{index:02d}"
    obj = make_fleet_node(FLEET_INDEX_OFFSET + 100 + index, prefix=f"diffimg-{run}")
    obj["metadata"]["name"] = name
    obj["status"]["addresses"] = [a for a in obj["status"]["addresses"] if a["type"] != "Hostname"] + [
        {"type": "Hostname", "address": name}
    ]
    obj["metadata"]["labels"] = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", POOL_LABEL: run}
    obj["spec"]["taints"] = [{"key": ISOLATION_TAINT, "value": run, "effect": "NoSchedule"}]
    alloc = {"cpu": "32", "memory": "128Gi", "pods": "110", "ephemeral-storage": "500Gi"}
    obj["status"]["allocatable"] = dict(alloc)
    obj["status"]["capacity"] = dict(alloc)
    held = [(names, size) for _, names, size in catalogue if rng.random() < 0.4]
    held.sort(key=lambda h: -h[1])  # a kubelet lists the largest first
    obj["status"]["images"] = [{"names": names, "sizeBytes": size} for names, size in held]
    return obj


def image_pod(
    rng: random.Random, name: str, run: str, catalogue: list[tuple[str, list[str], int]]
) -> dict[str, Any]:
    def reference() -> str:
        repo, names, _ = rng.choice(catalogue)
        r = rng.random()
        if r < 0.1:
            return f"{repo}:v9"  # on no node
        if r < 0.3:
            return repo  # normalized to :latest, which only some images are listed under
        if r < 0.5:
            return names[-1]  # the digest
        return f"{repo}:v1"

    pod = plain_pod(rng, name, run)
    spec = pod["spec"]
    spec["containers"] = [
        {"name": f"c{i}", "image": reference(), "resources": {"requests": {"cpu": "100m"}}}
        for i in range(rng.choice([1, 2, 2, 3]))
    ]
    if rng.random() < 0.25:
        spec["initContainers"] = [{"name": "init", "image": reference()}]
    return pod


@pytest.fixture
async def image_nodes(kube: KubeClient) -> AsyncIterator[tuple[str, list[tuple[str, list[str], int]]]]:
    run = uuid.uuid4().hex[:6]
    rng = random.Random(f"image-nodes:{SEED}")
    total = len((await kube.get("/api/v1/nodes"))["items"]) + IMAGE_NODES
    catalogue = image_catalogue(rng, run, total)
    nodes = [image_node(rng, i, run, catalogue) for i in range(IMAGE_NODES)]
    try:
        await asyncio.gather(*(kube.post("/api/v1/nodes", n) for n in nodes))
        yield run, catalogue
    finally:
        for n in nodes:
            with contextlib.suppress(NotFound):
                await kube.delete(f"/api/v1/nodes/{n['metadata']['name']}")


async def _gone(kube: KubeClient, path: str) -> None:
    for _ in range(200):
        try:
            await kube.get(path)
        except NotFound:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} was not deleted")


async def test_engine_agrees_with_kube_scheduler_on_image_locality(
    kube: KubeClient, namespace: str, image_nodes: tuple[str, list[tuple[str, list[str], int]]]
) -> None:
    run, catalogue = image_nodes
    nodes = (await kube.get("/api/v1/nodes"))["items"]
    d = Differential(kube, namespace, run, nodes)
    assert len(d.diff) == IMAGE_NODES
    assert any(d.cache.nodes[NodeName(n)].node.images.names for n in d.diff), "the API server kept no images"
    plugin = next(p for p, _ in d.engine.scores if p.name == "ImageLocality")
    decided = 0  # cases with one node of highest score: image locality alone chose it
    narrowed = 0  # cases where image locality left only some of the nodes in the running
    async with watching(d.outcomes):
        for case in range(IMAGE_CASES):
            rng = random.Random(f"image:{SEED}:{case}")
            name = f"img{case:04d}"
            pod = image_pod(rng, name, run, catalogue)
            dry = await kube.post(f"/api/v1/namespaces/{namespace}/pods", pod, params={"dryRun": "All"})
            record = pod_from_json(dry)
            infos = [d.cache.nodes[NodeName(n)] for n in d.diff]
            scores = dict(zip(d.diff, plugin.scores(record, infos), strict=True))
            top = max(scores.values())
            best = {n for n, v in scores.items() if v == top}
            decided += len(best) == 1
            narrowed += top > 0 and len(best) < len(d.diff)
            decision = d.engine.schedule(record)
            out = await d.decide(pod)
            problems = []
            if decision.node not in best:
                problems.append(
                    f"engine picked {decision.node}; highest ImageLocality {sorted(best)} ({top})"
                )
            if out.node not in best:
                problems.append(f"kube-scheduler bound it to {out.node} ({out.reason} {out.message})")
            if problems:
                problems.append(f"engine ImageLocality scores: {scores}")
                d.tally.disagreements.append(d.report(case, problems, pod, dry, {n for n in best if n}))
            d.tally.cases += 1
            await d.delete(name)
            await _gone(kube, f"/api/v1/namespaces/{namespace}/pods/{name}")
            await asyncio.sleep(SETTLE_AFTER_DELETE)  # kube-scheduler's cache sees the node empty again
    summary = (
        f"{d.tally.cases} image-locality cases: {narrowed} narrowed to some nodes by image locality, "
        f"{decided} of them to one node; "
        f"{len(d.tally.disagreements)} disagreements"
    )
    conclude(summary, d.tally.disagreements, report=False)
    assert narrowed > IMAGE_CASES // 2 and decided > IMAGE_CASES // 10, summary


# ----- namespaceSelector --------------------------------------------------------------------------------------
#
# The inter-pod comparison again, with terms that select namespaces by label. Three more namespaces beside the
# test's hold pods bound directly to the dedicated nodes (``spec.nodeName``: no scheduler decides them; some
# carry required anti-affinity or preferred terms selecting namespaces by label, for the symmetric rule and the
# score); now and then a namespace (the test's own included) is relabelled, and both schedulers are given a
# moment to see it before the next case. The engine's cache is fed the same Namespaces, as a worker's watch does.

NAMESPACE_CASES = int(os.environ.get("DIFF_NAMESPACE_CASES", "150"))
TEAMS = ["a", "b"]
RELABEL_NAMESPACE = 0.08  # chance per case to relabel a namespace
FOREIGN_POD = 0.3  # chance per case to bind a pod directly in another namespace first
SETTLE_INFORMERS = 0.5  # seconds for kube-scheduler's informers to see a change made outside its queue


def _namespace_selector(rng: random.Random) -> dict[str, Any]:
    r = rng.random()
    if r < 0.4:
        return {"matchLabels": {"team": rng.choice(TEAMS)}}
    if r < 0.55:
        return {"matchExpressions": [{"key": "team", "operator": "In", "values": TEAMS}]}
    if r < 0.7:
        return {"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}
    if r < 0.8:
        return {"matchExpressions": [{"key": "team", "operator": "NotIn", "values": [rng.choice(TEAMS)]}]}
    if r < 0.9:
        return {}  # every namespace
    return {"matchLabels": {"team": "nobody"}}


def _with_namespace_selectors(rng: random.Random, spec: dict[str, Any], others: list[str]) -> None:
    """Give most pod (anti-)affinity terms in ``spec`` a namespaceSelector, some also a namespaces list."""
    for kind in ("podAffinity", "podAntiAffinity"):
        block = (spec.get("affinity") or {}).get(kind) or {}
        terms = list(block.get("requiredDuringSchedulingIgnoredDuringExecution") or ())
        terms += [
            p["podAffinityTerm"] for p in block.get("preferredDuringSchedulingIgnoredDuringExecution") or ()
        ]
        for term in terms:
            if rng.random() < 0.75:
                term["namespaceSelector"] = _namespace_selector(rng)
            if rng.random() < 0.2:
                term["namespaces"] = [rng.choice(others)]


@pytest.fixture
async def other_namespaces(kube: KubeClient, namespace: str) -> AsyncIterator[list[str]]:
    names = [f"{namespace}-o{i}" for i in range(3)]
    try:
        for i, name in enumerate(names):
            labels = {"team": TEAMS[i]} if i < len(TEAMS) else {}
            await kube.post(
                "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}},
            )
        yield names
    finally:
        for name in names:
            await delete_namespace(kube, name)


class NamespaceDifferential(InterPodDifferential):
    def __init__(
        self, kube: KubeClient, namespace: str, run: str, nodes: list[dict[str, Any]], others: list[str]
    ) -> None:
        super().__init__(kube, namespace, run, nodes)
        self.others = others
        self.relabelled = 0
        self.foreign = 0

    def generate(self, rng: random.Random, name: str) -> dict[str, Any]:
        pod = inter_pod_pod(rng, name, self.run)
        _with_namespace_selectors(rng, pod["spec"], self.others)
        return pod

    async def load_namespaces(self) -> None:
        for obj in (await self.kube.get("/api/v1/namespaces"))["items"]:
            meta = obj["metadata"]
            self.cache.upsert_namespace(meta["name"], dict(meta.get("labels") or {}))

    async def relabel(self, rng: random.Random) -> None:
        name = rng.choice([self.namespace, *self.others])
        team = rng.choice([*TEAMS, None])
        obj = await self.kube.patch(f"/api/v1/namespaces/{name}", {"metadata": {"labels": {"team": team}}})
        self.cache.upsert_namespace(name, dict(obj["metadata"].get("labels") or {}))
        self.relabelled += 1
        await asyncio.sleep(SETTLE_INFORMERS)

    async def bind_foreign(self, rng: random.Random, case: int) -> None:
        """A pod bound directly to a dedicated node in another namespace, maybe with namespaceSelector terms."""
        pod = inter_pod_pod(rng, f"f{case:04d}", self.run)
        spec = pod["spec"]
        spec.pop("topologySpreadConstraints", None)
        affinity = spec["affinity"]
        affinity.pop("podAffinity", None)  # a bound pod's own required affinity is never checked again
        _with_namespace_selectors(rng, spec, [self.namespace, *self.others])
        spec["nodeName"] = rng.choice(self.diff)
        namespace = rng.choice(self.others)
        created = await self.kube.post(f"/api/v1/namespaces/{namespace}/pods", pod)
        self.cache.upsert_pod(pod_from_json(created))
        self.foreign += 1
        await asyncio.sleep(SETTLE_INFORMERS)

    async def namespace_case(self, case: int) -> None:
        rng = random.Random(f"namespaces:{SEED}:{case}")
        if rng.random() < RELABEL_NAMESPACE:
            await self.relabel(rng)
        if rng.random() < FOREIGN_POD:
            await self.bind_foreign(rng, case)
        await self.inter_case(case, seed="namespace-pods")


async def test_engine_agrees_with_kube_scheduler_on_namespace_selectors(
    kube: KubeClient, namespace: str, diff_nodes: str, other_namespaces: list[str]
) -> None:
    started = time.monotonic()
    nodes = (await kube.get("/api/v1/nodes"))["items"]
    d = NamespaceDifferential(kube, namespace, diff_nodes, nodes, other_namespaces)
    await d.load_namespaces()
    await load_bound(kube, d.cache)
    async with watching(d.outcomes):
        for case in range(NAMESPACE_CASES):
            await d.namespace_case(case)
    summary = (
        f"{d.tally.cases} namespaceSelector cases in {time.monotonic() - started:.0f}s: {d.tally.bound} bound, "
        f"{d.tally.unschedulable} unschedulable, {d.foreign} pods bound directly in other namespaces, "
        f"{d.relabelled} namespaces relabelled, {d.probes} of the engine's picks confirmed by a pinned probe; "
        f"engine verdicts per node: {dict(sorted(d.verdict_kinds.items()))}; "
        f"{len(d.tally.disagreements)} disagreements"
    )
    conclude(summary, d.tally.disagreements)
    assert d.tally.bound > NAMESPACE_CASES // 5 and d.tally.unschedulable > NAMESPACE_CASES // 10, summary
    assert d.relabelled > 0 and d.foreign > 0, summary


# ----- default topology spread constraints --------------------------------------------------------------------
#
# kube-scheduler's default configuration spreads a pod that states no constraint over hostnames (maxSkew 3) and
# zones (maxSkew 5) among the pods of the Services and controllers selecting it: a score. To compare placements
# where that score decides, the pods run on their own identical nodes (one without a zone label: kube still
# scores it on its hostname), each holding one ballast pod from the start, with requests so small that no
# other score of either scheduler tells the nodes apart. Pods come from a Service's selector (created by the
# test), a ReplicaSet and a StatefulSet (scaled up one pod at a time; kube-controller-manager creates the pod,
# kube-scheduler binds it, and the engine decides on it as it was before binding, over the same state).
# kube-scheduler breaks ties at random: its node must be one the engine's spread score ranks highest, and the
# engine's own pick too.

SPREAD_STEPS = int(os.environ.get("DIFF_SPREAD_STEPS", "60"))
SPREAD_ZONES = ["z1", "z1", "z2", "z2", "z3", "z3", None]
ZONE_LABEL = "topology.kubernetes.io/zone"
TINY = {"cpu": "1m", "memory": "1Mi"}


def _spread_node(index: int, run: str, zone: str | None) -> dict[str, Any]:
    name = f"spread-{run}-{index}"
    obj = make_fleet_node(FLEET_INDEX_OFFSET + 100 + index, prefix=f"spread-{run}")
    obj["metadata"]["name"] = name
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", POOL_LABEL: run}
    if zone is not None:
        labels[ZONE_LABEL] = zone
    obj["metadata"]["labels"] = labels
    obj["spec"]["taints"] = [{"key": ISOLATION_TAINT, "value": run, "effect": "NoSchedule"}]
    obj["status"]["addresses"] = [a for a in obj["status"]["addresses"] if a["type"] != "Hostname"] + [
        {"type": "Hostname", "address": name}
    ]
    # huge and identical: a few 1m pods never change the resource scores' integer percentages
    shape = {"cpu": "1000", "memory": "1000Gi", "pods": "110", "ephemeral-storage": "500Gi"}
    obj["status"]["allocatable"] = dict(shape)
    obj["status"]["capacity"] = dict(shape)
    return obj


def _spread_template(app: str, run: str) -> dict[str, Any]:
    pod = plain_pod(random.Random(0), "unused", run)
    pod["metadata"] = {"labels": {"app": app}}
    pod["spec"]["containers"][0]["resources"]["requests"] = dict(TINY)
    return pod


@pytest.fixture
async def spread_nodes(kube: KubeClient) -> AsyncIterator[str]:
    run = uuid.uuid4().hex[:6]
    nodes = [_spread_node(i, run, z) for i, z in enumerate(SPREAD_ZONES)]
    try:
        await asyncio.gather(*(kube.post("/api/v1/nodes", n) for n in nodes))
        yield run
    finally:
        for n in nodes:
            with contextlib.suppress(NotFound):
                await kube.delete(f"/api/v1/nodes/{n['metadata']['name']}")


class SpreadDifferential:
    def __init__(self, kube: KubeClient, namespace: str, run: str, nodes: list[dict[str, Any]]) -> None:
        self.kube = kube
        self.namespace = namespace
        self.run = run
        self.nodes = sorted(
            n["metadata"]["name"] for n in nodes if n["metadata"]["labels"].get(POOL_LABEL) == run
        )
        self.cache = Cache()
        for obj in nodes:
            self.cache.upsert_node(node_from_json(obj))
        self.engine = build_engine(WorkerSettings(), self.cache)  # the defaults: kube's System constraints
        self.outcomes = Outcomes(kube, namespace)
        self.compared = 0
        self.decided_by_spread = 0  # cases where the spread score did not rank every feasible node the same
        self.by_source: Counter[str] = Counter()
        self.disagreements: list[str] = []
        self.scaled = {"rs-web": 0, "ss-web": 0}

    async def setup(self) -> None:
        ns = self.namespace
        for i, node in enumerate(self.nodes):
            ballast = _spread_template("ballast", self.run)
            ballast["metadata"]["name"] = f"ballast-{i}"
            ballast["spec"]["nodeName"] = node
            self.cache.upsert_pod(
                pod_from_json(await self.kube.post(f"/api/v1/namespaces/{ns}/pods", ballast))
            )
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "svc-web"},
            "spec": {"selector": {"app": "svc-web"}, "ports": [{"port": 80}]},
        }
        self.cache.workloads.upsert(
            "Service", await self.kube.post(f"/api/v1/namespaces/{ns}/services", service)
        )
        for kind, path, app in (
            ("ReplicaSet", "replicasets", "rs-web"),
            ("StatefulSet", "statefulsets", "ss-web"),
        ):
            spec: dict[str, Any] = {
                "replicas": 0,
                "selector": {"matchLabels": {"app": app}},
                "template": _spread_template(app, self.run),
            }
            if kind == "StatefulSet":
                spec |= {"serviceName": "svc-web", "podManagementPolicy": "Parallel"}
            obj = {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": app}, "spec": spec}
            created = await self.kube.post(f"/apis/apps/v1/namespaces/{ns}/{path}", obj)
            self.cache.workloads.upsert(kind, created)
        await asyncio.sleep(SETTLE_INFORMERS)

    def spread_best(self, record: PodRecord) -> tuple[set[str], NodeName | None, bool | None]:
        """The feasible nodes the engine's spread score ranks highest, the engine's pick, and whether the
        spread score told the nodes apart at all (None: the engine gives the pod no spread constraint)."""
        decision = self.engine.schedule(record)
        feasible = [
            self.cache.nodes[NodeName(n)]
            for n in self.nodes
            if self.engine.filter_all(record, self.cache.nodes[NodeName(n)]) is None
        ]
        spread = next(p for p, _ in self.engine.scores if p.name == "PodTopologySpreadScore")
        if not spread.applies(record):
            return {i.node.name for i in feasible}, decision.node, None
        if not feasible:
            return set(), decision.node, False
        scores = spread.scores(record, feasible)
        top = max(scores)
        return (
            {i.node.name for i, s in zip(feasible, scores, strict=True) if s == top},
            decision.node,
            (min(scores) != top),
        )

    def compare(self, source: str, record: PodRecord, bound: dict[str, Any]) -> None:
        best, pick, decided = self.spread_best(record)
        node = bound["spec"].get("nodeName")
        self.compared += 1
        self.decided_by_spread += bool(decided)
        self.by_source[source] += 1
        problems = []
        if decided is None:
            problems.append(
                "the engine applies no spread constraint; kube-scheduler's defaults select the pod"
            )
        if node not in best:
            problems.append(f"kube-scheduler bound it to {node}; the engine's best by spread: {sorted(best)}")
        if pick not in best:
            problems.append(f"the engine picked {pick}, not one of its best by spread: {sorted(best)}")
        if problems:
            counts = {n: sorted(self.cache.nodes[NodeName(n)].pods) for n in self.nodes}
            self.disagreements.append(
                f"{source} pod {record.name}: " + "; ".join(problems) + f"\n  pods per node: {counts}"
            )
        self.cache.upsert_pod(pod_from_json(bound))

    async def service_pod(self, step: int) -> None:
        pod = _spread_template("svc-web", self.run)
        pod["metadata"]["name"] = f"s{step:03d}"
        dry = await self.kube.post(f"/api/v1/namespaces/{self.namespace}/pods", pod, params={"dryRun": "All"})
        record = pod_from_json(dry)
        fut = self.outcomes.expect(pod["metadata"]["name"])
        await self.kube.post(f"/api/v1/namespaces/{self.namespace}/pods", pod)
        out = await asyncio.wait_for(fut, DECISION_TIMEOUT)
        assert out.node is not None, out
        self.compare("Service", record, out.obj)

    async def scale_up(self, kind: str, path: str, app: str) -> None:
        """One more replica; the engine decides on the new pod as it was before kube-scheduler bound it."""
        known = {str(k).split("/", 1)[1] for n in self.nodes for k in self.cache.nodes[NodeName(n)].pods}
        self.scaled[app] += 1
        await self.kube.patch(
            f"/apis/apps/v1/namespaces/{self.namespace}/{path}/{app}",
            {"spec": {"replicas": self.scaled[app]}},
        )
        deadline = time.monotonic() + DECISION_TIMEOUT
        while True:
            listing = await self.kube.get(
                f"/api/v1/namespaces/{self.namespace}/pods", {"labelSelector": f"app={app}"}
            )
            new = [p for p in listing["items"] if p["metadata"]["name"] not in known]
            if new and new[0]["spec"].get("nodeName"):
                break
            assert time.monotonic() < deadline, f"no new {app} pod bound"
            await asyncio.sleep(0.1)
        bound = new[0]
        before = copy.deepcopy(bound)
        before["spec"].pop("nodeName")
        before["status"] = {"phase": "Pending"}
        self.compare(kind, pod_from_json(before), bound)


async def test_default_spread_scores_place_pods_as_kube_scheduler_does(
    kube: KubeClient, namespace: str, spread_nodes: str
) -> None:
    nodes = (await kube.get("/api/v1/nodes"))["items"]
    d = SpreadDifferential(kube, namespace, spread_nodes, nodes)
    assert len(d.nodes) == len(SPREAD_ZONES)
    rng = random.Random(f"spread:{SEED}")
    async with watching(d.outcomes):
        await d.setup()
        for step in range(SPREAD_STEPS):
            r = rng.random()
            if r < 0.5:
                await d.service_pod(step)
            elif r < 0.75:
                await d.scale_up("ReplicaSet", "replicasets", "rs-web")
            else:
                await d.scale_up("StatefulSet", "statefulsets", "ss-web")
    summary = (
        f"{d.compared} default-spread placements compared ({dict(d.by_source)}), {d.decided_by_spread} where "
        f"the spread score told the nodes apart; {len(d.disagreements)} disagreements"
    )
    conclude(summary, d.disagreements, report=False)
    assert d.decided_by_spread > SPREAD_STEPS // 2, summary
    assert all(d.by_source[k] for k in ("Service", "ReplicaSet", "StatefulSet")), summary


# ----- volumes ------------------------------------------------------------------------------------------------
#
# PVC-backed pods, compared over sequences as the inter-pod rules are (earlier pods, and the PVs they took, stay).
# Every case makes its own claims and PVs, then a plain pod using them: a claim that does not exist, an unbound
# claim of an Immediate class nothing satisfies, a claim the PV controller bound to a PV with zone node affinity
# (and zone labels: VolumeZone), or WaitForFirstConsumer claims with a few local PVs of random size, access modes
# and node affinity (zone or hostname), some already taken. Before each decision the engine's volume store is
# loaded from the API server (the claims, PVs and classes both schedulers see). The dedicated nodes carry
# ``topology.kubernetes.io/zone`` where they have a ``zone`` label, so VolumeZone is exercised too. No probes:
# a pinned probe would take the PV it was given. ``DIFF_VOLUME_CASES`` (default 200) sets the number of cases.

VOLUME_CASES = int(os.environ.get("DIFF_VOLUME_CASES", "200"))
TOPOLOGY_ZONE = "topology.kubernetes.io/zone"
VOLUME_LABEL = "diff-volume"
VOLUME_KINDS = ["missing", "immediate", "zonal", "zonal", "wffc", "wffc", "wffc", "wffc"]


@pytest.fixture
async def volume_nodes(kube: KubeClient) -> AsyncIterator[str]:
    """The dedicated nodes, with ``topology.kubernetes.io/zone`` copied from ``zone``; StorageClasses; the run id.
    Deletes the nodes, the classes and the PVs of the run at the end."""
    run = uuid.uuid4().hex[:6]
    rng = random.Random(f"nodes:{SEED}")
    nodes = [generate_node(rng, i, run) for i in range(NODES)]
    for n in nodes:
        labels = n["metadata"]["labels"]
        if "zone" in labels:
            labels[TOPOLOGY_ZONE] = labels["zone"]
    classes = {
        f"diff-immediate-{run}": "Immediate",
        f"diff-local-{run}": "WaitForFirstConsumer",
    }
    try:
        await asyncio.gather(*(kube.post("/api/v1/nodes", n) for n in nodes))
        for name, mode in classes.items():
            await kube.post(
                "/apis/storage.k8s.io/v1/storageclasses",
                {
                    "apiVersion": "storage.k8s.io/v1",
                    "kind": "StorageClass",
                    "metadata": {"name": name},
                    "provisioner": "kubernetes.io/no-provisioner",
                    "volumeBindingMode": mode,
                },
            )
        yield run
    finally:
        for n in nodes:
            with contextlib.suppress(NotFound):
                await kube.delete(f"/api/v1/nodes/{n['metadata']['name']}")
        for name in classes:
            with contextlib.suppress(NotFound):
                await kube.delete(f"/apis/storage.k8s.io/v1/storageclasses/{name}")
        pvs = await kube.get("/api/v1/persistentvolumes", {"labelSelector": f"{VOLUME_LABEL}={run}"})
        for pv in pvs["items"]:
            with contextlib.suppress(NotFound):
                await kube.delete(f"/api/v1/persistentvolumes/{pv['metadata']['name']}")


def _volume(
    rng: random.Random, name: str, run: str, cls: str, *, affinity: tuple[str, str] | None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "storageClassName": cls,
        "capacity": {"storage": rng.choice(["1Gi", "2Gi", "5Gi", "10Gi"])},
        "accessModes": rng.choice([["ReadWriteOnce"], ["ReadWriteOnce", "ReadOnlyMany"], ["ReadWriteMany"]]),
        "persistentVolumeReclaimPolicy": "Retain",
        "local": {"path": "/mnt/diff"},
    }
    labels = {VOLUME_LABEL: run}
    if affinity is not None:
        key, value = affinity
        spec["nodeAffinity"] = {
            "required": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}
                ]
            }
        }
        if key == "zone":
            labels[TOPOLOGY_ZONE] = value
    else:
        spec["hostPath"] = spec.pop("local")  # a local volume must have node affinity; hostPath need not
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    }


def _claim(rng: random.Random, name: str, cls: str) -> dict[str, Any]:
    modes = rng.choice([("ReadWriteOnce",), ("ReadWriteOnce",), ("ReadOnlyMany",), ("ReadWriteMany",)])
    return claim(name, cls, modes=modes, size=rng.choice(["1Gi", "2Gi", "4Gi", "8Gi"]))


def _volume_category(verdict: str | None) -> str:
    for needle, name in (
        ("persistentvolumeclaim", "claim-missing"),
        ("unbound immediate", "unbound-immediate"),
        ("volume node affinity", "pv-node-affinity"),
        ("available persistent volumes", "no-pv-to-bind"),
        ("volume zone", "volume-zone"),
    ):
        if verdict is not None and needle in verdict:
            return name
    return _category(verdict)


class VolumeDifferential(InterPodDifferential):
    def __init__(self, kube: KubeClient, namespace: str, run: str, nodes: list[dict[str, Any]]) -> None:
        super().__init__(kube, namespace, run, nodes)
        self.kinds: Counter[str] = Counter()

    async def load_storage(self) -> None:
        """The engine's volume store, from the API server: what kube-scheduler's informers hold."""
        store = self.cache.volumes
        store.replace("classes", (await self.kube.get("/apis/storage.k8s.io/v1/storageclasses"))["items"])
        store.replace("volumes", (await self.kube.get("/api/v1/persistentvolumes"))["items"])
        claims = await self.kube.get(f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims")
        store.replace("claims", claims["items"])
        store.replace("csinodes", [])

    async def wait_bound(self, name: str) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims/{name}"
        for _ in range(100):
            obj = await self.kube.get(path)
            if obj.get("status", {}).get("phase") == "Bound":
                return
            await asyncio.sleep(0.1)

    async def wait_available(self, pv: str) -> None:
        """Until the PV controller has made a new PV Available (only then can either scheduler bind it)."""
        for _ in range(100):
            obj = await self.kube.get(f"/api/v1/persistentvolumes/{pv}")
            if obj.get("status", {}).get("phase") == "Available":
                return
            await asyncio.sleep(0.05)

    async def make_storage(self, rng: random.Random, case: int, kind: str) -> list[str]:
        """The claims (and PVs) of one case; returns the claim names the pod uses."""
        claims_path = f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims"
        immediate, local = f"diff-immediate-{self.run}", f"diff-local-{self.run}"
        zones = NODE_LABELS["zone"] + MISSING_VALUES[:1]
        name = f"v{case:04d}"
        if kind == "missing":
            return [f"{name}-absent"]
        if kind == "immediate":
            too_big = _claim(rng, name, immediate)
            too_big["spec"]["resources"]["requests"]["storage"] = "900Gi"  # no PV that big exists
            await self.kube.post(claims_path, too_big)
            return [name]
        if kind == "zonal":
            zone = rng.choice(zones)
            pv = _volume(rng, f"{name}-{self.run}", self.run, immediate, affinity=("zone", zone))
            if rng.random() < 0.5:
                # zone labels only, no node affinity: VolumeZone alone decides
                del pv["spec"]["nodeAffinity"]
                pv["spec"]["hostPath"] = pv["spec"].pop("local")
            pv["spec"]["capacity"]["storage"] = "10Gi"
            pv["spec"]["accessModes"] = ["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany"]
            pv["spec"]["claimRef"] = {"namespace": self.namespace, "name": name}
            await self.kube.post("/api/v1/persistentvolumes", pv)
            await self.kube.post(claims_path, _claim(rng, name, immediate))
            await self.wait_bound(name)
            return [name]
        names = []
        for i in range(rng.choice([1, 1, 2])):
            for j in range(rng.choice([0, 1, 2, 3])):
                r = rng.random()
                if r < 0.45:
                    affinity: tuple[str, str] | None = ("zone", rng.choice(zones))
                elif r < 0.9:
                    affinity = ("kubernetes.io/hostname", rng.choice(self.diff))
                else:
                    affinity = None
                pv = _volume(rng, f"{name}-{i}-{j}-{self.run}", self.run, local, affinity=affinity)
                await self.kube.post("/api/v1/persistentvolumes", pv)
                await self.wait_available(pv["metadata"]["name"])
            await self.kube.post(claims_path, _claim(rng, f"{name}-{i}", local))
            names.append(f"{name}-{i}")
        return names

    async def volume_case(self, case: int) -> None:
        rng = random.Random(f"volumes:{SEED}:{case}")
        name = f"w{case:04d}"
        kind = rng.choice(VOLUME_KINDS)
        self.kinds[kind] += 1
        claims = await self.make_storage(rng, case, kind)
        pod = plain_pod(rng, name, self.run)
        pod["spec"]["volumes"] = [
            {"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}} for i, c in enumerate(claims)
        ]
        if rng.random() < 0.15:
            pod["spec"]["nodeSelector"] = {"zone": rng.choice(NODE_LABELS["zone"])}
        await asyncio.sleep(SETTLE_AFTER_DELETE)  # kube-scheduler's informers see the new claims and PVs
        await self.load_storage()
        dry = await self.kube.post(f"/api/v1/namespaces/{self.namespace}/pods", pod, params={"dryRun": "All"})
        record = pod_from_json(dry)
        decision = self.engine.schedule(record)
        verdicts = {n: self.verdict(record, n) for n in self.diff}
        problems: list[str] = []
        involved: set[str] = set()
        if record.parse_error is not None:
            problems.append(f"engine refuses the pod: {record.parse_error}")
        if decision.node is not None:
            involved.add(decision.node)
            if verdicts.get(decision.node, "not a dedicated node") is not None:
                problems.append(
                    f"engine picked {decision.node}, which filter_all rejects or is not dedicated"
                )
        elif any(v is None for v in verdicts.values()):
            problems.append("engine found no node, but filter_all accepts some")
        out = await self.decide(pod)
        if out.node is not None:
            self.tally.bound += 1
            involved.add(out.node)
            if decision.node is None:
                problems.append(
                    f"kube-scheduler bound it to {out.node}; the engine found no node ({decision.message})"
                )
            elif verdicts.get(out.node) is not None:
                problems.append(f"kube-scheduler bound it to {out.node}; engine: {verdicts.get(out.node)}")
            self.cache.upsert_pod(pod_from_json(out.obj))
            self.bound.append(name)
        else:
            self.tally.unschedulable += 1
            if out.reason != "Unschedulable":
                problems.append(f"kube-scheduler {out.reason}: {out.message}")
            elif decision.node is not None:
                problems.append(
                    f"kube-scheduler: unschedulable ({out.message}); the engine picked {decision.node}"
                )
            await self.delete(name)
        self.verdict_kinds.update(_volume_category(v) for v in verdicts.values())
        self.tally.cases += 1
        if problems:
            problems.append(f"case kind {kind}; claims {claims}")
            self.tally.disagreements.append(self.report(case, problems, pod, dry, involved))
        if self.bound and rng.random() < DELETE_EARLIER_POD:
            victim = self.bound.pop(rng.randrange(len(self.bound)))
            await self.delete(victim)
            self.cache.remove_pod(PodKey(f"{self.namespace}/{victim}"))
            self.tally.deleted += 1


async def test_engine_agrees_with_kube_scheduler_on_volumes(
    kube: KubeClient, namespace: str, volume_nodes: str
) -> None:
    started = time.monotonic()
    nodes = (await kube.get("/api/v1/nodes"))["items"]
    d = VolumeDifferential(kube, namespace, volume_nodes, nodes)
    assert len(d.diff) == NODES
    await load_bound(kube, d.cache)
    async with watching(d.outcomes):
        for case in range(VOLUME_CASES):
            await d.volume_case(case)
    summary = (
        f"{d.tally.cases} volume cases in {time.monotonic() - started:.0f}s ({dict(sorted(d.kinds.items()))}): "
        f"{d.tally.bound} bound, {d.tally.unschedulable} unschedulable, {d.tally.deleted} bound pods deleted "
        f"again; engine verdicts per node: {dict(sorted(d.verdict_kinds.items()))}; "
        f"{len(d.tally.disagreements)} disagreements"
    )
    conclude(summary, d.tally.disagreements)
    assert d.tally.bound > VOLUME_CASES // 5 and d.tally.unschedulable > VOLUME_CASES // 10, summary
