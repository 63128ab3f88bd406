"""The share run's report: ``report.md`` (the table, the goal verdict, each configuration's policy) and three
plots (allocation over time, agent latency CDFs, node moves) from ``results.json`` (``scale.bench.share_run``).

The goal (issue 15 item 3) is judged on every configuration but the static split, against the static split:
mean CPU allocation at least ``GOAL_POINTS`` higher, agent create->bound p99 and batch queue wait (censored
mean) no worse, and no node moving more than once per wave.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

GOAL_POINTS = 15.0


def _f(value: Any, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def verdict(static: dict[str, Any], other: dict[str, Any]) -> tuple[bool, str]:
    """Whether ``other`` meets the goal against ``static``, and why (or why not)."""
    gain = 100 * ((other["cpu_alloc_mean"] or 0) - (static["cpu_alloc_mean"] or 0))
    reasons = [f"CPU allocation {gain:+.1f} points ({'>=' if gain >= GOAL_POINTS else '<'} {GOAL_POINTS:g})"]
    p99_ok = other["agent_unbound"] <= static["agent_unbound"] and (
        other["agent_bound_p99_real_s"] or 1e9
    ) <= (static["agent_bound_p99_real_s"] or 0)
    reasons.append(f"agent p99 {'no worse' if p99_ok else 'worse'}")
    wait_ok = (other["batch_wait_censored_mean_s"] or 1e9) <= (static["batch_wait_censored_mean_s"] or 0)
    reasons.append(f"batch wait {'no worse' if wait_ok else 'worse'}")
    moves_ok = other["max_moves_node_wave"] <= 1
    gap = other.get("min_move_gap_s")
    shortest = "" if gap is None else f" (shortest time between two moves of one node {gap:.0f} simulated s)"
    reasons.append(f"at most one move per node per wave: {'yes' if moves_ok else 'no'}{shortest}")
    met = gain >= GOAL_POINTS and p99_ok and wait_ok and moves_ok and not other["violations"]
    return met, "; ".join(reasons)


def table(result: dict[str, Any]) -> str:
    rows = [
        "| configuration | CPU alloc mean / p10 | mem alloc mean / p10 | agent bound p50 / p99 (real s) | agent running "
        "p50 / p99 (real s) | agent unbound | batch started | batch wait p50 / censored mean (s) | moves / min | max "
        "moves per node per wave | handoff p50 / max (real s) | largest free CPU block agent / batch | violations |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in result["configs"]:
        rows.append(
            f"| {c['config']} | {_f(c['cpu_alloc_mean'], '{:.1%}')} / {_f(c['cpu_alloc_p10'], '{:.1%}')} "
            f"| {_f(c['mem_alloc_mean'], '{:.1%}')} / {_f(c['mem_alloc_p10'], '{:.1%}')} "
            f"| {_f(c['agent_bound_p50_real_s'], '{:.2f}')} / {_f(c['agent_bound_p99_real_s'], '{:.2f}')} "
            f"| {_f(c['agent_running_p50_real_s'], '{:.2f}')} / {_f(c['agent_running_p99_real_s'], '{:.2f}')} "
            f"| {c['agent_unbound']} of {c['agent_pods']} | {c['batch_started']} "
            f"| {_f(c['batch_wait_p50_s'], '{:.0f}')} / {_f(c['batch_wait_censored_mean_s'], '{:.0f}')} "
            f"| {_f(c['moves_per_min'])} | {c['max_moves_node_wave']} "
            f"| {_f(c['handoff_p50_real_s'], '{:.2f}')} / {_f(c['handoff_max_real_s'], '{:.2f}')} "
            f"| {_f(c['agent_free_block_mean_cpu'])} / {_f(c['batch_free_block_mean_cpu'])} "
            f"| {len(c['violations'])} |"
        )
    return "\n".join(rows)


def _plots(out: Path, result: dict[str, Any]) -> list[str]:
    c = result["spec"]["compression"]
    names = []
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for conf in result["configs"]:
        ts = [s["t"] * c for s in conf["samples"]]
        ax1.plot(ts, [100 * s["cpu"] for s in conf["samples"]], label=conf["config"])
        ax2.plot(ts, [s["agent_nodes"] for s in conf["samples"]], label=conf["config"])
    ax1.set_ylabel("CPU allocated (%)")
    ax2.set_ylabel("agent shard nodes")
    ax2.set_xlabel("simulated seconds")
    ax1.legend()
    ax1.set_title("CPU allocation and agent shard size over time")
    fig.tight_layout()
    fig.savefig(out / "allocation.png", dpi=90)
    plt.close(fig)
    names.append("allocation.png")
    fig, ax = plt.subplots(figsize=(8, 5))
    for conf in result["configs"]:
        values = conf["bound_real_s"]
        if values:
            ax.plot(
                values, [(i + 1) / len(values) for i in range(len(values))], label=f"{conf['config']} bound"
            )
        values = conf["running_real_s"]
        if values:
            ax.plot(
                values,
                [(i + 1) / len(values) for i in range(len(values))],
                linestyle="--",
                label=f"{conf['config']} running",
            )
    ax.set_xscale("log")
    ax.set_xlabel("agent pod create -> bound / running (real s)")
    ax.set_ylabel("fraction of pods")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "latency_cdf.png", dpi=90)
    plt.close(fig)
    names.append("latency_cdf.png")
    fig, ax = plt.subplots(figsize=(10, 4))
    for row, conf in enumerate(result["configs"]):
        to_agent = [m[0] for m in conf["move_times_s"] if m[3] == "agent"]
        to_batch = [m[0] for m in conf["move_times_s"] if m[3] == "batch"]
        ax.scatter(to_agent, [row + 0.1] * len(to_agent), marker="^", color="tab:blue", s=12)
        ax.scatter(to_batch, [row - 0.1] * len(to_batch), marker="v", color="tab:orange", s=12)
    ax.set_yticks(range(len(result["configs"])), [conf["config"] for conf in result["configs"]])
    ax.set_xlabel("simulated seconds (up: to agent, down: to batch)")
    ax.set_title("node moves")
    fig.tight_layout()
    fig.savefig(out / "moves.png", dpi=90)
    plt.close(fig)
    names.append("moves.png")
    return names


def write(out: Path, result: dict[str, Any], command: str = "") -> Path:
    plots = _plots(out, result)
    spec = result["spec"]
    by_name = {c["config"]: c for c in result["configs"]}
    lines = [
        "# share: agent waves over a batch backlog, shard policies side by side",
        "",
        f"Command: `{command}`" if command else "",
        "",
        f"Commit: {result['commit']}" if result.get("commit") else "",
        "",
        f"{len(result['configs'])} configurations on one local cluster at once, each on {result['nodes_per_config']} "
        f"nodes of {result['node_shape']} of its own, with its own coordinator + worker and batch stand-in; the "
        f"same agent arrivals at the same moments. {spec['simulated_s']:.0f} simulated seconds compressed "
        f"{spec['compression']:g}x ({result['real_seconds']:.0f} real s with the drain). Waves every "
        f"{spec['wave_period_s']:g} s: {spec['wave_burst_s']:g} s of arrivals at {spec['wave_rate']:g}/s, lifetimes "
        f"{spec['lifetime_min_s']:g}-{spec['lifetime_max_s']:g} s log-uniform; a batch backlog of "
        f"{spec['batch_backlog']} pods (1 CPU / 2Gi, {spec['batch_runtime_s']:g} s each). Agent latencies and handoffs are "
        "real seconds (the scheduler is not compressed), batch waits simulated seconds. Allocation = requests / allocatable over the configuration's nodes, sampled every 0.5 real s "
        "during the waves. Batch wait = backlog start -> bound; the censored mean counts pods never started as "
        "waiting until the end.",
        "",
        table(result),
        "",
    ]
    demand = result.get("agent_demand")
    if demand:
        nodes, cpu = result["nodes_per_config"], int(spec["node_cpu"])
        pool = result["agent_nodes_static"] * cpu
        idle = 100 * (pool - demand["mean_cpu"]) / (nodes * cpu)
        lines += [
            f"Agent demand from the plan (every pod running from its arrival): peak {demand['peak_cpu']:.1f} "
            f"cores, mean {demand['mean_cpu']:.1f}. The static agent pool holds {pool} cores, so about "
            f"{idle:.1f} points of the configuration's CPU sit idle in it on average: the most any policy can win "
            "from the agent side.",
            "",
        ]
    static = by_name.get("static")
    if static is not None:
        lines.append(
            "## Goal: +15 points of mean CPU allocation over the static split, agent p99 and batch wait no worse, one move per node per wave"
        )
        lines.append("")
        for name, conf in by_name.items():
            if name == "static":
                continue
            met, why = verdict(static, conf)
            lines.append(f"- **{name}**: {'met' if met else 'not met'}: {why}")
        lines.append("")
    lines.append("## Configurations")
    lines.append("")
    for conf in result["configs"]:
        lines += [
            f"### {conf['config']}",
            "",
            conf["description"],
            "",
            "```yaml",
            conf["sharding_yaml"].rstrip(),
        ]
        if conf["settings_yaml"]:
            lines += ["# agent-scheduler.yaml", conf["settings_yaml"].rstrip()]
        lines += ["```", ""]
        if conf["violations"]:
            lines += ["Violations:", "", *[f"- {v}" for v in conf["violations"]], ""]
    lines += [f"![{p}]({p})" for p in plots]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
