"""The chart's etcd TLS, run for real: three members of the pinned etcd on 127.0.0.1 with the chart's TLS flags
and the certificates it generates form a cluster over peer mutual TLS, and answer a client holding the
scheduler's client certificate, and refuse one without it. (In a cluster the members' names are the headless
Service's DNS names; here 127.0.0.1, which the chart's server certificate also names.)"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.integration.etcd_server import ETCD_BIN
from tests.unit.install.chart import one, render

pytestmark = pytest.mark.integration

MEMBERS = 3
START_TIMEOUT = 60.0
TLS_FLAGS = ("--client-cert-auth", "--peer-client-cert-auth")
TLS_FILE_FLAGS = (
    "--trusted-ca-file", "--cert-file", "--key-file", "--peer-trusted-ca-file", "--peer-cert-file", "--peer-key-file",
)  # fmt: skip


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def health(port: int, ctx: ssl.SSLContext) -> bool:
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/health", context=ctx, timeout=3) as reply:
            return bool(json.loads(reply.read()).get("health") == "true")
    except (urllib.error.URLError, OSError, ValueError):
        return False


def test_members_form_a_tls_cluster_and_serve_the_scheduler_client(tmp_path: Path) -> None:
    docs = render()
    tls = tmp_path / "tls"
    tls.mkdir()
    for secret in ("server", "client"):
        data = one(docs, "Secret", f"agent-scheduler-etcd-{secret}-tls")["data"]
        for key, value in data.items():
            (tls / f"{secret}-{key}").write_bytes(base64.b64decode(value))
    chart_args = one(docs, "StatefulSet", "agent-scheduler-etcd")["spec"]["template"]["spec"]["containers"][
        0
    ]["args"]
    # The chart's TLS flags, its files mounted at /etc/etcd/tls/server/ here in tmp_path.
    tls_args = [a for a in chart_args if a in TLS_FLAGS]
    for arg in chart_args:
        flag, _, value = arg.partition("=")
        if flag in TLS_FILE_FLAGS:
            tls_args.append(f"{flag}={tls / ('server-' + Path(value).name)}")
    assert len(tls_args) == len(TLS_FLAGS) + len(TLS_FILE_FLAGS)

    ports = [(free_port(), free_port()) for _ in range(MEMBERS)]
    cluster = ",".join(f"m{i}=https://127.0.0.1:{peer}" for i, (_, peer) in enumerate(ports))
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for i, (client, peer) in enumerate(ports):
            args = [
                str(ETCD_BIN), f"--name=m{i}", f"--data-dir={tmp_path / f'm{i}'}",
                f"--listen-client-urls=https://127.0.0.1:{client}", f"--advertise-client-urls=https://127.0.0.1:{client}",
                f"--listen-peer-urls=https://127.0.0.1:{peer}", f"--initial-advertise-peer-urls=https://127.0.0.1:{peer}",
                f"--initial-cluster={cluster}", "--initial-cluster-state=new", "--initial-cluster-token=chart-test",
                *tls_args,
            ]  # fmt: skip
            with (tmp_path / f"m{i}.log").open("wb") as log:
                processes.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT))

        scheduler = ssl.create_default_context(cafile=str(tls / "client-ca.crt"))
        scheduler.load_cert_chain(str(tls / "client-tls.crt"), str(tls / "client-tls.key"))
        deadline = time.monotonic() + START_TIMEOUT
        while not all(health(client, scheduler) for client, _ in ports):
            dead = [p.args for p in processes if p.poll() is not None]
            assert not dead and time.monotonic() < deadline, (tmp_path / "m0.log").read_text()[-3000:]
            time.sleep(0.5)

        anonymous = ssl.create_default_context(cafile=str(tls / "client-ca.crt"))
        assert not health(ports[0][0], anonymous), "a client without a certificate must be refused"
    finally:
        for p in processes:
            p.terminate()
        for p in processes:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
