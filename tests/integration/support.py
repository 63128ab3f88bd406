"""Helpers for integration tests: scheduler processes (started and stopped by PID with the scale tooling's
launcher, ``scale.cluster.processes``), ``agent-scheduler bench`` run as a subprocess, pod creation, waiting,
the capacity audit read back from the API server (``scale.audit``), and a TCP proxy whose connections a test
can cut."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from common.kube import KubeClient, NotFound
from scale.audit import Audit, audit_capacity
from scale.cluster import Cluster
from scale.cluster.processes import is_running, spawn, stop, tail

# Audit and audit_capacity are re-exported: the tests import the capacity audit from here.
__all__ = [
    "ROOT",
    "Audit",
    "CuttableProxy",
    "SchedulerProcess",
    "all_bound",
    "audit_capacity",
    "bench_env",
    "create_pods",
    "list_pods",
    "priority_classes",
    "run_bench",
    "start_worker",
    "wait_for",
]

ROOT = Path(__file__).resolve().parents[2]


class SchedulerProcess:
    """``agent-scheduler <args>`` in its own process; logs to a file; stopped by its PID.

    ``wrapper`` is a command line put in front (it must ``exec`` the scheduler in place, so that the recorded PID
    stays the scheduler's); ``env`` replaces the environment."""

    def __init__(
        self,
        args: list[str],
        log_path: Path,
        *,
        wrapper: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.log_path = log_path
        command = [*wrapper, sys.executable, "-m", "agent_scheduler.cli", *args]
        self.record = spawn(log_path.stem, command, log_path, env=env, cwd=ROOT)

    @property
    def pid(self) -> int:
        return self.record.pid

    def alive(self) -> bool:
        return is_running(self.record)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        """Send ``sig`` (SIGKILL after ``timeout``); the exit status."""
        return stop([self.record], grace=timeout, sig=sig)[0].code

    def tail(self, lines: int = 40) -> str:
        return tail(self.log_path, lines)


def bench_env(out: Path) -> dict[str, str]:
    """The environment of a test's bench: its own lock file (``scale.bench.lock``), so a benchmark running on
    the machine does not refuse the test's (which measures nothing a concurrent run could spoil)."""
    return {**os.environ, "AGENT_SCHEDULER_BENCH_LOCK": str(out.parent / "bench.lock")}


def run_bench(subcommand: str, out: Path, *args: str, timeout: float) -> None:
    """``agent-scheduler bench <subcommand> <args> --out=<out>`` as a subprocess (it starts its own clusters
    on free ports and stops them at the end); it must exit 0. ``timeout`` guards against a hang: it is not a
    speed requirement."""
    cmd = [sys.executable, "-m", "agent_scheduler.cli", "bench", subcommand, *args, f"--out={out}"]
    proc = subprocess.run(
        cmd, cwd=ROOT, env=bench_env(out), capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def start_worker(
    cluster: Cluster,
    tmp_path: Path,
    name: str,
    *,
    kubeconfig: Path | None = None,
    worker_id: str = "test-worker",
) -> SchedulerProcess:
    """A standalone worker for scheduler name ``name`` on the test cluster, logging to ``tmp_path``."""
    return SchedulerProcess(
        [
            "--log-level=INFO",
            "worker",
            "--standalone",
            f"--kubeconfig={kubeconfig or cluster.kubeconfig}",
            f"--scheduler-name={name}",
            f"--id={worker_id}",
        ],
        tmp_path / f"{name}.log",
    )


async def create_pods(
    kube: KubeClient, namespace: str, pods: list[dict[str, Any]], concurrency: int = 32
) -> None:
    sem = asyncio.Semaphore(concurrency)

    async def one(pod: dict[str, Any]) -> None:
        async with sem:
            await kube.post(f"/api/v1/namespaces/{namespace}/pods", pod)

    await asyncio.gather(*(one(p) for p in pods))


async def list_pods(kube: KubeClient, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = (await kube.get(f"/api/v1/namespaces/{namespace}/pods")).get("items", [])
    return items


async def wait_for(
    kube: KubeClient, namespace: str, predicate: Any, *, timeout: float, what: str
) -> list[dict[str, Any]]:
    """Poll the namespace's pods until ``predicate(pods)`` holds; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        pods = await list_pods(kube, namespace)
        if predicate(pods):
            return pods
        if time.monotonic() > deadline:
            bound = sum(1 for p in pods if p["spec"].get("nodeName"))
            raise AssertionError(f"timed out waiting for {what}: {bound}/{len(pods)} pods bound")
        await asyncio.sleep(0.5)


def all_bound(n: int) -> Any:
    return lambda pods: len(pods) == n and all(p["spec"].get("nodeName") for p in pods)


@contextlib.asynccontextmanager
async def priority_classes(
    kube: KubeClient, prefix: str, values: Mapping[str, int], *, never: Collection[str] = ()
) -> AsyncIterator[dict[str, str]]:
    """PriorityClasses ``<prefix>-<key>`` of the given values (those in ``never`` with ``preemptionPolicy:
    Never``), deleted on exit; yields key -> class name. PriorityClasses are cluster-scoped: the caller makes the
    prefix unique per run."""
    names = {k: f"{prefix}-{k}" for k in values}
    try:
        for k, value in values.items():
            body: dict[str, Any] = {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": names[k]},
                "value": value,
            }
            if k in never:
                body["preemptionPolicy"] = "Never"
            await kube.post("/apis/scheduling.k8s.io/v1/priorityclasses", body)
        yield names
    finally:
        for name in names.values():
            with contextlib.suppress(NotFound):
                await kube.delete(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")


class CuttableProxy:
    """A loopback TCP proxy to the API server. ``cut()`` closes every open connection at once, as a network
    blip would: watches break mid-stream and requests in flight fail."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0
        self.cuts = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            w.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}

    def cut(self) -> int:
        n = len(self._writers)
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()
        self.cuts += 1
        return n

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
