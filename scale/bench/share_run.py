"""``agent-scheduler bench share``: the share workload (issue 15) on the real local cluster, three shard
policies side by side in one run.

One fresh local cluster (kube-scheduler for the batch pods, the bench's kwok stages so pods complete) and, per
configuration, an isolated installation: its own ``nodes_per_config`` kwok nodes (identical shapes in every
configuration, labelled and tainted for that configuration only), namespace, scheduler name, etcd prefix,
sharding ConfigMap, agent and batch NodeShards, one coordinator and one worker (``agent-scheduler`` processes,
stopped by PID), and a batch side (``scale.bench.share_batch``) fed the same backlog. All configurations get the
same agent arrivals (``scale.bench.share.share_plan``) at the same moments, so they share the machine's noise.

Configurations (``policies``): ``static`` (node-limit split, ``maxMovesPerSync: 0`` freezes it after the first
evaluation), ``volcano-example`` (Volcano's example ConfigMap as shipped, its entries renamed, its sync period
compressed like every other time) and ``tuned`` (this project's policy for the mix, in Volcano's format); on
request (``--configs``) also ``scheduled``: the tuned policy whose target (free CPU, or with
``scheduled_nodes_high`` a node count) the run raises ahead of each wave and lowers when its burst ends
(``scale.bench.share.scheduled_levels``, ConfigMap edits the coordinator applies as new policy versions), the
forecast an operator who knows the waves' times could give.

Measured per configuration (``summarize``): CPU and memory allocation (requests / allocatable over the
configuration's nodes; mean and p10 of samples every ``SAMPLE_S`` during the waves), agent create->bound and
create->running p50/p99 in real seconds (from just before the create request to the watch showing it), batch pods started and
their queue wait (from the backlog's start to bound; pods never started count to the end of the run), node moves
per simulated minute, per node per wave (windows of one wave period from the first wave's start) and the
shortest time between two moves of one node, handoff durations (a node entering a shard's ``nodesDesired`` ->
published in its ``nodesInUse``, real seconds) and the largest free CPU block per pool. Times are simulated
seconds unless a name says ``real``: the scheduler's and the handoff's own latencies are not compressed.

Invariants audited (``violations``; a run with any is marked so in the report and fails the command): no pod
bound twice or moved, no node in two NodeShards' ``nodesDesired`` at once, every agent pod bound on a node its
agent shard published in ``status.nodesInUse`` at that resourceVersion, every batch pod bound on a node its
release allowed and the batch shard published. Resource versions of pods and NodeShards are revisions of the
cluster's one etcd and are compared as integers (an audit-only reliance on the API server's implementation).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import logging
import math
import shutil
import statistics
import tempfile
import time
from collections import defaultdict, deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from common.kube import Conflict, Gone, KubeClient, NotFound, TooManyRequests
from common.records import Resources, resources_from_list
from coordinator.nodeshards import bodies
from coordinator.nodeshards.bodies import parse_nodeshard
from scale.bench import stages
from scale.bench.schedulers import python_module, start, stop_children
from scale.bench.share import SHARE, ShareSpec, agent_demand, scheduled_levels, share_plan
from scale.bench.share_batch import BatchSide
from scale.bench.workloads import RUN_LABEL
from scale.cluster import Cluster, ClusterOptions, start_cluster_async
from scale.cluster.config import PROJECT_ROOT
from scale.cluster.nodes import create_nodes, make_node
from scale.cluster.ports import LOOPBACK, free_ports
from scale.cluster.processes import ProcessRecord, is_running, tail

log = logging.getLogger(__name__)

STATIC = "static"
VOLCANO = "volcano-example"
TUNED = "tuned"
SCHEDULED = "scheduled"
CONFIGS = (STATIC, VOLCANO, TUNED)  # the default set
KNOWN = (*CONFIGS, SCHEDULED)
CRD_MANIFEST = PROJECT_ROOT / "manifests" / "crds" / "nodeshards.shard.volcano.sh.yaml"
VOLCANO_EXAMPLE = PROJECT_ROOT / "tests" / "unit" / "nodeshards" / "policy" / "volcano_example_configmap.yaml"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
POOL_LABEL = "bench.agent-scheduler.io/share-pool"
GI_PER_CPU = 4
SAMPLE_S = 0.5
DRAIN_S = 30.0  # after the last arrival, at most this long for agent pods still unbound
READY_S = 120.0
CREATE_CONCURRENCY = 64
WARMUP_S = 60.0  # simulated: the batch backlog is placed this long before the first wave


@dataclass(frozen=True, slots=True)
class Policy:
    """One configuration: the two keys of its sharding ConfigMap."""

    name: str
    description: str
    sharding: str
    settings: str = ""


def _yaml(doc: dict[str, Any]) -> str:
    """YAML without anchors (the policy refuses them): the shared sub-dicts are written out each time."""
    return yaml.safe_dump(json.loads(json.dumps(doc)), sort_keys=False)


def _go_seconds(seconds: float) -> str:
    return f"{max(seconds, 0.001) * 1000:.0f}ms"


def volcano_example_sharding() -> dict[str, Any]:
    """Volcano's example ConfigMap's ``sharding.yaml``, parsed (the copy the policy tests check we accept)."""
    doc = yaml.safe_load(VOLCANO_EXAMPLE.read_text())
    data: dict[str, Any] = yaml.safe_load(doc["data"]["sharding.yaml"])
    return data


def tuned_sharding(spec: ShareSpec, free_cpu: float, *, agent: str, batch: str) -> dict[str, Any]:
    """The tuned policy's ``sharding.yaml`` keeping ``free_cpu`` cores free in the agent shard (the scheduled
    configuration is this document with ``free_cpu`` switched over time)."""
    anyutil = {"name": "allocation-rate", "weight": 1, "arguments": {"minCPUUtil": 0.0, "maxCPUUtil": 1.0}}
    max_util = 1.0 if spec.tuned_reclaim else spec.tuned_agent_max_util
    free_args: dict[str, Any] = {"minFreeCPU": free_cpu}
    if spec.tuned_reclaim:
        free_args["reclaim"] = True
    return {
        "schedulerConfigs": [
            {
                "name": agent,
                "type": "agent",
                "policies": [
                    {
                        "name": "allocation-rate",
                        "weight": 1,
                        "arguments": {"minCPUUtil": 0.0, "maxCPUUtil": max_util},
                    },
                    {"name": "free-capacity", "arguments": free_args},
                ],
            },
            {"name": batch, "type": "volcano", "policies": [anyutil]},
        ],
        "shardSyncPeriod": _go_seconds(spec.real(spec.tuned_sync_s)),
        "enableNodeEventTrigger": True,
    }


def scheduled_sharding(spec: ShareSpec, high: bool, *, agent: str, batch: str) -> dict[str, Any]:
    """The scheduled configuration's ``sharding.yaml`` at its high (a wave) or low (between waves) level: the
    tuned document with ``minFreeCPU`` switched, or, with ``scheduled_nodes_high``, a node count: the agent
    shard takes the busiest nodes (allocation-rate 0-100 %, scored by utilisation) up to node-limit's
    ``maxNodes``."""
    if not spec.scheduled_nodes_high:
        cores = spec.scheduled_free_cpu_high if high else spec.scheduled_free_cpu_low
        return tuned_sharding(spec, cores, agent=agent, batch=batch)
    count = spec.scheduled_nodes_high if high else spec.scheduled_nodes_low
    anyutil = {"name": "allocation-rate", "weight": 1, "arguments": {"minCPUUtil": 0.0, "maxCPUUtil": 1.0}}
    limit = {"name": "node-limit", "arguments": {"minNodes": count, "maxNodes": count}}
    return {
        "schedulerConfigs": [
            {"name": agent, "type": "agent", "policies": [anyutil, limit]},
            {"name": batch, "type": "volcano", "policies": [anyutil]},
        ],
        "shardSyncPeriod": _go_seconds(spec.real(spec.tuned_sync_s)),
        "enableNodeEventTrigger": True,
    }


def policies(spec: ShareSpec, *, nodes: int, agent_nodes: int, agent: str, batch: str) -> dict[str, Policy]:
    """The three configurations for one installation whose NodeShards are named ``agent`` and ``batch``.

    ``agent_nodes`` is the static split's agent share, sized for the agent peak."""
    limit = {"name": "node-limit", "arguments": {"minNodes": agent_nodes, "maxNodes": agent_nodes}}
    anyutil = {"name": "allocation-rate", "weight": 1, "arguments": {"minCPUUtil": 0.0, "maxCPUUtil": 1.0}}
    static = {
        "schedulerConfigs": [
            {"name": agent, "type": "agent", "policies": [anyutil, limit]},
            {"name": batch, "type": "volcano", "policies": [anyutil]},
        ],
        "shardSyncPeriod": _go_seconds(spec.real(60.0)),
        "enableNodeEventTrigger": True,
    }
    example = volcano_example_sharding()
    names = {"agent": agent, "volcano": batch}
    for entry in example["schedulerConfigs"]:
        entry["name"] = names[entry["type"]]
    example["shardSyncPeriod"] = _go_seconds(spec.real(60.0))  # "60s" as shipped, compressed
    tuned = tuned_sharding(spec, spec.tuned_free_cpu, agent=agent, batch=batch)
    tuned_shards: dict[str, Any] = {
        "bandHysteresis": spec.tuned_band_hysteresis,
        "rankHysteresis": spec.tuned_rank_hysteresis,
        "maxMovesPerSync": spec.tuned_max_moves,
    }
    residence = ""
    if spec.tuned_residence_s:
        tuned_shards["minResidenceSeconds"] = spec.real(spec.tuned_residence_s)
        residence = (
            f", a node stays {spec.tuned_residence_s:g} simulated s where it moved (minResidenceSeconds)"
        )
    if spec.tuned_batch_residence_s:
        tuned_shards["minResidenceSecondsByScheduler"] = {batch: spec.real(spec.tuned_batch_residence_s)}
        residence += f", a node lent to batch stays there {spec.tuned_batch_residence_s:g} simulated s"
    tuned_settings = {"shards": tuned_shards}
    if spec.scheduled_nodes_high:
        levels = f"{spec.scheduled_nodes_high} nodes (node-limit; busiest first)"
        quiet = f"{spec.scheduled_nodes_low} between waves"
    else:
        levels = f"{spec.scheduled_free_cpu_high:g} cores of free CPU"
        quiet = f"{spec.scheduled_free_cpu_low:g} cores between waves"
    return {
        STATIC: Policy(
            STATIC,
            f"fixed split: {agent_nodes} agent / {nodes - agent_nodes} batch nodes (node-limit; "
            "maxMovesPerSync 0 freezes it after the first evaluation)",
            _yaml(static),
            _yaml({"shards": {"maxMovesPerSync": 0}}),
        ),
        VOLCANO: Policy(
            VOLCANO,
            "Volcano's example ConfigMap as shipped (agent: nodes at 70-100 % CPU requested, warmup first, "
            "1-100 nodes; batch: 0-69 %, 1-100 nodes; legacy fields), shardSyncPeriod 60s compressed; "
            "our default hysteresis",
            _yaml(example),
        ),
        TUNED: Policy(
            TUNED,
            f"agent: nodes at 0-{1.0 if spec.tuned_reclaim else spec.tuned_agent_max_util:.0%} CPU requested, "
            f"busiest first, as many as {spec.tuned_free_cpu:g} cores of free CPU need (free-capacity"
            f"{', reclaim: batch pods count as capacity that comes back' if spec.tuned_reclaim else ''}); "
            f"batch: the rest. Nodes the agents left idle go to batch, which fills them. Sync every {spec.tuned_sync_s:g} simulated s, band "
            f"hysteresis {spec.tuned_band_hysteresis:g}, rank hysteresis {spec.tuned_rank_hysteresis:g}, at "
            f"most {spec.tuned_max_moves} moves per sync{residence}",
            _yaml(tuned),
            _yaml(tuned_settings),
        ),
        SCHEDULED: Policy(
            SCHEDULED,
            f"the tuned policy (same sync and hysteresis{residence}) with its agent target switched by "
            f"the run, as an operator's scheduled ConfigMap edit would: {levels} "
            f"from {spec.scheduled_lead_s:g} simulated s before each wave until {spec.scheduled_hold_s:g} s after "
            f"its burst ends, {quiet}",
            _yaml(scheduled_sharding(spec, True, agent=agent, batch=batch)),
            _yaml(tuned_settings),
        ),
    }


# --- observing the cluster -------------------------------------------------------------------------------------


@dataclass(slots=True)
class PodRecord:
    namespace: str
    name: str
    kind: str
    cpu: int
    mem_mib: int
    node: str = ""
    bind_rv: int = 0
    bound_at: float | None = None
    running_at: float | None = None
    done: bool = False


def _rv(obj: dict[str, Any]) -> int:
    return int((obj.get("metadata") or {}).get("resourceVersion") or 0)


class PodTracker:
    """Watch handler of the share pods (all namespaces, by the run label): bindings, phases, requests per node."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], PodRecord] = {}
        self.per_node: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # live requests: milli CPU, MiB
        self.double_binds: list[str] = []
        self.created_at: dict[tuple[str, str], float] = {}

    def _counted(self, rec: PodRecord) -> bool:
        return bool(rec.node) and not rec.done

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        rec = self.pods.get(key)
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        if rec is None:
            requests = Resources()
            for container in spec.get("containers") or ():
                requests.add(resources_from_list((container.get("resources") or {}).get("requests") or {}))
            kind_label = (meta.get("labels") or {}).get("app") == "batch"
            rec = PodRecord(
                key[0], key[1], "batch" if kind_label else "agent", requests.milli_cpu, requests.memory >> 20
            )
            self.pods[key] = rec
        was = self._counted(rec)
        now = time.monotonic()
        node = spec.get("nodeName") or ""
        if node and not rec.node:
            rec.node, rec.bind_rv, rec.bound_at = node, _rv(obj), now
        elif node and node != rec.node:
            self.double_binds.append(f"{key}: {rec.node} then {node}")
        phase = status.get("phase")
        if phase == "Running" and rec.running_at is None:
            rec.running_at = now
        if kind == "DELETED" or phase in ("Succeeded", "Failed"):
            rec.done = True
        now_counted = self._counted(rec)
        if was != now_counted:
            sign = 1 if now_counted else -1
            slot = self.per_node[rec.node]
            slot[0] += sign * rec.cpu
            slot[1] += sign * rec.mem_mib

    def bound(self, namespace: str, name: str) -> bool:
        rec = self.pods.get((namespace, name))
        return rec is not None and bool(rec.node)


@dataclass(slots=True)
class ShardEvent:
    at: float
    rv: int
    shard: str
    desired: frozenset[str]
    in_use: frozenset[str]


class ShardTracker:
    """Watch handler of NodeShards: every version seen, in order."""

    def __init__(self) -> None:
        self.events: list[ShardEvent] = []
        self.latest: dict[str, ShardEvent] = {}

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            return
        shard = parse_nodeshard(obj)
        event = ShardEvent(
            time.monotonic(),
            _rv(obj),
            shard.name,
            frozenset(shard.nodes_desired),
            frozenset(shard.nodes_in_use),
        )
        self.events.append(event)
        self.latest[shard.name] = event


async def follow(kube: KubeClient, path: str, handler: Any, params: dict[str, str] | None = None) -> None:
    """List then watch ``path`` into ``handler.apply`` until cancelled (relists when history is gone)."""
    while True:
        listed = await kube.get(path, params)
        for obj in listed.get("items") or ():
            handler.apply("ADDED", obj)
        version = str(listed["metadata"]["resourceVersion"])
        try:
            while True:
                async for kind, obj in kube.watch(path, resource_version=version, params=params):
                    if kind == "BOOKMARK":
                        version = str(_rv(obj)) or version
                        continue
                    handler.apply(kind, obj)
                    version = str(_rv(obj))
        except Gone:
            continue


# --- one configuration's installation ----------------------------------------------------------------------------


@dataclass(slots=True)
class Install:
    policy: Policy
    index: int
    nodes: list[str]
    cpu: int = 4  # per node
    children: list[ProcessRecord] = field(default_factory=list)
    batch: BatchSide | None = None

    @property
    def milli_cpu(self) -> int:
        return self.cpu * 1000

    @property
    def mem_mib(self) -> int:
        return self.cpu * GI_PER_CPU * 1024

    @property
    def tag(self) -> str:
        return f"share-{self.policy.name}"

    @property
    def namespace(self) -> str:
        return self.tag

    @property
    def scheduler(self) -> str:
        return f"{self.tag}-agent"

    @property
    def batch_shard(self) -> str:
        return f"{self.tag}-batch"


def share_node(install: int, i: int, cpu: int) -> dict[str, Any]:
    """Node ``i`` of configuration ``install``: one shape for all (``cpu`` CPUs, 4Gi each), own label and taint."""
    node = make_node(install * 1000 + i, prefix="share", prepulled=1.0)
    name = f"share-{install}-{i:03d}"
    node["metadata"]["name"] = name
    labels = node["metadata"]["labels"]
    labels["kubernetes.io/hostname"] = name
    labels.pop("node.volcano.sh/warmup", None)  # no warm nodes: identical nodes in every configuration
    labels.pop("node-pool", None)
    labels[POOL_LABEL] = str(install)
    node["spec"]["taints"] = [{"key": POOL_LABEL, "value": str(install), "effect": "NoSchedule"}]
    for key in ("capacity", "allocatable"):
        node["status"][key] = {
            "cpu": str(cpu),
            "memory": f"{cpu * GI_PER_CPU}Gi",
            "pods": "110",
            "ephemeral-storage": "500Gi",
        }
    return node


def tolerate(pod: dict[str, Any], install: int) -> dict[str, Any]:
    pod["spec"].setdefault("tolerations", []).append(
        {"key": POOL_LABEL, "operator": "Equal", "value": str(install), "effect": "NoSchedule"}
    )
    pod["spec"].pop("nodeSelector", None)
    return pod


async def ensure_crd(kube: KubeClient) -> None:
    """Apply the NodeShard CRD and wait until its collection is served."""
    crd = yaml.safe_load(CRD_MANIFEST.read_text())
    with contextlib.suppress(Conflict):
        await kube.post(CRD_PATH, crd)
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        try:
            await kube.get(bodies.COLLECTION_PATH)
            return
        except (NotFound, TooManyRequests):
            await asyncio.sleep(0.5)
    raise TimeoutError("NodeShard CRD not served")


def launch(install: Install, cluster: Cluster, logs: Path) -> None:
    etcd = cluster.etcd_endpoint.removeprefix("http://")
    ports = free_ports(2)
    common = [
        f"--kubeconfig={cluster.kubeconfig}",
        f"--etcd-endpoints={etcd}",
        f"--etcd-prefix=/bench-{install.tag}",
        "--lease-ttl=5",
        f"--scheduler-name={install.scheduler}",
    ]
    install.children.append(
        start(
            f"{install.tag}-worker",
            python_module(
                "agent_scheduler.cli",
                "worker",
                *common,
                f"--id={install.tag}-w1",
                f"--metrics-address={LOOPBACK}:{ports[0]}",
            ),
            logs / f"{install.tag}-worker.log",
        )
    )
    install.children.append(
        start(
            f"{install.tag}-coordinator",
            python_module(
                "agent_scheduler.cli",
                "coordinator",
                *common,
                f"--id={install.tag}-coordinator",
                "--policy-configmap=sharding",
                f"--policy-namespace={install.namespace}",
                f"--agent-node-selector={POOL_LABEL}={install.index}",
                f"--metrics-address={LOOPBACK}:{ports[1]}",
            ),
            logs / f"{install.tag}-coordinator.log",
        )
    )


# --- the run -----------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Sample:
    t: float  # real seconds since the start of the waves
    cpu: float
    mem: float
    agent_nodes: int
    batch_nodes: int
    agent_free_block: int  # milli CPU: the largest free CPU on one node of the pool
    batch_free_block: int
    agent_pending: int


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _sample(install: Install, pods: PodTracker, shards: ShardTracker, t: float) -> Sample:
    per_node = pods.per_node
    cpu = sum(per_node[n][0] for n in install.nodes) / (len(install.nodes) * install.milli_cpu)
    mem = sum(per_node[n][1] for n in install.nodes) / (len(install.nodes) * install.mem_mib)
    agent = shards.latest.get(install.scheduler)
    batch = shards.latest.get(install.batch_shard)
    agent_nodes = agent.desired if agent else frozenset()
    batch_nodes = batch.desired if batch else frozenset()

    def block(nodes: frozenset[str]) -> int:
        return max((install.milli_cpu - per_node[n][0] for n in nodes), default=0)

    pending = sum(
        1 for r in pods.pods.values() if r.namespace == install.namespace and r.kind == "agent" and not r.node
    )
    return Sample(
        t, cpu, mem, len(agent_nodes), len(batch_nodes), block(agent_nodes), block(batch_nodes), pending
    )


def _owner_timeline(install: Install, shards: ShardTracker) -> list[tuple[float, str, str, str]]:
    """(time, node, from, to) each time a node's desired owner changes between the two shards."""
    owner: dict[str, str] = {}
    current: dict[str, frozenset[str]] = {}
    moves = []
    for event in shards.events:
        if event.shard not in (install.scheduler, install.batch_shard):
            continue
        current[event.shard] = event.desired
        side = "agent" if event.shard == install.scheduler else "batch"
        for node in event.desired:
            before = owner.get(node)
            if before != side:
                if before is not None:
                    moves.append((event.at, node, before, side))
                owner[node] = side
    return moves


def _handoffs(
    install: Install, shards: ShardTracker, moves: list[tuple[float, str, str, str]]
) -> list[float]:
    """Real seconds from a move (node entering a shard's nodesDesired) to its publication in that shard's
    nodesInUse; moves never published before the end are left out (counted in ``unfinished_handoffs``)."""
    by_shard: dict[str, list[ShardEvent]] = defaultdict(list)
    for event in shards.events:
        by_shard[event.shard].append(event)
    out = []
    for at, node, _, side in moves:
        shard = install.scheduler if side == "agent" else install.batch_shard
        done = next((e.at for e in by_shard[shard] if e.at >= at and node in e.in_use), None)
        if done is not None:
            out.append(done - at)
    return out


def _in_both(install: Install, shards: ShardTracker, field: Literal["desired", "in_use"]) -> int:
    """Shard versions after which a node was listed in both NodeShards' ``field`` (``desired``: spec
    ``nodesDesired``; ``in_use``: status ``nodesInUse``). Both are reported, not violations:
    - ``desired``: the coordinator writes the two specs one after the other, so a moving node is briefly in both;
    - ``in_use``: claim-then-confirm allows it for a moment (both claim, then one sees the other's claim and keeps
      off).
    What must never happen, a pod binding on a node its side did not hold alone, is audited in ``_violations``."""
    listed: dict[str, frozenset[str]] = {}
    count = 0
    for event in sorted(shards.events, key=lambda e: e.rv):
        if event.shard in (install.scheduler, install.batch_shard):
            listed[event.shard] = getattr(event, field)
            if listed.get(install.scheduler, frozenset()) & listed.get(install.batch_shard, frozenset()):
                count += 1
    return count


def _violations(install: Install, pods: PodTracker, shards: ShardTracker) -> list[str]:
    problems = [d for d in pods.double_binds if d.startswith(f"('{install.namespace}'")]
    history: dict[str, tuple[list[int], list[ShardEvent]]] = {}
    for shard in (install.scheduler, install.batch_shard):
        events = sorted((e for e in shards.events if e.shard == shard), key=lambda e: e.rv)
        history[shard] = ([e.rv for e in events], events)

    def published(shard: str, rv: int) -> frozenset[str]:
        rvs, events = history[shard]
        i = bisect.bisect_left(rvs, rv) - 1
        return events[i].in_use if i >= 0 else frozenset()

    releases = install.batch.releases if install.batch else {}
    for rec in pods.pods.values():
        if rec.namespace != install.namespace or not rec.node:
            continue
        if rec.node not in install.nodes:
            problems.append(f"{rec.name} bound on {rec.node}, not a node of this configuration")
            continue
        own, other = (
            (install.scheduler, install.batch_shard)
            if rec.kind == "agent"
            else (install.batch_shard, install.scheduler)
        )
        if rec.node not in published(own, rec.bind_rv):
            problems.append(f"{rec.kind} pod {rec.name} bound on {rec.node} outside its shard's nodesInUse")
        if rec.node in published(other, rec.bind_rv):
            problems.append(
                f"{rec.kind} pod {rec.name} bound on {rec.node} while the other shard published it"
            )
        release = releases.get(rec.name)
        if rec.kind == "batch" and (release is None or rec.node not in release.nodes):
            problems.append(f"batch pod {rec.name} bound on {rec.node} outside its release")
    return problems[:50]


def summarize(
    install: Install,
    spec: ShareSpec,
    pods: PodTracker,
    shards: ShardTracker,
    samples: list[Sample],
    *,
    t0: float,
    batch_t0: float,
    t_end: float,
    wave_end: float,
) -> dict[str, Any]:
    """The configuration's numbers (see the module docstring); times in simulated seconds."""
    c = spec.compression
    during = [s for s in samples if s.t <= wave_end - t0]
    agents = [r for r in pods.pods.values() if r.namespace == install.namespace and r.kind == "agent"]
    created = pods.created_at
    bound = [r.bound_at - created[(r.namespace, r.name)] for r in agents if r.bound_at is not None]
    running = [
        r.running_at - created[(r.namespace, r.name)]
        for r in agents
        if r.running_at is not None and (r.namespace, r.name) in created
    ]
    batch = install.batch
    assert batch is not None
    started: dict[int, float] = {}
    release_bound = []
    for name, release in batch.releases.items():
        rec = pods.pods.get((install.namespace, name))
        if rec is not None and rec.bound_at is not None and not release.withdrawn:
            started[release.queued] = (rec.bound_at - batch_t0) * c
            release_bound.append(rec.bound_at - release.released_at)
    backlog = spec.batch_backlog
    censored = [started.get(i, (t_end - batch_t0) * c) for i in range(backlog)]
    moves = _owner_timeline(install, shards)
    handoffs = _handoffs(install, shards, moves)
    wave_s = spec.real(spec.wave_period_s)
    per_node_wave: dict[tuple[str, int], int] = defaultdict(int)
    last_move: dict[str, float] = {}
    gaps: list[float] = []
    for at, node, _, _ in moves:
        per_node_wave[(node, int(max(0.0, at - t0) // wave_s))] += 1
        if node in last_move:
            gaps.append((at - last_move[node]) * c)
        last_move[node] = at
    minutes = (wave_end - t0) * c / 60
    return {
        "config": install.policy.name,
        "description": install.policy.description,
        "nodes": len(install.nodes),
        "cpu_alloc_mean": statistics.fmean(s.cpu for s in during) if during else None,
        "cpu_alloc_p10": _pct([s.cpu for s in during], 0.10),
        "mem_alloc_mean": statistics.fmean(s.mem for s in during) if during else None,
        "mem_alloc_p10": _pct([s.mem for s in during], 0.10),
        "agent_pods": len(agents),
        "agent_unbound": sum(1 for r in agents if r.bound_at is None),
        "agent_bound_p50_real_s": _pct(bound, 0.5),
        "agent_bound_p99_real_s": _pct(bound, 0.99),
        "agent_running_p50_real_s": _pct(running, 0.5),
        "agent_running_p99_real_s": _pct(running, 0.99),
        "batch_started": len(started),
        "batch_withdrawn": batch.withdrawn,
        "batch_wait_p50_s": _pct(list(started.values()), 0.5),
        "batch_wait_censored_mean_s": statistics.fmean(censored) if censored else None,
        "batch_release_bound_p99_real_s": _pct(release_bound, 0.99),
        "moves": len(moves),
        "moves_per_min": len(moves) / minutes if minutes > 0 else None,
        "max_moves_node_wave": max(per_node_wave.values(), default=0),
        "min_move_gap_s": min(gaps, default=None),
        "handoff_p50_real_s": _pct(handoffs, 0.5),
        "handoff_max_real_s": max(handoffs, default=None),
        "unfinished_handoffs": len(moves) - len(handoffs),
        "agent_free_block_mean_cpu": statistics.fmean(s.agent_free_block for s in during) / 1000
        if during
        else None,
        "batch_free_block_mean_cpu": statistics.fmean(s.batch_free_block for s in during) / 1000
        if during
        else None,
        "violations": _violations(install, pods, shards),
        "dual_desired_versions": _in_both(install, shards, "desired"),
        "dual_in_use_versions": _in_both(install, shards, "in_use"),
        "batch_errors": batch.errors[:10],
        "samples": [asdict(s) for s in samples],
        "move_times_s": [((at - t0) * c, node, src, dst) for at, node, src, dst in moves],
        "bound_real_s": sorted(bound),
        "running_real_s": sorted(running),
    }


async def _create(kube: KubeClient, pod: dict[str, Any], pods: PodTracker, gate: asyncio.Semaphore) -> None:
    ns = pod["metadata"]["namespace"]
    async with gate:
        pods.created_at[(ns, pod["metadata"]["name"])] = time.monotonic()
        await kube.post(f"/api/v1/namespaces/{ns}/pods", pod)


async def _wait_ready(kube: KubeClient, installs: list[Install], shards: ShardTracker) -> None:
    """Each configuration's coordinator wrote both NodeShards covering all its nodes, and published its status."""
    deadline = time.monotonic() + READY_S
    while True:
        dead = [f"{c.name}: {tail(c.log, 8)}" for i in installs for c in i.children if not is_running(c)]
        if dead:
            raise RuntimeError("; ".join(dead))
        ready = 0
        for install in installs:
            agent, batch = shards.latest.get(install.scheduler), shards.latest.get(install.batch_shard)
            shard = await _get_raw(kube, install.scheduler)
            published = bool(((shard or {}).get("status") or {}).get("lastUpdateTime"))
            if agent and batch and published and (agent.desired | batch.desired) == set(install.nodes):
                ready += 1
            elif agent and batch and published and install.policy.name == VOLCANO:
                ready += (
                    1  # Volcano's example gives nodes only by utilisation bands: some may stay unassigned
                )
        if ready == len(installs):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {ready} of {len(installs)} configurations ready")
        await asyncio.sleep(0.5)


async def _schedule_targets(
    kube: KubeClient, install: Install, spec: ShareSpec, t0: float, stop: asyncio.Event
) -> None:
    """The scheduled configuration's ConfigMap edits (``scale.bench.share.scheduled_levels``) at their times;
    each is a new policy version, which the coordinator evaluates at once."""
    path = f"/api/v1/namespaces/{install.namespace}/configmaps/sharding"
    for at, high in scheduled_levels(spec):
        delay = t0 + at - time.monotonic()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
        if stop.is_set():
            return
        doc = scheduled_sharding(spec, high, agent=install.scheduler, batch=install.batch_shard)
        await kube.patch(path, {"data": {"sharding.yaml": _yaml(doc)}})
        log.info(
            "%s: %s target at %.0f simulated s",
            install.tag,
            "high" if high else "low",
            (time.monotonic() - t0) * spec.compression,
        )


async def _get_raw(kube: KubeClient, name: str) -> dict[str, Any] | None:
    try:
        obj: dict[str, Any] = await kube.get(bodies.object_path(name))
        return obj
    except NotFound:
        return None


async def run_share(
    cluster: Cluster,
    kube: KubeClient,
    spec: ShareSpec,
    *,
    nodes: int,
    agent_nodes: int,
    configs: tuple[str, ...],
    logs: Path,
) -> dict[str, Any]:
    """Run every configuration of ``configs`` side by side on ``cluster``; returns the results document."""
    await ensure_crd(kube)
    installs: list[Install] = []
    for index, name in enumerate(configs):
        install = Install(
            Policy(name, "", ""), index, [f"share-{index}-{i:03d}" for i in range(nodes)], spec.node_cpu
        )
        install.policy = policies(
            spec, nodes=nodes, agent_nodes=agent_nodes, agent=install.scheduler, batch=install.batch_shard
        )[name]
        installs.append(install)
    await create_nodes(kube, [share_node(i.index, n, spec.node_cpu) for i in installs for n in range(nodes)])
    for install in installs:
        await kube.post(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": install.namespace}},
        )
        data = {"sharding.yaml": install.policy.sharding}
        if install.policy.settings:
            data["agent-scheduler.yaml"] = install.policy.settings
        await kube.post(
            f"/api/v1/namespaces/{install.namespace}/configmaps",
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "sharding"}, "data": data},
        )
    pods, shards = PodTracker(), ShardTracker()
    tasks = [
        asyncio.create_task(follow(kube, "/api/v1/pods", pods, {"labelSelector": f"{RUN_LABEL}={SHARE}"})),
        asyncio.create_task(follow(kube, bodies.COLLECTION_PATH, shards)),
    ]
    stop = asyncio.Event()
    try:
        for install in installs:
            launch(install, cluster, logs)
        await _wait_ready(kube, installs, shards)
        plans = {
            i.index: share_plan(spec, namespace=i.namespace, scheduler_name=i.scheduler) for i in installs
        }
        for install in installs:
            ns = install.namespace
            queue = deque(
                (k, tolerate(a.pod, install.index)) for k, a in enumerate(plans[install.index].batch_backlog)
            )
            for _, pod in queue:
                pod["metadata"]["namespace"] = ns
            install.batch = BatchSide(
                kube,
                ns,
                install.batch_shard,
                install.scheduler,
                queue,
                free=lambda n, i=install: (  # type: ignore[misc]
                    i.milli_cpu - pods.per_node[n][0],
                    i.mem_mib - pods.per_node[n][1],
                ),
                bound=lambda name, ns=ns: pods.bound(ns, name),  # type: ignore[misc]
            )
        # The backlog stands before the first wave: the batch sides start WARMUP_S (simulated) earlier.
        batch_t0 = time.monotonic()
        side_tasks = [asyncio.create_task(i.batch.run(stop)) for i in installs if i.batch is not None]
        await asyncio.sleep(spec.real(WARMUP_S))
        t0 = time.monotonic()
        samples: dict[int, list[Sample]] = {i.index: [] for i in installs}

        async def sampler() -> None:
            while not stop.is_set():
                t = time.monotonic() - t0
                for install in installs:
                    samples[install.index].append(_sample(install, pods, shards, t))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), SAMPLE_S)

        side_tasks.append(asyncio.create_task(sampler()))
        for install in installs:
            if install.policy.name == SCHEDULED:
                side_tasks.append(asyncio.create_task(_schedule_targets(kube, install, spec, t0, stop)))
        gate = asyncio.Semaphore(CREATE_CONCURRENCY)
        creates: list[asyncio.Task[None]] = []
        arrivals = [
            [tolerate(a.pod, i.index) for i in installs for a in [plans[i.index].agents[k]]]
            for k in range(len(plans[installs[0].index].agents))
        ]
        times = [a.at for a in plans[installs[0].index].agents]
        for at, group in zip(times, arrivals, strict=True):
            delay = t0 + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            for pod in group:
                creates.append(asyncio.create_task(_create(kube, pod, pods, gate)))
        wave_end = t0 + spec.real(spec.simulated_s)
        await asyncio.sleep(max(0.0, wave_end - time.monotonic()))
        await asyncio.gather(*creates)
        drain_until = time.monotonic() + DRAIN_S
        while time.monotonic() < drain_until:
            waiting = [r for r in pods.pods.values() if r.kind == "agent" and not r.node]
            if not waiting and len(pods.created_at) <= sum(
                1 for r in pods.pods.values() if r.kind == "agent"
            ):
                break
            await asyncio.sleep(0.5)
        t_end = time.monotonic()
        stop.set()
        await asyncio.gather(*side_tasks)
        await asyncio.sleep(1.0)  # let the watches catch up with the last bindings
        configs_out = [
            summarize(
                install,
                spec,
                pods,
                shards,
                samples[install.index],
                t0=t0,
                batch_t0=batch_t0,
                t_end=t_end,
                wave_end=wave_end,
            )
            for install in installs
        ]
        for install, out in zip(installs, configs_out, strict=True):
            out["sharding_yaml"] = install.policy.sharding
            out["settings_yaml"] = install.policy.settings
        demand = agent_demand(spec)
        return {
            "spec": asdict(spec),
            "nodes_per_config": nodes,
            "node_shape": f"{spec.node_cpu} CPU / {spec.node_cpu * GI_PER_CPU}Gi",
            "agent_nodes_static": agent_nodes,
            "agent_demand": {"peak_cpu": max(demand, default=0.0), "mean_cpu": statistics.fmean(demand)},
            "real_seconds": t_end - t0,
            "configs": configs_out,
        }
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for install in installs:
            problems = stop_children(install.children)
            if problems:
                log.warning("%s: %s", install.tag, "; ".join(problems))


async def run_command(
    spec: ShareSpec,
    *,
    nodes: int,
    agent_nodes: int,
    configs: tuple[str, ...],
    out: Path,
    work_dir: Path | None,
) -> dict[str, Any]:
    """A fresh cluster and the run (process logs in ``out/logs``, which must exist); the cluster is removed."""
    logs = out / "logs"
    cluster_dir = Path(tempfile.mkdtemp(prefix="bench-share-", dir=work_dir))
    options = ClusterOptions(scheduler_qps=5000.0, scheduler_burst=5000, kwok_pod_parallelism=64)
    cluster = await start_cluster_async(
        cluster_dir,
        nodes=0,
        with_kube_scheduler=True,
        with_controller_manager=False,
        options=options,
        force=True,
    )
    try:
        await asyncio.to_thread(stages.install, cluster)
        async with cluster.client(qps=50000, burst=50000, max_connections=256) as kube:
            result = await run_share(
                cluster, kube, spec, nodes=nodes, agent_nodes=agent_nodes, configs=configs, logs=logs
            )
    finally:
        await asyncio.to_thread(cluster.stop)
        await asyncio.to_thread(shutil.rmtree, cluster_dir, True)
    return result


def main(args: Any) -> int:
    """``bench share`` (arguments from ``scale.bench.command``); 1 when an invariant was broken."""
    import shlex
    import sys

    spec = ShareSpec(
        simulated_s=args.simulated,
        compression=args.compression,
        wave_rate=args.wave_rate,
        wave_period_s=args.wave_period,
        wave_burst_s=args.wave_burst,
        lifetime_min_s=args.lifetime_min,
        lifetime_max_s=args.lifetime_max,
        batch_backlog=args.backlog,
        batch_runtime_s=args.batch_runtime,
        seed=args.seed,
        tuned_agent_max_util=args.tuned_max_util,
        tuned_sync_s=args.tuned_sync,
        tuned_band_hysteresis=args.tuned_band_hysteresis,
        tuned_rank_hysteresis=args.tuned_rank_hysteresis,
        tuned_free_cpu=args.tuned_free_cpu,
        tuned_max_moves=args.tuned_max_moves,
        tuned_reclaim=args.tuned_reclaim,
        scheduled_free_cpu_low=args.scheduled_free_cpu_low,
        scheduled_free_cpu_high=args.scheduled_free_cpu_high,
        scheduled_lead_s=args.scheduled_lead,
        scheduled_hold_s=args.scheduled_hold,
        scheduled_nodes_high=args.scheduled_nodes_high,
        scheduled_nodes_low=args.scheduled_nodes_low,
        tuned_residence_s=args.tuned_residence,
        tuned_batch_residence_s=args.tuned_batch_residence,
        node_cpu=args.node_cpu,
    )
    configs = tuple(args.configs or CONFIGS)
    unknown = [c for c in configs if c not in KNOWN]
    if unknown:
        print(f"unknown configuration(s) {', '.join(unknown)}; known: {', '.join(KNOWN)}")
        return 2
    out = (args.out or Path("results") / f"share-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    result = asyncio.run(
        run_command(
            spec, nodes=args.nodes, agent_nodes=args.agent_nodes, configs=configs, out=out, work_dir=None
        )
    )
    from scale.bench import share_report
    from scale.bench.footprint import _commit

    result["commit"] = _commit()
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    command = "agent-scheduler " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    share_report.write(out, result, command)
    print(share_report.table(result))
    print(f"\nresults in {out}/results.json, report in {out}/report.md")
    return 1 if any(c["violations"] for c in result["configs"]) else 0
