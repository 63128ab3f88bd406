"""Inter-pod rules across shards (issue 11, items 5 and 6): a coordinator and three workers place 1,000 pods in
groups whose rules span nodes, then an audit read from the API server checks every hard constraint.

The workload, per round (20 rounds of 50 pods, created round by round in one stream; the 1,000-pod test creates
them all behind a scheduling gate, starts the three workers, waits for the nodes to be shared out and lifts
the gates, so the lane works from a full queue and its own pace is measured; the ``slow`` 5,000-pod variant
starts the workers first and places pods while they are being created):
- ``spread``: 15 pods with a zone topologySpreadConstraint (maxSkew 1, DoNotSchedule) over their group: lane
  pods;
- ``zone-anti``: 2 pods with a required zone anti-affinity against the label ``zone-owner=<group>``, which they
  carry, plus 1 plain pod carrying the same label and no rule of its own (an "intruder"): it may land only in a
  zone neither of the two holds (the symmetric rule), which is exactly what rule 3 of the lane protects when
  the intruder is decided on another shard while a lane pod is in flight;
- ``host-anti``: 10 plain pods with a required hostname anti-affinity over their group (shard-local);
- ``affinity``: 10 pods with a required zone affinity to the spread group of an earlier round, and a hostname
  anti-affinity over their own group: lane pods (round 0 has none: nothing earlier to be near);
- ``plain``: 5 (round 0: 15) agent pods without inter-pod rules;
- PVC-backed pods (``volume_groups``; with the ``storage`` fixture's classes and the test provisioner):
  ``dyn``: 2 pods, each with a WaitForFirstConsumer claim the provisioner fills once a worker has annotated the
  selected node (a zonal PV); ``static``: 1 pod with a WaitForFirstConsumer claim of a class without a
  provisioner, matched by one of the pre-created PVs with zone node affinity (one PV per such claim, spread over
  the zones: workers race for the same PVs, their claimRef writes carry resourceVersions); ``rwop``: 2 pods
  wanting one ReadWriteOncePod claim at once (only one may be bound, the other stays pending with kube's
  reason); ``vspread``: 2 pods with a provisioned claim and a zone spread constraint over their group (lane
  pods). 7 pods per round, taken from ``plain``, so the total stays 1,000.
The generic audit covers the volume pods' inter-pod rules; ``audit_volumes`` checks their volume constraints
from the claims and PVs read back from the API server.

The audit is written against the pod and node objects only (not the scheduler's code): every pod bound exactly
once (unique uids, one binding line per pod in the workers' trails), no node overcommitted, and for every pod,
each of its hard rules holds in the final placement: spread skew (every pod of a spread group carries the same
constraint, so kube-scheduler's per-placement check implies it for the final counts), anti-affinity both ways,
affinity. For volumes: every bound pod's claims are Bound to a PV whose claimRef is that claim, the PV's
node affinity admits the pod's node (zone or hostname), no PV is bound to two claims, at most one live pod
per ReadWriteOncePod claim, and each pending pod is a ReadWriteOncePod loser whose claim is held by a bound pod
and whose PodScheduled message says so. Lane throughput is recorded and printed, never asserted: lane pods over the seconds from the
first to the last lane binding by the API server's clock (``PodScheduled``'s transition time), and over the
seconds from the workers having nodes (or the first creation) until the last lane pod was bound.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from common.kube import KubeClient
from scale.cluster import Cluster
from scale.workload import agent_pod
from tests.integration import volumes
from tests.integration.etcd_server import EtcdServer
from tests.integration.support import audit_capacity, create_pods, wait_for
from tests.integration.test_coordinator import (  # the harness of the coordinator tests
    SETTLE_TIMEOUT,
    Deployment,
    lease_etcd,  # noqa: F401 - the fixture, used by name
    logged,
    nodes_of,
    started,
    stopped_after,
)
from tests.integration.volumes import claim, local_pv, mount

# the storage fixtures: this run's StorageClasses, and the test provisioner (started and stopped by PID)
run = volumes.run
provisioner = volumes.provisioner
storage = volumes.storage

ZONE = "topology.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"
ROUNDS = 20
HOLD_GATE = "agent-scheduler.test/hold"
ROUND_PODS = 50
SLOW_ROUNDS = 100  # the ``slow`` variant: 5,000 pods
WORKERS = 3


def _pod(name: str, scheduler: str, labels: dict[str, str], *, cpu: str = "100m") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "schedulerName": scheduler,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "sandbox",
                    "image": "registry.local/agent-sandbox:1",
                    "resources": {"requests": {"cpu": cpu, "memory": "128Mi"}},
                }
            ],
        },
    }


def _term(key: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"topologyKey": key, "labelSelector": {"matchLabels": dict(labels)}}


def _required(pod: dict[str, Any], kind: str, term: dict[str, Any]) -> None:
    block = pod["spec"].setdefault("affinity", {}).setdefault(kind, {})
    block.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(term)


def _spread(pod: dict[str, Any], key: str, labels: dict[str, str], max_skew: int = 1) -> None:
    pod["spec"].setdefault("topologySpreadConstraints", []).append(
        {
            "maxSkew": max_skew,
            "topologyKey": key,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": dict(labels)},
        }
    )


VOLUME_PODS = 7  # per round, when the test has storage: dyn 2, static 1, rwop 2, vspread 2
RWOP_REASON = "node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod access mode"


def volume_groups(
    r: int, scheduler: str, storage: dict[str, str] | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The PVC-backed pods of round ``r`` and the claims they use (none without ``storage``, the classes of the
    ``storage`` fixture, ``tests.integration.volumes``). Static claims (class ``local``) are matched by PVs
    ``run_rounds`` creates, one per claim. Their volume constraints are audited in ``audit_volumes``; the
    spread by the generic audit."""
    if storage is None:
        return [], []
    pods: list[dict[str, Any]] = []
    claims: list[dict[str, Any]] = []
    for i in range(2):
        claims.append(claim(f"dyn-{r}-{i}", storage["dynamic"]))
        pods.append(mount(_pod(f"dyn-{r}-{i}", scheduler, {"group": f"dyn-{r}"}), f"dyn-{r}-{i}"))
    claims.append(claim(f"static-{r}", storage["local"]))
    pods.append(mount(_pod(f"static-{r}", scheduler, {"group": f"static-{r}"}), f"static-{r}"))
    claims.append(claim(f"rwop-{r}", storage["dynamic"], modes=("ReadWriteOncePod",)))
    for i in range(2):  # both want the claim at once: one is bound, the other stays pending
        pods.append(mount(_pod(f"rwop-{r}-{i}", scheduler, {"group": f"rwop-{r}"}), f"rwop-{r}"))
    vspread = {"group": f"vspread-{r}"}
    for i in range(2):
        claims.append(claim(f"vspread-{r}-{i}", storage["dynamic"]))
        p = mount(_pod(f"vspread-{r}-{i}", scheduler, vspread), f"vspread-{r}-{i}")
        _spread(p, ZONE, vspread)
        pods.append(p)
    assert len(pods) == VOLUME_PODS
    return pods, claims


def round_pods(
    r: int, scheduler: str, namespace: str = "default", storage: dict[str, str] | None = None
) -> tuple[list[dict[str, Any]], int]:
    """Round ``r``'s pods in creation order, and how many of them are lane pods (``storage``: with the
    PVC-backed pods of ``volume_groups``, taken from the plain ones; their claims by ``round_claims``)."""
    pods: list[dict[str, Any]] = []
    lane = 0
    spread = {"group": f"spread-{r}"}
    for i in range(15):
        p = _pod(f"spread-{r}-{i}", scheduler, spread)
        _spread(p, ZONE, spread)
        pods.append(p)
        lane += 1
    owner = {"zone-owner": f"zone-anti-{r}"}
    for i in range(2):
        p = _pod(f"zone-anti-{r}-{i}", scheduler, owner)
        _required(p, "podAntiAffinity", _term(ZONE, owner))
        pods.append(p)
        lane += 1
    pods.append(_pod(f"intruder-{r}", scheduler, owner))  # plain: kept out only by the others' rule
    host = {"group": f"host-anti-{r}"}
    for i in range(10):
        p = _pod(f"host-anti-{r}-{i}", scheduler, host)
        _required(p, "podAntiAffinity", _term(HOSTNAME, host))
        pods.append(p)
    volume_pods, _ = volume_groups(r, scheduler, storage)
    plain = 12 - len(volume_pods)
    if r > 0:
        near = {"group": f"spread-{max(0, r - 2)}"}
        own = {"group": f"affinity-{r}"}
        for i in range(10):
            p = _pod(f"affinity-{r}-{i}", scheduler, own)
            _required(p, "podAffinity", _term(ZONE, near))
            _required(p, "podAntiAffinity", _term(HOSTNAME, own))
            pods.append(p)
            lane += 1
    else:
        plain += 10
    for i in range(plain):
        p = agent_pod(r * 100 + i, namespace=namespace, scheduler_name=scheduler, prefix=f"plain-{r}")
        pods.append(p)
    for p in volume_pods:
        pods.append(p)
        lane += 1 if p["spec"].get("topologySpreadConstraints") else 0
    return pods, lane


# ----- the audit: read from the API server, independent of the scheduler's code ---------------------------


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """matchLabels only: the workload uses nothing else (``_required`` and ``_spread``)."""
    assert set(selector) <= {"matchLabels"}, selector
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def _required_terms(pod: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    block = (pod["spec"].get("affinity") or {}).get(kind) or {}
    terms: list[dict[str, Any]] = block.get("requiredDuringSchedulingIgnoredDuringExecution") or []
    return terms


def audit_constraints(pods: list[dict[str, Any]], node_labels: dict[str, dict[str, str]]) -> list[str]:
    """Every hard inter-pod rule of every bound pod, checked on the final placement; the violations."""
    bound = [p for p in pods if p["spec"].get("nodeName")]

    def domain(p: dict[str, Any], key: str) -> str | None:
        return node_labels[p["spec"]["nodeName"]].get(key)

    def name(p: dict[str, Any]) -> str:
        return str(p["metadata"]["name"])

    def labels(p: dict[str, Any]) -> dict[str, str]:
        return dict(p["metadata"].get("labels") or {})

    violations: list[str] = []
    all_zones = {v for labels_ in node_labels.values() if (v := labels_.get(ZONE)) is not None}
    spread_checked: set[tuple[str, str, int]] = set()
    for p in bound:
        for term in _required_terms(p, "podAntiAffinity"):
            key, mine = term["topologyKey"], domain(p, term["topologyKey"])
            for q in bound:
                if q is not p and _selects(term["labelSelector"], labels(q)) and domain(q, key) == mine:
                    violations.append(f"anti-affinity: {name(p)} and {name(q)} share {key}={mine}")
        for term in _required_terms(p, "podAffinity"):
            key, mine = term["topologyKey"], domain(p, term["topologyKey"])
            if not any(
                q is not p and _selects(term["labelSelector"], labels(q)) and domain(q, key) == mine
                for q in bound
            ):
                violations.append(f"affinity: no pod for {name(p)}'s term in {key}={mine}")
        for c in p["spec"].get("topologySpreadConstraints") or []:
            if c["whenUnsatisfiable"] != "DoNotSchedule":
                continue
            ident = (repr(sorted(c["labelSelector"].items())), c["topologyKey"], c["maxSkew"])
            if ident in spread_checked:
                continue
            spread_checked.add(ident)
            assert c["topologyKey"] == ZONE  # the workload's only spread key; every zone is eligible
            counts = Counter(domain(q, ZONE) for q in bound if _selects(c["labelSelector"], labels(q)))
            per_zone = [counts.get(z, 0) for z in sorted(all_zones)]
            if max(per_zone) - min(per_zone) > c["maxSkew"]:
                violations.append(f"spread {c['labelSelector']}: zones {per_zone}, maxSkew {c['maxSkew']}")
    return violations


def _admits(pv: dict[str, Any], labels: dict[str, str]) -> bool:
    """A PV's required node affinity against a node's labels (terms ORed, expressions ANDed)."""
    required = ((pv["spec"].get("nodeAffinity") or {}).get("required") or {}).get("nodeSelectorTerms")
    if not required:
        return True

    def holds(e: dict[str, Any]) -> bool:
        value, op = labels.get(e["key"]), e["operator"]
        if op == "In":
            return value in e.get("values", [])
        if op == "NotIn":
            return value not in e.get("values", [])
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        raise AssertionError(f"operator {op} not audited")

    return any(all(holds(e) for e in t.get("matchExpressions") or []) for t in required)


def _claims_of(pod: dict[str, Any]) -> list[str]:
    return [
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["spec"].get("volumes") or []
        if "persistentVolumeClaim" in v
    ]


def _pending_message(pod: dict[str, Any]) -> str:
    for c in pod.get("status", {}).get("conditions") or ():
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return str(c.get("message") or "")
    return ""


def audit_volumes(
    pods: list[dict[str, Any]],
    node_labels: dict[str, dict[str, str]],
    claims: list[dict[str, Any]],
    pvs: list[dict[str, Any]],
) -> list[str]:
    """The volume constraints of the pods, from their claims and the PVs as the API server has them: every
    bound pod's claims Bound to a PV that names the claim and admits the pod's node; no PV bound to two claims;
    at most one live pod per ReadWriteOncePod claim; every pending pod a ReadWriteOncePod loser (its claim
    held by a bound pod) whose PodScheduled message says so."""
    violations: list[str] = []
    claim_by = {c["metadata"]["name"]: c for c in claims}
    pv_by = {v["metadata"]["name"]: v for v in pvs}
    volume_users: defaultdict[str, list[str]] = defaultdict(list)
    for c in claims:
        if c["spec"].get("volumeName"):
            volume_users[c["spec"]["volumeName"]].append(c["metadata"]["name"])
    for volume_name, users in volume_users.items():
        if len(users) > 1:
            violations.append(f"PV {volume_name} is the volume of claims {users}")
    live_users: defaultdict[str, list[str]] = defaultdict(list)
    for p in pods:
        name, node = p["metadata"]["name"], p["spec"].get("nodeName")
        for cname in _claims_of(p):
            if node:
                live_users[cname].append(name)
            found = claim_by.get(cname)
            if found is None:
                violations.append(f"{name}: claim {cname} does not exist")
                continue
            if not node:
                continue
            c = found
            volume = c["spec"].get("volumeName")
            if (c.get("status") or {}).get("phase") != "Bound" or not volume:
                violations.append(f"{name} is bound to {node} but its claim {cname} is not Bound")
                continue
            pv = pv_by.get(volume)
            if pv is None:
                violations.append(f"{name}: claim {cname}'s PV {volume} does not exist")
                continue
            ref = pv["spec"].get("claimRef") or {}
            if ref.get("uid") != c["metadata"]["uid"]:
                violations.append(f"PV {volume} of claim {cname} is claimed by {ref.get('name')}")
            if not _admits(pv, node_labels[node]):
                violations.append(
                    f"{name} on {node} ({node_labels[node].get(ZONE)}): PV {volume} does not admit it"
                )
    for cname, users in live_users.items():
        modes = claim_by[cname]["spec"].get("accessModes") or [] if cname in claim_by else []
        if "ReadWriteOncePod" in modes and len(users) > 1:
            violations.append(f"ReadWriteOncePod claim {cname} used by bound pods {users}")
    for p in pods:
        if p["spec"].get("nodeName"):
            continue
        name, wanted = p["metadata"]["name"], _claims_of(p)
        rwop = [
            c
            for c in wanted
            if "ReadWriteOncePod" in (claim_by.get(c, {}).get("spec", {}).get("accessModes") or [])
        ]
        if not any(live_users.get(c) for c in rwop):
            violations.append(
                f"{name} is pending but no ReadWriteOncePod claim of it is held: {_pending_message(p)!r}"
            )
        elif RWOP_REASON not in _pending_message(p):
            violations.append(
                f"{name} is pending without the ReadWriteOncePod reason: {_pending_message(p)!r}"
            )
    return violations


async def _node_labels(kube: KubeClient) -> dict[str, dict[str, str]]:
    items = (await kube.get("/api/v1/nodes")).get("items") or []
    return {n["metadata"]["name"]: dict(n["metadata"].get("labels") or {}) for n in items}


@pytest.fixture
async def sharded(
    cluster: Cluster,
    lease_etcd: EtcdServer,  # noqa: F811 - the imported fixture
    tmp_path: Path,
) -> AsyncIterator[Deployment]:
    """A coordinator of a scheduler name of its own (the test starts the workers); stopped by PID afterwards."""
    with stopped_after(Deployment(cluster, lease_etcd, tmp_path)) as d:
        d.coordinator("coord-a")
        yield d


@pytest.fixture
async def sharded_sole(
    cluster: Cluster,
    lease_etcd: EtcdServer,  # noqa: F811 - the imported fixture
    tmp_path: Path,
) -> AsyncIterator[Deployment]:
    """As ``sharded``, the coordinator with ``--sole-worker``."""
    with stopped_after(Deployment(cluster, lease_etcd, tmp_path)) as d:
        d.coordinator("coord-a", "--sole-worker")
        yield d


async def start_workers(d: Deployment) -> None:
    """Start the workers; return once each holds nodes and no handoff is under way."""
    for i in range(WORKERS):
        d.worker(f"w{i + 1}")
    await started(d, WORKERS)
    await d.wait_status(
        lambda s: (
            len(nodes_of(s)) == WORKERS
            and all(v.get("live") and not v.get("revoking") for v in s["workers"].values())
        ),
        "no handoff under way",
    )


async def _lift_gates(kube: KubeClient, namespace: str, names: list[str]) -> None:
    sem = asyncio.Semaphore(32)

    async def one(name: str) -> None:
        async with sem:
            await kube.patch(
                f"/api/v1/namespaces/{namespace}/pods/{name}", {"spec": {"schedulingGates": None}}
            )

    await asyncio.gather(*(one(n) for n in names))


async def run_rounds(
    kube: KubeClient,
    d: Deployment,
    namespace: str,
    rounds: int,
    record: Callable[[str, object], None],
    *,
    backlog: bool,
    storage: dict[str, str] | None = None,
    disrupt: Callable[[], Coroutine[Any, Any, float]] | None = None,
    start: Callable[[Deployment], Coroutine[Any, Any, None]] = start_workers,
) -> None:
    """Create the rounds' pods and place them: all at once from a backlog (``backlog``: created with a
    scheduling gate, the workers started, the gates lifted: the lane's own pace is measured on a full queue),
    or while they are being created (the workers started first). With ``storage``, the PVC-backed groups'
    claims and static PVs are created first. ``disrupt`` runs once the pods may be placed, beside the
    placing, and returns when (monotonic) it disrupted: that must be before the last lane pod was bound.
    ``start`` starts the workers (all of them by default)."""
    workload = [round_pods(r, d.scheduler_name, namespace, storage) for r in range(rounds)]
    pods = [p for round_, _ in workload for p in round_]
    lane_pods = sum(n for _, n in workload)
    lane_names = {
        p["metadata"]["name"]
        for p in pods
        if p["spec"].get("topologySpreadConstraints")
        or any(t["topologyKey"] != HOSTNAME for t in _required_terms(p, "podAntiAffinity"))
        or _required_terms(p, "podAffinity")
    }
    assert len(lane_names) == lane_pods
    claims = [c for r in range(rounds) for c in volume_groups(r, d.scheduler_name, storage)[1]]
    if storage is not None:
        zones = sorted({v for labels in (await _node_labels(kube)).values() if (v := labels.get(ZONE))})
        static = [c for c in claims if c["spec"]["storageClassName"] == storage["local"]]
        for i, _ in enumerate(static):  # one PV per static claim, round-robin over the zones
            await kube.post(
                "/api/v1/persistentvolumes",
                local_pv(
                    f"static-{namespace}-{i}",
                    storage["local"],
                    key=ZONE,
                    value=zones[i % len(zones)],
                    size="1Gi",
                ),
            )
        for c in claims:
            await kube.post(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", c)
    rwop_claims = {c["metadata"]["name"] for c in claims if "ReadWriteOncePod" in c["spec"]["accessModes"]}
    losers = len(rwop_claims)  # every ReadWriteOncePod claim has two pods: one of them stays pending
    if backlog:
        for p in pods:  # held until every worker has its share of the nodes
            p["spec"]["schedulingGates"] = [{"name": HOLD_GATE}]
    else:
        await start(d)
    t0 = time.monotonic()
    await create_pods(kube, namespace, pods, concurrency=16)
    created_s = time.monotonic() - t0
    if backlog:
        await start(d)
        t0 = time.monotonic()
        await _lift_gates(kube, namespace, [p["metadata"]["name"] for p in pods])
    disruption = asyncio.create_task(disrupt()) if disrupt is not None else None

    def lane_bound(listed: list[dict[str, Any]]) -> bool:
        bound = sum(1 for p in listed if p["metadata"]["name"] in lane_names and p["spec"].get("nodeName"))
        return bound == lane_pods

    await wait_for(kube, namespace, lane_bound, timeout=SETTLE_TIMEOUT * rounds / ROUNDS, what="lane pods")
    lane_done = time.monotonic()
    lane_s = lane_done - t0
    if disruption is not None:
        disrupted = await disruption
        assert disrupted < lane_done, "the lane was done before the disruption"
    lane_metrics = await _lane_metrics(d)
    worker_metrics = await _worker_metrics(d)
    n = len(pods)

    def settled(ps: list[dict[str, Any]]) -> bool:
        """Every pod bound but one user of each ReadWriteOncePod claim, which has been answered (pending with
        the reason: ``audit_volumes`` checks which)."""
        pending = [p for p in ps if not p["spec"].get("nodeName")]
        return (
            len(ps) == n
            and len(pending) == losers
            and all(RWOP_REASON in _pending_message(p) and set(_claims_of(p)) & rwop_claims for p in pending)
        )

    try:
        listed = await wait_for(
            kube,
            namespace,
            settled,
            timeout=SETTLE_TIMEOUT,
            what=f"{n - losers} pods bound, {losers} pending",
        )
    except AssertionError as e:
        states = {
            p["metadata"]["name"]: _pending_message(p)
            for p in (await kube.get(f"/api/v1/namespaces/{namespace}/pods"))["items"]
            if not p["spec"].get("nodeName")
        }
        raise AssertionError(f"{e}; pending: {states}") from None
    assert len({p["metadata"]["uid"] for p in listed}) == n
    bound_pods = [p for p in listed if p["spec"].get("nodeName")]
    trails: Counter[str] = Counter(t["pod"] for t in d.trails() if str(t["pod"]).startswith(namespace + "/"))
    # the trails are flushed by the running workers in batches: every line names a listed pod, once
    assert set(trails) <= {f"{namespace}/{p['metadata']['name']}" for p in bound_pods}
    assert all(c == 1 for c in trails.values()), {k: c for k, c in trails.items() if c > 1}
    cap = await audit_capacity(kube)
    assert cap.overcommitted == []
    node_labels = await _node_labels(kube)
    listed_claims = (await kube.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims"))["items"]
    pvs = (await kube.get("/api/v1/persistentvolumes"))["items"]
    violations = audit_constraints(listed, node_labels) + audit_volumes(
        listed, node_labels, listed_claims, pvs
    )
    assert violations == [], violations[:20]
    by_worker: defaultdict[str, int] = defaultdict(int)
    for t in d.trails():
        by_worker[t["worker"]] += 1
    # The lane's own pace, by the API server's clock: first to last binding of a lane pod (PodScheduled's
    # lastTransitionTime, whole seconds: one second is added for the truncation).
    bound_at = sorted(_scheduled_at(p) for p in listed if p["metadata"]["name"] in lane_names)
    binding_s = (bound_at[-1] - bound_at[0]) + 1.0
    groups: defaultdict[str, list[float]] = defaultdict(list)
    for p in listed:
        if p["metadata"]["name"] in lane_names:
            groups[p["metadata"]["name"].rsplit("-", 1)[0]].append(_scheduled_at(p))
    spans = sorted(max(t) - min(t) + 1.0 for t in groups.values())
    print(
        f"\nlane group spans (first to last binding of a group, s): median {spans[len(spans) // 2]:.0f}, "
        f"max {spans[-1]:.0f}"
    )
    per_group = Counter(re.sub(r"-\d+(-\d+)?$", "", str(p["metadata"]["name"])) for p in listed)
    record("pods", n)
    record("pods_per_group", dict(per_group))
    record("claims", len(claims))
    record("rwop_pending", losers)
    record("lane_pods", lane_pods)
    record("lane_pods_per_s", round(lane_pods / lane_s, 1))
    record("lane_pods_per_s_binding_span", round(lane_pods / binding_s, 1))
    since = "the gates began to lift" if backlog else "the first creation"
    print(
        f"\n{n} pods ({lane_pods} lane pods; per group {dict(per_group)}; {len(claims)} claims, "
        f"{losers} ReadWriteOncePod users pending), {WORKERS} workers, created in {created_s:.1f}s: lane pods all "
        f"bound {lane_s:.1f}s after {since} ({lane_pods / lane_s:.1f} lane pods/s); first to last lane "
        f"binding {binding_s:.0f}s ({lane_pods / binding_s:.1f} lane pods/s); per worker {dict(by_worker)}; "
        f"the leader's lane metrics {lane_metrics}; the workers' mean stages {worker_metrics}; "
        "0 violated constraints"
    )


def _scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as reply:
        text: str = reply.read().decode()
        return text


async def _worker_metrics(d: Deployment) -> dict[str, float]:
    """The workers' mean time per stage (``common.metrics``) and parked for ``min_rv``, over all pods."""
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, float] = defaultdict(float)
    for name, proc in d.procs.items():
        found = re.search(r"metrics on \['([^']+)'", proc.tail(400)) if name.startswith("w") else None
        if found is None:
            continue
        for line in (await asyncio.to_thread(_scrape, found.group(1))).splitlines():
            metric, _, value = line.rpartition(" ")
            for suffix, into in (("_sum", sums), ("_count", counts)):
                if metric.startswith(f"agent_scheduler_pod_scheduling_stage_duration_seconds{suffix}{{"):
                    into[metric.split('"')[1]] += float(value)
                elif metric == f"agent_scheduler_lane_watch_wait_seconds{suffix}":
                    into["parked for min_rv"] += float(value)
            if metric.startswith("scheduler_schedule_attempts_total{") and 'result="unschedulable"' in metric:
                sums["unschedulable decisions"] += float(value)
                counts["unschedulable decisions"] = 1.0
    return {k: round(sums[k] / counts[k], 4) for k in sums if counts.get(k)}


async def _lane_metrics(d: Deployment) -> dict[str, float]:
    """The leader's lane metrics (``coordinator.metrics``): mean dispatch-to-settled time, waits by reason."""
    address = (await d.status())["leader_address"]
    values: dict[str, float] = {}
    for line in (await asyncio.to_thread(_scrape, address)).splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("agent_scheduler_coordinator_lane_waits_total{"):
            values["waits " + name.split('"')[1]] = float(value)
        elif name.startswith("agent_scheduler_coordinator_lane_settle_duration_seconds_sum"):
            values["settle_sum_s"] = round(float(value), 2)
        elif name.startswith("agent_scheduler_coordinator_lane_settle_duration_seconds_count"):
            values["settled"] = float(value)
    if values.get("settled"):
        values["mean_cycle_s"] = round(values["settle_sum_s"] / values["settled"], 3)
    return values


def _scheduled_at(pod: dict[str, Any]) -> float:
    for c in pod["status"].get("conditions") or []:
        if c["type"] == "PodScheduled" and c["status"] == "True":
            return datetime.fromisoformat(c["lastTransitionTime"].replace("Z", "+00:00")).timestamp()
    raise AssertionError(f"{pod['metadata']['name']} has no PodScheduled=True condition")


@pytest.mark.integration
async def test_sharded_inter_pod_rules_1000_pods(
    kube: KubeClient, namespace: str, storage: dict[str, str], sharded: Deployment, record_property: Any
) -> None:
    await run_rounds(kube, sharded, namespace, ROUNDS, record_property, backlog=True, storage=storage)


FAILOVER_ROUNDS = 8  # 400 pods


@pytest.mark.integration
async def test_sharded_inter_pod_rules_across_a_leader_failover(
    kube: KubeClient, namespace: str, storage: dict[str, str], sharded: Deployment, record_property: Any
) -> None:
    """The leader is killed (SIGKILL) while the lane has pods in flight: its workers go on binding what it
    dispatched, and the new leader's term must not dispatch a pod such a placement could make wrong before it
    is seen (the lane's rule 6). The audit is the same as above."""
    d = sharded
    await d.wait_status(lambda s: s["leader"] == "coord-a", "coord-a leading")
    standby = d.coordinator("coord-b")
    leader = d.procs["coord-a"]

    async def kill_the_leader() -> float:
        await asyncio.sleep(2)
        leader.stop(signal.SIGKILL)
        killed = time.monotonic()
        await d.wait_status(lambda s: s["leader"] == "coord-b", "coord-b leading")
        return killed

    await run_rounds(
        kube,
        d,
        namespace,
        FAILOVER_ROUNDS,
        record_property,
        backlog=True,
        storage=storage,
        disrupt=kill_the_leader,
    )
    log = standby.log_path.read_text(errors="replace")
    # its term inherited, and stopped because every worker said it binds nothing of an earlier stream
    assert "no earlier term's placement is under way; pods with cross-node rules may go" in log
    waits = await _lane_metrics(d)
    print(f"\nthe new leader's lane after the failover: {waits}")


@pytest.mark.integration
async def test_sharded_inter_pod_rules_as_a_sole_worker_is_joined(
    kube: KubeClient, namespace: str, storage: dict[str, str], sharded_sole: Deployment, record_property: Any
) -> None:
    """With ``--sole-worker``: w1 alone takes every pod from its own watch while the pods are created; w2
    and w3 join meanwhile, which ends the period (a new stream, the term inheriting again) while w1 still
    binds lane pods the leader never saw. The audit is the same as above."""
    d = sharded_sole
    coord = d.procs["coord-a"]

    joining: list[asyncio.Task[float]] = []

    async def sole(d: Deployment) -> None:
        d.worker("w1")
        await started(d, 1)
        await logged(coord, "w1 took the sole worker's role")
        joining.append(asyncio.create_task(join()))  # while the pods are being created

    async def join() -> float:
        await asyncio.sleep(1)
        joined = time.monotonic()
        for name in ("w2", "w3"):
            d.worker(name)
        return joined

    async def joined() -> float:
        return await joining[0]

    await run_rounds(
        kube,
        d,
        namespace,
        FAILOVER_ROUNDS,
        record_property,
        backlog=False,
        storage=storage,
        disrupt=joined,
        start=sole,
    )
    log = coord.log_path.read_text(errors="replace")
    assert "w1 is no longer the sole worker: the set of workers changed" in log
    via = Counter(t["via"] for t in d.trails() if str(t["pod"]).startswith(namespace + "/"))
    assert via["sole"] > 0 and via["dispatch"] > 0, via
    print(f"\nbindings by way: {dict(via)}")


@pytest.mark.integration
@pytest.mark.slow
async def test_sharded_inter_pod_rules_5000_pods(
    kube: KubeClient, namespace: str, storage: dict[str, str], sharded: Deployment, record_property: Any
) -> None:
    await run_rounds(kube, sharded, namespace, SLOW_ROUNDS, record_property, backlog=False, storage=storage)


def test_the_audit_finds_violations() -> None:
    """The audit is not vacuous: a placement that breaks each kind of rule is reported."""
    nodes = {
        "a1": {ZONE: "a", HOSTNAME: "a1"},
        "a2": {ZONE: "a", HOSTNAME: "a2"},
        "b1": {ZONE: "b", HOSTNAME: "b1"},
        "c1": {ZONE: "c", HOSTNAME: "c1"},
    }

    def placed(p: dict[str, Any], node: str) -> dict[str, Any]:
        p["spec"]["nodeName"] = node
        return p

    pods, _ = round_pods(1, "s")
    by_name = {p["metadata"]["name"]: p for p in pods}
    spread = [placed(by_name[f"spread-1-{i}"], "a1") for i in range(3)]  # skew 3 > 1
    anti = [placed(by_name["zone-anti-1-0"], "a1"), placed(by_name["intruder-1"], "a2")]  # same zone
    host = [placed(by_name["host-anti-1-0"], "b1"), placed(by_name["host-anti-1-1"], "b1")]  # same node
    lonely = [placed(by_name["affinity-1-0"], "c1")]  # no spread-0 pod anywhere
    violations = audit_constraints(spread + anti + host + lonely, nodes)
    kinds = Counter(v.split(":")[0] for v in violations)
    assert any(v.startswith("spread") for v in violations)
    assert kinds["anti-affinity"] >= 3  # zone (both ways: the intruder is matched by the term) and hostname
    assert kinds["affinity"] == 1
    ok = [placed(by_name[f"spread-1-{i}"], node) for i, node in enumerate(("a1", "b1", "c1"))]
    assert audit_constraints(ok, nodes) == []


def test_the_volume_audit_finds_violations() -> None:
    """``audit_volumes`` is not vacuous: each kind of volume violation is reported, a sound placement is not."""
    nodes = {"a1": {ZONE: "a", HOSTNAME: "a1"}, "b1": {ZONE: "b", HOSTNAME: "b1"}}
    classes = {"dynamic": "dyn", "local": "loc"}
    pods, claims = volume_groups(0, "s", classes)
    by_name = {p["metadata"]["name"]: p for p in pods}
    claim_by = {c["metadata"]["name"]: c for c in claims}
    pvs: list[dict[str, Any]] = []

    def bind(name: str, zone: str) -> None:
        c = claim_by[name]
        c["metadata"]["uid"] = f"uid-{name}"
        c["spec"]["volumeName"] = f"pv-{name}"
        c["status"] = {"phase": "Bound"}
        pv = local_pv(f"pv-{name}", "loc", key=ZONE, value=zone, size="1Gi")
        pv["spec"]["claimRef"] = {"namespace": "ns", "name": name, "uid": f"uid-{name}"}
        pvs.append(pv)

    def placed(name: str, node: str | None) -> dict[str, Any]:
        by_name[name]["spec"]["nodeName"] = node
        return by_name[name]

    for name in ("dyn-0-0", "static-0", "rwop-0"):
        bind(name, "a")
    pending = placed("rwop-0-1", None)
    pending["status"] = {"conditions": [{"type": "PodScheduled", "status": "False", "message": RWOP_REASON}]}
    ok = [placed("dyn-0-0", "a1"), placed("static-0", "a1"), placed("rwop-0-0", "a1"), pending]
    assert audit_volumes(ok, nodes, claims, pvs) == []
    bad = [
        placed("dyn-0-0", "b1"),  # its PV is in zone a
        placed("dyn-0-1", "a1"),  # its claim is not Bound
        placed("rwop-0-0", "a1"),
        placed("rwop-0-1", "b1"),  # a second live user of the ReadWriteOncePod claim
        placed("vspread-0-0", None),  # pending without a ReadWriteOncePod claim held
    ]
    claim_by["static-0"]["spec"]["volumeName"] = "pv-dyn-0-0"  # a PV that is the volume of two claims
    violations = audit_volumes(bad, nodes, claims, pvs)
    for needle in (
        "does not admit",
        "is not Bound",
        "used by bound pods",
        "is pending but",
        "volume of claims",
    ):
        assert any(needle in v for v in violations), (needle, violations)
