"""Processes are started into their own log, recognised by PID and start time, and stopped by PID."""

from __future__ import annotations

import dataclasses
import signal
import sys
import time
from pathlib import Path

from scale.cluster import processes
from scale.cluster.processes import ProcessRecord, exit_code, is_running, spawn, tail, terminate

IGNORES_SIGTERM = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ignoring SIGTERM', flush=True)\n"
    "time.sleep(60)\n"
)


def _wait_for_line(path: Path, text: str) -> None:
    deadline = time.monotonic() + 10
    while text not in tail(path) and time.monotonic() < deadline:
        time.sleep(0.02)


def test_spawn_logs_and_terminate(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "sleeper.log"
    record = spawn(
        "sleeper", [sys.executable, "-c", "print('hello', flush=True); import time; time.sleep(60)"], log
    )
    try:
        assert is_running(record)
        _wait_for_line(log, "hello")
        assert tail(log) == "hello"
    finally:
        killed = terminate([record], grace=5)
    assert killed == []
    assert not is_running(record)


def test_sigkill_after_grace(tmp_path: Path) -> None:
    log = tmp_path / "stubborn.log"
    record = spawn("stubborn", [sys.executable, "-c", IGNORES_SIGTERM], log)
    _wait_for_line(log, "ignoring SIGTERM")
    started = time.monotonic()
    assert terminate([record], grace=0.3) == ["stubborn"]
    assert time.monotonic() - started < 5
    assert not is_running(record)


def test_exit_code_of_a_child(tmp_path: Path) -> None:
    record = spawn("fails", [sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "fails.log")
    deadline = time.monotonic() + 10
    code = None
    while code is None and time.monotonic() < deadline:
        code = exit_code(record)
        time.sleep(0.02)
    assert code == 3
    assert not is_running(record)


def test_reused_pid_is_not_ours(tmp_path: Path) -> None:
    record = spawn("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "s.log")
    try:
        # Same PID, other start time: what state.json would say after the PID was reused.
        stranger = dataclasses.replace(record, create_time=record.create_time - 1000)
        child = processes._children.pop(record.pid)  # look at it the way another interpreter would
        try:
            assert is_running(record)
            assert not is_running(stranger)
            assert terminate([stranger], grace=0.1) == []
            assert is_running(record), "a process that is not ours is never signalled"
        finally:
            processes._children[record.pid] = child
    finally:
        terminate([record], grace=5)


def test_record_round_trip_and_tail_limits(tmp_path: Path) -> None:
    record = ProcessRecord("x", 123, 456.5, ("a", "b"), "/tmp/x.log")
    assert ProcessRecord.from_json(record.to_json()) == record
    log = tmp_path / "many.log"
    log.write_text("".join(f"line {i}\n" for i in range(200)))
    lines = tail(log).splitlines()
    assert len(lines) == 50 and lines[-1] == "line 199" and lines[0] == "line 150"
    assert tail(tmp_path / "missing.log") == ""


def test_stop_reports_exit_status_and_log_tail_of_failures(tmp_path: Path) -> None:
    clean = spawn("clean", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "clean.log")
    failed = spawn(
        "failed", [sys.executable, "-c", "print('boom', flush=True); raise SystemExit(2)"], tmp_path / "f.log"
    )
    deadline = time.monotonic() + 10
    while exit_code(failed) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    outcome = processes.stop([clean, failed], grace=5)
    assert [s.name for s in outcome] == ["clean", "failed"]
    assert outcome[0].code == -signal.SIGTERM and not outcome[0].killed and outcome[0].log_tail == ""
    assert outcome[1].code == 2 and not outcome[1].killed and outcome[1].log_tail == "boom"
    assert exit_code(failed) == 2, "the exit status stays readable after the child was reaped"


def test_stop_with_another_first_signal(tmp_path: Path) -> None:
    log = tmp_path / "stubborn.log"
    record = spawn("stubborn", [sys.executable, "-c", IGNORES_SIGTERM], log)
    _wait_for_line(log, "ignoring SIGTERM")
    [outcome] = processes.stop([record], grace=5, sig=signal.SIGKILL)
    assert outcome.code == -signal.SIGKILL and not outcome.killed
    assert not processes.send(record, signal.SIGTERM), "an exited process is not signalled"
