"""Chaos on the coordinator's leadership, on the real local cluster: a leader that cannot lead gives its term up
and a standby takes over; an etcd replaced by an empty one gets a leader dispatching again.

Each scenario runs a burst through the disruption and ends with ``test_coordinator``'s invariant audit (every
pod bound exactly once, no node over its allocatable, no two workers' bindings overlapping on a node). Recovery
times are recorded as test properties and printed, never asserted; waits are bounded by generous guards.

Faults are real, not hooks: the leader's connection to the API server is cut (a TCP proxy we stop), the
leader's lease is revoked in etcd, etcd is stopped by its PID and replaced by a fresh empty one on the same
port.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from common.etcd.keys import KeyLayout
from common.etcd.kv import connect, get_prefix, kv_service, lease_service
from common.kube import KubeClient
from scale.cluster import Cluster
from scale.cluster.config import kubeconfig_document
from tests.integration.etcd_server import EtcdServer
from tests.integration.support import CuttableProxy, SchedulerProcess, wait_for
from tests.integration.test_coordinator import TTL, Deployment, audit, burst, started

pytestmark = pytest.mark.integration

PODS = 400
PROGRESS_TIMEOUT = 5  # seconds; the default (30) is for production, where a blip must not cost the term
GUARD = 120.0
OLD_REVISIONS = 300


@pytest.fixture
def chaos_etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """An etcd of the test's own: scenarios stop it, wipe it and start it again."""
    server = EtcdServer(tmp_path / "lease-etcd-data")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def deployment(cluster: Cluster, chaos_etcd: EtcdServer, tmp_path: Path) -> AsyncIterator[Deployment]:
    d = Deployment(cluster, chaos_etcd, tmp_path)
    try:
        yield d
    finally:
        codes = d.stop_all()
        logs = {n: p.tail(15) for n, p in d.procs.items()}
        assert all(c in (0, -signal.SIGKILL) for c in codes.values()), (codes, logs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def coordinator(d: Deployment, name: str, *extra: str) -> tuple[SchedulerProcess, str]:
    """A coordinator with a known metrics address (for its probes); returns it and that base URL."""
    port = _free_port()
    proc = SchedulerProcess(
        [
            "coordinator",
            *d._common(),
            f"--id={name}",
            f"--progress-timeout={PROGRESS_TIMEOUT}",
            f"--metrics-address=127.0.0.1:{port}",
            *extra,
        ],
        d.tmp / f"{name}.log",
    )
    d.procs[name] = proc
    return proc, f"http://127.0.0.1:{port}"


def probe(base: str, path: str) -> int:
    try:
        with urllib.request.urlopen(base + path, timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


async def eventually(check: Any, what: str) -> float:
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < GUARD, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)
    return time.monotonic()


async def test_leader_cut_from_the_api_server_steps_down_and_the_standby_finishes_the_burst(
    kube: KubeClient, namespace: str, cluster: Cluster, deployment: Deployment, record_property: Any
) -> None:
    d = deployment
    url = urlparse(cluster.server)
    proxy = CuttableProxy(url.hostname or "127.0.0.1", url.port or 443)
    port = await proxy.start()
    proxied = d.tmp / "proxied.kubeconfig"
    proxied.write_text(
        kubeconfig_document(
            server=f"https://127.0.0.1:{port}",
            ca_pem=cluster.ca_file.read_bytes(),
            token=cluster.token,
            user="a",
        )
    )
    try:
        leader, a = coordinator(d, "coord-a", f"--kubeconfig={proxied}")
        await d.wait_status(lambda s: s["leader"] == "coord-a", "coord-a leading")
        _, b = coordinator(d, "coord-b")
        d.worker("w1")
        d.worker("w2")
        await started(d, 2)
        await eventually(lambda: probe(a, "/readyz") == 200 and probe(b, "/readyz") == 200, "both ready")
        creating = asyncio.create_task(burst(kube, d, namespace, PODS, concurrency=16))
        await asyncio.sleep(1)
        await proxy.stop()  # coord-a's watches break and cannot reconnect; its etcd lease stays healthy
        cut = time.monotonic()
        took_over = await d.wait_status(lambda s: s["leader"] == "coord-b", "coord-b leading")
        await creating
        await audit(d, kube, namespace, PODS)
        assert "stepping down: no progress: pending-pod watch" in leader.log_path.read_text()
        # coord-a stands by again (healthy lease) and says so; it is alive, so not unhealthy.
        await eventually(lambda: probe(a, "/readyz") == 200, "coord-a a ready standby")
        assert probe(a, "/healthz") == 200 and probe(b, "/readyz") == 200
    finally:
        await proxy.stop()
    record_property("pods", PODS)
    record_property("recover_s", round(took_over - cut, 2))
    print(f"\nleader cut from the API: standby leading {took_over - cut:.2f}s after the cut ({PODS} pods)")


async def test_leader_lease_revoked_in_etcd_standby_takes_over(
    kube: KubeClient, namespace: str, deployment: Deployment, chaos_etcd: EtcdServer, record_property: Any
) -> None:
    d = deployment
    coordinator(d, "coord-a")
    await d.wait_status(lambda s: s["leader"] == "coord-a", "coord-a leading")
    coordinator(d, "coord-b")
    d.worker("w1")
    d.worker("w2")
    await started(d, 2)
    creating = asyncio.create_task(burst(kube, d, namespace, PODS, concurrency=16))
    await asyncio.sleep(1)
    etcd = await connect([chaos_etcd.endpoint])
    try:
        candidates, _ = await get_prefix(etcd, KeyLayout(d.prefix).election_prefix)
        await lease_service(etcd).revoke(candidates[0].lease, timeout=5)
    finally:
        await etcd.close()
    revoked = time.monotonic()
    took_over = await d.wait_status(lambda s: s["leader"] == "coord-b", "coord-b leading")
    await creating
    await audit(d, kube, namespace, PODS)
    record_property("pods", PODS)
    record_property("recover_s", round(took_over - revoked, 2))
    print(f"\nleader lease revoked: standby leading {took_over - revoked:.2f}s later ({PODS} pods)")


@pytest.mark.slow
async def test_etcd_replaced_by_an_empty_one_gets_a_leader_dispatching_again(
    kube: KubeClient, namespace: str, deployment: Deployment, chaos_etcd: EtcdServer, record_property: Any
) -> None:
    d = deployment
    # A long-lived etcd has a high revision, so the terms it gave out are high; the replacement starts at 1.
    etcd = await connect([chaos_etcd.endpoint])
    try:
        for i in range(OLD_REVISIONS):
            await kv_service(etcd).put(f"/history/{i}", b"", timeout=5)
    finally:
        await etcd.close()
    coordinator(d, "coord-a")
    coordinator(d, "coord-b")
    d.worker("w1")
    d.worker("w2")
    await started(d, 2)
    await burst(kube, d, namespace, PODS // 2, concurrency=16)
    await audit(d, kube, namespace, PODS // 2)
    chaos_etcd.stop()
    shutil.rmtree(chaos_etcd.data_dir)  # the same port, nothing of the old state
    chaos_etcd.start()
    replaced = time.monotonic()
    await started(d, 2)
    leading = time.monotonic()
    await burst(kube, d, namespace, PODS // 2, start=PODS // 2, concurrency=16)
    await wait_for(
        kube,
        namespace,
        lambda pods: sum(1 for p in pods if p["spec"].get("nodeName")) > PODS // 2,
        timeout=2 * TTL + GUARD,
        what="a pod bound after the replacement",
    )
    dispatching = time.monotonic()
    await audit(d, kube, namespace, PODS)
    record_property("pods", PODS)
    record_property("recover_s", round(dispatching - replaced, 2))
    print(
        f"\netcd replaced by an empty one: leader and workers back {leading - replaced:.2f}s, first binding "
        f"{dispatching - replaced:.2f}s after the replacement ({PODS} pods)"
    )
