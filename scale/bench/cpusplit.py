"""Where a scheduler process's CPU goes, by activity: a split of the profiles ``AGENT_BENCH_PROFILE_DIR`` writes.

``python -m scale.bench.cpusplit LABEL=FILE[,FILE...] [LABEL=...]`` reads each label's cProfile stats (one file
per process: a coordinated configuration gives several, summed under one label) and prints a Markdown table of
CPU seconds per activity (``ACTIVITIES``), one column per label, then each activity's share of the label's
total without the start-up (``ONCE``: once per process, never in a measured window). ``bench paired``'s
and ``bench cluster``'s profiles hold their measured windows only (``scale.bench.cpuprofile --window``): the
same span as the window's CPU figure. ``FILE:CPU`` scales that process's activities so they sum to ``CPU`` (its CPU-s per 1,000 pods in an
unprofiled run, from ``bench paired``'s "by process" column): an estimate of where the unprofiled CPU went, on
the assumption that profiling slows every activity of a process alike (below: it does not quite). A label's
files all carry a CPU figure or none do.

An activity is the cumulative time of its entry points: the coroutine or callback under which that work runs
(a watch's reader, the pod feed's handler, the scheduling loop, the binder, each end of the dispatch link).
The feeds' handler is split further by what it calls (parsing a pod, applying it to the cache, the rest of the
handler), and applying a list by who calls it (``Reflector.run``), from the profile's caller records. Entry
points are named by file and function, not line, so a change that moves a function does not move its time to
"rest"; renaming one does (a test checks that every entry point still exists).

Invariants: no entry point of one activity runs under another's (each is a separate task or callback), so the
activities do not overlap and "rest" is the total less their sum. "Rest" is what no entry point names:
timers, metrics, the etcd client's Python side, other threads' CPU charged to whatever the main thread ran
meanwhile (the timer is the process's). In a whole-run profile it also holds the event loop's own C code,
charged to the frame that runs the loop; in a window profile that frame was entered before the window, so
that time is in no line and not in the total (``scale.bench.cpuprofile``): a window profile's total is a few
per cent short of the process's CPU, and a scaled estimate spreads the difference over the named lines. If
the activities ever add up to more than the total, an entry point runs under another's, and the table says
so.

How to read the numbers: cProfile adds a cost to every Python call and builtin call (with the CPU clock as its
timer, a system call per call), so a profiled process runs slower and call-heavy code looks dearer than it is:
``scale.bench.protocolcost`` measured the protocol's steps inflated 6-16 times where whole processes came out
about 3 times slower (which also holds what profiling changed in the run); a bench with profiling on also
changes what the processes do (a saturated worker batches differently). The shares say where the time goes within one process; applying
them to that process's CPU in an unprofiled run of the same workload is an estimate, not a measurement.
"""

from __future__ import annotations

import argparse
import math
import pstats
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# pstats' raw record: (file, line, function) -> (primitive calls, calls, own time, cumulative time, callers),
# callers: (file, line, function) -> (primitive calls, calls, own time, cumulative time) of calls from there.
Func = tuple[str, int, str]
CallerStats = Mapping[Func, tuple[int, int, float, float]]
RawStats = Mapping[Func, tuple[int, int, float, float, CallerStats]]


@dataclass(frozen=True)
class Entry:
    """A function by the end of its file's path and its name."""

    file: str
    name: str

    def matches(self, func: Func) -> bool:
        return func[0].endswith(self.file) and func[2] == self.name


@dataclass(frozen=True)
class Activity:
    label: str
    entries: tuple[Entry, ...]
    # Only the time these entries spend in calls from ``within`` (the callee's cumulative time per caller).
    within: Entry | None = None


STARTUP = "start-up: the argument parser and the command modules it imports"
ONCE = (STARTUP,)  # left out of the shares and of a scaled estimate
_FEED = Entry("worker/feeds.py", "event")
_FEED_PARSE = (Entry("common/records.py", "pod_update"), Entry("common/records.py", "pod_from_json"))
_FEED_APPLY = (Entry("worker/feeds.py", "_apply"), Entry("worker/feeds.py", "_remove"))
_REFLECTOR = Entry("common/watching.py", "run")
PARSE = "pod feed: parse a pod"
APPLY = "pod feed: apply to the cache"
FEED_REST = "feeds: rest of the event handlers"

ACTIVITIES: tuple[Activity, ...] = (
    Activity(STARTUP, (Entry("agent_scheduler/cli.py", "_build_parser"),)),
    Activity("watches: HTTP stream, lines, JSON decode", (Entry("common/kube.py", "watch"),)),
    Activity("lists: the API read and decode", (Entry("common/watching.py", "list_all"),)),
    Activity("lists: applied by every feed (replace)", (Entry("", "replace"),), within=_REFLECTOR),
    Activity(
        "socket receive (watch streams and reads through aiohttp, replies to writes through the write pool)",
        (Entry("aiohttp/client_proto.py", "data_received"), Entry("common/apiconn.py", "data_received")),
    ),
    Activity(PARSE, _FEED_PARSE, within=_FEED),
    Activity(APPLY, _FEED_APPLY, within=_FEED),
    Activity(FEED_REST, (_FEED,)),
    Activity("worker: catch-up of granted nodes (per-node reads)", (Entry("worker/shard.py", "one"),)),
    Activity("scheduling loop", (Entry("worker/scheduler.py", "scheduling_loop"),)),
    Activity("binding", (Entry("worker/binder.py", "_work"),)),
    Activity("Kubernetes Events", (Entry("common/reporting.py", "_scheduled_loop"),)),
    Activity(
        "worker: dispatch link (DISPATCH in; ACK, RESULT, CAPACITY out)",
        (Entry("worker/intake.py", "serve"), Entry("worker/intake.py", "_report_capacity")),
    ),
    Activity("worker: dispatch gate", (Entry("worker/gate.py", "run"),)),
    Activity("coordinator: pod watch handler", (Entry("coordinator/dispatch/dispatcher.py", "event"),)),
    Activity(
        "coordinator: dispatch loop and housekeeping",
        (
            Entry("coordinator/dispatch/dispatcher.py", "_loop"),
            Entry("coordinator/dispatch/dispatcher.py", "_housekeeping"),
        ),
    ),
    Activity(
        "coordinator: links (ACK, RESULT, CAPACITY in)", (Entry("coordinator/dispatch/links.py", "_run"),)
    ),
    Activity("coordinator: shard map", (Entry("coordinator/workershards/shardmap.py", "run"),)),
    Activity("coordinator: NodeShards", (Entry("coordinator/nodeshards/controller.py", "_loop"),)),
)
REST = "rest: timers, metrics, the etcd client, unnamed"
TOTAL = "total"
OVERLAP = "overlap"  # the activities' sum beyond the total (zero unless an entry point runs under another's)


def _cumulative(stats: RawStats, activity: Activity) -> float:
    total = 0.0
    for func, (_, _, _, cumulative, callers) in stats.items():
        if not any(e.matches(func) for e in activity.entries):
            continue
        if activity.within is None:
            total += cumulative
        else:
            total += sum(c[3] for caller, c in callers.items() if activity.within.matches(caller))
    return total


def split(stats: RawStats, total: float) -> dict[str, float]:
    """CPU seconds per activity of one profile, with ``REST``, ``TOTAL`` and ``OVERLAP``."""
    out = {a.label: _cumulative(stats, a) for a in ACTIVITIES}
    # The feed handler's parse and apply are inside its own cumulative time: what it is left with is the rest.
    out[FEED_REST] = max(0.0, out[FEED_REST] - out[PARSE] - out[APPLY])
    named = sum(out.values())
    out[REST] = max(0.0, total - named)
    out[TOTAL] = total
    out[OVERLAP] = max(0.0, named - total)
    return out


def in_window(out: Mapping[str, float]) -> float:
    """The total less the start-up."""
    return out.get(TOTAL, 0.0) - sum(out.get(label, 0.0) for label in ONCE)


def scaled(out: Mapping[str, float], cpu: float) -> dict[str, float]:
    """``out`` without the start-up, scaled so its total is ``cpu``."""
    running = in_window(out)
    factor = cpu / running if running > 0 else 0.0
    result = {label: seconds * factor for label, seconds in out.items() if label not in ONCE}
    result.update(dict.fromkeys(ONCE, 0.0))
    result[TOTAL] = cpu
    return result


def _file_spec(spec: str) -> tuple[str, float | None]:
    path, sep, cpu = spec.rpartition(":")
    if not sep:
        return spec, None
    try:
        value = float(cpu)
    except ValueError:
        return spec, None  # a colon in the path, not a CPU figure
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{spec!r}: a CPU figure must be a finite number, at least 0")
    return path, value


def load(specs: Sequence[str]) -> dict[str, float]:
    """The split of several profiles (one per process of a configuration), summed; ``PATH:CPU`` scaled."""
    files = [_file_spec(spec) for spec in specs]
    if len({cpu is None for _, cpu in files}) > 1:
        # profiled seconds and estimated CPU-s per 1,000 pods do not add up
        raise ValueError("either every file of a label has a CPU figure or none has")
    summed: dict[str, float] = {}
    for path, cpu in files:
        s = pstats.Stats(path)
        raw: RawStats = s.stats  # type: ignore[attr-defined]  # documented, not in the stubs
        out = split(raw, s.total_tt)  # type: ignore[attr-defined]
        if cpu is not None:
            out = scaled(out, cpu)
        for label, seconds in out.items():
            summed[label] = summed.get(label, 0.0) + seconds
    return summed


def table(columns: Mapping[str, Mapping[str, float]]) -> list[str]:
    """CPU seconds per activity, then shares of the total without the start-up; a warning line when a label's
    activities overlap."""
    names = list(columns)
    labels = [a.label for a in ACTIVITIES] + [REST, TOTAL]
    lines = [
        "| activity | "
        + " | ".join(f"{n} CPU-s" for n in names)
        + " | "
        + " | ".join(f"{n} %" for n in names)
        + " |",
        "|---|" + "---:|" * (2 * len(names)),
    ]
    for label in labels:
        seconds = [columns[n].get(label, 0.0) for n in names]
        shares = []
        for n in names:
            running = in_window(columns[n])
            shown = label not in (*ONCE, TOTAL) and running > 0
            shares.append(f"{100 * columns[n].get(label, 0.0) / running:.1f}" if shown else "")
        lines.append(
            f"| {label} | " + " | ".join(f"{v:.3f}" for v in seconds) + " | " + " | ".join(shares) + " |"
        )
    for n in names:
        if columns[n].get(OVERLAP, 0.0) > 0.001 * max(columns[n].get(TOTAL, 0.0), 1e-9):
            lines.append(
                f"\nWarning: {n}'s activities add up to {columns[n][OVERLAP]:.3f} s more than its total: an entry "
                "point runs under another's, so some time is counted twice."
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scale.bench.cpusplit", description=__doc__.split("\n")[0]
    )
    parser.add_argument("columns", nargs="+", metavar="LABEL=FILE[:CPU][,FILE[:CPU]...]")
    args = parser.parse_args(argv)
    columns: dict[str, dict[str, float]] = {}
    for spec in args.columns:
        label, sep, files = spec.partition("=")
        if not sep or not label or not files:
            parser.error(f"{spec!r}: expected LABEL=FILE[,FILE...]")
        try:
            columns[label] = load(files.split(","))
        except (OSError, EOFError, ValueError) as e:
            parser.error(f"{label}: {e}")
    print("\n".join(table(columns)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
