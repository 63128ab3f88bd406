"""``agent-scheduler bench paired``: scheduler configurations measured alternately on one cluster, so that
changes of a few percent in CPU per pod can be told from noise.

Why not ``bench cluster``: it starts a fresh cluster per configuration, and on this kind of machine the same
code measured twice that way differs by 6-22 % in CPU-s per 1,000 pods (``docs/benchmarks.md``); a change to
the sharded path typically moves it by 2-10 %. Here:

1. one local cluster (``scale.cluster``, no controller manager, the bench's kwok stages, the product's RBAC
   for the ``system:kube-scheduler`` user), as ``bench cluster`` builds it;
2. one warm-up trial of the first contender, not counted (the first burst on a fresh cluster meets a faster API
   server than every later one), then ``rounds`` rounds; each runs every contender once, in the given order
   on even rounds and reversed on odd ones. A cluster drifts as it ages: in one run its API server spent
   half as much again per burst by the eighth, pods reached the scheduler in thinner streams, and CPU per pod
   crept up; fitted over five runs here the drift was -1.5 to +2.6 % per trial. Over an even number of
   rounds every contender's trials sit at the same mean position, so a steady drift falls on all alike; the
   summary also fits it (least squares on the logarithm: one level per contender plus a common growth per
   trial) and gives each contender's level at the mean position;
3. each trial starts the contender's processes afresh (a coordinated one under an etcd prefix of its own),
   waits until it is ready (shard map settled, probe pods bound) and the host is quiet, then ``idle_s`` more
   with nothing to schedule (``--idle``: a user's first burst after a quiet spell), runs the workload
   (``scale.bench.cluster``'s ``run_workload``: the same load generator, meter and clean-up; with
   ``--until-idle`` the CPU window runs on, once every pod is seen bound, until the scheduler and the API server
   are idle, so work it does for the pods after binding them, such as their Scheduled events, is counted), then
   stops the processes by PID;
4. a contender may run from another checkout of this project (``LABEL=SCHEDULER@DIR``, e.g. a ``git worktree``
   of the baseline), with this interpreter and its packages: before and after are paired in one run;
5. a backlog pauses every process of the contender (SIGSTOP) while its pods are created, which takes longer
   than the 5 s a coordinated process keeps its lease unrefreshed (half its default 10-s TTL): each would be
   fenced, and the trial would measure a failover onto a backlog, not the backlog. So a coordinated contender
   runs a backlog with a longer ``--lease-ttl`` (``scale.bench.schedulers.paused_lease_ttl``, noted in the
   trial).

Each trial's result is appended to ``trials.json`` at once (an interrupted run keeps what it measured); the
summary gives each contender's mean over its rounds and their spread (min-max), its drift-adjusted CPU per pod,
and per process where its CPU went; then (``ratios``) every other contender's rate, p50, p99 and CPU per pod over
the first contender's, each fitted as CPU per pod is, with its 95 % interval: how a goal stated as a ratio is
judged. ``python -m scale.bench.paired DIR [LABEL...]`` prints that table again from a run's ``trials.json``.
Our schedulers, the no-decision binder and one kube-scheduler configuration can be contenders. kube-scheduler
is the cluster's own process, started once with that configuration's client limits (without such a contender,
at qps/burst 5000 as ``bench cluster`` runs it when it is not under test): unlike the others it is not started
afresh per trial, and it watches every contender's pods throughout (it does not schedule the others' pods, but
caches each one as it is bound). Volcano's agent scheduler cannot be a contender: its binary has no
checkout of this project (compare it with ``bench cluster``).
Nothing is asserted: the numbers are reported.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any, Final, NamedTuple

from common.kube import ApiError
from scale.bench import stages
from scale.bench.cluster import (
    BenchConfig,
    failed_result,
    fresh_cluster,
    measured_kubeconfig,
    run_workload,
    until_ready,
    wait_quiet,
)
from scale.bench.results import RunResult
from scale.bench.schedulers import (
    AGENT,
    CLIENT_BURST,
    CLIENT_QPS,
    KUBE,
    NOOP,
    PAUSED_NOTE,
    SCHEDULERS,
    Running,
    grant_agent_rbac,
    launch,
    paused_lease_ttl,
)
from scale.bench.workloads import BURST, default_workloads, scaled
from scale.cluster import ClusterError, ClusterOptions, generate_nodes
from scale.cluster.config import PROJECT_ROOT
from scale.cluster.nodes import PREPULLED_FRACTION

log = logging.getLogger(__name__)

DEFAULT_NODES = 1000
DEFAULT_PODS = 2000
DEFAULT_ROUNDS = 4
WARMUP = "warm-up"  # the label of the uncounted first trial
LABEL = re.compile(r"[A-Za-z0-9._-]+")
BUSY_NOTE = "busy outside the bench"  # in the note of a trial ``wait_quiet`` could not start quietly


class ContenderError(ValueError):
    """A contender that cannot be run (the message says why)."""


@dataclass(frozen=True, slots=True)
class Contender:
    label: str
    scheduler: str  # a key of ``scale.bench.schedulers.SCHEDULERS``
    checkout: Path  # the project checkout its processes run from

    @property
    def describe(self) -> str:
        where = "" if self.checkout == PROJECT_ROOT else f" @ {self.checkout}"
        return f"{self.label} ({self.scheduler}{where})"


def parse_contender(text: str) -> Contender:
    """``LABEL=SCHEDULER`` or ``LABEL=SCHEDULER@CHECKOUT``."""
    label, sep, rest = text.partition("=")
    if not sep or not label.strip() or not rest:
        raise ContenderError(f"{text!r}: expected LABEL=SCHEDULER or LABEL=SCHEDULER@CHECKOUT")
    label = label.strip()
    if not LABEL.fullmatch(label) or label == WARMUP:
        # labels name log files and etcd prefixes; the warm-up's is the bench's own
        raise ContenderError(f"{text!r}: a label is letters, digits, '.', '_' or '-', and not {WARMUP!r}")
    scheduler, at, where = rest.partition("@")
    spec = SCHEDULERS.get(scheduler)
    if spec is None:
        raise ContenderError(f"{text!r}: unknown scheduler {scheduler!r}; known: {', '.join(SCHEDULERS)}")
    if spec.kind not in (AGENT, NOOP, KUBE):
        raise ContenderError(
            f"{text!r}: {scheduler} cannot be paired on one cluster (Volcano's binary has no checkout and "
            "is built apart): compare it with `bench cluster`"
        )
    checkout = PROJECT_ROOT
    if at and spec.kind == KUBE:
        raise ContenderError(
            f"{text!r}: kube-scheduler is the cluster's own process, not run from a checkout"
        )
    if at:
        checkout = Path(where).expanduser().resolve()
        if not (checkout / "agent_scheduler" / "cli.py").is_file():
            raise ContenderError(f"{text!r}: {checkout} is not a checkout of this project")
    return Contender(label, scheduler, checkout)


def parse_contenders(texts: Sequence[str]) -> list[Contender]:
    contenders = [parse_contender(t) for t in texts]
    labels = [c.label for c in contenders]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ContenderError(f"labels must differ: {', '.join(repeated)} given twice")
    if len(contenders) < 2:
        raise ContenderError("give at least two contenders (--run LABEL=SCHEDULER[@CHECKOUT], repeated)")
    kube = [c for c in contenders if SCHEDULERS[c.scheduler].kind == KUBE]
    if len(kube) > 1:
        raise ContenderError(
            f"one kube-scheduler contender at most ({', '.join(c.label for c in kube)} given): the cluster runs "
            "one kube-scheduler, its client limits set when it starts"
        )
    return contenders


def cluster_options(contenders: Sequence[Contender]) -> ClusterOptions:
    """The cluster's options: its kube-scheduler runs with the client limits of the kube-scheduler contender
    if there is one, else at those ``bench cluster`` gives it when it is not under test (qps/burst 5000, so
    that the mix workload's batch pods, the default scheduler's, are not throttled)."""
    for c in contenders:
        spec = SCHEDULERS[c.scheduler]
        if spec.kind == KUBE:
            return ClusterOptions(scheduler_qps=spec.kube_qps, scheduler_burst=spec.kube_burst)
    return ClusterOptions(scheduler_qps=CLIENT_QPS, scheduler_burst=CLIENT_BURST)


def schedule(contenders: Sequence[Contender], rounds: int) -> Iterator[tuple[int, Contender]]:
    """(round, contender) in run order: the given order on even rounds, reversed on odd ones."""
    for r in range(rounds):
        yield from ((r, c) for c in (contenders if r % 2 == 0 else list(reversed(contenders))))


@dataclass(slots=True)
class Trial:
    label: str  # the contender's, or ``WARMUP``
    round: int  # -1 for the warm-up
    position: int  # in run order on the cluster, from 0 (the warm-up's)
    result: RunResult

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "round": self.round,
            "position": self.position,
            "result": self.result.to_json(),
        }


@dataclass(slots=True)
class Summary:
    """One contender over its rounds: means, with (min, max) of the measured rounds."""

    contender: Contender
    rounds: int  # trials without an error
    failed: int
    disturbed: int = 0  # measured trials that started while the host was busy outside the bench
    cpu_s_per_1k: tuple[float, float, float] = (0.0, 0.0, 0.0)  # mean, min, max
    p50_ms: tuple[float, float, float] = (0.0, 0.0, 0.0)
    p99_ms: tuple[float, float, float] = (0.0, 0.0, 0.0)
    pods_per_s: tuple[float, float, float] = (0.0, 0.0, 0.0)
    # create -> the load generator's watch delivering the pod: the API server's part, which no contender moves
    visible_p99_ms: tuple[float, float, float] = (0.0, 0.0, 0.0)
    # pod watches the API server ended as too slow, per trial (``scale.bench.apiserver_watches``); None when
    # no trial measured it
    ended_watches: tuple[float, float, float] | None = None
    by_process: dict[str, float] = field(default_factory=dict)  # mean CPU-s per 1k pods of each process
    # mean part of each process's CPU its main thread used, over the rounds whose results say
    main_share: dict[str, float] = field(default_factory=dict)
    # mean times per bound pod each process's main thread blocked, over the rounds whose results say
    sleeps_per_pod: dict[str, float] = field(default_factory=dict)
    adjusted_cpu_s_per_1k: float = 0.0  # its level in the drift fit, at the mean position (``drift``)
    # the 95 % interval of that level against the first contender's, as fractions (``versus_first``)
    versus_first: tuple[float, float] | None = None


def _mean_of(
    results: Sequence[RunResult], processes: Sequence[str], read: Callable[[RunResult], Mapping[str, float]]
) -> dict[str, float]:
    """Each process's mean of a per-process figure over the results that have one (older results do not)."""
    out = {}
    for p in processes:
        values = [read(r)[p] for r in results if p in read(r)]
        if values:
            out[p] = statistics.fmean(values)
    return out


def _spread(values: list[float]) -> tuple[float, float, float]:
    return (statistics.fmean(values), min(values), max(values)) if values else (0.0, 0.0, 0.0)


def _measured(trial: Trial) -> bool:
    return trial.label != WARMUP and not trial.result.error and trial.result.unbound == 0


Read = Callable[[RunResult], float]


_cpu: Final[Read] = attrgetter("cpu_s_per_1k_pods")

# What the ratios table compares (``versus``), each fitted on its own: the figures the sharded path's goals are
# stated in (a backlog's rate against the no-decision binder's; latency and CPU against the standalone's)
RATIOS: Final[tuple[tuple[str, Read], ...]] = (
    ("pods/s", attrgetter("pods_per_s")),
    ("p50", attrgetter("p50_ms")),
    ("p99", attrgetter("p99_ms")),
    ("CPU per pod", _cpu),
)


def _log_of(trials: Sequence[Trial], read: Read = _cpu) -> dict[str, list[tuple[int, float]]]:
    """(position, log(``read``)) of each contender's measured trials (CPU per pod by default)."""
    groups: dict[str, list[tuple[int, float]]] = {}
    for t in trials:
        if _measured(t) and (value := read(t.result)) > 0:
            groups.setdefault(t.label, []).append((t.position, math.log(value)))
    return groups


def _fit(
    groups: Mapping[str, list[tuple[int, float]]],
) -> tuple[float, float, dict[str, tuple[float, float]]]:
    """The slope of the drift fit, its sum of squares of positions about each contender's mean, and each
    contender's (mean position, mean log CPU per pod)."""
    means = {
        label: (statistics.fmean(x for x, _ in points), statistics.fmean(y for _, y in points))
        for label, points in groups.items()
    }
    sxx = sxy = 0.0
    for label, points in groups.items():
        x0, y0 = means[label]
        sxx += sum((x - x0) ** 2 for x, _ in points)
        sxy += sum((x - x0) * (y - y0) for x, y in points)
    return (sxy / sxx if sxx else 0.0), sxx, means


def drift(trials: Sequence[Trial], read: Read = _cpu) -> tuple[float, dict[str, float]]:
    """The least squares fit of log(figure) = level(contender) + slope x position over the measured trials (a
    drift that scales every contender's figure alike): the slope (the fraction the figure grows per trial)
    and each contender's figure at the mean position of them all. The figure is ``read`` of each trial's
    result, CPU per pod by default."""
    groups = _log_of(trials, read)
    if not groups:
        return 0.0, {}
    slope, _, means = _fit(groups)
    center = statistics.fmean(x for points in groups.values() for x, _ in points)
    return math.expm1(slope), {
        label: math.exp(y0 + slope * (center - x0)) for label, (x0, y0) in means.items()
    }


# Student's t distribution's 0.975 quantile (a two-sided 95 % interval) by degrees of freedom, 1 to 30
T_975: Final = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def _t_975(df: int) -> float:
    # past the table, 1.96 + 2.4 / df is within 0.2 % of the quantile
    return T_975[df - 1] if df <= len(T_975) else 1.96 + 2.4 / df


class Ratio(NamedTuple):
    """A contender's fitted level over the first's, with its 95 % interval when the fit gives one."""

    ratio: float
    low: float | None = None
    high: float | None = None


def versus(trials: Sequence[Trial], first: str, read: Read = _cpu) -> dict[str, Ratio]:
    """Each other contender's drift-adjusted level of ``read`` (CPU per pod by default) over ``first``'s: the
    ratio and its 95 % interval, from the drift fit's residuals (Student's t on the log
    scale: the trials' spread about the fit is taken as one noise shared by every contender, so a noisy
    contender widens every interval of the run). The ratio alone, no interval, when the fit leaves no degree
    of freedom (too few trials for the levels and the slope). Empty when ``first`` has no measured trial; a
    contender with no measured trial is left out. A steady drift is what the fit removes; a disturbance that
    hits one trial widens every interval."""
    groups = _log_of(trials, read)
    if first not in groups:
        return {}
    slope, sxx, means = _fit(groups)
    n = sum(len(points) for points in groups.values())
    df = n - len(groups) - (1 if sxx else 0)  # a level per contender, and the slope when positions differ
    ssr = sum(
        (y - means[label][1] - slope * (x - means[label][0])) ** 2
        for label, points in groups.items()
        for x, y in points
    )
    x1, y1 = means[first]
    n1 = len(groups[first])
    out: dict[str, Ratio] = {}
    for label, points in groups.items():
        if label == first:
            continue
        x0, y0 = means[label]
        change = y0 - y1 + slope * (x1 - x0)  # the log of the ratio of the levels at any common position
        if df < 1:
            out[label] = Ratio(math.exp(change))
            continue
        variance = ssr / df * (1 / len(points) + 1 / n1 + ((x1 - x0) ** 2 / sxx if sxx else 0.0))
        half = _t_975(df) * math.sqrt(variance)
        out[label] = Ratio(math.exp(change), math.exp(change - half), math.exp(change + half))
    return out


def versus_first(trials: Sequence[Trial], first: str) -> dict[str, tuple[float, float]]:
    """The 95 % interval of each other contender's drift-adjusted CPU per pod against ``first``'s, as
    fractions (-0.05: 5 % less): ``versus``'s, without the contenders it could give no interval for (empty
    when the fit leaves no degree of freedom)."""
    return {
        label: (fit.low - 1, fit.high - 1)
        for label, fit in versus(trials, first).items()
        if fit.low is not None and fit.high is not None
    }


def ratios(labels: Sequence[str], trials: Sequence[Trial]) -> str:
    """A Markdown table of each contender's drift-adjusted rate, p50, p99 and CPU per pod over the first
    contender's (``RATIOS``, each fitted as ``drift`` fits CPU per pod), with their 95 % intervals: what a
    goal stated as a ratio ("within 1.25 x of the standalone's") is read from. ``labels``: the contenders,
    the reference first."""
    if len(labels) < 2:
        return ""
    first = labels[0]
    fits = [versus(trials, first, read) for _, read in RATIOS]

    def cell(fit: Ratio | None) -> str:
        if fit is None:
            return "-"
        if fit.low is None or fit.high is None:
            return f"{fit.ratio:.2f} x (no interval)"
        return f"{fit.ratio:.2f} x ({fit.low:.2f}-{fit.high:.2f})"

    lines = [
        f"Against {first}: each contender's drift-fitted level over {first}'s, with its 95 % interval "
        "(an interval that holds 1.00 has not told the two apart)",
        "",
        "| contender | " + " | ".join(name for name, _ in RATIOS) + " |",
        "|---|" + "---|" * len(RATIOS),
    ]
    for label in labels[1:]:
        lines.append(f"| {label} | " + " | ".join(cell(fit.get(label)) for fit in fits) + " |")
    return "\n".join(lines)


def _ended(results: Sequence[RunResult]) -> list[float]:
    return [float(r.apiserver_ended_pod_watches) for r in results if r.apiserver_ended_pod_watches >= 0]


def summarize(contenders: Sequence[Contender], trials: Sequence[Trial]) -> list[Summary]:
    _, levels = drift(trials)
    intervals = versus_first(trials, contenders[0].label) if contenders else {}
    out = []
    for c in contenders:
        mine = [t for t in trials if t.label == c.label]
        ok = [t.result for t in mine if _measured(t)]
        processes = sorted({p for r in ok for p in r.cpu_s_per_1k_pods_by_process})
        out.append(
            Summary(
                contender=c,
                rounds=len(ok),
                failed=len(mine) - len(ok),
                disturbed=sum(1 for r in ok if any(BUSY_NOTE in n for n in r.notes)),
                cpu_s_per_1k=_spread([r.cpu_s_per_1k_pods for r in ok]),
                p50_ms=_spread([r.p50_ms for r in ok]),
                p99_ms=_spread([r.p99_ms for r in ok]),
                pods_per_s=_spread([r.pods_per_s for r in ok]),
                visible_p99_ms=_spread([r.visible_p99_ms for r in ok]),
                ended_watches=_spread(ended) if (ended := _ended(ok)) else None,
                by_process={
                    p: statistics.fmean(r.cpu_s_per_1k_pods_by_process.get(p, 0.0) for r in ok)
                    for p in processes
                },
                main_share=_mean_of(ok, processes, lambda r: r.main_thread_share_by_process),
                sleeps_per_pod=_mean_of(ok, processes, lambda r: r.main_sleeps_per_pod_by_process),
                adjusted_cpu_s_per_1k=levels.get(c.label, 0.0),
                versus_first=intervals.get(c.label),
            )
        )
    return out


def _thread_notes(s: Summary, process: str) -> str:
    notes = []
    if process in s.main_share:
        notes.append(f"{s.main_share[process] * 100:.0f} % main thread")
    if process in s.sleeps_per_pod:
        notes.append(f"{s.sleeps_per_pod[process]:.2f} sleeps/pod")
    return f" ({', '.join(notes)})" if notes else ""


def _checkout(c: Contender) -> str:
    if SCHEDULERS[c.scheduler].kind == KUBE:
        return "-"  # the cluster's own process
    return "this" if c.checkout == PROJECT_ROOT else str(c.checkout)


def table(summaries: Sequence[Summary], slope: float = 0.0) -> str:
    """A Markdown table: each contender's means, with the min-max of its rounds, its drift-adjusted CPU per
    pod and that one's change against the first contender's; then the drift, when given."""

    def cell(v: tuple[float, float, float], fmt: str) -> str:
        mean, lo, hi = v
        return f"{mean:{fmt}} ({lo:{fmt}}-{hi:{fmt}})"

    base = summaries[0].adjusted_cpu_s_per_1k if summaries and summaries[0].rounds else 0.0
    lines = [
        "| contender | scheduler | checkout | rounds | CPU-s/1k pods | drift-adjusted | vs first | p50 ms "
        "| p99 ms | visible p99 ms | watches ended | pods/s | CPU-s/1k by process |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        c = s.contender
        versus = f"{(s.adjusted_cpu_s_per_1k / base - 1) * 100:+.1f} %" if base and s.rounds else "-"
        if s.versus_first is not None and versus != "-":
            lo, hi = s.versus_first
            versus += f" ({lo * 100:+.1f} to {hi * 100:+.1f})"
        by_process = ", ".join(f"{p} {v:.3f}{_thread_notes(s, p)}" for p, v in s.by_process.items()) or "-"
        rounds = f"{s.rounds}" + (f" ({s.disturbed} disturbed)" if s.disturbed else "")
        rounds += f" (+{s.failed} failed)" if s.failed else ""
        visible = cell(s.visible_p99_ms, ".0f") if s.visible_p99_ms[1] > 0 else "-"  # 0: not measured
        ended = cell(s.ended_watches, ".1f") if s.ended_watches is not None else "-"
        lines.append(
            f"| {c.label} | {c.scheduler} | {_checkout(c)} | {rounds} "
            f"| {cell(s.cpu_s_per_1k, '.3f')} | {s.adjusted_cpu_s_per_1k:.3f} | {versus} "
            f"| {cell(s.p50_ms, '.0f')} | {cell(s.p99_ms, '.0f')} | {visible} | {ended} | {cell(s.pods_per_s, '.0f')} "
            f"| {by_process} |"
        )
    if slope:
        lines.append(
            f"\nDrift: CPU per pod {slope * 100:+.1f} % per trial (fitted with one level per contender; the "
            "drift-adjusted column is each contender's level at the mean position of all measured trials)."
        )
    if any(s.versus_first is not None for s in summaries):
        lines.append(
            '\n"vs first": the change of the drift-adjusted CPU per pod, with its 95 % interval from the spread '
            "of the trials about the fit; an interval that holds 0 has not told the contenders apart."
        )
    return "\n".join(lines)


@dataclass(kw_only=True, slots=True)
class PairedConfig:
    contenders: list[Contender]
    nodes: int = DEFAULT_NODES
    workload: str = BURST
    pods: int = DEFAULT_PODS
    rate: float | None = None  # the steady workload's arrival rate
    rounds: int = DEFAULT_ROUNDS
    out: Path
    pull_delay_s: float = 0.0
    quiet_wait_s: float = 30.0
    idle_s: float = 0.0  # after ready and quiet, before the workload
    # once every pod is seen bound, CPU counted until the scheduler and the API server are idle (at most this long)
    until_idle_s: float = 0.0
    stall_s: float = 30.0
    timeout_s: float = 300.0


def load(path: Path) -> list[Trial]:
    """The trials a run wrote (``trials.json``)."""
    return [
        Trial(str(t["label"]), int(t["round"]), int(t["position"]), RunResult.from_json(t["result"]))
        for t in json.loads(path.read_text())
    ]


def labels_of(trials: Sequence[Trial]) -> list[str]:
    """The contenders' labels in the order given to the run (its first round's)."""
    first_round = sorted((t for t in trials if t.round == 0), key=lambda t: t.position)
    return [t.label for t in first_round]


def _dump(trials: Sequence[Trial], path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([t.to_json() for t in trials], indent=1) + "\n")
    tmp.replace(path)


async def run_paired(config: PairedConfig) -> list[Trial]:
    config.out.mkdir(parents=True, exist_ok=True)
    logs = config.out / "logs"
    specs = default_workloads(config.nodes, burst=config.pods, pods=config.pods, rate=config.rate)
    workload = scaled(specs[config.workload], pull_delay_s=config.pull_delay_s)
    fleet = generate_nodes(config.nodes, prepulled=PREPULLED_FRACTION)
    # what ``run_workload`` reads of a ``bench cluster`` configuration
    bench = BenchConfig(
        nodes=[config.nodes],
        schedulers=[c.scheduler for c in config.contenders],
        out=config.out,
        stall_s=config.stall_s,
        timeout_s=config.timeout_s,
        quiet_wait_s=config.quiet_wait_s,
        pull_delay_s=config.pull_delay_s,
        until_idle_s=config.until_idle_s,
    )
    trials: list[Trial] = []
    cluster = await fresh_cluster(
        Path(tempfile.mkdtemp(prefix=f"bench-paired-{config.nodes}-")),
        config.nodes,
        cluster_options(config.contenders),
    )
    try:
        await asyncio.to_thread(stages.install, cluster)
        async with cluster.client(qps=50000, burst=50000, max_connections=256) as client:
            kubeconfig, notes = measured_kubeconfig(cluster, await grant_agent_rbac(client))
            runs = [(-1, config.contenders[0], WARMUP)]
            runs += [(r, c, c.label) for r, c in schedule(config.contenders, config.rounds)]
            for position, (r, c, label) in enumerate(runs):
                spec = SCHEDULERS[c.scheduler]
                lease_ttl = paused_lease_ttl(spec, paused=workload.paused)
                log.info("%s: %s", f"round {r + 1}" if r >= 0 else label, c.describe)
                running: Running | None = None
                try:
                    running = launch(
                        spec,
                        cluster,
                        logs,
                        kubeconfig=kubeconfig,
                        tag=f"{label}-{position}",
                        code=c.checkout,
                        profile_windows=True,  # run_workload opens them
                        lease_ttl=lease_ttl,
                    )
                    trial_notes = list(notes)
                    if lease_ttl is not None:
                        trial_notes.append(PAUSED_NOTE.format(ttl=lease_ttl))
                    why = await until_ready(
                        client, spec, running, nodes=config.nodes, fleet=fleet, notes=trial_notes
                    )
                    if why:
                        result = failed_result(spec, workload, config.nodes, why)
                    else:
                        quiet = await wait_quiet(
                            cluster, running, cores=bench.quiet_cores, max_wait=config.quiet_wait_s
                        )
                        await asyncio.sleep(config.idle_s)
                        result = await run_workload(
                            client,
                            cluster,
                            running,
                            workload,
                            nodes=config.nodes,
                            fleet=fleet,
                            config=bench,
                            notes=[*trial_notes, quiet] if quiet else trial_notes,
                        )
                except (ApiError, OSError, TimeoutError) as e:  # this trial failed; the next ones may not
                    log.exception("%s, %s, failed", c.describe, label)
                    result = failed_result(spec, workload, config.nodes, f"{type(e).__name__}: {e}")
                finally:
                    problems = running.stop() if running is not None else []
                if problems:
                    result.notes += problems
                    log.warning("stopping %s: %s", c.describe, "; ".join(problems))
                trials.append(Trial(label, r, position, result))
                _dump(trials, config.out / "trials.json")
    finally:
        await asyncio.to_thread(cluster.stop)
    return trials


def main(
    *,
    runs: Sequence[str],
    nodes: int,
    workload: str,
    pods: int,
    rate: float | None,
    rounds: int,
    out: Path | None,
    pull_delay_s: float,
    quiet_wait_s: float,
    idle_s: float = 0.0,
    until_idle_s: float = 0.0,
) -> int:
    try:
        contenders = parse_contenders(runs)
    except ContenderError as e:
        print(f"agent-scheduler bench paired: error: {e}", file=sys.stderr)
        return 2
    if rounds < 1 or nodes < 1 or pods < 1:
        print(
            "agent-scheduler bench paired: error: --rounds, --nodes and --pods must be positive",
            file=sys.stderr,
        )
        return 2
    if idle_s < 0 or until_idle_s < 0:
        print(
            "agent-scheduler bench paired: error: --idle and --until-idle must be 0 or more", file=sys.stderr
        )
        return 2
    config = PairedConfig(
        contenders=contenders,
        nodes=nodes,
        workload=workload,
        pods=pods,
        rate=rate,
        rounds=rounds,
        out=(out or Path("results") / f"bench-paired-{time.strftime('%Y%m%d-%H%M%S')}").resolve(),
        pull_delay_s=pull_delay_s,
        quiet_wait_s=quiet_wait_s,
        idle_s=idle_s,
        until_idle_s=until_idle_s,
    )
    began = time.monotonic()
    try:
        trials = asyncio.run(run_paired(config))
    except ClusterError as e:
        print(f"agent-scheduler bench paired: error: the cluster did not start: {e}", file=sys.stderr)
        return 1
    slope, _ = drift(trials)
    text = table(summarize(contenders, trials), slope)
    text += "\n\n" + ratios([c.label for c in contenders], trials)
    (config.out / "summary.md").write_text(
        f"{config.workload} of {config.pods} pods on {config.nodes} nodes"
        + (f", each after {config.idle_s:g} s idle" if config.idle_s else "")
        + (
            f", CPU counted until the scheduler and the API server were idle (up to {config.until_idle_s:g} s after every pod was "
            "seen bound)"
            if config.until_idle_s
            else ""
        )
        + f", a warm-up trial then {config.rounds} rounds (order reversed on odd rounds); mean (min-max) over "
        f"the rounds\n\n{text}\n"
    )
    print(text)
    print(
        f"\n{len(trials)} trials in {time.monotonic() - began:.0f}s; trials in {config.out}/trials.json, "
        f"summary in {config.out}/summary.md"
    )
    measured = [t for t in trials if t.label != WARMUP]
    return 0 if measured and all(_measured(t) for t in measured) else 1


def ratios_main(argv: Sequence[str] | None = None) -> int:
    """``python -m scale.bench.paired DIR [LABEL...]``: the ratios table of a run already made, from its
    ``trials.json``, against the first LABEL (default: the contenders in the run's order)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0].startswith("-"):
        print("usage: python -m scale.bench.paired DIR [LABEL...]", file=sys.stderr)
        return 2
    try:
        trials = load(Path(args[0]) / "trials.json")
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"{args[0]}: cannot read its trials.json: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    labels = args[1:] or labels_of(trials)
    unknown = sorted(set(labels) - {t.label for t in trials})
    if unknown:
        print(f"no trials of {', '.join(unknown)} in {args[0]}", file=sys.stderr)
        return 2
    if len(labels) < 2:
        print(f"{args[0]}: fewer than two contenders to compare", file=sys.stderr)
        return 2
    print(ratios(labels, trials))
    return 0


if __name__ == "__main__":
    raise SystemExit(ratios_main())
