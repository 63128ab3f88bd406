"""Where a scheduler process's CPU goes, by activity: a split of the profiles ``AGENT_BENCH_PROFILE_DIR`` writes.

``python -m scale.bench.cpusplit LABEL=FILE[,FILE...] [LABEL=...]`` reads each label's cProfile stats (one file
per process: a coordinated configuration gives several, summed under one label) and prints a Markdown table of
CPU seconds per activity (``ACTIVITIES``), one column per label, then each activity's share of the label's
total without the work a bench trial does before its measured window (``BEFORE_WINDOW``: start-up, the first
lists, the catch-up of granted nodes). ``FILE:CPU`` scales that process's other activities so they sum to
``CPU`` (its CPU-s per 1,000 pods in an unprofiled run, from ``bench paired``'s "by process" column): an
estimate of where the unprofiled CPU went, on the assumption that profiling slows every activity of a process
alike (below: it does not quite).

An activity is the cumulative time of its entry points: the coroutine or callback under which that work runs
(the pod watch's reader, the pod feed's handler, the scheduling loop, the binder, the dispatch link). The pod
feed's handler is split further by what it calls (parsing a pod, applying it to the cache, the rest of the
handler), from the profile's caller records. Entry points are named by file and function, not line, so a
change that moves a function does not move its time to "rest".

Invariants: no entry point of one activity runs under another's (each is a separate task or callback), so the
activities do not overlap and "rest" (the event loop, timers, metrics, everything unnamed) is the total less
their sum; a function matched twice is counted once.

How to read the numbers: cProfile adds a cost to every Python call and builtin call, so a profiled process runs
slower and call-heavy code looks dearer than it is; a bench with profiling on also changes what the processes
do (a saturated worker batches differently). The shares say where the time goes within one process; applying
them to that process's CPU in an unprofiled run of the same workload is an estimate, not a measurement.
"""

from __future__ import annotations

import argparse
import pstats
import sys
from collections.abc import Iterable, Mapping, Sequence
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


STARTUP = "start-up: imports, argument parser (once per process)"
RELISTS = "relists (every feed's replace; the first list at start)"
CATCH_UP = "worker: catch-up of granted nodes (per-node reads)"
# Work a bench trial does before its measured window (the processes start, list, and are granted their shards
# before the trial is ready): left out of the shares and of a scaled estimate.
BEFORE_WINDOW = (STARTUP, RELISTS, CATCH_UP)
_FEED = Entry("worker/feeds.py", "event")
_FEED_PARSE = (Entry("common/records.py", "pod_update"), Entry("common/records.py", "pod_from_json"))
_FEED_APPLY = (Entry("worker/feeds.py", "_apply"), Entry("worker/feeds.py", "_remove"))

ACTIVITIES: tuple[Activity, ...] = (
    Activity(STARTUP, (Entry("agent_scheduler/cli.py", "_build_parser"),)),
    Activity("watches: HTTP stream, lines, JSON decode", (Entry("common/kube.py", "watch"),)),
    Activity(
        "socket receive (aiohttp, every connection)", (Entry("aiohttp/client_proto.py", "data_received"),)
    ),
    Activity("pod feed: parse a pod", _FEED_PARSE, within=_FEED),
    Activity("pod feed: apply to the cache", _FEED_APPLY, within=_FEED),
    Activity("feeds: rest of the event handlers", (_FEED,)),
    Activity(RELISTS, (Entry("worker/feeds.py", "replace"),)),
    Activity(CATCH_UP, (Entry("worker/shard.py", "one"),)),
    Activity("scheduling loop", (Entry("worker/scheduler.py", "scheduling_loop"),)),
    Activity("binding", (Entry("worker/binder.py", "_work"),)),
    Activity("Kubernetes Events", (Entry("common/reporting.py", "_scheduled_loop"),)),
    Activity(
        "worker: dispatch link",
        (Entry("worker/intake.py", "serve"), Entry("worker/intake.py", "_report_capacity")),
    ),
    Activity("coordinator: pod watch handler", (Entry("coordinator/dispatch/dispatcher.py", "event"),)),
    Activity("coordinator: dispatch loop", (Entry("coordinator/dispatch/dispatcher.py", "_loop"),)),
    Activity("coordinator: links", (Entry("coordinator/dispatch/links.py", "_run"),)),
    Activity("coordinator: shard map", (Entry("coordinator/workershards/shardmap.py", "run"),)),
    Activity("coordinator: NodeShards", (Entry("coordinator/nodeshards/controller.py", "_loop"),)),
)
REST = "rest: event loop, timers, metrics, unnamed"
TOTAL = "total"


def _cumulative(stats: RawStats, activity: Activity) -> float:
    seen: set[Func] = set()
    total = 0.0
    for func, (_, _, _, cumulative, callers) in stats.items():
        if func in seen or not any(e.matches(func) for e in activity.entries):
            continue
        seen.add(func)
        if activity.within is None:
            total += cumulative
        else:
            total += sum(c[3] for caller, c in callers.items() if activity.within.matches(caller))
    return total


def split(stats: RawStats, total: float) -> dict[str, float]:
    """CPU seconds per activity of one profile, ``REST`` and ``TOTAL`` included."""
    out = {a.label: _cumulative(stats, a) for a in ACTIVITIES}
    # The feed handler's parse and apply are inside its own cumulative time: what it is left with is the rest.
    rest_of_feed = "feeds: rest of the event handlers"
    out[rest_of_feed] = max(
        0.0, out[rest_of_feed] - out["pod feed: parse a pod"] - out["pod feed: apply to the cache"]
    )
    out[REST] = max(0.0, total - sum(out.values()))
    out[TOTAL] = total
    return out


def in_window(out: Mapping[str, float]) -> float:
    """The total less the work of ``BEFORE_WINDOW``."""
    return out.get(TOTAL, 0.0) - sum(out.get(label, 0.0) for label in BEFORE_WINDOW)


def scaled(out: Mapping[str, float], cpu: float) -> dict[str, float]:
    """``out`` without the work of ``BEFORE_WINDOW``, scaled so its total is ``cpu``."""
    running = in_window(out)
    factor = cpu / running if running > 0 else 0.0
    result = {label: seconds * factor for label, seconds in out.items() if label not in BEFORE_WINDOW}
    result.update(dict.fromkeys(BEFORE_WINDOW, 0.0))
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
    if value < 0:
        raise ValueError(f"{spec!r}: a negative CPU figure")
    return path, value


def load(specs: Iterable[str]) -> dict[str, float]:
    """The split of several profiles (one per process of a configuration), summed; ``PATH:CPU`` scaled."""
    summed: dict[str, float] = {}
    for spec in specs:
        path, cpu = _file_spec(spec)
        s = pstats.Stats(path)
        raw: RawStats = s.stats  # type: ignore[attr-defined]  # documented, not in the stubs
        out = split(raw, s.total_tt)  # type: ignore[attr-defined]
        if cpu is not None:
            out = scaled(out, cpu)
        for label, seconds in out.items():
            summed[label] = summed.get(label, 0.0) + seconds
    return summed


def table(columns: Mapping[str, Mapping[str, float]]) -> list[str]:
    """CPU seconds per activity, then shares of the total without the work before the window."""
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
            shown = label not in (*BEFORE_WINDOW, TOTAL) and running > 0
            shares.append(f"{100 * columns[n].get(label, 0.0) / running:.1f}" if shown else "")
        lines.append(
            f"| {label} | " + " | ".join(f"{v:.3f}" for v in seconds) + " | " + " | ".join(shares) + " |"
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
