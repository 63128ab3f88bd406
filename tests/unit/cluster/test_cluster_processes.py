"""Processes are started into their own log, recognised by PID and start time, and stopped by PID."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

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


@contextlib.contextmanager
def _as_another_interpreter(record: ProcessRecord) -> Iterator[None]:
    """Look at ``record`` the way a later ``cluster down`` in another interpreter would (no Popen for it)."""
    child = processes._children.pop(record.pid)
    try:
        yield
    finally:
        processes._children[record.pid] = child


def test_reused_pid_is_not_ours(tmp_path: Path) -> None:
    record = spawn("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "s.log")
    try:
        assert record.start_ticks is not None and record.boot
        # Same PID, another start tick, or another boot: what state.json would say after the PID was reused.
        strangers = [
            dataclasses.replace(record, start_ticks=record.start_ticks - 1),
            dataclasses.replace(record, boot="another-boot"),
        ]
        with _as_another_interpreter(record):
            assert is_running(record)
            for stranger in strangers:
                assert not is_running(stranger)
                assert terminate([stranger], grace=0.1) == []
            assert is_running(record), "a process that is not ours is never signalled"
    finally:
        terminate([record], grace=5)


def test_a_stepped_clock_does_not_make_our_process_a_stranger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = spawn("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "s.log")
    try:
        # psutil's create_time() adds the boot time, which /proc/stat derives from the wall clock: a clock
        # stepped by an hour moves it by an hour. Identified by it, the process would be left running.
        import psutil._pslinux as pslinux

        boot = pslinux.boot_time()
        monkeypatch.setattr(pslinux, "boot_time", lambda: boot + 3600)
        with _as_another_interpreter(record):
            assert is_running(record)
            assert terminate([record], grace=5) == []
            assert not is_running(record)
    finally:
        terminate([record], grace=5)


def test_a_record_without_ticks_is_recognised_by_its_create_time(tmp_path: Path) -> None:
    # A state.json written before the start ticks were recorded: compared by create_time, as then.
    record = spawn("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "s.log")
    try:
        old = ProcessRecord.from_json(
            {k: v for k, v in record.to_json().items() if k not in ("start_ticks", "boot")}
        )
        assert old.start_ticks is None and old.boot is None
        stranger = dataclasses.replace(old, create_time=old.create_time - 1000)
        with _as_another_interpreter(record):
            assert is_running(old)
            assert not is_running(stranger)
    finally:
        terminate([record], grace=5)


def test_record_round_trip_and_tail_limits(tmp_path: Path) -> None:
    record = ProcessRecord("x", 123, 456.5, ("a", "b"), "/tmp/x.log", 789, "boot")
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


# A command that started something and stops it in a ``finally`` block, as a benchmark stops its cluster: the
# cleanup awaits (``asyncio.to_thread``), as ``run_paired``'s does.
STOPS_IN_FINALLY = """
import asyncio, pathlib, sys
from scale.cluster.processes import stop_on_sigterm
if sys.argv[2] == "handled":
    stop_on_sigterm()
marker = pathlib.Path(sys.argv[1])

async def main():
    try:
        print("started", flush=True)
        await asyncio.sleep(60)
    finally:
        await asyncio.to_thread(marker.write_text, "stopped what it started")

asyncio.run(main())
"""


@pytest.mark.parametrize("handled", [True, False])
def test_sigterm_runs_the_cleanup_only_after_stop_on_sigterm(tmp_path: Path, handled: bool) -> None:
    marker = tmp_path / "cleaned"
    log = tmp_path / "command.log"
    argv = [sys.executable, "-c", STOPS_IN_FINALLY, str(marker), "handled" if handled else "default"]
    record = spawn("command", argv, log, cwd=Path(__file__).resolve().parents[3])
    try:
        _wait_for_line(log, "started")
        assert "started" in tail(log)
        processes.send(record, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while is_running(record) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not is_running(record)
        # handled: the cleanup ran (KeyboardInterrupt, as Ctrl-C); default: the interpreter ended at once
        assert marker.exists() == handled
        assert (exit_code(record) == -signal.SIGTERM) == (not handled)
    finally:
        terminate([record])


# A benchmark stopped with kill while its cluster is still starting: ``start_cluster_async`` alone must give it
# the Ctrl-C answer (the script calls no ``stop_on_sigterm``) and stop the cluster its thread goes on making,
# however many signals come. ``start_cluster`` is replaced by a start that lasts until the test lets it end
# (file ``go``), whose cluster writes the marker when stopped.
KILLED_WHILE_STARTING = """
import asyncio, pathlib, sys, time
from scale.cluster import lifecycle
marker, go = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])

class Started:
    dir = "nowhere"

    def stop(self):
        marker.write_text("stopped the cluster started meanwhile")

def slow_start(*args, **kwargs):
    print("starting", flush=True)
    deadline = time.monotonic() + 30
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return Started()

lifecycle.start_cluster = slow_start

async def main():
    await lifecycle.start_cluster_async("unused", nodes=1)
    await asyncio.sleep(60)

asyncio.run(main())
"""


@pytest.mark.parametrize("signals", [1, 2])
def test_a_command_killed_while_its_cluster_starts_stops_that_cluster(tmp_path: Path, signals: int) -> None:
    marker, go = tmp_path / "cleaned", tmp_path / "go"
    log = tmp_path / "command.log"
    argv = [sys.executable, "-c", KILLED_WHILE_STARTING, str(marker), str(go)]
    record = spawn("command", argv, log, cwd=Path(__file__).resolve().parents[3])
    try:
        _wait_for_line(log, "starting")
        assert "starting" in tail(log)
        for _ in range(signals):  # a second one while the first one's cleanup waits for the start
            processes.send(record, signal.SIGTERM)
            time.sleep(0.3)
        assert is_running(record), "the start has not ended: the interpreter waits for its thread"
        go.touch()
        deadline = time.monotonic() + 10
        while is_running(record) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not is_running(record)
        assert marker.exists(), tail(log)
        assert exit_code(record) != -signal.SIGTERM
    finally:
        terminate([record])


def test_starting_a_cluster_makes_sigterm_a_keyboard_interrupt_even_when_the_start_fails(
    tmp_path: Path,
) -> None:
    # in a fresh interpreter: the handler is process-wide
    probe = (
        "import signal, sys\n"
        "from pathlib import Path\n"
        "from scale.cluster import ClusterOptions, start_cluster\n"
        "from scale.cluster.errors import ClusterError\n"
        "assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL\n"
        "try:\n"
        "    start_cluster(sys.argv[1], options=ClusterOptions(bin_dir=Path(sys.argv[2])))\n"
        "except ClusterError:\n"
        "    pass\n"
        "print(signal.getsignal(signal.SIGTERM) is signal.default_int_handler)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "c"), str(tmp_path / "nowhere")],
        cwd=Path(__file__).resolve().parents[3],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "True", out.stderr


def test_stop_on_sigterm_keeps_a_handler_of_the_interpreters_own() -> None:
    def own(signum: int, frame: object) -> None:
        pass

    previous = signal.signal(signal.SIGTERM, own)
    try:
        processes.stop_on_sigterm()
        assert signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_stop_on_sigterm_does_nothing_off_the_main_thread() -> None:
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        errors: list[BaseException] = []

        def call() -> None:
            try:
                processes.stop_on_sigterm()
            except BaseException as e:  # signal.signal off the main thread raises ValueError
                errors.append(e)

        thread = threading.Thread(target=call)
        thread.start()
        thread.join()
        assert not errors
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        processes.stop_on_sigterm()  # the main thread: it takes
        assert signal.getsignal(signal.SIGTERM) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGTERM, previous)
