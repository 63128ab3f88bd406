"""``agent-scheduler demo`` (``make demo``): the main job, end to end, on this machine.

1. a local real cluster (etcd, kube-apiserver, kwok) with ``--nodes`` fake nodes, in ``.local/demo/cluster``
   (scheduler logs and binding trails in ``.local/demo/schedulers``);
2. a coordinator and ``--workers`` worker processes, using the cluster's etcd for leases and the shard map;
3. a bursty stream of agent pods (bursts separated by a steady trickle), with live progress every second;
4. a summary: pods/s, p50/p99 create-to-bound latency from the generator's own clocks, each worker's share
   (from the workers' binding trails), and the capacity audit read back from the API server;
5. a clean shutdown: every process stopped by its PID, the cluster removed (``--keep`` leaves it running).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from common.kube import KubeClient
from common.records import node_from_json, pod_from_json
from scale.cluster import Cluster, start_cluster
from scale.tracking import BindTracker
from scale.workload import agent_pod

NAMESPACE = "agents"
SCHEDULER = "agent-scheduler"


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
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, args: list[str]) -> None:
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "agent_scheduler.cli", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def stop(self) -> dict[str, int | None]:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes: dict[str, int | None] = {}
        for name, p in self.procs.items():
            try:
                codes[name] = p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                codes[name] = p.wait()
        return codes


async def _workers_ready(cluster: Cluster, want: int) -> None:
    from coordinator.status import collect

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        s = await collect([cluster.etcd_endpoint], "/agent-scheduler")
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
        tracker = BindTracker(kube, NAMESPACE)
        watch = asyncio.create_task(tracker.reflector.run())
        sem = asyncio.Semaphore(64)
        index = 0

        async def create(i: int) -> None:
            pod = agent_pod(i, namespace=NAMESPACE, scheduler_name=SCHEDULER, mix=i % 5 == 0)
            async with sem:
                tracker.created(pod["metadata"]["name"])
                await kube.post(f"/api/v1/namespaces/{NAMESPACE}/pods", pod)

        async def progress(stop: asyncio.Event) -> None:
            t0 = time.monotonic()
            last = 0
            while not stop.is_set():
                await asyncio.sleep(1.0)
                b = len(tracker.bound)
                print(
                    f"  t={time.monotonic() - t0:5.1f}s  created {len(tracker.sent):6d}  bound {b:6d}  pending {len(tracker.sent) - b:6d}  {b - last:5d} binds/s",
                    flush=True,
                )
                last = b

        stop = asyncio.Event()
        reporter = asyncio.create_task(progress(stop))
        await tracker.reflector.synced.wait()
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
        await tracker.wait_bound(index, timeout=120)
        stop.set()
        await reporter
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        summary = tracker.summary()
        summary["created"] = index
        summary["overcommitted_nodes"] = await _overcommitted(kube)
        return summary


def _worker_shares(run_dir: Path) -> dict[str, int]:
    shares: Counter[str] = Counter()
    for path in run_dir.glob("*.audit.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec["pod"].startswith(NAMESPACE + "/"):
                shares[rec["worker"]] += 1
    return dict(sorted(shares.items()))


async def _overcommitted(kube: KubeClient) -> int:
    nodes = {
        n["metadata"]["name"]: node_from_json(n).allocatable
        for n in (await kube.get("/api/v1/nodes"))["items"]
    }
    used: Counter[str] = Counter()
    for obj in (await kube.get("/api/v1/pods"))["items"]:
        pod = pod_from_json(obj)
        if pod.node_name and not pod.terminal:
            used[pod.node_name] += pod.requests.milli_cpu
    return sum(1 for name, cpu in used.items() if name in nodes and cpu > nodes[name].milli_cpu)


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
                f"left running: cluster in {root} (agent-scheduler cluster down --dir {root}), schedulers {[p.pid for p in procs.procs.values()]}"
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
