"""Starting, watching and stopping OS processes, by PID only: the one launcher of the scale tooling.

The local cluster's components, the benchmark's schedulers, the demo's schedulers and the integration tests'
schedulers are all started with ``spawn`` and stopped with ``stop``/``terminate``. A started process is
described by a ``ProcessRecord`` (name, pid, start time, command, log file); the cluster writes its records to
``state.json``, so a later ``cluster down`` in another interpreter can stop them.

Invariants:
- A process is identified by ``(pid, start_ticks)``, the kernel's start time in clock ticks since boot
  (``/proc/PID/stat``): a recorded PID whose current owner started at another tick belongs to someone else (PID
  reuse) and is never signalled. Not psutil's ``create_time()``, a wall-clock time: it adds the boot time,
  which ``/proc/stat`` derives from the wall clock, so after the clock was stepped our own process would look
  like a stranger and be left running. ``create_time`` is still recorded (when it started, for people); a
  record without ticks (a ``state.json`` written before they were recorded) is compared by it, within
  ``_CREATE_TIME_TOLERANCE``, and a record read after a reboot never matches (another boot's ticks).
- Signals go to single PIDs we started: never to a process group, never by name.
- Processes start in their own session (``start_new_session``), so a Ctrl-C in the terminal that ran
  ``cluster up`` does not take the cluster down with it, and their output goes to one log file each.
- An interpreter that starts a cluster (``start_cluster``: a benchmark, the demo, the test session) answers
  SIGTERM as it answers Ctrl-C (``stop_on_sigterm``), so that its cleanup runs instead of leaving the cluster
  and its schedulers running.
- Children started by this interpreter are kept in ``_children``, so that ``Popen`` objects are never
  collected while their process runs (no ResourceWarning), exited children are reaped (no zombies) and
  their exit status stays readable after they were reaped.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

log = logging.getLogger(__name__)

DEFAULT_GRACE = 10.0
TAIL_LINES = 50
_CREATE_TIME_TOLERANCE = 0.5
_POLL = 0.05

# Children of this interpreter, by pid, until they are reaped (see the module docstring).
_children: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    """A process this package started."""

    name: str
    pid: int
    create_time: float
    command: tuple[str, ...]
    log: str
    #: start time in clock ticks since boot (``start_ticks``); None in records written before it was kept
    start_ticks: int | None = None
    #: the boot it was started in (``boot_id``); None in records written before it was kept
    boot: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pid": self.pid,
            "create_time": self.create_time,
            "start_ticks": self.start_ticks,
            "boot": self.boot,
            "command": list(self.command),
            "log": self.log,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProcessRecord:
        return cls(
            name=str(data["name"]),
            pid=int(data["pid"]),
            create_time=float(data["create_time"]),
            command=tuple(str(a) for a in data.get("command") or ()),
            log=str(data.get("log") or ""),
            start_ticks=None if data.get("start_ticks") is None else int(data["start_ticks"]),
            boot=None if data.get("boot") is None else str(data["boot"]),
        )


def stat_fields(path: str) -> list[bytes]:
    """The fields of a ``/proc/PID/stat`` (or ``/proc/PID/task/TID/stat``) file from field 3 on: field N is at
    index N - 3. Raises ``OSError`` when there is no such process or thread."""
    with open(path, "rb") as f:
        stat = f.read()
    # The command (field 2) may hold spaces and parentheses: the fields after it start past its last ")".
    return stat[stat.rindex(b")") + 2 :].split()


def start_ticks(pid: int) -> int:
    """The start time of process ``pid`` in clock ticks since boot: fixed for the process's life and
    independent of the wall clock. Raises ``OSError`` (``FileNotFoundError``, ``ProcessLookupError``) when
    there is no such process."""
    return int(stat_fields(f"/proc/{pid}/stat")[22 - 3])


@functools.cache
def boot_id() -> str:
    """This boot's identity (``/proc/sys/kernel/random/boot_id``): clock ticks count from a boot, so a record
    of another boot never matches a process of this one. Read once: it cannot change under a running
    interpreter."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def _same_process(record: ProcessRecord, proc: psutil.Process) -> bool:
    if record.start_ticks is not None and record.boot is not None:
        try:
            return record.boot == boot_id() and start_ticks(proc.pid) == record.start_ticks
        except (OSError, ValueError, IndexError):
            return False
    return abs(proc.create_time() - record.create_time) <= _CREATE_TIME_TOLERANCE


def stop_on_sigterm() -> None:
    """From now on, SIGTERM ends this interpreter as a Ctrl-C does: ``KeyboardInterrupt`` in the main thread.

    So a command that stops what it started in ``finally`` blocks (``asyncio.run`` also cancels its tasks and
    waits for their cleanup) does so when it is stopped with ``kill PID`` too. Python's default for SIGTERM
    ends the interpreter at once, and every process started in its own session (``spawn``) went on running:
    a cluster and schedulers left behind, competing for the cores with the next measurement.

    ``start_cluster`` and ``start_cluster_async`` call it, so every command that starts a cluster gets it
    before the cluster's first process; a command that starts something else first (the cluster benchmarks
    build tools) calls it itself, first. It does nothing off the main thread (only the main thread may set a
    handler) or when this interpreter already handles SIGTERM its own way."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def spawn(
    name: str,
    command: Sequence[str],
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> ProcessRecord:
    """Start ``command`` with stdout and stderr written to ``log_path`` (truncated first)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(env) if env is not None else None,
            cwd=cwd,
        )
    _children[proc.pid] = proc
    ticks: int | None
    try:
        create_time = psutil.Process(proc.pid).create_time()
        ticks = start_ticks(proc.pid)
    except (psutil.NoSuchProcess, OSError):
        create_time, ticks = 0.0, None  # already gone; is_running() will say so via the Popen
    log.debug("started %s (pid %d): %s", name, proc.pid, " ".join(command))
    return ProcessRecord(name, proc.pid, create_time, tuple(command), str(log_path), ticks, boot_id())


def exit_code(record: ProcessRecord) -> int | None:
    """The exit status when the process is our child and has exited; else None."""
    child = _children.get(record.pid)
    if child is None:
        return None
    return child.poll()


def is_running(record: ProcessRecord) -> bool:
    """True when the recorded process still runs (not exited, not a zombie, PID not reused)."""
    child = _children.get(record.pid)
    if child is not None:
        return child.poll() is None
    try:
        proc = psutil.Process(record.pid)
        if not _same_process(record, proc):
            return False
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def send(record: ProcessRecord, sig: int) -> bool:
    """Send ``sig`` to the recorded process if it still runs (a reused PID is never signalled).

    Returns whether the signal was sent."""
    if not is_running(record):
        return False
    try:
        os.kill(record.pid, sig)
    except ProcessLookupError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Stopped:
    """How one process ended under ``stop``."""

    name: str
    #: exit status (negative: the signal that ended it) when the process is our child; None when it is not
    code: int | None
    #: True when it outlived the grace period and got SIGKILL
    killed: bool
    #: the tail of its log when it exited with a non-zero status or was killed; "" otherwise
    log_tail: str = ""


def stop(
    records: Sequence[ProcessRecord],
    *,
    grace: float = DEFAULT_GRACE,
    sig: int = signal.SIGTERM,
    tail_lines: int = TAIL_LINES,
) -> list[Stopped]:
    """Send ``sig`` to every running process of ``records`` (in that order), SIGKILL those still running after
    ``grace`` seconds, and wait until all are gone.

    Returns one ``Stopped`` per record, in the order of ``records``; a process that had exited before is
    reported with its exit status too."""
    alive = [r for r in records if is_running(r)]
    for record in alive:
        log.info("stopping %s (pid %d)", record.name, record.pid)
        send(record, sig)
    deadline = time.monotonic() + grace
    while alive and time.monotonic() < deadline:
        time.sleep(_POLL)
        alive = [r for r in alive if is_running(r)]
    killed = {r.pid for r in alive}
    for record in alive:
        log.warning(
            "%s (pid %d) outlived its stop signal for %.0fs; sending SIGKILL", record.name, record.pid, grace
        )
        send(record, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while alive and time.monotonic() < deadline:
        time.sleep(_POLL)
        alive = [r for r in alive if is_running(r)]
    if alive:
        log.error("still running after SIGKILL: %s", ", ".join(f"{r.name} ({r.pid})" for r in alive))
    out = []
    for record in records:
        code = exit_code(record)
        was_killed = record.pid in killed
        failed = was_killed or (code is not None and code != 0)
        out.append(
            Stopped(
                record.name, code, was_killed, tail(record.log, tail_lines) if failed and record.log else ""
            )
        )
    return out


def terminate(records: Iterable[ProcessRecord], *, grace: float = DEFAULT_GRACE) -> list[str]:
    """SIGTERM every running process in ``records``, SIGKILL those still running after ``grace`` seconds.

    Returns the names of the processes that had to be killed. Returns when all of them are gone.
    """
    return [s.name for s in stop(list(records), grace=grace) if s.killed]


def tail(path: str | Path, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ("" when it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * 1024))
            data = f.read()
    except FileNotFoundError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


def rss_bytes(record: ProcessRecord) -> int | None:
    """Resident set size of a running recorded process, None when it does not run."""
    if not is_running(record):
        return None
    try:
        return int(psutil.Process(record.pid).memory_info().rss)
    except psutil.NoSuchProcess:
        return None
