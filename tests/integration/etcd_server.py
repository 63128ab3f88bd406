"""A real etcd server process for tests that need their own (restartable) etcd: the project's own build
(.local/bin/etcd) on free 127.0.0.1 ports with a temp data dir, stopped by the PID we started. With ``tls``
it serves https only and requires client certificates signed by the same CA (``--client-cert-auth``).

A port found free can be taken by another process before etcd binds it (the suite starts many servers and
clients). A first start that loses that race picks new ports and begins again with an empty data dir; a
restart keeps its endpoint (clients hold it), so it waits and tries the same ports again."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ETCD_BIN = ROOT / ".local" / "bin" / "etcd"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
BIND_ATTEMPTS = 5
BIND_RETRY_PAUSE = 0.5


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _PortTaken(Exception):
    """etcd exited because another process holds one of its ports."""


@dataclass(frozen=True)
class EtcdTls:
    """PEM files: the CA, etcd's serving certificate and key, and a client certificate and key it accepts."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


class EtcdServer:
    """One etcd process; ``stop``/``start`` keep ports and data dir, so a restart is the same member."""

    def __init__(self, data_dir: Path, *, tls: EtcdTls | None = None) -> None:
        self.data_dir = data_dir
        self.tls = tls
        self.client_port = _free_port()
        self.peer_port = _free_port()
        self.log_path = data_dir.with_suffix(".log")
        self._proc: subprocess.Popen[bytes] | None = None
        self._started = False

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.endpoint}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        assert not self.running
        for attempt in range(1, BIND_ATTEMPTS + 1):
            try:
                self._start_once()
            except _PortTaken:
                if attempt == BIND_ATTEMPTS:
                    raise RuntimeError(
                        f"etcd could not bind its ports in {BIND_ATTEMPTS} attempts; see {self.log_path}"
                    ) from None
                if self._started:
                    time.sleep(BIND_RETRY_PAUSE)
                else:
                    self.client_port, self.peer_port = _free_port(), _free_port()
                    shutil.rmtree(self.data_dir, ignore_errors=True)
            else:
                self._started = True
                return

    def _start_once(self) -> None:
        log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        client_url = self.url
        peer_url = f"http://127.0.0.1:{self.peer_port}"
        security = []
        context = None
        if self.tls is not None:
            t = self.tls
            security = [
                f"--cert-file={t.server_cert}",
                f"--key-file={t.server_key}",
                f"--trusted-ca-file={t.ca}",
                "--client-cert-auth",
            ]
            context = ssl.create_default_context(cafile=str(t.ca))
            context.load_cert_chain(str(t.client_cert), str(t.client_key))
        args = [
            str(ETCD_BIN),
            "--name=test",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=test={peer_url}",
            "--log-level=warn",
            *security,
        ]
        log = self.log_path.open("ab")
        try:
            self._proc = subprocess.Popen(args, stdout=log, stderr=log, start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                with self.log_path.open("rb") as f:
                    f.seek(log_offset)
                    if b"address already in use" in f.read():
                        raise _PortTaken
                raise RuntimeError(f"etcd exited with {self._proc.returncode}; see {self.log_path}")
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(f"{client_url}/health", timeout=1, context=context) as resp,
            ):
                if b'"health":"true"' in resp.read():
                    return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"etcd not healthy within {START_TIMEOUT} s; see {self.log_path}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            if proc is not None:
                proc.wait()
            return
        os.kill(proc.pid, sig)  # the PID we started, nothing else
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()
