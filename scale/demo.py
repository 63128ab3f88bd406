"""``agent-scheduler demo`` (``make demo``): the main job, end to end, on this machine.

1. a local real cluster (etcd, kube-apiserver, kwok) with ``--nodes`` fake nodes, in ``.local/demo/cluster``
   (scheduler logs and binding trails in ``.local/demo/schedulers``);
2. a coordinator and ``--workers`` worker processes, using the cluster's etcd for leases and the shard map;
3. a bursty stream of agent pods (bursts separated by a steady trickle), with live progress every second;
4. a summary: pods/s, p50/p99 create-to-bound latency from the generator's own clocks, each worker's share
   (from the workers' binding trails), and the capacity audit read back from the API server (``scale.audit``);
5. a clean shutdown: every process stopped by its PID, the cluster removed (``--keep`` leaves it running).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from common.watching import Reflector
from common.wellknown import DEFAULT_ETCD_PREFIX, DEFAULT_SCHEDULER_NAME
from scale.audit import audit_capacity
from scale.bench.loadgen import create_one
from scale.bench.results import latency_stats
from scale.cluster import Cluster, start_cluster
from scale.cluster.processes import ProcessRecord, spawn, stop
from scale.tracking import BindWatch, PodTimes, wait_bound
from scale.workload import agent_pod

NAMESPACE = "agents"
SCHEDULER = DEFAULT_SCHEDULER_NAME
STOP_GRACE = 30.0
BIND_TIMEOUT_S = 120.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--bursts", type=int, default=3, help="bursts of --burst-size pods")
    p.add_argument("--burst-size", type=int, default=1000)
    p.add_argument("--trickle", type=float, default=50.0, help="pods/s between bursts")
    p.add_argument("--dir", default=".local/demo")
    p.add_argument("--keep", action="store_true", help="leave the cluster and schedulers running")


class Processes:
    """The scheduler processes of the demo, each stopped by its own PID."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.records: list[ProcessRecord] = []

    def start(self, name: str, args: list[str]) -> None:
        self.records.append(
            spawn(name, [sys.executable, "-m", "agent_scheduler.cli", *args], self.log_dir / f"{name}.log")
        )

    def stop(self) -> dict[str, int | None]:
        return {s.name: s.code for s in stop(self.records, grace=STOP_GRACE)}


async def _workers_ready(cluster: Cluster, want: int) -> None:
    from coordinator.status import collect

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        s = await collect([cluster.etcd_endpoint], DEFAULT_ETCD_PREFIX)
        live = [w for w in s["workers"].values() if w.get("live") and w.get("nodes", 0) > 0]
        if s["leader"] and len(live) >= want:
            print(
                f"leader {s['leader']}, epoch {s['epoch']}: "
                + ", ".join(f"{w}={v.get('nodes', 0)} nodes" for w, v in sorted(s["workers"].items()))
            )
            return
        await asyncio.sleep(0.2)
    raise RuntimeError("the coordinator did not assign nodes to every worker within 60 s (see the logs)")


async def _drive(cluster: Cluster, args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    async with cluster.client() as kube:
        await kube.post("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        watch = BindWatch()
        reflector = Reflector(kube, f"/api/v1/namespaces/{NAMESPACE}/pods", watch, name=f"track-{NAMESPACE}")
        watcher = asyncio.create_task(reflector.run())
        sem = asyncio.Semaphore(64)
        index = 0

        async def create(i: int) -> None:
            pod = agent_pod(i, namespace=NAMESPACE, scheduler_name=SCHEDULER, mix=i % 5 == 0)
            times = watch.expect(pod["metadata"]["name"], "agent")
            async with sem:
                await create_one(kube, NAMESPACE, pod, times, watch.clock)
            if times.error:
                raise RuntimeError(f"creating {pod['metadata']['name']} failed: {times.error}")

        async def progress(stop: asyncio.Event) -> None:
            t0 = time.monotonic()
            last = 0
            while not stop.is_set():
                await asyncio.sleep(1.0)
                b = watch.bound
                sent = watch.sent()
                print(
                    f"  t={time.monotonic() - t0:5.1f}s  created {sent:6d}  bound {b:6d}  pending {sent - b:6d}  {b - last:5d} binds/s",
                    flush=True,
                )
                last = b

        stop = asyncio.Event()
        reporter = asyncio.create_task(progress(stop))
        await reflector.synced.wait()
        for burst in range(args.bursts):
            print(f"burst {burst + 1}/{args.bursts}: {args.burst_size} agent pods at once", flush=True)
            await asyncio.gather(*(create(index + i) for i in range(args.burst_size)))
            index += args.burst_size
            if burst < args.bursts - 1 and args.trickle > 0:
                print(f"steady trickle: {args.trickle:.0f} pods/s for 5 s", flush=True)
                t0 = time.monotonic()
                for k in range(int(args.trickle * 5)):
                    await create(index)
                    index += 1
                    await asyncio.sleep(max(0.0, t0 + (k + 1) / args.trickle - time.monotonic()))
        await wait_bound(watch, stall_s=BIND_TIMEOUT_S, timeout_s=BIND_TIMEOUT_S, since=watch.clock())
        stop.set()
        await reporter
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        summary = _summary(watch.of_kind("agent"))
        summary["created"] = index
        summary["overcommitted_nodes"] = len((await audit_capacity(kube)).overcommitted)
        return summary


def _summary(pods: list[PodTimes]) -> dict[str, Any]:
    """Throughput from the first create sent to the last bind seen, and create-to-bound percentiles."""
    bound = [p for p in pods if p.is_bound]
    if not bound:
        return {"bound": 0}
    first = min(p.sent for p in pods)
    last = max(p.bound for p in bound)
    stats = latency_stats(p.latency for p in bound)
    return {
        "bound": len(bound),
        "pods_per_s": len(bound) / max(1e-9, last - first),
        "p50_ms": stats.p50_ms,
        "p90_ms": stats.p90_ms,
        "p99_ms": stats.p99_ms,
        "max_ms": stats.max_ms,
    }


def _worker_shares(run_dir: Path) -> dict[str, int]:
    shares: Counter[str] = Counter()
    for path in run_dir.glob("*.audit.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec["pod"].startswith(NAMESPACE + "/"):
                shares[rec["worker"]] += 1
    return dict(sorted(shares.items()))


def run(args: argparse.Namespace) -> int:
    root = Path(args.dir).resolve()
    print(f"starting a local cluster with {args.nodes} kwok nodes in {root} ...", flush=True)
    t0 = time.monotonic()
    cluster = start_cluster(root / "cluster", nodes=args.nodes, force=True)
    print(f"cluster up in {time.monotonic() - t0:.1f}s: {cluster.server}", flush=True)
    run_dir = root / "schedulers"
    shutil.rmtree(run_dir, ignore_errors=True)  # the previous demo's logs and trails
    run_dir.mkdir(parents=True)
    procs = Processes(run_dir)
    common = [
        f"--kubeconfig={cluster.kubeconfig}",
        f"--etcd-endpoints={cluster.etcd_endpoint}",
        f"--scheduler-name={SCHEDULER}",
    ]
    summary: dict[str, Any] = {}
    try:
        procs.start("coordinator", ["coordinator", *common, "--id=coordinator-0"])
        for i in range(args.workers):
            procs.start(
                f"worker-{i}",
                ["worker", *common, f"--id=worker-{i}", f"--audit-log={run_dir / f'worker-{i}.audit.jsonl'}"],
            )
        asyncio.run(_workers_ready(cluster, args.workers))
        summary = asyncio.run(_drive(cluster, args, run_dir))
        summary["worker_share"] = _worker_shares(run_dir)
    finally:
        if not args.keep:
            codes = procs.stop()
            cluster.stop()
            print(f"stopped: {codes}; cluster removed", flush=True)
        else:
            print(
                f"left running: cluster in {root} (agent-scheduler cluster down --dir {root}), schedulers {[p.pid for p in procs.records]}"
            )
    if summary:
        print("\nsummary")
        print(f"  pods created          {summary['created']}")
        print(f"  pods bound            {summary.get('bound', 0)}")
        if summary.get("bound"):
            print(f"  throughput            {summary['pods_per_s']:.0f} pods/s (first create to last bind)")
            print(
                f"  create-to-bound       p50 {summary['p50_ms']:.0f} ms   p99 {summary['p99_ms']:.0f} ms   max {summary['max_ms']:.0f} ms"
            )
        print(f"  each worker's share   {summary['worker_share']}")
        print(f"  overcommitted nodes   {summary['overcommitted_nodes']}")
    ok = (
        bool(summary)
        and summary.get("bound") == summary.get("created")
        and summary.get("overcommitted_nodes") == 0
    )
    return 0 if ok else 1
