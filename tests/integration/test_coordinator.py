"""Coordinator + workers on the real local cluster and a real (restartable) etcd, under failure.

Every scenario ends with the same audit, read from the API server and the workers' binding trails:
- every agent pod is bound (exactly once: the API refuses a second binding, and no pod appears twice in the
  trails), or carries PodScheduled=False with a reason;
- no node's summed requests exceed its allocatable;
- no node was usable by two workers at once: two workers' [assumed, bound] intervals on one node never
  overlap. ``bound`` is the trail's ``bound_at`` (the worker read the API server's answer), or the API
  server's answer as a proxy in the way saw it, if earlier (``applied_bounds``): a worker paused with an answer
  unread reads it late, and its reading says nothing about when the binding was applied.
Measured times (failover, pods/s) are recorded as test properties and printed; they are not asserted —
generous timeouts only guard against hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from common.kube import KubeClient
from coordinator.status import collect
from scale.cluster import Cluster
from scale.workload import agent_pod
from tests.builders import make_pod
from tests.integration.etcd_server import EtcdServer
from tests.integration.support import SchedulerProcess, all_bound, audit_capacity, create_pods, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TTL = 3
D = TypeVar("D", bound="Deployment")
SETTLE_TIMEOUT = 120.0  # hang guard


@pytest.fixture(scope="module")
def lease_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """An etcd of its own for leases and the shard map, so a test can restart it without touching the API
    server's etcd."""
    server = EtcdServer(tmp_path_factory.mktemp("lease-etcd") / "data")
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Deployment:
    """Coordinators and workers of one test: a scheduler name and an etcd prefix of their own."""

    def __init__(self, cluster: Cluster, etcd: EtcdServer, tmp: Path) -> None:
        self.cluster, self.etcd, self.tmp = cluster, etcd, tmp
        suffix = uuid.uuid4().hex[:6]
        self.scheduler_name = f"agent-co-{suffix}"
        self.prefix = f"/test-{suffix}"
        self.procs: dict[str, SchedulerProcess] = {}

    def _common(self) -> list[str]:
        return [
            f"--kubeconfig={self.cluster.kubeconfig}",
            f"--etcd-endpoints={self.etcd.endpoint}",
            f"--etcd-prefix={self.prefix}",
            f"--lease-ttl={TTL}",
            f"--scheduler-name={self.scheduler_name}",
        ]

    def coordinator(self, name: str, *extra: str) -> SchedulerProcess:
        proc = SchedulerProcess(
            ["coordinator", *self._common(), f"--id={name}", *extra], self.tmp / f"{name}.log"
        )
        self.procs[name] = proc
        return proc

    def worker(self, name: str) -> SchedulerProcess:
        proc = SchedulerProcess(
            ["worker", *self._common(), f"--id={name}", f"--audit-log={self.tmp / f'{name}.audit.jsonl'}"],
            self.tmp / f"{name}.log",
        )
        self.procs[name] = proc
        return proc

    def stop_all(self) -> dict[str, int | None]:
        return {name: p.stop() for name, p in self.procs.items()}

    def trails(self) -> list[dict[str, Any]]:
        lines = []
        for path in self.tmp.glob("*.audit.jsonl"):
            lines += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return lines

    async def trails_of(self, namespace: str, n: int) -> list[dict[str, Any]]:
        """The audit lines of ``namespace``'s pods once there are ``n``: a worker writes a binding's line after
        its POST returns, which can be after a watch has shown the pod bound."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while True:
            lines = [t for t in self.trails() if t["pod"].startswith(namespace + "/")]
            if len(lines) >= n:
                return lines
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(lines)} of {n} bindings in the audit trails")
            await asyncio.sleep(0.1)

    async def status(self) -> dict[str, Any]:
        return await collect([self.etcd.endpoint], self.prefix)

    async def wait_status(self, predicate: Any, what: str) -> float:
        """Poll etcd until ``predicate(status)``; returns when (monotonic)."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while True:
            with_status = await self.status()
            if predicate(with_status):
                return time.monotonic()
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {with_status}")
            await asyncio.sleep(0.1)


@contextlib.contextmanager
def stopped_after(d: D, *, killed: bool = True) -> Iterator[D]:
    """``d`` with its etcd running; afterwards every process it started is stopped by PID, and each must have
    exited 0 (or, with ``killed``, been SIGKILLed by the test)."""
    if not d.etcd.running:
        d.etcd.start()
    try:
        yield d
    finally:
        codes = d.stop_all()
        logs = {n: p.tail(15) for n, p in d.procs.items()}
        allowed = (0, -signal.SIGKILL) if killed else (0,)
        assert all(c in allowed for c in codes.values()), (codes, logs)


@pytest.fixture
async def deployment(cluster: Cluster, lease_etcd: EtcdServer, tmp_path: Path) -> AsyncIterator[Deployment]:
    with stopped_after(Deployment(cluster, lease_etcd, tmp_path)) as d:
        yield d


def nodes_of(status: dict[str, Any]) -> dict[str, int]:
    return {w: int(v.get("nodes", 0)) for w, v in status["workers"].items() if v.get("live")}


Answers = dict[tuple[str, str], float]  # (pod key, node) -> when a proxy saw the API server apply the binding


def applied_bounds(trails: list[dict[str, Any]], worker: str, answered: Answers) -> list[dict[str, Any]]:
    """The trails, each of ``worker``'s ``bound_at`` lowered to ``answered[(pod, node)]`` (when a proxy between
    that worker and the API server saw the API server answer the binding with 201) if that is earlier. Both
    are moments by which the binding had been applied; the earlier is the tighter bound."""
    return [
        t | {"bound_at": min(t["bound_at"], answered.get((t["pod"], t["node"]), t["bound_at"]))}
        if t["worker"] == worker
        else t
        for t in trails
    ]


def overlapping(trails: list[dict[str, Any]]) -> list[str]:
    """Where two workers' [assumed_at, bound_at] intervals on one node overlap: every span is compared with
    the latest end of every other worker's earlier-starting spans on that node, not only with its neighbour
    (one long span of a worker can cover several of another's)."""
    per_node: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for t in trails:
        per_node[t["node"]].append((t["assumed_at"], t["bound_at"], t["worker"]))
    found = []
    for node, spans in per_node.items():
        latest: dict[str, float] = {}
        for start, end, worker in sorted(spans):
            found += [
                f"{node}: {other} bound until {until}, {worker} assumed at {start}"
                for other, until in latest.items()
                if other != worker and until > start
            ]
            latest[worker] = max(latest.get(worker, end), end)
    return found


async def audit(
    d: Deployment,
    kube: KubeClient,
    namespace: str,
    n: int,
    *,
    answered: tuple[str, Callable[[], Answers]] | None = None,
) -> list[dict[str, Any]]:
    """The module docstring's audit; ``answered`` names a worker whose bindings went through a proxy and gives
    when that proxy saw each applied (read once every pod is bound)."""
    pods = await wait_for(kube, namespace, all_bound(n), timeout=SETTLE_TIMEOUT, what=f"{n} pods bound")
    assert len({p["metadata"]["uid"] for p in pods}) == n
    cap = await audit_capacity(kube)
    assert cap.overcommitted == []
    trails = d.trails()
    if answered is not None:
        worker, answers = answered
        trails = applied_bounds(trails, worker, answers())
    per_pod: dict[str, int] = defaultdict(int)
    for t in trails:
        if t["pod"].startswith(namespace + "/"):
            per_pod[t["pod"]] += 1
    assert all(c == 1 for c in per_pod.values()), {k: c for k, c in per_pod.items() if c > 1}
    overlaps = overlapping(trails)
    assert not overlaps, (len(overlaps), overlaps[:5])
    return pods


async def burst(
    kube: KubeClient, d: Deployment, namespace: str, n: int, *, start: int = 0, concurrency: int = 32
) -> None:
    pods = [
        agent_pod(i, namespace=namespace, scheduler_name=d.scheduler_name) for i in range(start, start + n)
    ]
    await create_pods(kube, namespace, pods, concurrency=concurrency)


MID_BURST_PODS = 1500


@contextlib.asynccontextmanager
async def mid_burst(kube: KubeClient, d: Deployment, namespace: str) -> AsyncIterator[None]:
    """Start a burst, let it run for two seconds, hand over to the disruption, then finish the burst and run
    the audit."""
    creating = asyncio.create_task(burst(kube, d, namespace, MID_BURST_PODS, concurrency=16))
    await asyncio.sleep(2)
    yield
    await creating
    await audit(d, kube, namespace, MID_BURST_PODS)


async def logged(proc: SchedulerProcess, line: str) -> None:
    """Wait until ``proc``'s log has a line containing ``line``."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while line not in proc.log_path.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"timed out waiting for {line!r} in {proc.log_path}"
        await asyncio.sleep(0.1)


async def started(d: Deployment, workers: int) -> None:
    await d.wait_status(
        lambda s: (
            s["leader"] is not None
            and len(nodes_of(s)) == workers
            and all(v > 0 for v in nodes_of(s).values())
        ),
        f"a leader and {workers} workers with nodes",
    )


async def settled(d: Deployment, kube: KubeClient) -> int:
    """Every node granted, none in handoff, and every live worker placing on all the nodes granted to it (its
    load report's ``usable``). ``started`` only says the shard map named the workers: a worker granted nodes
    after its pod watch listed catches up on them node by node (``worker.shard``), seconds on a busy API
    server, and meanwhile a burst goes to the others. A test that asserts which workers placed pods, or
    counts the nodes the shards evaluated, waits for this first. Returns the number of nodes."""
    total = len((await kube.get("/api/v1/nodes"))["items"])  # the pool is every node (no selector)
    await d.wait_status(
        lambda s: (
            sum(nodes_of(s).values()) == total
            and all(
                not v.get("revoking") and v.get("usable") == v.get("nodes")
                for v in s["workers"].values()
                if v.get("live")
            )
        ),
        f"all {total} nodes granted and usable, none in handoff",
    )
    return total


@pytest.mark.parametrize("via", ["dispatch", "claim"])
async def test_steady_load_two_workers(
    kube: KubeClient, namespace: str, deployment: Deployment, via: str, record_property: Any
) -> None:
    """About 50 pods/s for 6 s over two workers, by the leader's dispatch (the default) or by worker claims."""
    d = deployment
    coord = d.coordinator("coord-a", *(["--worker-claims"] if via == "claim" else []))
    d.worker("w1")
    d.worker("w2")
    await started(d, 2)
    await settled(d, kube)
    if via == "claim":
        await logged(coord, "claim set: w1, w2")
    t0 = time.monotonic()
    for second in range(6):  # about 50 pods/s
        await burst(kube, d, namespace, 50, start=second * 50)
        await asyncio.sleep(max(0.0, t0 + second + 1 - time.monotonic()))
    pods = await audit(d, kube, namespace, 300)
    by_worker: dict[str, int] = defaultdict(int)
    by_via: dict[str, int] = defaultdict(int)
    for t in await d.trails_of(namespace, 300):
        by_worker[t["worker"]] += 1
        by_via[t["via"]] += 1
    assert set(by_worker) == {"w1", "w2"}, by_worker  # both shards are used
    # every pod went the one way: claimed by the worker its uid hashes to, from its own watch, or dispatched
    assert by_via == {via: 300}, by_via
    record_property("pods", len(pods))


async def test_burst_2000_and_pods_per_second(
    kube: KubeClient, namespace: str, deployment: Deployment, record_property: Any
) -> None:
    d = deployment
    d.coordinator("coord-a")
    d.worker("w1")
    d.worker("w2")
    await started(d, 2)
    t0 = time.monotonic()
    await burst(kube, d, namespace, 2000, concurrency=64)
    await audit(d, kube, namespace, 2000)
    elapsed = time.monotonic() - t0
    record_property("pods_per_s", round(2000 / elapsed, 1))
    print(f"\nburst 2000 pods, 2 workers: {2000 / elapsed:.0f} pods/s create-to-all-bound")


async def test_kill_worker_mid_burst(
    kube: KubeClient, namespace: str, deployment: Deployment, record_property: Any
) -> None:
    d = deployment
    d.coordinator("coord-a")
    d.worker("w1")
    victim = d.worker("w2")
    await started(d, 2)
    async with mid_burst(kube, d, namespace):
        victim.stop(signal.SIGKILL)
        killed = time.monotonic()
        total = sum(nodes_of(await d.status()).values())
        moved = await d.wait_status(lambda s: nodes_of(s).get("w1", 0) == total, "w1 holding every node")
    record_property("worker_failover_s", round(moved - killed, 2))
    print(f"\nkill -9 worker: nodes reassigned {moved - killed:.2f}s after the kill (lease TTL {TTL}s)")


async def test_kill_leader_mid_burst(
    kube: KubeClient, namespace: str, deployment: Deployment, record_property: Any
) -> None:
    d = deployment
    leader = d.coordinator("coord-a")
    await d.wait_status(lambda s: s["leader"] == "coord-a", "coord-a leading")
    d.coordinator("coord-b")
    d.worker("w1")
    d.worker("w2")
    await started(d, 2)
    async with mid_burst(kube, d, namespace):
        leader.stop(signal.SIGKILL)
        killed = time.monotonic()
        took_over = await d.wait_status(lambda s: s["leader"] == "coord-b", "coord-b leading")
    record_property("leader_failover_s", round(took_over - killed, 2))
    print(f"\nkill -9 leader: standby leading {took_over - killed:.2f}s after the kill (lease TTL {TTL}s)")


@pytest.mark.parametrize("sole", [False, True], ids=["dispatched", "sole-worker"])
async def test_add_worker_mid_burst(
    kube: KubeClient, namespace: str, deployment: Deployment, record_property: Any, sole: bool
) -> None:
    """With ``--sole-worker``, w1 places the burst's first pods alone; w2's arrival ends that (a new stream,
    the term inheriting again) while w1 still binds them, and the audit holds across it."""
    d = deployment
    coord = d.coordinator("coord-a", "--sole-worker" if sole else "--no-sole-worker")
    d.worker("w1")
    await started(d, 1)
    if sole:
        await logged(coord, "w1 took the sole worker's role")

    # The shard map balances capacity (allocatable CPU), not node counts: a fair share is judged by the free
    # CPU each worker reports, which at this light load is nearly its capacity.
    def fair_share(s: dict[str, Any]) -> bool:
        live = {w: v for w, v in s["workers"].items() if v.get("live") and "free_cpu" in v}
        total = sum(v["free_cpu"] for v in live.values())
        return "w2" in live and total > 0 and live["w2"]["free_cpu"] >= 0.4 * total

    async with mid_burst(kube, d, namespace):
        d.worker("w2")
        joined = time.monotonic()
        fair = await d.wait_status(fair_share, "w2 holding a fair share of the capacity")
    record_property("join_to_fair_share_s", round(fair - joined, 2))
    print(f"\nadded worker: fair share of the capacity {fair - joined:.2f}s after start")
    if sole:
        await logged(coord, "w1 is no longer the sole worker: the set of workers changed")
        via = {t["via"] for t in await d.trails_of(namespace, MID_BURST_PODS)}
        assert "sole" in via and "dispatch" in via, via


async def test_the_default_sole_worker_reports_a_malformed_pod_and_places_the_rest(
    kube: KubeClient, namespace: str, deployment: Deployment
) -> None:
    """Coordinator + 1 as shipped: the worker is sole, so the leader's pending watch is stopped and only the
    worker can report a pod it refuses. A request beyond what the worker accepts is reported on the pod with the
    field named; an ordinary pod created with it is bound."""
    d = deployment
    coord = d.coordinator("coord-a")  # no flag: the default
    d.worker("w1")
    await started(d, 1)
    await logged(coord, "w1 took the sole worker's role")
    bad = make_pod("huge-request", namespace).scheduler(d.scheduler_name).req(cpu="1e20").json()
    ordinary = agent_pod(0, namespace=namespace, scheduler_name=d.scheduler_name)
    await create_pods(kube, namespace, [bad, ordinary])

    def condition(pods: list[dict[str, Any]]) -> str | None:
        for p in pods:
            if p["metadata"]["name"] == "huge-request":
                for c in p["status"].get("conditions") or []:
                    if c.get("type") == "PodScheduled" and c.get("status") == "False":
                        return str(c.get("message") or "")
        return None

    def done(pods: list[dict[str, Any]]) -> bool:
        placed = [p for p in pods if p["metadata"]["name"] == ordinary["metadata"]["name"]]
        return condition(pods) is not None and bool(placed) and bool(placed[0]["spec"].get("nodeName"))

    pods = await wait_for(
        kube, namespace, done, timeout=SETTLE_TIMEOUT, what="the refusal reported, the rest bound"
    )
    message = condition(pods)
    assert message is not None and "spec.containers[0].resources.requests.cpu" in message, message
    assert not any(p["spec"].get("nodeName") for p in pods if p["metadata"]["name"] == "huge-request")
    assert "w1 is no longer the sole worker" not in coord.log_path.read_text(errors="replace")


async def test_kill_leader_while_a_sole_worker_places_a_burst(
    kube: KubeClient, namespace: str, deployment: Deployment, record_property: Any
) -> None:
    """The standby knows nothing of what the sole worker placed: it inherits (rule 6) and dispatches until
    the worker, its old stream gone, says it binds nothing of it; then it offers SOLE again."""
    d = deployment
    leader = d.coordinator("coord-a", "--sole-worker")
    await d.wait_status(lambda s: s["leader"] == "coord-a", "coord-a leading")
    standby = d.coordinator("coord-b", "--sole-worker")
    d.worker("w1")
    await started(d, 1)
    await logged(leader, "w1 took the sole worker's role")
    async with mid_burst(kube, d, namespace):
        leader.stop(signal.SIGKILL)
        killed = time.monotonic()
        took_over = await d.wait_status(lambda s: s["leader"] == "coord-b", "coord-b leading")
    await logged(standby, "w1 took the sole worker's role")
    via = {t["via"] for t in await d.trails_of(namespace, MID_BURST_PODS)}
    assert "sole" in via, via
    record_property("leader_failover_s", round(took_over - killed, 2))


async def test_remove_worker_mid_burst_drains(
    kube: KubeClient, namespace: str, deployment: Deployment
) -> None:
    d = deployment
    d.coordinator("coord-a")
    d.worker("w1")
    leaving = d.worker("w2")
    await started(d, 2)
    async with mid_burst(kube, d, namespace):
        assert leaving.stop(signal.SIGTERM) == 0, leaving.tail()  # graceful: drains and exits 0
        await d.wait_status(lambda s: "w2" not in nodes_of(s), "w2's nodes handed over")


async def test_etcd_restart_mid_burst(
    kube: KubeClient, namespace: str, deployment: Deployment, lease_etcd: EtcdServer
) -> None:
    d = deployment
    d.coordinator("coord-a")
    d.worker("w1")
    d.worker("w2")
    await started(d, 2)
    async with mid_burst(kube, d, namespace):
        lease_etcd.stop()
        await asyncio.sleep(TTL)  # long enough for every lease holder to fence itself
        lease_etcd.start()
    status = await d.status()
    assert status["leader"] is not None and sum(nodes_of(status).values()) > 0


async def test_pod_no_shard_can_fit_is_reported_with_every_shards_reasons(
    kube: KubeClient, namespace: str, deployment: Deployment
) -> None:
    d = deployment
    d.coordinator("coord-a")
    d.worker("w1")
    d.worker("w2")
    await started(d, 2)
    # the message counts the nodes the shards evaluated: a node in handoff (released by one worker, not yet
    # granted to the other) or still catching up is evaluated by none
    total = await settled(d, kube)
    huge = agent_pod(0, namespace=namespace, scheduler_name=d.scheduler_name)
    huge["metadata"]["name"] = "huge"
    huge["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "500"
    small = agent_pod(1, namespace=namespace, scheduler_name=d.scheduler_name)
    await create_pods(kube, namespace, [huge, small])

    def reported(pods: list[dict[str, Any]]) -> bool:
        by_name = {p["metadata"]["name"]: p for p in pods}
        conds = by_name["huge"].get("status", {}).get("conditions") or []
        return bool(by_name[small["metadata"]["name"]]["spec"].get("nodeName")) and any(
            c["type"] == "PodScheduled" and c["status"] == "False" for c in conds
        )

    pods = await wait_for(kube, namespace, reported, timeout=SETTLE_TIMEOUT, what="the huge pod reported")
    cond = next(
        c
        for p in pods
        if p["metadata"]["name"] == "huge"
        for c in p["status"]["conditions"]
        if c["type"] == "PodScheduled"
    )
    assert cond["reason"] == "Unschedulable"
    # one cluster-wide message over both shards, in kube-scheduler's shape
    assert cond["message"].startswith(f"0/{total} nodes are available: "), cond["message"]
    assert "Insufficient cpu" in cond["message"]
    await asyncio.sleep(2)
    events = (await kube.get(f"/api/v1/namespaces/{namespace}/events"))["items"]
    failed = [
        e for e in events if e["reason"] == "FailedScheduling" and e["involvedObject"]["name"] == "huge"
    ]
    assert len(failed) == 1, [e["message"] for e in failed]
