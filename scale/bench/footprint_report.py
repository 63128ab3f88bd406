"""The results of ``bench footprint`` and the report made from them. Pure: no processes, no API server.

One ``Step`` is one measurement: a scheduler configuration on a cluster of ``nodes`` nodes after ``pods`` bound
pods exist (step 0: none yet). It holds the resident set size (RSS) of each of the scheduler's processes and, for
the same moment in the same cluster, of the cluster's kube-scheduler (every cluster runs one, and it caches every
assigned pod whichever scheduler placed it, so it is the like-for-like reference) and of the API server; and the CPU
seconds each of those spent during the step, with the number of pod watch events the step caused (the events the
schedulers' pod watches received).

Derived figures (computed here, never stored, so a report rebuilt from ``results.json`` says the same):
- ``cpu_ms_per_event``: the scheduler processes' summed CPU during the step over the step's pod events;
- ``marginal_slope``: MiB per 1,000 pods of a process between the previous step and this one;
- ``fitted_slope``: least-squares MiB per 1,000 pods of a process over all steps of one configuration × nodes;
- the goal (issue 14 item 4): at ``GOAL_NODES`` nodes and ``GOAL_PODS`` pods, each of our workers' RSS is below
  the RSS of the kube-scheduler of the same cluster.

Invariant: ``dump`` and ``load`` round-trip every field; ``load`` refuses a file of another schema version.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "footprint/1"
MIB = 1024 * 1024
GOAL_NODES = 5000
GOAL_PODS = 50000
KUBE_SCHEDULER = "kube-scheduler"
WORKER_PREFIX = "worker"


class SchemaError(ValueError):
    pass


@dataclass(kw_only=True, slots=True)
class Step:
    scheduler: str
    kind: str
    nodes: int
    pods: int
    #: RSS in MiB of each process of the scheduler under test, by process name (worker, worker-1, coordinator, ...)
    rss_mib: dict[str, float]
    #: the cluster's kube-scheduler at the same moment (for a kube-scheduler configuration: the same process)
    kube_scheduler_rss_mib: float
    apiserver_rss_mib: float
    #: CPU seconds of each scheduler process during the step (creates + settle)
    cpu_s: dict[str, float] = field(default_factory=dict)
    kube_scheduler_cpu_s: float = 0.0
    apiserver_cpu_s: float = 0.0
    #: pod watch events (ADDED/MODIFIED/DELETED) the step caused, as a watch of the namespace received them
    events: int = 0
    duration_s: float = 0.0
    #: seconds waited after the last pod ran until the scheduler's CPU was quiet
    settle_s: float = 0.0
    #: the scheduler processes' CPU use at rest before the first step, in cores
    idle_cores: float = 0.0
    notes: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def cpu_ms_per_event(self) -> float:
        return 1000.0 * sum(self.cpu_s.values()) / self.events if self.events else 0.0

    @property
    def kube_cpu_ms_per_event(self) -> float:
        return 1000.0 * self.kube_scheduler_cpu_s / self.events if self.events else 0.0

    @property
    def workers(self) -> dict[str, float]:
        """RSS of the processes that hold a worker's cache (a standalone worker is one too)."""
        return {k: v for k, v in self.rss_mib.items() if k.startswith(WORKER_PREFIX)}


def dump(steps: Sequence[Step], path: Path, *, meta: dict[str, Any] | None = None) -> None:
    body = {"schema": SCHEMA, "meta": meta or {}, "steps": [asdict(s) for s in steps]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=1) + "\n")
    tmp.replace(path)


def load(path: Path) -> tuple[list[Step], dict[str, Any]]:
    body = json.loads(path.read_text())
    if body.get("schema") != SCHEMA:
        raise SchemaError(f"{path}: schema {body.get('schema')!r}, expected {SCHEMA!r}")
    return [Step(**s) for s in body["steps"]], dict(body.get("meta") or {})


def slope(points: Iterable[tuple[float, float]]) -> float:
    """Least-squares slope of y over x; 0 for fewer than two distinct x."""
    pts = list(points)
    if len(pts) < 2:
        return 0.0
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in pts) / sxx


def series(steps: Sequence[Step], scheduler: str, nodes: int) -> list[Step]:
    """The successful steps of one configuration on one cluster size, by pod count."""
    return sorted(
        (s for s in steps if s.scheduler == scheduler and s.nodes == nodes and not s.error),
        key=lambda s: s.pods,
    )


def marginal_slope(previous: Step | None, step: Step, process: str) -> float | None:
    """MiB per 1,000 pods of ``process`` from ``previous`` to ``step`` (None at the first step)."""
    if previous is None or step.pods == previous.pods:
        return None
    before = previous.kube_scheduler_rss_mib if process == KUBE_SCHEDULER else previous.rss_mib.get(process)
    after = step.kube_scheduler_rss_mib if process == KUBE_SCHEDULER else step.rss_mib.get(process)
    if before is None or after is None:
        return None
    return 1000.0 * (after - before) / (step.pods - previous.pods)


def fitted_slopes(run: Sequence[Step]) -> dict[str, float]:
    """MiB per 1,000 pods of every process of a series (and the same cluster's kube-scheduler), least squares."""
    names = sorted({name for s in run for name in s.rss_mib})
    out = {
        name: 1000.0 * slope((s.pods, s.rss_mib[name]) for s in run if name in s.rss_mib) for name in names
    }
    out.setdefault(KUBE_SCHEDULER, 1000.0 * slope((s.pods, s.kube_scheduler_rss_mib) for s in run))
    return out


def goal_rows(steps: Sequence[Step]) -> list[tuple[Step, bool]]:
    """Each step of an agent configuration with workers at the goal's size: (step, every worker below kube's)."""
    return [
        (s, all(rss < s.kube_scheduler_rss_mib for rss in s.workers.values()))
        for s in steps
        if not s.error and s.workers and s.nodes >= GOAL_NODES and s.pods >= GOAL_PODS
    ]


def verdict(steps: Sequence[Step]) -> str:
    rows = goal_rows(steps)
    if not rows:
        return "not measured"
    return "met" if all(ok for _, ok in rows) else "missed"


def _fmt_processes(values: dict[str, float | None], digits: int = 0) -> str:
    shown = [f"{name} {v:,.{digits}f}" for name, v in sorted(values.items()) if v is not None]
    return "; ".join(shown) or "–"


def _configs(steps: Sequence[Step]) -> list[tuple[str, int]]:
    seen: dict[tuple[str, int], None] = {}
    for s in steps:
        seen.setdefault((s.scheduler, s.nodes), None)
    return sorted(seen, key=lambda c: (c[1], list(dict.fromkeys(s.scheduler for s in steps)).index(c[0])))


def table(steps: Sequence[Step]) -> str:
    """The main table: one row per configuration × nodes × pods."""
    lines = [
        "| configuration | nodes | pods | RSS MiB per process | kube-scheduler RSS MiB (same cluster) "
        "| API server RSS MiB | MiB per 1k pods (since previous step) | CPU-ms per pod event "
        "| kube-scheduler CPU-ms per pod event | worker below kube-scheduler |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for scheduler, nodes in _configs(steps):
        previous: Step | None = None
        for s in sorted(
            (s for s in steps if s.scheduler == scheduler and s.nodes == nodes), key=lambda s: s.pods
        ):
            if s.error:
                lines.append(f"| {scheduler} | {nodes:,} | {s.pods:,} | failed: {s.error} | | | | | | |")
                continue
            slopes = {name: marginal_slope(previous, s, name) for name in s.rss_mib}
            below = (
                ("yes" if all(v < s.kube_scheduler_rss_mib for v in s.workers.values()) else "**no**")
                if s.workers
                else "–"
            )
            cpu = f"{s.cpu_ms_per_event:.3f}" if s.events else "–"
            kube_cpu = f"{s.kube_cpu_ms_per_event:.3f}" if s.events else "–"
            lines.append(
                f"| {scheduler} | {nodes:,} | {s.pods:,} | {_fmt_processes(dict(s.rss_mib))} "
                f"| {s.kube_scheduler_rss_mib:,.0f} | {s.apiserver_rss_mib:,.0f} | {_fmt_processes(slopes, 2)} "
                f"| {cpu} | {kube_cpu} | {below} |"
            )
            previous = s
    return "\n".join(lines)


def growth_table(steps: Sequence[Step]) -> str:
    lines = [
        "| configuration | nodes | MiB per 1k pods, least squares over the steps | kube-scheduler (same clusters) "
        "| scheduler idle CPU (cores) |",
        "|---|---|---|---|---|",
    ]
    for scheduler, nodes in _configs(steps):
        run = series(steps, scheduler, nodes)
        if len(run) < 2:
            continue
        fitted = fitted_slopes(run)
        kube = fitted.pop(KUBE_SCHEDULER) if KUBE_SCHEDULER not in run[0].rss_mib else fitted[KUBE_SCHEDULER]
        lines.append(
            f"| {scheduler} | {nodes:,} | {_fmt_processes(dict(fitted.items()), 2)} | {kube:.2f} "
            f"| {run[0].idle_cores:.3f} |"
        )
    return "\n".join(lines)


def markdown(steps: Sequence[Step], meta: dict[str, Any] | None = None) -> str:
    meta = meta or {}
    rows = goal_rows(steps)
    goal = verdict(steps)
    out = ["# Memory and CPU per pod event: `bench footprint`", ""]
    if meta.get("command"):
        out += [f"Command: `{meta['command']}`  ", f"Commit: `{meta.get('commit', '?')}`  "]
        out += [f"Started: {meta.get('started', '?')}; host: {meta.get('host', '?')}", ""]
    out += [
        "## Goal",
        "",
        f"Issue 14 item 4: a worker's cache at {GOAL_NODES:,} nodes and {GOAL_PODS:,} bound pods stays under "
        f"kube-scheduler's RSS for the same cluster: **{goal}**"
        + (
            " ("
            + "; ".join(
                f"{s.scheduler}: {_fmt_processes(dict(s.workers))} MiB vs kube-scheduler "
                f"{s.kube_scheduler_rss_mib:,.0f} MiB"
                for s, _ in rows
            )
            + ")"
            if rows
            else f" (no run at {GOAL_NODES:,} nodes with {GOAL_PODS:,} pods)"
        )
        + ".",
        "",
        "## Results",
        "",
        table(steps),
        "",
        "## Growth",
        "",
        growth_table(steps),
        "",
        "## How it was measured",
        "",
        "For each node count and each configuration: a fresh local cluster (etcd, kube-apiserver, kwok with the "
        "bench's node fleet, kube-scheduler), the scheduler started and made ready with a few probe pods, then "
        "bound pods created in steps: each pod is an agent pod (labels, one container with CPU and memory "
        "requests) with `spec.nodeName` already set to a node the real engine chose for it, so no scheduler "
        "decides it and kwok runs it. After each step, once a watch of the namespace has seen every pod of "
        "the step Running, the bench waits until the scheduler processes' CPU is quiet (two consecutive 1 s "
        "windows under 5 % of a core above their idle rate, bounded) — that is when their caches have applied every event — and "
        "then reads each process's RSS with psutil. CPU per pod event: the CPU seconds the scheduler processes "
        "spent from the step's first create until it settled, over the pod watch events the step caused "
        "(ADDED and MODIFIED as a watch of the namespace received them; each of the schedulers' pod watches "
        "received the same events); it includes their idle CPU (the growth table lists it). kube-scheduler "
        "runs in every cluster and caches every assigned pod, so its RSS in the same cluster at the same moment "
        "is the reference; the API server's RSS is given for context.",
        "",
    ]
    notes = [(s, n) for s in steps for n in s.notes]
    if notes or meta.get("notes"):
        out += ["## Notes", ""]
        out += [f"- {n}" for n in meta.get("notes") or []]
        out += [f"- {s.scheduler}, {s.nodes:,} nodes, {s.pods:,} pods: {n}" for s, n in notes]
        out.append("")
    return "\n".join(out)


def write(out: Path, steps: Sequence[Step], meta: dict[str, Any] | None = None) -> Path:
    dump(steps, out / "results.json", meta=meta)
    path = out / "report.md"
    path.write_text(markdown(steps, meta))
    return path


def rebuild(out: Path) -> Path:
    steps, meta = load(out / "results.json")
    path = out / "report.md"
    path.write_text(markdown(steps, meta))
    return path
