"""The result of one scale run (one scheduler × one workload × one node count) and the statistics behind it.

Pure: no I/O beyond ``load``/``dump``, no clock. ``summarize`` turns what the load generator observed (per-pod
send and bind times on its own monotonic clock) and what the process meter measured into a ``RunResult``; the
JSON file of a bench run is a list of ``RunResult.to_json()`` objects, documented field by field in
``docs/benchmarks.md`` (``SCHEMA_VERSION`` changes whenever a field changes meaning or is removed).

Definitions (the report and the docs use the same words):
- latency: from the moment the load generator *sent* the pod's create request (backlog: from the moment the
  paused scheduler was released) to the moment its watch showed ``spec.nodeName`` set. Pods never bound are left
  out of the percentiles and counted in ``unbound``.
- sustained throughput (``pods_per_s``): binds per second between the moments 10 % and 90 % of the bound
  pods were bound, so start-up and the tail of stragglers do not dilute it. ``pods_per_s_overall`` divides
  all binds by the time from the first create sent to the last bind.
- create -> running (``running_p50_ms``/``running_p99_ms``): from the same start to the moment the watch first
  showed the pod Running; measured only in runs that simulate image pulls (``params.pull_delay_s`` > 0,
  ``scale.bench.pulls``), where it includes the pulls the node needed (``pods_waiting_for_pulls`` of the pods
  waited for one; ``pulls`` were started). 0 when not measured.
- percentiles interpolate linearly between order statistics (numpy's default).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from scale.tracking import PodTimes

SCHEMA_VERSION = 1
CDF_POINTS = 101  # quantiles 0, 1 %, ..., 100 % kept per run for the latency plot
TIMELINE_POINTS = 200  # (seconds, bound pods) samples kept per run for the throughput plot

#: Fields every result object has, whatever the version; the issue's contract.
REQUIRED_FIELDS = (
    "scheduler",
    "workload",
    "nodes",
    "pods",
    "pods_per_s",
    "p50_ms",
    "p99_ms",
    "cpu_s_per_1k_pods",
    "unbound",
)


class SchemaError(ValueError):
    """Raised by ``RunResult.from_json``/``load`` when an object lacks a field or has one of the wrong type."""


@dataclass(frozen=True, slots=True)
class LatencyStats:
    count: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ascending ``sorted_values``, linearly interpolated; nan if empty."""
    if not sorted_values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    rank = (len(sorted_values) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low)


def latency_stats(seconds: Iterable[float]) -> LatencyStats:
    """Percentiles of latencies given in seconds, reported in milliseconds (zeros when there are none)."""
    values = sorted(seconds)
    if not values:
        return LatencyStats(0, 0.0, 0.0, 0.0, 0.0, 0.0)

    def ms(x: float) -> float:
        return round(x * 1000.0, 2)

    return LatencyStats(
        count=len(values),
        p50_ms=ms(percentile(values, 50)),
        p90_ms=ms(percentile(values, 90)),
        p99_ms=ms(percentile(values, 99)),
        max_ms=ms(values[-1]),
        mean_ms=ms(sum(values) / len(values)),
    )


def sustained_rate(bound_times: Iterable[float], *, low: float = 0.10, high: float = 0.90) -> float:
    """Binds per second between the ``low`` and ``high`` fractions of all binds (times in seconds, any origin).

    With fewer than 10 binds, or when they all happened at once, the rate over the whole span is used; a
    single bind gives 0.
    """
    times = sorted(bound_times)
    n = len(times)
    if n < 2:
        return 0.0
    if n < 10:
        i, j = 0, n - 1
    else:
        i, j = math.floor(low * (n - 1)), math.ceil(high * (n - 1))
    span = times[j] - times[i]
    if span <= 0:
        span = times[-1] - times[0]
        i, j = 0, n - 1
    return round((j - i) / span, 1) if span > 0 else 0.0


def cdf(seconds: Iterable[float], points: int = CDF_POINTS) -> list[float]:
    """Latency quantiles in ms at ``points`` evenly spaced fractions 0..1 (empty when no pod was bound)."""
    values = sorted(seconds)
    if not values:
        return []
    return [round(percentile(values, 100.0 * k / (points - 1)) * 1000.0, 2) for k in range(points)]


def timeline(
    bound_times: Iterable[float], *, origin: float, points: int = TIMELINE_POINTS
) -> list[list[float]]:
    """Cumulative binds over time as ``[seconds since origin, bound so far]``, at most ``points`` of them."""
    times = sorted(bound_times)
    if not times:
        return []
    step = max(1, math.ceil(len(times) / points))
    out = [[round(times[k] - origin, 3), k + 1] for k in range(step - 1, len(times), step)]
    if out[-1][1] != len(times):
        out.append([round(times[-1] - origin, 3), len(times)])
    return [[0.0, 0], *out]


@dataclass(slots=True)
class RunResult:
    """One scheduler × workload × node count. See ``docs/benchmarks.md`` for every field."""

    scheduler: str
    workload: str
    nodes: int
    pods: int
    bound: int
    unbound: int
    pods_per_s: float
    pods_per_s_overall: float
    offered_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    create_p50_ms: float
    create_p99_ms: float
    duration_s: float
    cpu_s: float
    cpu_s_per_1k_pods: float
    peak_rss_mb: float
    scheduler_processes: int
    apiserver_cpu_s: float
    etcd_cpu_s: float
    kwok_cpu_s: float
    loadgen_cpu_s: float
    host_other_cpu_s: float
    scheduler_kind: str = ""
    batch_pods: int = 0
    batch_bound: int = 0
    batch_p99_ms: float = 0.0
    create_errors: int = 0
    running: int = 0
    running_p50_ms: float = 0.0
    running_p99_ms: float = 0.0
    # create sent (or eligible, if later) to the load generator's watch first delivering the pod, of the bound
    # agent pods: the part of the latency before any scheduler could see the pod (0 when not measured)
    visible_p50_ms: float = 0.0
    visible_p99_ms: float = 0.0
    visible_mean_ms: float = 0.0
    pods_waiting_for_pulls: int = 0
    pulls: int = 0
    # pod watches (any client's) the API server ended as too slow during the run, its deletions and the settle
    # pause (``scale.bench.apiserver_watches``); -1 when not measured
    apiserver_ended_pod_watches: int = -1
    params: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    cdf_ms: list[float] = field(default_factory=list)
    timeline: list[list[float]] = field(default_factory=list)
    stages: dict[str, dict[str, float]] = field(default_factory=dict)  # per stage: count, mean/p50/p99 ms
    # CPU-s per 1k bound pods of each scheduler process (coordinator, worker-1, ...): where the sum went
    cpu_s_per_1k_pods_by_process: dict[str, float] = field(default_factory=dict)
    # the part of each one's CPU its main thread (the event loop) used, 0-1: the rest went to other threads
    main_thread_share_by_process: dict[str, float] = field(default_factory=dict)
    # per bound pod, how many times each one's main thread blocked (mostly its event loop going to sleep, to
    # be woken by the next frame, timer or watch chunk; ``scale.bench.meter`` says what else it counts)
    main_sleeps_per_pod_by_process: dict[str, float] = field(default_factory=dict)
    schema: int = SCHEMA_VERSION
    started_at: str = ""
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunResult:
        missing = [name for name in REQUIRED_FIELDS if name not in data]
        if missing:
            raise SchemaError(f"result object lacks {', '.join(missing)}")
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for name, value in data.items():
            if name not in known:
                continue  # newer writers may add fields; readers ignore them
            kwargs[name] = value
        for name in ("scheduler", "workload"):
            if not isinstance(kwargs.get(name), str):
                raise SchemaError(f"{name} must be a string, got {kwargs.get(name)!r}")
        for name in ("nodes", "pods", "unbound"):
            if not isinstance(kwargs.get(name), int) or isinstance(kwargs.get(name), bool):
                raise SchemaError(f"{name} must be an integer, got {kwargs.get(name)!r}")
        for name in ("pods_per_s", "p50_ms", "p99_ms", "cpu_s_per_1k_pods"):
            if not isinstance(kwargs.get(name), int | float):
                raise SchemaError(f"{name} must be a number, got {kwargs.get(name)!r}")
        for f in fields(cls):
            if f.name not in kwargs and f.default is MISSING and f.default_factory is MISSING:
                kwargs[f.name] = "" if f.type == "str" else 0  # older files: absent counters read as zero
        return cls(**kwargs)


def dump(results: Iterable[RunResult], path: Path) -> None:
    """Write ``results`` as one JSON array (atomically: a reader never sees half a file)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps([r.to_json() for r in results], indent=1) + "\n")
    tmp.replace(path)


def load(path: Path) -> list[RunResult]:
    data = json.loads(path.read_text())
    if not isinstance(data, list):
        raise SchemaError(f"{path}: expected a JSON array of result objects")
    return [RunResult.from_json(item) for item in data]


@dataclass(frozen=True, slots=True)
class Usage:
    """CPU seconds and peak summed RSS of one group of processes over a run."""

    cpu_s: float = 0.0
    peak_rss_bytes: int = 0
    processes: int = 0
    by_pid: Mapping[int, float] = field(default_factory=dict)  # each process's CPU seconds
    main_by_pid: Mapping[int, float] = field(default_factory=dict)  # of those, its main thread's
    # how many times each one's main thread blocked (voluntary context switches; ``scale.bench.meter``)
    main_sleeps_by_pid: Mapping[int, int] = field(default_factory=dict)


def summarize(
    *,
    scheduler: str,
    scheduler_kind: str,
    workload: str,
    nodes: int,
    agent: Sequence[PodTimes],
    batch: Sequence[PodTimes] = (),
    origin: float,
    end: float,
    usage: Mapping[str, Usage],
    host_cpu_s: float,
    params: Mapping[str, Any] | None = None,
    notes: Sequence[str] = (),
    started_at: str = "",
    pods_waiting_for_pulls: int = 0,
    pulls: int = 0,
    process_names: Mapping[int, str] | None = None,
) -> RunResult:
    """Fold one run's observations into a ``RunResult``.

    ``origin`` is when the workload started and ``end`` when measuring stopped (same clock as the pod times).
    ``usage`` has the groups ``scheduler``, ``apiserver``, ``etcd``, ``kwok`` and ``loadgen``; missing ones read
    as zero. ``host_cpu_s`` is the host's busy CPU over the window, from which the groups' CPU is subtracted.
    ``process_names`` names the scheduler's processes by PID (a child process counts under its parent's name
    only if named; unnamed ones are summed as ``other``).
    """
    bound = [p for p in agent if p.is_bound]
    latencies = [max(0.0, p.latency) for p in bound]
    stats = latency_stats(latencies)
    creates = sorted(p.acked - p.sent for p in agent if not math.isnan(p.acked))
    sent = [p.sent for p in agent if not math.isnan(p.sent)]
    bound_times = [p.bound for p in bound]
    first_sent = min(sent) if sent else origin
    last_sent = max(sent) if sent else origin
    offered = len(sent) / (last_sent - first_sent) if last_sent > first_sent else 0.0
    overall_span = (max(bound_times) - first_sent) if bound_times else 0.0
    batch_bound = [p for p in batch if p.is_bound]
    started = [max(0.0, p.running_latency) for p in bound if not math.isnan(p.running)]
    visible = latency_stats(max(0.0, p.visible - p.start) for p in bound if not math.isnan(p.visible))
    running = latency_stats(started) if started else None
    sched = usage.get("scheduler", Usage())
    measured = sum(u.cpu_s for u in usage.values())
    return RunResult(
        scheduler=scheduler,
        scheduler_kind=scheduler_kind,
        workload=workload,
        nodes=nodes,
        pods=len(agent),
        bound=len(bound),
        unbound=len(agent) - len(bound),
        pods_per_s=sustained_rate(bound_times),
        pods_per_s_overall=round(len(bound) / overall_span, 1) if overall_span > 0 else 0.0,
        offered_per_s=round(offered, 1),
        p50_ms=stats.p50_ms,
        p90_ms=stats.p90_ms,
        p99_ms=stats.p99_ms,
        max_ms=stats.max_ms,
        mean_ms=stats.mean_ms,
        create_p50_ms=round(percentile(creates, 50) * 1000, 2) if creates else 0.0,
        create_p99_ms=round(percentile(creates, 99) * 1000, 2) if creates else 0.0,
        duration_s=round(end - origin, 2),
        cpu_s=round(sched.cpu_s, 2),
        cpu_s_per_1k_pods=round(sched.cpu_s / len(bound) * 1000, 3) if bound else 0.0,
        peak_rss_mb=round(sched.peak_rss_bytes / 2**20, 1),
        scheduler_processes=sched.processes,
        apiserver_cpu_s=round(usage.get("apiserver", Usage()).cpu_s, 2),
        etcd_cpu_s=round(usage.get("etcd", Usage()).cpu_s, 2),
        kwok_cpu_s=round(usage.get("kwok", Usage()).cpu_s, 2),
        loadgen_cpu_s=round(usage.get("loadgen", Usage()).cpu_s, 2),
        host_other_cpu_s=round(max(0.0, host_cpu_s - measured), 2),
        batch_pods=len(batch),
        batch_bound=len(batch_bound),
        batch_p99_ms=latency_stats(max(0.0, p.latency) for p in batch_bound).p99_ms,
        create_errors=sum(1 for p in [*agent, *batch] if p.error),
        running=len(started),
        running_p50_ms=running.p50_ms if running is not None else 0.0,
        running_p99_ms=running.p99_ms if running is not None else 0.0,
        visible_p50_ms=visible.p50_ms,
        visible_p99_ms=visible.p99_ms,
        visible_mean_ms=visible.mean_ms,
        pods_waiting_for_pulls=pods_waiting_for_pulls,
        pulls=pulls,
        params=dict(params or {}),
        notes=list(notes),
        cdf_ms=cdf(latencies),
        timeline=timeline(bound_times, origin=origin),
        started_at=started_at,
        cpu_s_per_1k_pods_by_process=_by_process(sched, process_names or {}, len(bound)),
        main_thread_share_by_process=_main_share(sched, process_names or {}),
        main_sleeps_per_pod_by_process=_sleeps_per_pod(sched, process_names or {}, len(bound)),
    )


def _per_name(by_pid: Mapping[int, float], names: Mapping[int, str]) -> dict[str, float]:
    """CPU seconds by PID summed per process name (PIDs without a name: "other"), in name order."""
    out: dict[str, float] = {}
    for pid, cpu in by_pid.items():
        name = names.get(pid, "other")
        out[name] = out.get(name, 0.0) + cpu
    return dict(sorted(out.items()))


def _main_share(sched: Usage, names: Mapping[int, str]) -> dict[str, float]:
    main = _per_name(sched.main_by_pid, names)
    return {
        name: round(min(main.get(name, 0.0) / cpu, 1.0), 3)
        for name, cpu in _per_name(sched.by_pid, names).items()
        if cpu > 0
    }


def _sleeps_per_pod(sched: Usage, names: Mapping[int, str], bound: int) -> dict[str, float]:
    if not bound or not sched.main_sleeps_by_pid:
        return {}
    return {name: round(n / bound, 3) for name, n in _per_name(sched.main_sleeps_by_pid, names).items()}


def _by_process(sched: Usage, names: Mapping[int, str], bound: int) -> dict[str, float]:
    if not bound or not sched.by_pid:
        return {}
    return {name: round(cpu / bound * 1000, 3) for name, cpu in _per_name(sched.by_pid, names).items()}
