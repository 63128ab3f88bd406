"""What reading the pod watch costs a Python process, by way of reading it: the floor under every worker's CPU.

Every worker reads every pod event (its topology counts are cluster-wide), and so does a standalone worker; the
leader reads every pending pod. This measures what that reading alone costs, with nothing done with the events,
beside a scheduler placing a burst, so that a design of the sharded path can be judged before it is built:

- ``cluster``: the cluster-wide watch of ``/api/v1/pods`` as the workers open it (JSON), split into lines, not
  decoded: the transport (TLS, HTTP chunks, the event loop's wake-ups);
- ``cluster-decoded``: the same, each line decoded as the workers' reflector decodes it
  (``common.kube._event``: orjson);
- ``cluster-protobuf``: the same watch in Kubernetes' protobuf encoding (``stream=watch``, length-prefixed
  frames), frames counted, not decoded: what the transport would cost in the encoding kube-scheduler uses;
- ``per-node``: one watch per node (``fieldSelector=spec.nodeName=NODE``, as each kubelet watches its pods) on
  every ``--share``-th node (2: half of them, one of two workers' shards), lines counted: what a worker would
  read if it watched the bound pods of its own nodes only.

``python -m scale.bench.watchcost [--nodes N] [--pods N] [--rounds N] [--scheduler NAME] [--share N] [--out DIR]``:
one local cluster (as ``bench paired`` builds it); a warm-up trial, not counted, then ``rounds`` trials. Each
trial starts the scheduler and one reader process per mode (``python -m scale.bench.watchcost read ...``),
waits until the scheduler is ready and the readers have settled, runs a burst (``bench cluster``'s
``run_workload``), and takes each reader's CPU (user + system, from psutil) over the burst per 1,000 pods, with
the events and bytes it read. The window is ``run_workload``'s: the burst and the deletion of its pods (each
pod's ADDED, binding, Running, deletionTimestamp and DELETED), so CPU per event is the figure to carry over to
another event mix. A reader whose stream ended before the burst did is reported as such and its
trial not averaged. ``watchcost.json`` and ``summary.md`` go to ``--out``.

Nothing is asserted; the numbers are reported. They are a floor: a real worker does more per event, and a busy
one may read several events per wake-up where an idle reader wakes once per event.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from common.kube import MAX_WATCH_EVENT, KubeClient, _event, _lines, load_credentials
from scale.bench import stages
from scale.bench.cluster import (
    BenchConfig,
    fresh_cluster,
    measured_kubeconfig,
    run_workload,
    until_ready,
    wait_quiet,
)
from scale.bench.schedulers import SCHEDULERS, grant_agent_rbac, launch
from scale.bench.workloads import BURST, default_workloads, scaled
from scale.cluster import ClusterOptions, generate_nodes
from scale.cluster.nodes import PREPULLED_FRACTION

log = logging.getLogger(__name__)

MODES = ("cluster", "cluster-decoded", "cluster-protobuf", "per-node")
MODULE = "scale.bench.watchcost"  # what the readers run (``__name__`` is "__main__" under ``-m``)
PROTOBUF_WATCH = "application/vnd.kubernetes.protobuf;stream=watch"
SETTLE_S = 20.0  # after the readers start: 500 per-node watches take seconds to open on a 2-core host
READER_STOP_S = 10.0


@dataclass(slots=True)
class Reading:
    """What one reader read, written when it stops."""

    mode: str
    watches: int = 0
    events: int = 0
    bytes: int = 0
    ended: int = 0  # streams that ended before the reader was stopped (their events stopped counting)


class FrameCounter:
    """Counts the frames of a protobuf watch stream (each a 4-byte big-endian length, then that many bytes)
    across the chunks they arrive in."""

    def __init__(self) -> None:
        self.frames = 0
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> None:
        self._buf += chunk
        start = 0
        while len(self._buf) - start >= 4:
            size = int.from_bytes(self._buf[start : start + 4], "big")
            if len(self._buf) - start - 4 < size:
                break
            start += 4 + size
            self.frames += 1
        del self._buf[:start]


def every_nth(names: Sequence[str], share: int) -> list[str]:
    """The nodes one of ``share`` workers would own: every ``share``-th of the sorted names."""
    if share < 1:
        raise ValueError(f"share must be at least 1, got {share}")
    return sorted(names)[::share]


async def _watch(
    session: aiohttp.ClientSession,
    server: str,
    reading: Reading,
    *,
    resource_version: str,
    mode: str,
    field_selector: str = "",
) -> None:
    query = {"watch": "1", "resourceVersion": resource_version, "timeoutSeconds": "3600"}
    if field_selector:
        query["fieldSelector"] = field_selector
    headers = {"Accept": PROTOBUF_WATCH} if mode == "cluster-protobuf" else None
    timeout = aiohttp.ClientTimeout(total=None)
    async with session.get(server + "/api/v1/pods", params=query, headers=headers, timeout=timeout) as resp:
        if resp.status != 200:
            raise RuntimeError(f"watch answered {resp.status}: {(await resp.read())[:200]!r}")
        reading.watches += 1
        if mode == "cluster-protobuf":
            frames = FrameCounter()
            async for chunk in resp.content.iter_any():
                reading.bytes += len(chunk)
                frames.feed(chunk)
                reading.events = frames.frames
        else:
            async for line in _lines(resp.content, MAX_WATCH_EVENT, "/api/v1/pods"):
                reading.bytes += len(line) + 1
                if line.strip():
                    reading.events += 1
                    if mode == "cluster-decoded":
                        _event(line, "/api/v1/pods")
    reading.ended += 1


async def read(mode: str, kubeconfig: str, share: int) -> dict[str, Any]:
    """Read the pod watch the ``mode`` way until SIGTERM; what was read (a ``Reading``, and why watches
    failed)."""
    reading = Reading(mode)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    creds = load_credentials(kubeconfig)
    async with KubeClient(creds) as lister:
        rv = str((await lister.get("/api/v1/pods", {"limit": "1"}))["metadata"]["resourceVersion"])
        nodes = [str(n["metadata"]["name"]) for n in (await lister.get("/api/v1/nodes"))["items"]]
    selectors = [f"spec.nodeName={node}" for node in every_nth(nodes, share)] if mode == "per-node" else [""]
    # One connection per watch (HTTP/1.1). The raw stream is read beneath ``KubeClient.watch`` (its session,
    # ``common.kube``'s line splitter and event decoder): what is measured is the transport and, by mode, the
    # decoding, with the client's TLS and authentication.
    async with KubeClient(creds, max_connections=len(selectors) + 4) as client:
        tasks = [
            asyncio.create_task(
                _watch(
                    client._session,
                    client.creds.server,
                    reading,
                    resource_version=rv,
                    mode=mode,
                    field_selector=selector,
                )
            )
            for selector in selectors
        ]
        await stop.wait()
        failed = [e for t in tasks if t.done() and not t.cancelled() and (e := t.exception()) is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return asdict(reading) | {"failed": [str(e) for e in failed]}


@dataclass(slots=True)
class ReaderResult:
    mode: str
    trial: int
    cpu_s_per_1k_pods: float
    events_per_pod: float
    bytes_per_pod: float
    watches: int
    ended: int
    failed: list[str] = field(default_factory=list)

    @property
    def cpu_us_per_event(self) -> float:
        return self.cpu_s_per_1k_pods * 1000 / self.events_per_pod if self.events_per_pod else 0.0

    @property
    def valid(self) -> bool:
        return not self.ended and not self.failed and self.watches > 0


def summary(results: Sequence[ReaderResult], scheduler_cpu: Sequence[float], share: int) -> str:
    """A Markdown table: each mode's mean (min-max) CPU-s per 1,000 pods over its valid trials, events and
    bytes per pod; then the scheduler's own CPU per 1,000 pods in the same trials, for scale."""

    def spread(values: list[float], fmt: str) -> str:
        if not values:
            return "-"
        return f"{statistics.fmean(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"

    lines = [
        "| reader | trials | CPU-s/1k pods | µs CPU/event | events/pod | KB/pod | watches |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode in MODES:
        mine = [r for r in results if r.mode == mode]
        ok = [r for r in mine if r.valid]
        if not mine:
            continue
        name = f"per-node (1 of {share} shards)" if mode == "per-node" else mode
        trials = f"{len(ok)}" + (f" (+{len(mine) - len(ok)} invalid)" if len(ok) < len(mine) else "")
        lines.append(
            f"| {name} | {trials} | {spread([r.cpu_s_per_1k_pods for r in ok], '.3f')} "
            f"| {spread([r.cpu_us_per_event for r in ok], '.0f')} "
            f"| {spread([r.events_per_pod for r in ok], '.2f')} "
            f"| {spread([r.bytes_per_pod / 1000 for r in ok], '.1f')} | {max((r.watches for r in ok), default=0)} |"
        )
    if scheduler_cpu:
        lines.append(f"\nThe scheduler itself: {spread(list(scheduler_cpu), '.3f')} CPU-s/1k pods.")
    return "\n".join(lines)


async def _stop_readers(procs: Sequence[asyncio.subprocess.Process]) -> None:
    """SIGTERM each reader still running (it writes its reading), then wait for it; kill it (our own child, by
    its PID) if it does not end in ``READER_STOP_S``."""
    for proc in procs:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            await asyncio.wait_for(proc.wait(), READER_STOP_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return {"failed": [f"no reading: {e}"]}
    return data if isinstance(data, dict) else {"failed": ["no reading"]}


@dataclass(kw_only=True, slots=True)
class WatchCostConfig:
    nodes: int = 1000
    pods: int = 2000
    rounds: int = 3
    scheduler: str = "agent-standalone"
    share: int = 2
    out: Path


async def run(config: WatchCostConfig) -> tuple[list[ReaderResult], list[float]]:
    config.out.mkdir(parents=True, exist_ok=True)
    workload = scaled(
        default_workloads(config.nodes, burst=config.pods, pods=config.pods, rate=None)[BURST],
        pull_delay_s=0.0,
    )
    fleet = generate_nodes(config.nodes, prepulled=PREPULLED_FRACTION)
    bench = BenchConfig(nodes=[config.nodes], schedulers=[config.scheduler], out=config.out, pull_delay_s=0.0)
    spec = SCHEDULERS[config.scheduler]
    results: list[ReaderResult] = []
    scheduler_cpu: list[float] = []
    cluster = await fresh_cluster(
        Path(tempfile.mkdtemp(prefix=f"bench-watchcost-{config.nodes}-")),
        config.nodes,
        ClusterOptions(),
    )
    try:
        await asyncio.to_thread(stages.install, cluster)
        async with cluster.client(qps=50000, burst=50000, max_connections=256) as client:
            kubeconfig, _ = measured_kubeconfig(cluster, await grant_agent_rbac(client))
            for trial in range(config.rounds + 1):  # trial 0: the warm-up
                running = launch(spec, cluster, config.out / "logs", kubeconfig=kubeconfig, tag=f"w{trial}")
                readers: dict[str, tuple[asyncio.subprocess.Process, Path]] = {}
                try:
                    why = await until_ready(client, spec, running, nodes=config.nodes, fleet=fleet, notes=[])
                    if why:
                        raise RuntimeError(f"{config.scheduler} did not get ready: {why}")
                    for mode in MODES:
                        out = config.out / f"reader-{trial}-{mode}.json"
                        argv = [sys.executable, "-m", MODULE, "read", mode, str(kubeconfig), str(out)]
                        argv += ["--share", str(config.share)]
                        readers[mode] = (await asyncio.create_subprocess_exec(*argv), out)
                    await asyncio.sleep(SETTLE_S)
                    await wait_quiet(cluster, running, cores=bench.quiet_cores, max_wait=30.0)
                    procs = {m: psutil.Process(p.pid) for m, (p, _) in readers.items()}
                    before = {m: sum(p.cpu_times()[:2]) for m, p in procs.items()}
                    result = await run_workload(
                        client,
                        cluster,
                        running,
                        workload,
                        nodes=config.nodes,
                        fleet=fleet,
                        config=bench,
                        notes=[],
                    )
                    after = {m: sum(p.cpu_times()[:2]) for m, p in procs.items()}
                finally:
                    running.stop()
                    await _stop_readers([proc for proc, _ in readers.values()])
                if trial == 0:
                    continue
                scheduler_cpu.append(result.cpu_s_per_1k_pods)
                pods = max(result.pods, 1)
                for mode, (_, out) in readers.items():
                    data: dict[str, Any] = _load(out)
                    results.append(
                        ReaderResult(
                            mode=mode,
                            trial=trial,
                            cpu_s_per_1k_pods=(after[mode] - before[mode]) / pods * 1000,
                            events_per_pod=int(data.get("events", 0)) / pods,
                            bytes_per_pod=int(data.get("bytes", 0)) / pods,
                            watches=int(data.get("watches", 0)),
                            ended=int(data.get("ended", 0)),
                            failed=list(data.get("failed", [])),
                        )
                    )
                log.info(
                    "trial %d: %s", trial, summary(results[-len(MODES) :], scheduler_cpu[-1:], config.share)
                )
    finally:
        await asyncio.to_thread(cluster.stop)
    return results, scheduler_cpu


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scale.bench.watchcost", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="action")
    reader = sub.add_parser("read", help="one reader (started by the run)")
    reader.add_argument("mode", choices=MODES)
    reader.add_argument("kubeconfig")
    reader.add_argument("out", type=Path)
    reader.add_argument("--share", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scheduler", default="agent-standalone")
    parser.add_argument("--share", type=int, default=2, help="per-node reads every SHARE-th node")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.share < 1 or args.nodes < 1 or args.pods < 1 or args.rounds < 1:
        parser.error("--share, --nodes, --pods and --rounds must be positive")
    if args.action == "read":
        import uvloop

        args.out.write_text(json.dumps(uvloop.run(read(args.mode, args.kubeconfig, args.share))))
        return 0
    if args.scheduler not in SCHEDULERS:
        parser.error(f"--scheduler: one of {', '.join(sorted(SCHEDULERS))}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    out = (args.out or Path("results") / f"bench-watchcost-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    config = WatchCostConfig(
        nodes=args.nodes,
        pods=args.pods,
        rounds=args.rounds,
        scheduler=args.scheduler,
        share=args.share,
        out=out,
    )
    results, scheduler_cpu = asyncio.run(run(config))
    text = summary(results, scheduler_cpu, config.share)
    (out / "watchcost.json").write_text(
        json.dumps(
            {
                "config": {k: str(v) for k, v in asdict(config).items()},
                "readers": [asdict(r) for r in results],
                "scheduler_cpu_s_per_1k_pods": scheduler_cpu,
            },
            indent=1,
        )
    )
    (out / "summary.md").write_text(
        f"Readers of the pod watch beside {config.scheduler}, bursts of {config.pods} pods on {config.nodes} "
        f"nodes, {config.rounds} trials after a warm-up; mean (min-max)\n\n{text}\n"
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
