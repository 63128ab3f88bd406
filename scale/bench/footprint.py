"""``agent-scheduler bench footprint``: memory and CPU per pod event of each scheduler as bound pods accumulate.

For each node count and each scheduler configuration (``scale.bench.schedulers``), on a fresh local cluster
started as ``bench cluster`` starts it (``scale.bench.cluster``: the deterministic kwok fleet, kube-scheduler, the
product's RBAC for ``system:kube-scheduler``):
1. the scheduler's processes, made ready as ``bench cluster`` does (shard map settled, probe pods bound), then
   their CPU at rest is read over a few seconds and the step-0 RSS taken;
2. bound pods created in ``steps`` equal steps up to ``pods``: agent pods (``scale.workload.agent_pod``: labels,
   one container with requests) whose ``spec.nodeName`` is already set to a node the real engine chose for them
   (``noop_binder.placer``, computed once per node count, the same for every configuration), so no scheduler
   decides them and kwok runs them;
3. after each step: wait until a watch of the namespace has seen every pod of the step Running, then until the
   scheduler processes' CPU is quiet (``QUIET_WINDOWS`` consecutive windows of ``QUIET_WINDOW_S`` each under
   ``QUIET_CORES`` above the processes' idle rate measured before the first step, at most ``SETTLE_TIMEOUT_S``): their caches have applied the events by then. Read each
   process's RSS (scheduler processes, the cluster's kube-scheduler, the API server) and the CPU each spent since
   the step began; append a ``footprint_report.Step`` and rewrite ``results.json`` and ``report.md`` at once, so
   an interrupted run keeps what it measured;
4. stop the scheduler by PID and the cluster.

Nothing is asserted: the report marks issue 14 item 4's goal met, missed or not measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from common.events import rfc3339
from common.kube import ApiError, KubeClient
from common.watching import Reflector
from scale.bench import cluster as bench_cluster
from scale.bench import footprint_report, loadgen, noop_binder
from scale.bench.footprint_report import KUBE_SCHEDULER, MIB, Step
from scale.bench.meter import PidSource, ProcessMeter, with_children
from scale.bench.schedulers import (
    KUBE,
    SCHEDULERS,
    Running,
    grant_agent_rbac,
    launch,
)
from scale.bench.workloads import RUN_LABEL
from scale.cluster import Cluster, ClusterError, ClusterOptions, generate_nodes
from scale.cluster.components import APISERVER, SCHEDULER
from scale.cluster.config import PROJECT_ROOT
from scale.tracking import Clock, PodTimes
from scale.workload import agent_pod

log = logging.getLogger(__name__)

NAMESPACE = "bench-footprint"
WORKLOAD = "footprint"
DEFAULT_SCHEDULERS = ("agent-standalone", "agent-coord-1", "agent-coord-2", "kube-scheduler-qps5000")
DEFAULT_NODES = (1000,)
PODS_PER_NODE = 10
DEFAULT_STEPS = 4
CREATE_CONCURRENCY = 64
IDLE_WINDOW_S = 5.0
QUIET_WINDOW_S = 1.0
QUIET_WINDOWS = 2
QUIET_CORES = 0.05
SETTLE_TIMEOUT_S = 120.0
RUNNING_TIMEOUT_S = 300.0
RUNNING_POLL_S = 0.5


@dataclass(kw_only=True, slots=True)
class FootprintConfig:
    nodes: list[int]
    #: bound pods at the last step, per node count (same order as ``nodes``)
    pods: list[int]
    schedulers: list[str]
    steps: int
    out: Path
    command: str = ""


def step_targets(pods: int, steps: int) -> list[int]:
    """Cumulative pod counts after each of ``steps`` equal steps (the last is ``pods``)."""
    steps = max(1, min(steps, pods)) if pods else 1
    return [round(pods * (k + 1) / steps) for k in range(steps)]


def bound_pods(fleet: list[dict[str, Any]], count: int, *, scheduler_name: str) -> list[dict[str, Any]]:
    """``count`` agent pods, each with ``spec.nodeName`` set to a node the real engine picked for it."""
    place = noop_binder.placer(fleet)
    out = []
    for i in range(count):
        pod = agent_pod(i, namespace=NAMESPACE, scheduler_name=scheduler_name, prefix="bound")
        pod["metadata"]["labels"][RUN_LABEL] = WORKLOAD
        node = place(pod)
        if node is None:
            raise RuntimeError(f"the fleet of {len(fleet)} nodes holds only {i} of {count} pods")
        pod["spec"]["nodeName"] = node
        out.append(pod)
    return out


class PodEvents:
    """Watch handler: counts pod events and which pods are Running."""

    def __init__(self) -> None:
        self.events = 0
        self.running: set[str] = set()

    def _see(self, obj: dict[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        if (obj.get("status") or {}).get("phase") == "Running":
            self.running.add(name)
        else:
            self.running.discard(name)

    def replace(self, objects: list[dict[str, Any]]) -> None:
        self.running.clear()
        for obj in objects:
            self._see(obj)

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        self.events += 1
        if kind == "DELETED":
            self.running.discard(str((obj.get("metadata") or {}).get("name") or ""))
        else:
            self._see(obj)


def _processes(cluster: Cluster, running: Running) -> dict[str, list[int]]:
    """Name -> PIDs of each process of the scheduler under test."""
    if running.spec.kind == KUBE:
        record = cluster.state.process(SCHEDULER)
        return {KUBE_SCHEDULER: [record.pid] if record is not None else []}
    return {c.name: with_children([c.pid]) for c in running.children}


def _component(cluster: Cluster, name: str) -> list[int]:
    record = cluster.state.process(name)
    return [record.pid] if record is not None else []


def rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            total += int(psutil.Process(pid).memory_info().rss)
    return round(total / MIB, 1)


def _fixed(pids: list[int]) -> Callable[[], list[int]]:
    return lambda: pids


def _meter(cluster: Cluster, running: Running) -> ProcessMeter:
    groups: dict[str, PidSource] = {name: _fixed(pids) for name, pids in _processes(cluster, running).items()}
    groups[KUBE_SCHEDULER] = lambda: _component(cluster, SCHEDULER)
    groups[APISERVER] = lambda: _component(cluster, APISERVER)
    return ProcessMeter(groups, period=QUIET_WINDOW_S)


async def settle(
    cluster: Cluster, running: Running, *, idle: float = 0.0, clock: Clock = time.monotonic
) -> tuple[float, bool]:
    """Wait until the scheduler's processes use at most ``QUIET_CORES`` more than their ``idle`` rate (a
    coordinator and its workers at 5,000 nodes idle above ``QUIET_CORES`` alone); (seconds waited, whether it
    got quiet)."""
    began = clock()
    quiet = 0
    while clock() - began < SETTLE_TIMEOUT_S:
        meter = ProcessMeter(
            {"scheduler": lambda: [p for ps in _processes(cluster, running).values() for p in ps]}
        )
        meter.start()
        await asyncio.sleep(QUIET_WINDOW_S)
        usage = await meter.stop()
        quiet = quiet + 1 if usage["scheduler"].cpu_s < (QUIET_CORES + idle) * QUIET_WINDOW_S else 0
        if quiet >= QUIET_WINDOWS:
            return clock() - began, True
    return clock() - began, False


async def _idle_cores(cluster: Cluster, running: Running) -> float:
    meter = _meter(cluster, running)
    meter.start()
    await asyncio.sleep(IDLE_WINDOW_S)
    usage = await meter.stop()
    names = _processes(cluster, running)
    return round(sum(usage[n].cpu_s for n in names) / IDLE_WINDOW_S, 4)


def _reading(cluster: Cluster, running: Running, *, nodes: int, pods: int, idle: float) -> Step:
    procs = _processes(cluster, running)
    return Step(
        scheduler=running.spec.name,
        kind=running.spec.kind,
        nodes=nodes,
        pods=pods,
        rss_mib={name: rss_mib(pids) for name, pids in procs.items()},
        kube_scheduler_rss_mib=rss_mib(_component(cluster, SCHEDULER)),
        apiserver_rss_mib=rss_mib(_component(cluster, APISERVER)),
        idle_cores=idle,
    )


async def _create(client: KubeClient, pods: list[dict[str, Any]]) -> int:
    """Create ``pods`` with ``CREATE_CONCURRENCY`` in flight; returns how many failed."""
    queue = iter(pods)
    failed = 0

    async def worker() -> None:
        nonlocal failed
        for pod in queue:
            times = PodTimes("agent")
            await loadgen.create_one(client, NAMESPACE, pod, times, time.monotonic)
            if times.error:
                failed += 1

    await asyncio.gather(*(worker() for _ in range(CREATE_CONCURRENCY)))
    return failed


async def measure(
    client: KubeClient,
    cluster: Cluster,
    running: Running,
    *,
    nodes: int,
    plan: list[dict[str, Any]],
    targets: list[int],
    on_step: Callable[[Step], None],
) -> None:
    """Step 0 and each step of ``targets``; each ``Step`` is passed to ``on_step`` as soon as it is read."""
    waited, quiet = await settle(cluster, running)
    idle = await _idle_cores(cluster, running)
    first = _reading(cluster, running, nodes=nodes, pods=0, idle=idle)
    if not quiet:
        first.notes.append(f"scheduler CPU not quiet after {waited:.0f}s")
    on_step(first)
    watch = PodEvents()
    reflector = Reflector(client, f"/api/v1/namespaces/{NAMESPACE}/pods", watch, name="footprint-pods")
    task = asyncio.create_task(reflector.run())
    try:
        await asyncio.wait_for(reflector.synced.wait(), 60.0)
        done = 0
        for target in targets:
            meter = _meter(cluster, running)
            events_before = watch.events
            began = time.monotonic()
            meter.start()
            notes: list[str] = []
            try:
                failed = await _create(client, plan[done:target])
                if failed:
                    notes.append(f"{failed} creates failed")
                names = {p["metadata"]["name"] for p in plan[:target]}
                for _ in range(int(RUNNING_TIMEOUT_S / RUNNING_POLL_S)):
                    if names <= watch.running:
                        break
                    await asyncio.sleep(RUNNING_POLL_S)
                if not names <= watch.running:
                    notes.append(
                        f"{len(names - watch.running)} pods not Running after {RUNNING_TIMEOUT_S:.0f}s"
                    )
                waited, quiet = await settle(cluster, running, idle=idle)
                if not quiet:
                    notes.append(f"scheduler CPU not quiet after {waited:.0f}s")
            finally:
                usage = await meter.stop()
            step = _reading(cluster, running, nodes=nodes, pods=target, idle=idle)
            step.cpu_s = {name: usage[name].cpu_s for name in step.rss_mib}
            step.kube_scheduler_cpu_s = usage[KUBE_SCHEDULER].cpu_s
            step.apiserver_cpu_s = usage[APISERVER].cpu_s
            step.events = watch.events - events_before
            step.duration_s = round(time.monotonic() - began, 2)
            step.settle_s = round(waited, 2)
            step.notes = notes + running.dead()
            log.info(
                "%s, %d nodes, %d pods: RSS %s, kube-scheduler %.0f MiB, %.3f CPU-ms per event (%d events)",
                step.scheduler,
                nodes,
                target,
                step.rss_mib,
                step.kube_scheduler_rss_mib,
                step.cpu_ms_per_event,
                step.events,
            )
            on_step(step)
            done = target
            if running.dead():
                return
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def run_config(
    name: str,
    nodes: int,
    *,
    plan: list[dict[str, Any]],
    targets: list[int],
    config: FootprintConfig,
    on_step: Callable[[Step], None],
) -> None:
    spec = SCHEDULERS[name]
    logs = config.out / "logs" / f"{nodes}"
    logs.mkdir(parents=True, exist_ok=True)
    cluster_dir = Path(tempfile.mkdtemp(prefix=f"footprint-{nodes}-{name}-"))
    options = ClusterOptions(scheduler_qps=spec.kube_qps, scheduler_burst=spec.kube_burst)

    def failed(error: str) -> None:
        on_step(
            Step(
                scheduler=name,
                kind=spec.kind,
                nodes=nodes,
                pods=targets[-1],
                rss_mib={},
                kube_scheduler_rss_mib=0.0,
                apiserver_rss_mib=0.0,
                error=error,
            )
        )

    try:
        cluster = await bench_cluster.fresh_cluster(cluster_dir, nodes, options)
    except ClusterError as e:
        failed(f"cluster did not start: {e}")
        return
    running: Running | None = None
    try:
        async with cluster.client(qps=50000, burst=50000, max_connections=256) as client:
            kubeconfig, notes = bench_cluster.measured_kubeconfig(cluster, await grant_agent_rbac(client))
            running = launch(spec, cluster, logs, kubeconfig=kubeconfig, tag="footprint")
            why = await bench_cluster.until_ready(
                client, spec, running, nodes=nodes, fleet=generate_nodes(nodes), notes=notes
            )
            for note in notes:
                log.warning("%s: %s", name, note)
            if why:
                failed(why)
                return
            await client.post(
                "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            )
            await measure(client, cluster, running, nodes=nodes, plan=plan, targets=targets, on_step=on_step)
    except (ApiError, OSError, TimeoutError) as e:
        log.exception("%s at %d nodes failed", name, nodes)
        failed(f"{type(e).__name__}: {e}")
    finally:
        if running is not None:
            problems = running.stop()
            if problems:
                log.warning("stopping %s: %s", name, "; ".join(problems))
        await asyncio.to_thread(cluster.stop)


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out + (" (with uncommitted changes)" if dirty else "")


async def run_footprint(config: FootprintConfig) -> list[Step]:
    config.out.mkdir(parents=True, exist_ok=True)
    steps: list[Step] = []
    meta = {
        "command": config.command,
        "commit": _commit(),
        "started": rfc3339(),
        "host": f"{platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "notes": [
            "CPU figures were taken on a shared machine while other work ran (several sessions on 2 cores); "
            "RSS does not depend on that, CPU per event does."
        ],
    }

    def on_step(step: Step) -> None:
        steps.append(step)
        footprint_report.write(config.out, steps, meta)

    for nodes, pods in zip(config.nodes, config.pods, strict=True):
        fleet = generate_nodes(nodes)
        log.info("placing %d bound pods on %d nodes with the engine", pods, nodes)
        plan = await asyncio.to_thread(bound_pods, fleet, pods, scheduler_name="bench-footprint-none")
        targets = step_targets(pods, config.steps)
        for name in config.schedulers:
            await run_config(name, nodes, plan=plan, targets=targets, config=config, on_step=on_step)
    footprint_report.write(config.out, steps, meta)
    return steps


def main(
    *,
    nodes: list[int] | None,
    pods: list[int] | None,
    schedulers: list[str] | None,
    steps: int,
    out: Path | None,
) -> int:
    unknown = [s for s in schedulers or () if s not in SCHEDULERS]
    if unknown:
        print(f"unknown scheduler(s) {', '.join(unknown)}; known: {', '.join(SCHEDULERS)}")
        return 2
    node_counts = nodes or list(DEFAULT_NODES)
    pod_counts = pods or [n * PODS_PER_NODE for n in node_counts]
    if len(pod_counts) == 1 and len(node_counts) > 1:
        pod_counts = pod_counts * len(node_counts)
    if len(pod_counts) != len(node_counts):
        print("--pods needs one count, or one per node count")
        return 2
    stamp = time.strftime("%Y%m%d-%H%M%S")
    config = FootprintConfig(
        nodes=node_counts,
        pods=pod_counts,
        schedulers=schedulers or list(DEFAULT_SCHEDULERS),
        steps=steps,
        out=(out or Path("results") / f"footprint-{stamp}").resolve(),
        command=shlex.join(["agent-scheduler", *sys.argv[1:]]),
    )
    results = asyncio.run(run_footprint(config))
    print(footprint_report.table(results))
    print(f"\nresults in {config.out}/results.json, report in {config.out}/report.md")
    return 0 if results and not any(s.error for s in results) else 1
