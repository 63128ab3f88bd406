"""The command line as an operator meets it: ``--version``, one-line errors instead of tracebacks, and SIGTERM
while a service starts stopping it with exit 0."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agent_scheduler import cli


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_version_is_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == 0
    assert out.strip() == f"agent-scheduler {cli.version()}"
    assert cli.version() != "unknown"


def test_a_bad_flag_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "status", "--no-such-flag")
    assert code == 2
    assert err.count("\n") == 1
    assert "unrecognized arguments: --no-such-flag" in err


def test_a_bad_flag_value_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "worker", "--lease-ttl", "ten")
    assert code == 2
    assert err.count("\n") == 1
    assert "--lease-ttl" in err


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "no such file"),
        ("", "empty"),
        (":::: not yaml [", "current-context"),
        ("apiVersion: v1\nkind: Config\nclusters: []\n", "current-context"),
    ],
)
def test_a_bad_kubeconfig_is_one_line_exit_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str | None, expected: str
) -> None:
    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_text(content)
    for role in ("worker", "coordinator"):
        code, _, err = run(capsys, role, "--kubeconfig", str(path))
        assert code == 1
        assert err.count("\n") == 1, err
        assert err.startswith(f"agent-scheduler {role}: error: kubeconfig {path}")
        assert expected in err
        assert "Traceback" not in err


def test_a_directory_as_kubeconfig(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "worker", "--kubeconfig", str(tmp_path))
    assert (code, err.count("\n")) == (1, 1)
    assert "not a file" in err


def test_no_kubeconfig_outside_a_pod(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code, _, err = run(capsys, "coordinator")
    assert (code, err.count("\n")) == (1, 1)
    assert "not running in a pod" in err


def test_development_commands_without_scale_say_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # An installation without the scale package (the container image): importing it fails.
    for name in [m for m in sys.modules if m == "scale" or m.startswith("scale.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "scale", None)
    for command in ("cluster", "bench", "demo"):
        code, _, err = run(capsys, command, "--help")
        assert (code, err.count("\n")) == (1, 1), err
        assert "development command" in err


# ---- SIGTERM while a command starts ----

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""
HANG = 60.0  # a guard against hanging, never a speed requirement


def start(tmp_path: Path, *argv: str) -> tuple[subprocess.Popen[bytes], Path]:
    """Start ``agent-scheduler *argv`` against an API server and an etcd that do not answer (port 1)."""
    kubeconfig, log = tmp_path / "kubeconfig", tmp_path / "stderr"
    kubeconfig.write_text(KUBECONFIG)
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agent_scheduler.cli",
                *argv,
                *("--kubeconfig", str(kubeconfig), "--etcd-endpoints", "127.0.0.1:1"),
                *("--metrics-address", "127.0.0.1:0"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    return proc, log


def until(condition: Callable[[], bool], what: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + HANG
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            pytest.fail(f"never {what} (exit {proc.returncode})")
        time.sleep(0.001)


def importing_the_command(pid: int) -> bool:
    """Whether the process is within the subcommand's imports: uvloop's extension is mapped, imported with
    ``common.aiotools`` about 50 ms into both commands' 0.5 s of imports here (``python -X importtime``)."""
    return "uvloop/loop." in Path(f"/proc/{pid}/maps").read_text()


def stopped(proc: subprocess.Popen[bytes], log: Path) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(HANG)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail("SIGTERM did not stop it")
    err = log.read_text()
    assert code == 0, err
    assert "Traceback" not in err
    return err


def test_sigterm_while_the_coordinator_waits_for_etcd_stops_it_with_exit_0(tmp_path: Path) -> None:
    # Waiting for etcd comes before the coordinator's event loop takes SIGTERM over: a start abandoned.
    proc, log = start(tmp_path, "coordinator")
    until(lambda: "not reachable yet" in log.read_text(), "waited for etcd", proc)
    err = stopped(proc, log)
    assert "agent-scheduler coordinator: stopped by SIGTERM while starting" in err


@pytest.mark.skipif(
    not Path("/proc/self/maps").exists(), reason="reads the process's mappings from Linux's /proc"
)
def test_sigterm_during_the_workers_imports_stops_it_with_exit_0(tmp_path: Path) -> None:
    # The window the CI run that found this failed in: a worker stopped while importing its modules.
    proc, log = start(tmp_path, "worker")
    until(lambda: importing_the_command(proc.pid), "imported its command", proc)
    err = stopped(proc, log)
    assert "agent-scheduler worker: stopped by SIGTERM while starting" in err
    assert "not reachable yet" not in err  # it landed before the wait for etcd


def test_a_second_sigterm_while_the_first_unwinds_the_start_changes_nothing(tmp_path: Path) -> None:
    proc, log = start(tmp_path, "coordinator")
    until(lambda: "not reachable yet" in log.read_text(), "waited for etcd", proc)
    proc.send_signal(signal.SIGTERM)
    for _ in range(10):  # more over the next 20 ms, while it unwinds and exits (a zombie ignores them)
        time.sleep(0.002)
        proc.send_signal(signal.SIGTERM)
    err = stopped(proc, log)
    assert err.count("stopped by SIGTERM while starting") == 1
