"""CPU seconds and peak memory of groups of processes over one measured window, read with psutil.

A ``ProcessMeter`` is given named groups, each a function returning the PIDs that belong to it right now (the
scheduler's processes, the API server, etcd, kwok, this process). ``start()`` takes a baseline, a background
task samples every ``period`` seconds (new PIDs and children appear, exited ones keep their last reading), and
``stop()`` returns each group's CPU seconds (user + system, also of reaped children) and its peak summed RSS, and
each process's own CPU seconds (by PID), so a report can say which process of a group the CPU went to, and those
of its main thread (the event loop of an asyncio process; the rest went to other threads, such as gRPC's), and
how many times that main thread blocked (its voluntary context switches). For an asyncio process that is
mostly its event loop going to sleep with nothing to do, to be woken by the next frame, timer or watch chunk
and make a pass of the loop whatever work it brings; it also counts waits for the interpreter lock another
thread holds, and the pacer's sleeps (``common.aiotools.Pacer``: while paced, an idle pass sleeps instead of
blocking, so each sleep counts where a wake-up would have).
Divided by the pods a run placed, it says roughly how finely a process's work is cut into wake-ups.

It also reads the whole host's busy CPU time, so the report can say how much of the machine's CPU went to
processes outside the measured groups (other work on a shared machine makes numbers noisy; this says how noisy).

Invariant: a process is identified by PID and the kernel's start time in clock ticks since boot
(``/proc/PID/stat``), so a reused PID is never charged to a group and one process is never counted twice. (Not
psutil's ``create_time()``: that adds the boot time, which ``/proc/stat`` derives from the wall clock, so on a
host whose clock is stepped one process read twice could look like two, and the second would be charged its
whole life's CPU.)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterable

import psutil

from scale.bench.results import Usage
from scale.cluster.processes import start_ticks, stat_fields

DEFAULT_PERIOD = 0.5

PidSource = Callable[[], Iterable[int]]


def own_pid() -> list[int]:
    return [os.getpid()]


def with_children(pids: Iterable[int]) -> list[int]:
    """``pids`` and all their descendants that are alive now."""
    out: list[int] = []
    for pid in pids:
        out.append(pid)
        with contextlib.suppress(psutil.Error):
            out.extend(child.pid for child in psutil.Process(pid).children(recursive=True))
    return out


def host_busy_seconds() -> float:
    """CPU seconds the whole host spent not idle since boot, over all cores."""
    t = psutil.cpu_times()
    return float(sum(t)) - float(t.idle) - float(getattr(t, "iowait", 0.0))


class _Tracked:
    __slots__ = ("first", "last", "main_first", "main_last", "proc", "sleeps_first", "sleeps_last")

    def __init__(self, proc: psutil.Process, cpu: float, main: float, sleeps: int | None) -> None:
        self.proc = proc
        self.first = cpu
        self.last = cpu
        self.main_first = main
        self.main_last = main
        self.sleeps_first = sleeps
        self.sleeps_last = sleeps


def _identity(pid: int) -> tuple[int, int]:
    """(PID, start time in clock ticks since boot): fixed for a process's life, distinct for a reused PID."""
    return pid, start_ticks(pid)


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system + t.children_user + t.children_system)


def _main_thread_cpu(pid: int) -> float:
    """CPU seconds (user + system) of the process's main thread, whose thread id is its PID."""
    fields = stat_fields(f"/proc/{pid}/task/{pid}/stat")
    return (int(fields[14 - 3]) + int(fields[15 - 3])) / _TICKS  # utime and stime


def _main_thread_sleeps(pid: int) -> int | None:
    """How many times the process's main thread has blocked (voluntary context switches) since it started;
    None when that cannot be read (the CPU figures do not depend on it)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"voluntary_ctxt_switches:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


_TICKS = os.sysconf("SC_CLK_TCK")


class ProcessMeter:
    def __init__(self, groups: dict[str, PidSource], *, period: float = DEFAULT_PERIOD) -> None:
        self.groups = groups
        self.period = period
        self._tracked: dict[str, dict[tuple[int, int], _Tracked]] = {g: {} for g in groups}
        self._peak: dict[str, int] = dict.fromkeys(groups, 0)
        self._host_start = 0.0
        self._host_cpu = 0.0
        self._task: asyncio.Task[None] | None = None
        self._started = False

    def sample(self) -> None:
        """Read every group once: CPU of each process, summed RSS per group (peak kept)."""
        for group, source in self.groups.items():
            tracked = self._tracked[group]
            rss = 0
            for pid in set(source()):
                try:
                    key = _identity(pid)
                    entry = tracked.get(key)
                    if entry is None:
                        proc = psutil.Process(pid)
                        # A process born inside the window counts from zero, one alive before from the baseline.
                        born = self._started
                        entry = tracked[key] = _Tracked(
                            proc,
                            0.0 if born else _cpu(proc),
                            0.0 if born else _main_thread_cpu(pid),
                            0 if born else _main_thread_sleeps(pid),
                        )
                    with entry.proc.oneshot():
                        entry.last = _cpu(entry.proc)
                        rss += int(entry.proc.memory_info().rss)
                    entry.main_last = _main_thread_cpu(pid)
                    if (sleeps := _main_thread_sleeps(pid)) is not None:
                        entry.sleeps_last = sleeps
                except (OSError, ValueError, IndexError, psutil.Error):
                    continue  # gone (or going) since the source listed it: its last reading stands
            self._peak[group] = max(self._peak[group], rss)

    def cpu_so_far(self, group: str) -> float:
        """CPU seconds ``group`` has used since ``start``, as of the latest sample."""
        return sum(max(0.0, e.last - e.first) for e in self._tracked[group].values())

    def start(self) -> None:
        """Take the baseline and begin sampling in the background (call inside a running event loop)."""
        self._host_start = host_busy_seconds()
        self.sample()
        self._started = True
        self._task = asyncio.create_task(self._run(), name="process-meter")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            self.sample()

    async def stop(self) -> dict[str, Usage]:
        """Stop sampling, take a last reading; per group: CPU seconds used in the window, peak RSS, processes."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.sample()
        self._host_cpu = host_busy_seconds() - self._host_start
        out: dict[str, Usage] = {}
        for group, tracked in self._tracked.items():
            by_pid: dict[int, float] = {}
            main_by_pid: dict[int, float] = {}
            sleeps_by_pid: dict[int, int] = {}
            for (pid, _), e in tracked.items():
                by_pid[pid] = by_pid.get(pid, 0.0) + max(0.0, e.last - e.first)
                main_by_pid[pid] = main_by_pid.get(pid, 0.0) + max(0.0, e.main_last - e.main_first)
                if e.sleeps_first is not None and e.sleeps_last is not None:  # else its count is unknown
                    sleeps_by_pid[pid] = sleeps_by_pid.get(pid, 0) + max(0, e.sleeps_last - e.sleeps_first)
            cpu = sum(by_pid.values())
            out[group] = Usage(
                round(cpu, 3),
                self._peak[group],
                len(tracked),
                {p: round(c, 3) for p, c in by_pid.items()},
                {p: round(c, 3) for p, c in main_by_pid.items()},
                sleeps_by_pid,
            )
        return out

    @property
    def host_cpu_s(self) -> float:
        """Busy CPU seconds of the whole host over the window (valid after ``stop``)."""
        return round(self._host_cpu, 3)
