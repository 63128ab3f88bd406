"""Helpers for the shard-policy integration tests: a per-test rig (coordinator and workers by PID, a set of managed
nodes, the sharding ConfigMap), a batch-scheduler stand-in speaking the NodeShard protocol, and a recorder that
puts NodeShard statuses and pod bindings on one timeline.

Isolation: each rig has its own scheduler name, etcd prefix and namespace, and manages only nodes it labelled with a
label of its own (``--agent-node-selector``), so the policy never sees nodes other tests use. NodeShards are
cluster-scoped: a rig deletes the ones its policy names, before and after the test.

The timeline is ordered by resourceVersion. On this cluster every object lives in one etcd, so resourceVersions of
different kinds are revisions of one store and compare as integers (an implementation detail of the API server,
relied on here only to audit, never by the product).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from etcd3aio import Etcd3Client

from common.etcd.keys import KeyFamily, KeyLayout
from common.etcd.kv import DEFAULT_TIMEOUT, EVENT_DELETE, get_prefix, kv_service, watch
from common.etcd.schema import ShardAssignment
from common.kube import Conflict, Gone, KubeClient, NotFound, TooManyRequests
from coordinator.nodeshards import bodies
from coordinator.nodeshards.bodies import NodeShard, parse_nodeshard
from coordinator.status import collect
from scale.bench.schedulers import agent_rules
from scale.bench.share_batch import claim_and_confirm, get_shard
from scale.cluster import Cluster
from tests.integration.support import SchedulerProcess

ROOT = Path(__file__).resolve().parents[2]
CRD_MANIFEST = ROOT / "manifests" / "crds" / "nodeshards.shard.volcano.sh.yaml"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
TTL = 3
POLL = 0.2


async def eventually(check: Callable[[], Awaitable[Any]], timeout: float, what: str) -> Any:
    """Poll ``check`` until it returns something truthy; fail with ``what`` after ``timeout`` (a hang guard)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = await check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what} (last: {last!r})")
        await asyncio.sleep(POLL)


async def ensure_crd(kube: KubeClient) -> None:
    """Apply the NodeShard CRD from manifests/ through the API and wait until it is Established."""
    crd = yaml.safe_load(CRD_MANIFEST.read_text())
    with contextlib.suppress(Conflict):
        await kube.post(CRD_PATH, crd)

    async def established() -> bool:
        obj = await kube.get(f"{CRD_PATH}/{crd['metadata']['name']}")
        conds = (obj.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conds)

    await eventually(established, 30, "NodeShard CRD established")
    await eventually(lambda: _served(kube), 30, "NodeShard collection served")


async def _served(kube: KubeClient) -> bool:
    try:
        await kube.get(bodies.COLLECTION_PATH)
    except (NotFound, TooManyRequests):  # 429 "storage is (re)initializing" right after the CRD is created
        return False
    return True


async def delete_shard(kube: KubeClient, name: str) -> None:
    with contextlib.suppress(NotFound):
        await kube.delete(bodies.object_path(name))


def rv(obj: dict[str, Any]) -> int:
    return int((obj.get("metadata") or {}).get("resourceVersion") or 0)


@dataclass
class Rig:
    """One test's scheduler installation and its managed nodes."""

    cluster: Cluster
    kube: KubeClient
    namespace: str
    tmp: Path
    suffix: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    nodes: list[str] = field(default_factory=list)
    procs: dict[str, SchedulerProcess] = field(default_factory=dict)
    shard_names: set[str] = field(default_factory=set)
    configmap: str = "sharding"
    kubeconfig: Path | None = None  # default: the cluster's admin kubeconfig

    @property
    def scheduler_name(self) -> str:
        return f"agent-pol-{self.suffix}"

    @property
    def batch_name(self) -> str:
        return f"batch-pol-{self.suffix}"

    @property
    def prefix(self) -> str:
        return f"/policy-{self.suffix}"

    @property
    def managed_label(self) -> str:
        return f"e2e.agent-scheduler.io/policy-{self.suffix}"

    @property
    def warm_label(self) -> str:
        return f"e2e.agent-scheduler.io/warm-{self.suffix}"

    @property
    def etcd(self) -> str:
        return self.cluster.etcd_endpoint.removeprefix("http://")

    async def manage(self, count: int) -> list[str]:
        """Label ``count`` untainted nodes that run no pod as this rig's nodes (sorted by name)."""
        busy = {
            p["spec"]["nodeName"]
            for p in (await self.kube.get("/api/v1/pods", {"fieldSelector": "spec.nodeName!="}))["items"]
        }
        free = sorted(
            n["metadata"]["name"]
            for n in (await self.kube.get("/api/v1/nodes"))["items"]
            if not (n.get("spec") or {}).get("taints") and n["metadata"]["name"] not in busy
        )
        assert len(free) >= count, f"only {len(free)} free untainted nodes"
        self.nodes = sorted(free[-count:])
        for name in self.nodes:
            await self.label(name, self.managed_label, "true")
        return self.nodes

    async def label(self, node: str, key: str, value: str | None) -> None:
        await self.kube.patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {key: value}}})

    def _common(self) -> list[str]:
        return [
            f"--kubeconfig={self.kubeconfig or self.cluster.kubeconfig}",
            f"--etcd-endpoints={self.etcd}",
            f"--etcd-prefix={self.prefix}",
            f"--lease-ttl={TTL}",
            f"--scheduler-name={self.scheduler_name}",
        ]

    def coordinator(self, name: str = "coordinator", *, policy_flags: bool = True) -> SchedulerProcess:
        """A coordinator managing this rig's nodes; with ``policy_flags`` it watches this rig's ConfigMap,
        without them the default one (``volcano-system/volcano-sharding-configmap``, absent here)."""
        flags = [f"--policy-configmap={self.configmap}", f"--policy-namespace={self.namespace}"]
        args = [
            "--log-level=INFO",
            "coordinator",
            *self._common(),
            f"--id={name}",
            *(flags if policy_flags else []),
            f"--agent-node-selector={self.managed_label}=true",
        ]
        proc = SchedulerProcess(args, self.tmp / f"{name}.log")
        self.procs[name] = proc
        return proc

    def worker(self, name: str) -> SchedulerProcess:
        proc = SchedulerProcess(
            ["--log-level=INFO", "worker", *self._common(), f"--id={name}"], self.tmp / f"{name}.log"
        )
        self.procs[name] = proc
        return proc

    async def put_configmap(self, data: dict[str, str]) -> int:
        """Create or replace the sharding ConfigMap's data; returns the new resourceVersion."""
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": self.configmap}, "data": data}
        path = f"/api/v1/namespaces/{self.namespace}/configmaps"
        try:
            return rv(await self.kube.post(path, body))
        except Conflict:
            return rv(await self.kube.put(f"{path}/{self.configmap}", body))

    async def delete_configmap(self) -> None:
        await self.kube.delete(f"/api/v1/namespaces/{self.namespace}/configmaps/{self.configmap}")

    async def shard(self, name: str) -> NodeShard | None:
        return await get_shard(self.kube, name)

    async def record(self) -> dict[str, Any]:
        """The policy record ``agent-scheduler status`` shows ({} until published)."""
        status = await collect([self.etcd], self.prefix)
        return dict(status.get("policy") or {})

    async def status(self) -> dict[str, Any]:
        return await collect([self.etcd], self.prefix)

    async def events(self, reason: str) -> list[dict[str, Any]]:
        items = (await self.kube.get(f"/api/v1/namespaces/{self.namespace}/events"))["items"]
        return [e for e in items if e.get("reason") == reason]

    async def forget_shards(self, names: set[str]) -> None:
        self.shard_names |= names
        for name in names:
            await delete_shard(self.kube, name)

    async def close(self) -> list[str]:
        """Stop every process (by PID), unlabel the nodes, delete the NodeShards. Returns failing process tails."""
        failures = []
        for name, proc in self.procs.items():
            code = proc.stop()
            if code != 0:
                failures.append(f"{name} exited {code}:\n{proc.tail()}")
        for node in self.nodes:
            with contextlib.suppress(NotFound):
                await self.kube.patch(
                    f"/api/v1/nodes/{node}",
                    {"metadata": {"labels": {self.managed_label: None, self.warm_label: None}}},
                )
        for name in self.shard_names:
            await delete_shard(self.kube, name)
        return failures


async def service_account_kubeconfig(
    kube: KubeClient, cluster: Cluster, namespace: str, path: Path, *, configmap: str
) -> list[str]:
    """Create a service account ``agent-scheduler`` in ``namespace`` holding the rules of both roles from
    manifests/rbac.yaml (the chart's RBAC; the policy ConfigMap's rule names ``configmap``), and write a
    kubeconfig authenticating as that account. Returns the cluster-scoped object paths to delete."""
    docs = [d for d in yaml.safe_load_all((ROOT / "manifests" / "rbac.yaml").read_text()) if d]
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "agent-scheduler"}}
    await kube.post(f"/api/v1/namespaces/{namespace}/serviceaccounts", account)
    name = f"{namespace}-rbac"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": agent_rules(docs, configmap=configmap),
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "agent-scheduler", "namespace": namespace}],
    }
    created = []
    for collection, body in (
        ("/apis/rbac.authorization.k8s.io/v1/clusterroles", role),
        ("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding),
    ):
        await kube.post(collection, body)
        created.append(f"{collection}/{name}")
    token = await kube.post(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/agent-scheduler/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        },
    )
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {"server": cluster.server, "certificate-authority": str(cluster.ca_file)},
            }
        ],
        "users": [{"name": "agent-scheduler", "user": {"token": token["status"]["token"]}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": "agent-scheduler"}}],
        "current-context": "sa",
    }
    await asyncio.to_thread(path.write_text, yaml.safe_dump(config))
    return created


def small_pod(
    name: str, *, scheduler: str, node_names: list[str] | None = None, kind: str, cpu: str = "100m"
) -> dict[str, Any]:
    """A pod requesting ``cpu``; ``node_names`` restricts it (required node affinity on metadata.name)."""
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "c",
                "image": "registry.local/x:1",
                "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}},
            }
        ],
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
        ],
    }
    if node_names is not None:
        # matchFields takes exactly one value per requirement: one term per node (terms are ORed)
        terms = [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            for node in sorted(node_names)
        ]
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"e2e-kind": kind}},
        "spec": spec,
    }


class BatchStandIn:
    """Plays Volcano's batch scheduler by the NodeShard protocol, in waves.

    Each wave starts at a safe point (none of its pods pending): read its shard's nodesDesired and the agent
    shard's nodesInUse; publish ``desired - agent in use`` as its own status.nodesInUse (this is where it releases
    and claims); confirm with a fresh read that the agent shard does not claim the new nodes; then create a wave
    of batch pods that kube-scheduler may place only on the confirmed nodes (required affinity, matchFields on
    metadata.name), and wait until they are bound - or delete the leftovers - before the next wave.
    """

    def __init__(self, kube: KubeClient, namespace: str, name: str, agent: str, *, wave: int = 6) -> None:
        self.kube, self.namespace, self.name, self.agent, self.wave = kube, namespace, name, agent, wave
        self.published: frozenset[str] = frozenset()
        self.waves = 0
        self.created = 0
        self.deleted_pending = 0
        self._live: list[list[str]] = []

    async def run(self) -> None:
        while True:
            claimed = await claim_and_confirm(self.kube, self.name, self.agent, self.published)
            if claimed is not None:
                self.published, confirmed = claimed
                if confirmed:
                    await self._wave(sorted(confirmed))
            await asyncio.sleep(POLL)

    async def _wave(self, nodes: list[str]) -> None:
        self.waves += 1
        names = [f"batch-{self.waves:04d}-{i}" for i in range(self.wave)]
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        for name in names:
            await self.kube.post(
                path, small_pod(name, scheduler="default-scheduler", node_names=nodes, kind="batch")
            )
        self.created += len(names)
        deadline = time.monotonic() + 20
        pending = set(names)
        while pending and time.monotonic() < deadline:
            await asyncio.sleep(POLL)
            pods = (await self.kube.get(path, {"labelSelector": "e2e-kind=batch"}))["items"]
            bound = {p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")}
            pending -= bound
        for name in pending:  # not placed in time: withdraw before the next safe point
            with contextlib.suppress(NotFound):
                await self.kube.delete(f"{path}/{name}", {"gracePeriodSeconds": "0"})
            self.deleted_pending += 1
        if pending:
            await eventually(lambda: self._gone(pending), 30, "withdrawn batch pods gone")
        self._live.append(names)
        while len(self._live) > 4:  # keep a few waves "running"; completed batch work leaves the node
            for name in self._live.pop(0):
                with contextlib.suppress(NotFound):
                    await self.kube.delete(f"{path}/{name}", {"gracePeriodSeconds": "0"})

    async def _gone(self, names: set[str]) -> bool:
        pods = (await self.kube.get(f"/api/v1/namespaces/{self.namespace}/pods"))["items"]
        return not names & {p["metadata"]["name"] for p in pods}


@dataclass(frozen=True)
class Entry:
    """One point of the timeline: a NodeShard status as published, an agent worker's holding in the etcd shard
    map, or a pod binding."""

    rv: int
    kind: str  # "shard", "held" or "bind"
    name: str  # shard name, worker id, or pod name
    nodes: frozenset[str] = frozenset()  # shard: status.nodesInUse; held: granted | revoking
    node: str = ""  # bind: the node
    pod_kind: str = ""  # bind: "agent" or "batch"


class Recorder:
    """Watches NodeShards, the namespace's pods and the agent shard map in etcd (the cluster's own etcd, so its
    revisions are resourceVersions) from before the load starts; collects the timeline."""

    def __init__(
        self, kube: KubeClient, namespace: str, shards: set[str], etcd: Etcd3Client, prefix: str
    ) -> None:
        self.kube, self.namespace, self.shards = kube, namespace, shards
        self.etcd, self.keys = etcd, KeyLayout(prefix)
        self.entries: list[Entry] = []
        self.bound: set[str] = set()
        self.last_rv = {"shards": 0, "pods": 0, "etcd": 0}
        self.relists = 0
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        kvs, revision = await get_prefix(self.etcd, self.keys.assignments_prefix)
        for kv in kvs:
            self._held(kv.key, kv.value, kv.mod_revision)
        self.last_rv["etcd"] = revision
        self._tasks.append(asyncio.create_task(self._follow_etcd(revision + 1)))
        for stream, path in (
            ("shards", bodies.COLLECTION_PATH),
            ("pods", f"/api/v1/namespaces/{self.namespace}/pods"),
        ):
            listed = await self.kube.get(path)
            self._apply_list(stream, listed)
            self._tasks.append(
                asyncio.create_task(self._follow(stream, path, str(listed["metadata"]["resourceVersion"])))
            )

    def _apply_list(self, stream: str, listed: dict[str, Any]) -> None:
        for obj in listed.get("items") or ():
            self._apply(stream, "ADDED", obj)
        self.last_rv[stream] = max(self.last_rv[stream], int(listed["metadata"]["resourceVersion"]))

    def _apply(self, stream: str, kind: str, obj: dict[str, Any]) -> None:
        version = rv(obj)
        self.last_rv[stream] = max(self.last_rv[stream], version)
        name = obj["metadata"]["name"]
        if stream == "shards":
            if name in self.shards and kind != "DELETED":
                self.entries.append(
                    Entry(version, "shard", name, frozenset(parse_nodeshard(obj).nodes_in_use))
                )
            return
        node = (obj.get("spec") or {}).get("nodeName")
        if node and name not in self.bound and kind != "DELETED":
            self.bound.add(name)
            pod_kind = ((obj["metadata"].get("labels") or {}).get("e2e-kind")) or ""
            self.entries.append(Entry(version, "bind", name, node=node, pod_kind=pod_kind))

    def _held(self, key: str, value: bytes | None, revision: int) -> None:
        parsed = self.keys.parse(key)
        if parsed is None or parsed[0] is not KeyFamily.ASSIGNMENT:
            return
        held = frozenset(ShardAssignment.decode(value).held) if value is not None else frozenset()
        self.entries.append(Entry(revision, "held", parsed[1], held))

    async def _follow_etcd(self, start: int) -> None:
        async with contextlib.aclosing(
            watch(self.etcd, self.keys.root, prefix=True, start_revision=start)
        ) as stream:
            async for batch in stream:
                if batch.lost_history:
                    self.relists += 1
                    return
                for kind, kv in batch.events:
                    self._held(kv.key, None if kind == EVENT_DELETE else kv.value, kv.mod_revision)
                    self.last_rv["etcd"] = max(self.last_rv["etcd"], kv.mod_revision)

    async def _follow(self, stream: str, path: str, version: str) -> None:
        while True:
            try:
                async for kind, obj in self.kube.watch(path, resource_version=version, timeout_seconds=120):
                    if kind == "BOOKMARK":
                        continue
                    self._apply(stream, kind, obj)
                    version = str(rv(obj))
            except Gone:
                self.relists += 1  # history lost: the audit would be incomplete
                listed = await self.kube.get(path)
                self._apply_list(stream, listed)
                version = str(listed["metadata"]["resourceVersion"])

    async def fence(self, rig: Rig, agent_shard: str) -> None:
        """Make sure every write so far is in the timeline: write a marker to each stream and wait for it."""
        pod = await rig.kube.post(
            f"/api/v1/namespaces/{self.namespace}/pods",
            small_pod("fence", scheduler="no-such-scheduler", kind="fence"),
        )
        shard = await rig.kube.patch(
            bodies.object_path(agent_shard), {"metadata": {"labels": {"e2e-fence": str(time.time_ns())}}}
        )
        put = await kv_service(self.etcd).put(self.keys.root + "e2e-fence", b"x", timeout=DEFAULT_TIMEOUT)
        want = {"pods": rv(pod), "shards": rv(shard), "etcd": int(put.header.revision)}

        async def caught_up() -> bool:
            return all(self.last_rv[s] >= v for s, v in want.items())

        await eventually(caught_up, 30, "recorder caught up with the fence")

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def timeline(self) -> list[Entry]:
        # at equal revisions (never two writes) shards first is arbitrary; sort is stable by insertion
        return sorted(self.entries, key=lambda e: e.rv)
