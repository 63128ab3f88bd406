"""The bench report: ``report.md`` with the issue's goals met or missed, the results table, plots, limits.

Input is only the list of ``RunResult`` (what ``results.json`` holds), so a report can be rebuilt from a results
file alone (``agent-scheduler bench report DIR``). Pure functions (``goals``, ``table``, ``utilisation``,
``stage_table``, ``stack``) build the text; ``write`` adds the PNG plots (matplotlib, Agg backend, imported
lazily), among them a stacked bar of stage means per scheduler configuration.

The goals (issue 6), each comparing one agent configuration with kube-scheduler at client qps 5000 on the same
node count. The throughput workload is ``backlog`` when it was run (pods all pending before the scheduler is
released: nothing but the scheduler and its bindings load the API server), else ``burst``:
- throughput: sustained pods/s on the throughput workload at least 2x;
- latency: p99 create-to-bound at equal offered load (the steady workload, else churn, else mix) at most half;
- ceiling: pods/s on the throughput workload at least 90 % of the no-decision binder's;
- cost: CPU-seconds per 1,000 pods on the throughput workload no more than kube-scheduler's.

The sharded path's goals (issue 14), each comparing a coordinated configuration (``agent-coord-N``: a leader and
N workers) with the standalone worker, kube-scheduler and the no-decision binder on the same node count:
- backlog at least 95 % of the no-decision ceiling's pods/s;
- burst p50 and p99 create-to-bound at most 1.25x the standalone worker's, and p99 at most half kube-scheduler's;
- burst CPU-seconds per 1,000 pods of all its processes summed at most 1.3x the standalone worker's.
"""

from __future__ import annotations

import json
import math
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scale.bench.results import RunResult, load
from scale.bench.stagemetrics import STAGES
from scale.bench.volcano import VolcanoProbe

KUBE_REFERENCE = "kube-scheduler-qps5000"
CEILING = "no-decision"
STANDALONE = "agent-standalone"
COORDINATED_PREFIX = "agent-coord-"
THROUGHPUT_WORKLOADS = ("backlog", "burst")  # the first one present is used
WORKLOAD_ORDER = ("backlog", "burst", "steady", "churn", "mix", "spread", "preempt")
PREEMPT = "preempt"
SPREAD = "spread"
LATENCY_WORKLOADS = ("steady", "churn", "mix")


@dataclass(frozen=True, slots=True)
class Goal:
    nodes: int
    scheduler: str
    goal: str
    target: str
    value: float | None  # the measured ratio; None when a needed run is missing or failed
    met: bool | None

    @property
    def verdict(self) -> str:
        return "n/a" if self.met is None else ("met" if self.met else "missed")


def _find(results: Sequence[RunResult], scheduler: str, workload: str, nodes: int) -> RunResult | None:
    for r in results:
        if r.scheduler == scheduler and r.workload == workload and r.nodes == nodes and not r.error:
            return r
    return None


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b > 0 else None


def throughput_workload(results: Sequence[RunResult], nodes: int) -> str:
    """The workload the throughput, ceiling and cost goals use at ``nodes``: backlog if run, else burst."""
    present = {r.workload for r in results if r.nodes == nodes}
    return next((w for w in THROUGHPUT_WORKLOADS if w in present), THROUGHPUT_WORKLOADS[-1])


def goals(results: Sequence[RunResult]) -> list[Goal]:
    """The four goals for every agent configuration and node count found in ``results``."""
    out: list[Goal] = []
    nodes_seen = sorted({r.nodes for r in results})
    agents = sorted(
        {r.scheduler for r in results if r.scheduler_kind == "agent" or r.scheduler.startswith("agent")}
    )
    for nodes in nodes_seen:
        tw = throughput_workload(results, nodes)
        for agent in agents:
            kube_burst = _find(results, KUBE_REFERENCE, tw, nodes)
            ours_burst = _find(results, agent, tw, nodes)
            ceiling = _find(results, CEILING, tw, nodes)
            ratio = (
                _ratio(ours_burst.pods_per_s, kube_burst.pods_per_s) if ours_burst and kube_burst else None
            )
            out.append(
                Goal(
                    nodes,
                    agent,
                    f"throughput vs kube-scheduler ({tw})",
                    ">= 2.0x",
                    ratio,
                    None if ratio is None else ratio >= 2.0,
                )
            )
            lat = next(
                (
                    (w, o, k)
                    for w in LATENCY_WORKLOADS
                    if (o := _find(results, agent, w, nodes))
                    and (k := _find(results, KUBE_REFERENCE, w, nodes))
                ),
                None,
            )
            if lat is not None and lat[2].p99_ms > 0:
                workload, ours, kube = lat
                r = round(ours.p99_ms / kube.p99_ms, 2)
                out.append(Goal(nodes, agent, f"p99 vs kube-scheduler ({workload})", "<= 0.5x", r, r <= 0.5))
            else:
                out.append(Goal(nodes, agent, "p99 vs kube-scheduler (steady)", "<= 0.5x", None, None))
            ratio = _ratio(ours_burst.pods_per_s, ceiling.pods_per_s) if ours_burst and ceiling else None
            out.append(
                Goal(
                    nodes,
                    agent,
                    f"share of the no-decision ceiling ({tw})",
                    ">= 0.90",
                    ratio,
                    None if ratio is None else ratio >= 0.9,
                )
            )
            ratio = (
                _ratio(ours_burst.cpu_s_per_1k_pods, kube_burst.cpu_s_per_1k_pods)
                if ours_burst and kube_burst
                else None
            )
            out.append(
                Goal(
                    nodes,
                    agent,
                    f"CPU per 1k pods vs kube-scheduler ({tw})",
                    "<= 1.0x",
                    ratio,
                    None if ratio is None else ratio <= 1.0,
                )
            )
    return out


SHARDED_GOALS = (
    # (goal, workload, reference configuration, compared field, target, limit, at least?)
    ("backlog share of the no-decision ceiling", "backlog", CEILING, "pods_per_s", ">= 0.95", 0.95, True),
    ("burst p50 vs standalone", "burst", STANDALONE, "p50_ms", "<= 1.25x", 1.25, False),
    ("burst p99 vs standalone", "burst", STANDALONE, "p99_ms", "<= 1.25x", 1.25, False),
    ("burst p99 vs kube-scheduler", "burst", KUBE_REFERENCE, "p99_ms", "<= 0.5x", 0.5, False),
    (
        "burst CPU per 1k pods, all processes, vs standalone",
        "burst",
        STANDALONE,
        "cpu_s_per_1k_pods",
        "<= 1.3x",
        1.3,
        False,
    ),
)


def sharded_goals(results: Sequence[RunResult]) -> list[Goal]:
    """Issue 14's goals for every coordinated configuration and node count found in ``results``
    (``cpu_s_per_1k_pods`` already sums every process of a configuration)."""
    out: list[Goal] = []
    coordinated = sorted({r.scheduler for r in results if r.scheduler.startswith(COORDINATED_PREFIX)})
    for nodes in sorted({r.nodes for r in results}):
        for coord in coordinated:
            for name, workload, reference, field, target, limit, at_least in SHARDED_GOALS:
                ours, theirs = (
                    _find(results, coord, workload, nodes),
                    _find(results, reference, workload, nodes),
                )
                value = (
                    _ratio(float(getattr(ours, field)), float(getattr(theirs, field)))
                    if ours and theirs
                    else None
                )
                met = None if value is None else (value >= limit if at_least else value <= limit)
                out.append(Goal(nodes, coord, name, target, value, met))
    return out


def _fmt(x: float, digits: int = 0) -> str:
    if isinstance(x, float) and math.isnan(x):
        return "-"
    return f"{x:,.{digits}f}"


def table(results: Sequence[RunResult]) -> str:
    """The results as one Markdown table, rows grouped by node count and workload."""
    head = (
        "| nodes | workload | scheduler | pods | unbound | offered/s | pods/s | p50 ms | p90 ms | p99 ms | max ms "
        "| create→running p50/p99 ms | sched CPU-s/1k pods | sched peak RSS MiB | apiserver CPU-s "
        "| other host CPU-s |\n"
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    rows = [head]
    for r in sorted(results, key=lambda r: (r.nodes, _workload_order(r.workload), r.scheduler)):
        if r.error:
            rows.append(
                f"| {r.nodes} | {r.workload} | {r.scheduler} | {r.pods} | {r.unbound} | failed: {r.error[:80]} |"
                + " |" * 10
            )
            continue
        rows.append(
            f"| {r.nodes} | {r.workload} | {r.scheduler} | {r.pods} | {r.unbound} | {_fmt(r.offered_per_s)} "
            f"| **{_fmt(r.pods_per_s)}** | {_fmt(r.p50_ms)} | {_fmt(r.p90_ms)} | **{_fmt(r.p99_ms)}** | {_fmt(r.max_ms)} "
            f"| {_running(r)} | {_fmt(r.cpu_s_per_1k_pods, 2)} | {_fmt(r.peak_rss_mb)} | {_fmt(r.apiserver_cpu_s, 1)} "
            f"| {_fmt(r.host_other_cpu_s, 1)} |"
        )
    return "\n".join(rows)


def _running(r: RunResult) -> str:
    """create -> running, where image pulls were simulated; how many pods waited for a pull."""
    if not r.running:
        return "-"
    return f"{_fmt(r.running_p50_ms)} / {_fmt(r.running_p99_ms)} ({r.pods_waiting_for_pulls} pulled)"


def _runs_of(results: Sequence[RunResult], workload: str) -> list[RunResult]:
    """The successful runs of one workload, by node count and scheduler."""
    return sorted(
        (r for r in results if r.workload == workload and not r.error), key=lambda r: (r.nodes, r.scheduler)
    )


def preemption_table(results: Sequence[RunResult]) -> list[str]:
    """Markdown: the preempt workload side by side per node count (no lines when it was not run)."""
    runs = _runs_of(results, PREEMPT)
    if not runs:
        return []
    lines = [
        "| nodes | scheduler | preemptors | bound | placeholders | victims deleted | p50 ms | p99 ms | max ms "
        "| overcommitted nodes |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        p = r.params
        lines.append(
            f"| {r.nodes} | {r.scheduler} | {r.pods} | {r.bound} | {p.get('placeholders', '-')} "
            f"| {p.get('victims', '-')} | {_fmt(r.p50_ms)} | **{_fmt(r.p99_ms)}** | {_fmt(r.max_ms)} "
            f"| {p.get('overcommitted_nodes', '-')} |"
        )
    return lines


def spread_table(results: Sequence[RunResult]) -> list[str]:
    """Markdown: the spread workload side by side per node count, with its audit of the pools' hard rules (no
    lines when it was not run)."""
    runs = _runs_of(results, SPREAD)
    if not runs:
        return []
    lines = [
        "| nodes | scheduler | pods | bound | pods/s | p50 ms | p99 ms | zone-spread pools over maxSkew 1 "
        "| anti-affinity pools with two pods on one node | created |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in runs:
        p = r.params
        lines.append(
            f"| {r.nodes} | {r.scheduler} | {r.pods} | {r.bound} | {_fmt(r.pods_per_s)} | {_fmt(r.p50_ms)} "
            f"| **{_fmt(r.p99_ms)}** | {p.get('skew_violations', '-')} of {p.get('spread_pools', '-')} "
            f"| {p.get('anti_affinity_violations', '-')} of {p.get('anti_affinity_pools', '-')} "
            f"| {'as a backlog (scheduler paused)' if p.get('paused') else 'while the scheduler ran'} |"
        )
    return lines


def _workload_order(name: str) -> int:
    return WORKLOAD_ORDER.index(name) if name in WORKLOAD_ORDER else len(WORKLOAD_ORDER)


def utilisation(r: RunResult) -> dict[str, float]:
    """Average busy cores of each measured group over the run (CPU-seconds / wall seconds)."""
    if r.duration_s <= 0:
        return {}
    d = r.duration_s
    return {
        "scheduler": round(r.cpu_s / d, 2),
        "apiserver": round(r.apiserver_cpu_s / d, 2),
        "etcd": round(r.etcd_cpu_s / d, 2),
        "kwok": round(r.kwok_cpu_s / d, 2),
        "loadgen": round(r.loadgen_cpu_s / d, 2),
        "other": round(r.host_other_cpu_s / d, 2),
    }


def limits(results: Sequence[RunResult], cores: int) -> list[str]:
    """What bounded each backlog and burst run, read from where the CPU went (one line per run), and whether the
    throughput goal was within reach at all (the no-decision ceiling against kube-scheduler)."""
    lines = []
    for nodes in sorted({r.nodes for r in results}):
        tw = throughput_workload(results, nodes)
        ceiling = _find(results, CEILING, tw, nodes)
        kube = _find(results, KUBE_REFERENCE, tw, nodes)
        if ceiling and kube and kube.pods_per_s > 0:
            ratio = ceiling.pods_per_s / kube.pods_per_s
            reach = (
                "so the 2x throughput goal is out of reach for any scheduler here"
                if ratio < 2
                else "so 2x is possible"
            )
            lines.append(
                f"- {nodes} nodes: the no-decision ceiling ({ceiling.pods_per_s:.0f} pods/s) is {ratio:.2f}x "
                f"kube-scheduler's {tw} throughput ({kube.pods_per_s:.0f} pods/s), {reach} on this machine."
            )
    for r in sorted(results, key=lambda r: (r.nodes, _workload_order(r.workload), r.scheduler)):
        if r.error or r.workload not in THROUGHPUT_WORKLOADS:
            continue
        u = utilisation(r)
        if not u:
            continue
        total = sum(u.values())
        per_process = u["scheduler"] / max(1, r.scheduler_processes)
        if r.scheduler_kind == "agent" and per_process >= 0.8:
            why = "the scheduler process is CPU-bound (one asyncio thread per process)"
        elif r.scheduler == "kube-scheduler-default":
            why = "its client rate limit (qps 50 / burst 100) paces the bindings"
        elif total >= 0.85 * cores:
            why = f"the machine is saturated ({total:.1f} of {cores} cores busy; the API server takes {u['apiserver']:.2f})"
        else:
            why = "no single resource saturated; latency of the API round trips paces it"
        lines.append(
            f"- {r.nodes} nodes, {r.workload}, {r.scheduler}: {r.pods_per_s:.0f} pods/s; busy cores: scheduler {u['scheduler']:.2f}, "
            f"API server {u['apiserver']:.2f}, etcd {u['etcd']:.2f}, kwok {u['kwok']:.2f}, load generator "
            f"{u['loadgen']:.2f}, other processes {u['other']:.2f} — {why}."
        )
    return lines


HOPS = "hops"  # the leader's result stage minus the worker's stages: the two network hops and the RESULT


def stack(r: RunResult) -> list[tuple[str, float]]:
    """The segments of one run's stacked stage bar, in path order: (stage, mean ms).

    Every stage is one process's own measurement, so the means add up along the path. A coordinated run has
    two views of the worker's part: the worker's stages, and the leader's ``result`` that spans them plus the
    hops; the bar shows the worker's stages and, as ``hops``, what ``result`` has beyond them (mean minus
    means, never a difference of clocks; 0 when the worker's side is the larger)."""
    means = {stage: float(v.get("mean_ms", 0.0)) for stage, v in r.stages.items()}
    out = [(stage, means[stage]) for stage in STAGES if stage in means and stage != "result"]
    if "result" in means:
        worker = sum(means.get(stage, 0.0) for stage in STAGES if stage not in ("dispatched", "result"))
        out.append((HOPS, max(0.0, means["result"] - worker)))
    return out


def stage_table(results: Sequence[RunResult]) -> list[str]:
    """Markdown: mean / p99 ms per stage for every run that reported stages ("" when none did)."""
    runs = sorted(
        (r for r in results if r.stages and not r.error),
        key=lambda r: (r.nodes, _workload_order(r.workload), r.scheduler),
    )
    if not runs:
        return []
    seen = [s for s in STAGES if any(s in r.stages for r in runs)]
    lines = [
        "| nodes | workload | scheduler | " + " | ".join(seen) + " |",
        "|---:|---|---|" + "---:|" * len(seen),
    ]
    for r in runs:
        cells = []
        for stage in seen:
            v = r.stages.get(stage)
            cells.append("-" if not v else f"{v['mean_ms']:.1f} / {v['p99_ms']:.0f}")
        lines.append(f"| {r.nodes} | {r.workload} | {r.scheduler} | " + " | ".join(cells) + " |")
    return lines


def split_table(results: Sequence[RunResult]) -> list[str]:
    """Markdown: each run's mean create->bound latency split into what came before any scheduler could see the
    pod (the load generator's watch delivering it), the scheduler's stages along the path (their means summed,
    as the stacked bar), and the rest; [] when no run measured the first part."""
    runs = sorted(
        (r for r in results if r.visible_mean_ms > 0 and not r.error),
        key=lambda r: (r.nodes, _workload_order(r.workload), r.scheduler),
    )
    if not runs:
        return []
    lines = [
        "| nodes | workload | scheduler | create→bound mean | create→visible mean (p50 / p99) | scheduler stages | rest |",
        "|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in runs:
        # None: the scheduler reports no stages (kube-scheduler, the no-decision binder); the rest holds its work
        path = sum(ms for _, ms in stack(r)) if r.stages else None
        rest = r.mean_ms - r.visible_mean_ms - (path or 0.0)
        lines.append(
            f"| {r.nodes} | {r.workload} | {r.scheduler} | {_fmt(r.mean_ms)} | {_fmt(r.visible_mean_ms)} "
            f"({_fmt(r.visible_p50_ms)} / {_fmt(r.visible_p99_ms)}) | {'-' if path is None else _fmt(path)} "
            f"| {_fmt(rest)} |"
        )
    return lines


def process_cpu_table(results: Sequence[RunResult]) -> list[str]:
    """Markdown: each scheduler process's CPU-s per 1k pods, for runs with more than one process."""
    runs = sorted(
        (r for r in results if len(r.cpu_s_per_1k_pods_by_process) > 1 and not r.error),
        key=lambda r: (r.nodes, _workload_order(r.workload), r.scheduler),
    )
    if not runs:
        return []
    lines = ["| nodes | workload | scheduler | total | per process |", "|---:|---|---|---:|---|"]
    for r in runs:
        parts = ", ".join(f"{name} {cpu:.2f}" for name, cpu in r.cpu_s_per_1k_pods_by_process.items())
        lines.append(f"| {r.nodes} | {r.workload} | {r.scheduler} | {r.cpu_s_per_1k_pods:.2f} | {parts} |")
    return lines


def _stage_plots(out: Path, results: Sequence[RunResult]) -> list[tuple[str, str]]:
    """One stacked-bar figure of stage means per node count: a panel per workload, a bar per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made: list[tuple[str, str]] = []
    ok = [r for r in results if r.stages and not r.error]
    segments = [s for s in STAGES if s != "result"] + [HOPS]
    colours = {s: plt.get_cmap("tab10")(i % 10) for i, s in enumerate(segments)}
    for nodes in sorted({r.nodes for r in ok}):
        runs = [r for r in ok if r.nodes == nodes]
        workloads = sorted({r.workload for r in runs}, key=_workload_order)
        fig, axes = plt.subplots(1, len(workloads), figsize=(4.2 * len(workloads), 3.8), squeeze=False)
        for ax, workload in zip(axes[0], workloads, strict=True):
            bars = sorted((r for r in runs if r.workload == workload), key=lambda r: r.scheduler)
            for x, r in enumerate(bars):
                bottom = 0.0
                for stage, ms in stack(r):
                    ax.bar(x, ms, bottom=bottom, color=colours[stage], label=stage if x == 0 else None)
                    bottom += ms
            ax.set_xticks(range(len(bars)), [r.scheduler for r in bars], rotation=20, fontsize=7)
            ax.set_title(f"{workload} ({nodes} nodes)")
            ax.set_ylabel("mean ms per pod, by stage")
            ax.grid(True, axis="y", alpha=0.3)
        handles: dict[str, Any] = {}
        for ax in axes[0]:
            for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                handles.setdefault(label, handle)
        axes[0][-1].legend(
            [handles[s] for s in segments if s in handles],
            [s for s in segments if s in handles],
            fontsize=7,
            loc="upper right",
        )
        fig.tight_layout()
        name = f"stages-{nodes}.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        made.append((f"Where the time goes: mean per stage, {nodes} nodes", name))
    return made


def _plots(out: Path, results: Sequence[RunResult]) -> list[tuple[str, str]]:
    """One latency-CDF figure and one bound-over-time figure per node count; returns (title, file) pairs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made: list[tuple[str, str]] = []
    ok = [r for r in results if not r.error]
    for nodes in sorted({r.nodes for r in ok}):
        runs = [r for r in ok if r.nodes == nodes]
        workloads = sorted({r.workload for r in runs}, key=_workload_order)
        schedulers = sorted({r.scheduler for r in runs})
        colours = {s: plt.get_cmap("tab10")(i % 10) for i, s in enumerate(schedulers)}
        for kind in ("cdf", "timeline"):
            fig, axes = plt.subplots(1, len(workloads), figsize=(4.2 * len(workloads), 3.6), squeeze=False)
            for ax, workload in zip(axes[0], workloads, strict=True):
                for r in sorted((r for r in runs if r.workload == workload), key=lambda r: r.scheduler):
                    if kind == "cdf" and r.cdf_ms:
                        ys = [k / (len(r.cdf_ms) - 1) for k in range(len(r.cdf_ms))]
                        ax.plot(
                            [max(x, 0.1) for x in r.cdf_ms], ys, label=r.scheduler, color=colours[r.scheduler]
                        )
                    elif kind == "timeline" and r.timeline:
                        ax.plot(
                            [p[0] for p in r.timeline],
                            [p[1] for p in r.timeline],
                            label=r.scheduler,
                            color=colours[r.scheduler],
                        )
                ax.set_title(f"{workload} ({nodes} nodes)")
                ax.grid(True, alpha=0.3)
                if kind == "cdf":
                    ax.set_xscale("log")
                    ax.set_xlabel("create-to-bound latency (ms, log)")
                    ax.set_ylabel("fraction of pods")
                else:
                    ax.set_xlabel("seconds since the workload started")
                    ax.set_ylabel("pods bound")
            axes[0][-1].legend(fontsize=7, loc="lower right")
            fig.tight_layout()
            name = f"{'latency-cdf' if kind == 'cdf' else 'bound-over-time'}-{nodes}.png"
            fig.savefig(out / name, dpi=110)
            plt.close(fig)
            made.append(
                (f"{'Latency CDF' if kind == 'cdf' else 'Pods bound over time'}, {nodes} nodes", name)
            )
    return made


def render(
    results: Sequence[RunResult],
    *,
    plots: Sequence[tuple[str, str]] = (),
    volcano: VolcanoProbe | None = None,
    profiles: Sequence[str] = (),
    quick: bool = False,
) -> str:
    cores = os.cpu_count() or 1
    lines = [
        f"# Scale bench: agent scheduler vs kube-scheduler{' (quick)' if quick else ''}",
        "",
        f"Machine: {cores} cores, {platform.machine()}, Python {platform.python_version()}; every component "
        "(etcd, kube-apiserver, kwok, the schedulers, the load generator) shares it. Each scheduler ran on a fresh "
        "local cluster with the same kwok node fleet. Latency is from the load generator sending the create to its "
        "watch seeing `spec.nodeName`; pods/s is sustained (10 %–90 % of binds). Field definitions: "
        "`docs/benchmarks.md`.",
        "",
        "## Goals (agent scheduler vs kube-scheduler at client qps 5000)",
        "",
        "| nodes | agent configuration | goal | target | measured | verdict |",
        "|---:|---|---|---|---:|---|",
    ]
    for g in goals(results):
        value = "-" if g.value is None else f"{g.value:.2f}"
        lines.append(f"| {g.nodes} | {g.scheduler} | {g.goal} | {g.target} | {value} | **{g.verdict}** |")
    sharded = sharded_goals(results)
    if sharded:
        lines += [
            "",
            "## Goals of the sharded path (coordinator + workers vs the standalone worker, issue 14)",
            "",
            "From one run of each workload per configuration. On a shared host a single burst's latency moves "
            "with the API server's watch delivery (*create→visible* below), by several times between runs of "
            "one configuration: judge the latency goals by `agent-scheduler bench paired`, which alternates "
            "configurations on one cluster over several rounds.",
            "",
            "| nodes | agent configuration | goal | target | measured | verdict |",
            "|---:|---|---|---|---:|---|",
        ]
        for g in sharded:
            value = "-" if g.value is None else f"{g.value:.2f}"
            lines.append(f"| {g.nodes} | {g.scheduler} | {g.goal} | {g.target} | {value} | **{g.verdict}** |")
    lines += ["", "## Results", "", table(results), ""]
    other = [r for r in results if not r.error and r.host_other_cpu_s > 0.2 * max(r.duration_s, 1e-9)]
    if other:
        lines += [
            f"Note: in {len(other)} of {len(results)} runs, processes outside the bench used more than 0.2 cores on "
            "average (column *other host CPU-s*): the machine was shared and those numbers carry that noise.",
            "",
        ]
    preempt = preemption_table(results)
    if preempt:
        lines += [
            "## Preemption: a burst of high-priority agent pods on a cluster full of placeholders",
            "",
            "Every untainted node is filled with lowest-priority placeholders; each preemptor is the size of one "
            "placeholder, so each binds only after a victim is deleted (create to bound, all preemptors).",
            "",
            *preempt,
            "",
        ]
    spread = spread_table(results)
    if spread:
        lines += [
            "## Spread: sandbox pools with inter-pod rules",
            "",
            "Pools of 8 pods: a third spread over the zones (maxSkew 1, DoNotSchedule), a third with required "
            "anti-affinity on the hostname, a third with both rules soft. The bound pods are audited against "
            "the hard rules afterwards; any pool counted in the last two columns is a broken rule.",
            "",
            *spread,
            "",
        ]
    for title, name in plots:
        lines += [f"### {title}", "", f"![{title}]({name})", ""]
    stages = stage_table(results)
    if stages:
        lines += [
            "## Where the time goes: per-stage latency (mean / p99 ms)",
            "",
            "From the schedulers' `agent_scheduler_pod_scheduling_stage_duration_seconds{stage}`, scraped before "
            "and after each run (`common/metrics.py` defines the stages). Leader: `dispatched` (its watch to the "
            "DISPATCH), `result` (DISPATCH to RESULT bound); worker: `queued`, `decided`, `bind_sent`, `bound`. "
            "p99 is estimated from the histogram buckets. In the stacked bars, `hops` is the leader's `result` "
            "mean minus the worker's stage means.",
            "",
            *stages,
            "",
        ]
    split = split_table(results)
    if split:
        lines += [
            "## Where the time goes, end to end (mean ms)",
            "",
            "`create→visible`: from the create sent (a backlog: its release) to the load generator's pod watch first "
            "delivering the pod, the API server's commit and watch fan-out that every scheduler waits for too "
            "(a backlog's pods are visible before their release: 0, and the release's delivery is in `rest`). "
            "`scheduler stages`: the stage means along the path, as the stacked bar (no stages: kube-scheduler, "
            "the no-decision binder). `rest`: create→bound minus both, the time no stage covers: the pod's way to "
            "the scheduler's own watch and into its loop, and the bound pod's way back to the load generator's "
            "watch (on a saturated host, mostly waits for a core). Durations of different processes are added, "
            "never their clocks subtracted.",
            "",
            *split,
            "",
        ]
    per_process = process_cpu_table(results)
    if per_process:
        lines += [
            "## Where the scheduler CPU goes: CPU-s per 1k pods of each process",
            "",
            "The `sched CPU-s/1k pods` column split by process (user + system CPU over the run, as the column).",
            "",
            *per_process,
            "",
        ]
    lim = limits(results, cores)
    if lim:
        lines += ["## What limits throughput (backlog and burst runs, from where the CPU went)", "", *lim, ""]
    for text in profiles:
        lines += ["## Profile of the agent scheduler", "", "```", text.strip()[:6000], "```", ""]
    mixed = [r for r in results if r.batch_pods and not r.error]
    if mixed:
        lines += ["## Mix: the default scheduler's batch pods alongside", ""]
        lines += [
            f"- {r.nodes} nodes, {r.scheduler}: {r.batch_bound}/{r.batch_pods} batch pods bound, p99 {r.batch_p99_ms:.0f} ms"
            for r in mixed
        ]
        lines.append("")
    lines += ["## Volcano's agent-scheduler", ""]
    if volcano is None:
        lines.append("Not attempted in this run (`--quick` or `--no-volcano`).")
    else:
        state = f"found ({volcano.version})" if volcano.built else "not found"
        lines.append(f"{state} after {volcano.seconds:.0f}s: {volcano.reason}.")
        ran = sorted({r.scheduler for r in results if r.scheduler_kind == "volcano-agent-scheduler"})
        if volcano.built and ran:
            lines.append(
                f"Measured as {', '.join(ran)} (its scheduling workers in one process, sharding mode `none`, "
                "client qps/burst 5000, its default plugins), in the tables above."
            )
    lines.append("")
    noted = [r for r in results if r.notes or r.error]
    if noted:
        lines += ["## Notes per run", ""]
        for r in noted:
            for note in ([r.error] if r.error else []) + r.notes:
                lines.append(f"- {r.nodes} nodes, {r.scheduler} × {r.workload}: {note}")
        lines.append("")
    return "\n".join(lines)


def write(
    out: Path,
    results: Sequence[RunResult],
    *,
    volcano: VolcanoProbe | None = None,
    profiles: Sequence[str] = (),
    quick: bool = False,
) -> Path:
    """Write ``report.md`` and its PNG plots into ``out``; returns the report's path."""
    out.mkdir(parents=True, exist_ok=True)
    plots = [*_plots(out, results), *_stage_plots(out, results)] if results else []
    path = out / "report.md"
    path.write_text(render(results, plots=plots, volcano=volcano, profiles=profiles, quick=quick))
    return path


def rebuild(out: Path) -> Path:
    """Rebuild the report of a results directory from its ``results.json`` (profiles kept if present)."""
    profiles = [p.read_text() for p in sorted(out.glob("profile-*.txt"))]
    volcano = None
    if (out / "volcano.json").exists():
        volcano = VolcanoProbe(**json.loads((out / "volcano.json").read_text()))
    quick = all(r.nodes <= 200 for r in load(out / "results.json"))
    return write(out, load(out / "results.json"), profiles=profiles, volcano=volcano, quick=quick)
