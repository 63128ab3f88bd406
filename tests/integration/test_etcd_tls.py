"""The coordinator and a worker against a TLS etcd that requires client certificates (and, later in the
module, etcd's user/password auth), binding a small burst on the real local cluster; a worker started before
etcd is reachable waits for it instead of exiting; a misconfigured etcd client says what is wrong in one line.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from common.etcd.kv import EtcdSecurity, connect
from common.kube import KubeClient
from coordinator.status import collect
from scale.cluster import Cluster
from tests.integration.etcd_pki import etcd_tls
from tests.integration.etcd_server import EtcdServer
from tests.integration.support import SchedulerProcess
from tests.integration.test_coordinator import Deployment, audit, burst, started

pytestmark = pytest.mark.integration

PODS = 100
GUARD = 60.0  # hang guard for waits on a process's log


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """Not started: the first test starts it after its worker is already waiting."""
    d = tmp_path_factory.mktemp("tls-etcd")
    server = EtcdServer(d / "data", tls=etcd_tls(d / "pki"))
    try:
        yield server
    finally:
        server.stop()


def security(server: EtcdServer, **overrides: str) -> EtcdSecurity:
    tls = server.tls
    assert tls is not None
    values = {"ca_file": str(tls.ca), "cert_file": str(tls.client_cert), "key_file": str(tls.client_key)}
    return EtcdSecurity(**{**values, **overrides})


def flags(s: EtcdSecurity) -> list[str]:
    out = [f"--etcd-cafile={s.ca_file}", f"--etcd-certfile={s.cert_file}", f"--etcd-keyfile={s.key_file}"]
    if s.user:
        out += [f"--etcd-user={s.user}", f"--etcd-password-file={s.password_file}"]
    return out


class TlsDeployment(Deployment):
    """``Deployment`` whose processes reach etcd over https with the test's certificates."""

    def __init__(self, cluster: Cluster, etcd: EtcdServer, tmp: Path, sec: EtcdSecurity) -> None:
        super().__init__(cluster, etcd, tmp)
        self.security = sec

    def _common(self) -> list[str]:
        return [
            *(
                f"--etcd-endpoints={self.etcd.url}" if a.startswith("--etcd-endpoints") else a
                for a in super()._common()
            ),
            *flags(self.security),
        ]

    async def status(self) -> dict[str, Any]:
        return await collect([self.etcd.url], self.prefix, self.security)


@pytest.fixture
async def tls_deployment(
    cluster: Cluster, tls_etcd: EtcdServer, tmp_path: Path
) -> AsyncIterator[TlsDeployment]:
    d = TlsDeployment(cluster, tls_etcd, tmp_path, security(tls_etcd))
    try:
        yield d
    finally:
        d.stop_all()


async def wait_log(proc: SchedulerProcess, text: str) -> None:
    deadline = time.monotonic() + GUARD
    while text not in proc.log_path.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"{text!r} not logged: {proc.tail()}"
        await asyncio.sleep(0.2)


async def test_a_burst_over_mutual_tls_and_a_worker_that_waits_for_etcd(
    kube: KubeClient, namespace: str, tls_deployment: TlsDeployment, tls_etcd: EtcdServer
) -> None:
    d = tls_deployment
    worker = d.worker("w1")  # etcd is not up yet: the worker must wait, not crash-loop
    await wait_log(worker, "not reachable yet")
    await asyncio.sleep(1)
    assert worker.alive(), worker.tail()
    tls_etcd.start()
    d.coordinator("coord-a")
    await started(d, 1)
    await burst(kube, d, namespace, PODS)
    await audit(d, kube, namespace, PODS)
    assert "Traceback" not in worker.log_path.read_text()


async def test_a_wrong_ca_is_retried_in_one_line_and_a_plain_endpoint_is_refused(
    tls_deployment: TlsDeployment, tls_etcd: EtcdServer, tmp_path: Path
) -> None:
    if not tls_etcd.running:
        tls_etcd.start()
    d = tls_deployment
    tls = tls_etcd.tls
    assert tls is not None
    d.security = security(tls_etcd, ca_file=str(tls.client_cert))  # not the CA that signed etcd's certificate
    wrong = d.worker("wrong-ca")
    await wait_log(wrong, "CERTIFICATE_VERIFY_FAILED")
    await asyncio.sleep(2)  # retries go on quietly
    text = wrong.log_path.read_text()
    assert wrong.alive() and text.count("not reachable yet") == 1 and "Traceback" not in text, text
    assert "Handshake failed" not in text  # gRPC's own per-attempt logging is off
    plain = SchedulerProcess(
        ["status", f"--etcd-endpoints=https://{tls_etcd.endpoint}"], tmp_path / "status-plain.log"
    )
    await wait_exit(plain)
    assert plain.stop() == 2 and "--etcd-cafile" in plain.tail() and "Traceback" not in plain.tail()


async def wait_exit(proc: SchedulerProcess) -> None:
    deadline = time.monotonic() + GUARD
    while proc.alive():
        assert time.monotonic() < deadline, proc.tail()
        await asyncio.sleep(0.2)


async def test_etcd_user_and_password(
    kube: KubeClient, namespace: str, tls_deployment: TlsDeployment, tls_etcd: EtcdServer, tmp_path: Path
) -> None:
    """Runs last in the module: it turns etcd's auth on."""
    if not tls_etcd.running:
        tls_etcd.start()
    admin = await connect([tls_etcd.url], security(tls_etcd))
    try:
        assert admin.auth is not None
        await admin.auth.user_add("root", "s3cret")
        await admin.auth.user_grant_role("root", "root")
        await admin.auth.auth_enable()
    finally:
        await admin.close()
    (tmp_path / "good").write_text("s3cret\n")
    (tmp_path / "bad").write_text("guess\n")
    good = security(tls_etcd, user="root", password_file=str(tmp_path / "good"))
    status = await collect([tls_etcd.url], "/nothing-here", good)
    assert status["leader"] is None
    d = tls_deployment
    d.security = good  # the processes authenticate as root (their certificate alone would say root, too)
    d.coordinator("coord-a")
    d.worker("w1")
    await started(d, 1)
    await burst(kube, d, namespace, PODS // 2)
    await audit(d, kube, namespace, PODS // 2)
    d.security = security(tls_etcd, user="root", password_file=str(tmp_path / "bad"))
    worker = d.worker("bad-password")
    await wait_exit(worker)
    text = worker.log_path.read_text()
    assert worker.stop() == 2, text
    assert "etcd refused user 'root'" in text and "Traceback" not in text, text
