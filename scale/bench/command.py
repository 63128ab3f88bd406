"""``agent-scheduler bench engine|cluster|simulate|footprint|report``: argument parsing only; each benchmark owns its module."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _ints(text: str) -> list[int]:
    return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    subs = p.add_subparsers(dest="bench", metavar="BENCH", required=True)
    e = subs.add_parser("engine", help="the decision engine in-process on synthetic nodes and pods")
    e.add_argument(
        "--nodes", type=int, action="append", help="node count (repeatable; default 1000, 5000, 10000)"
    )
    e.add_argument("--pods", type=int, default=20000)
    e.add_argument("--feasible-nodes", type=int, default=16)
    e.add_argument(
        "--mix",
        action="append",
        choices=("plain", "mix", "interpod", "preempt", "pool"),
        help="workload mix (repeatable; default all; preempt runs at most 1,000 pods)",
    )
    e.add_argument(
        "--no-batching",
        action="store_true",
        help="decide every pod from scratch (batched decisions of one shape off), for comparison",
    )
    e.add_argument("--json", action="store_true", help="one JSON object per line")

    c = subs.add_parser(
        "cluster",
        help="scale runs on local clusters: agent scheduler vs kube-scheduler vs the no-decision ceiling",
        description="Each scheduler runs every workload on a fresh local cluster with the same kwok nodes; "
        "writes results.json, report.md and PNG plots into --out.",
    )
    c.add_argument(
        "--quick", action="store_true", help="100 nodes, 3 schedulers, backlog+steady (~3 minutes)"
    )
    c.add_argument("--nodes", type=_ints, default=None, help="comma-separated node counts (default 1000)")
    c.add_argument(
        "--workloads",
        type=_names,
        default=None,
        help="backlog,burst,steady,churn,mix,spread,preempt (default all but preempt)",
    )
    c.add_argument(
        "--schedulers",
        type=_names,
        default=None,
        help="agent-standalone,agent-standalone-bc256,agent-coord-1,agent-coord-1-dispatched,agent-coord-2,"
        "kube-scheduler-qps5000,kube-scheduler-default,no-decision,volcano-agent-1w,volcano-agent-4w, "
        "agent-coord-1-sole (default all but the last, the volcano ones when its binary is found; --quick: "
        "agent-standalone,kube-scheduler-qps5000,no-decision)",
    )
    c.add_argument(
        "--out", type=Path, default=None, help="results directory (default results/bench-TIMESTAMP)"
    )
    c.add_argument("--rate", type=float, default=None, help="steady/churn/mix arrival rate, pods/s")
    c.add_argument("--burst", type=int, default=None, help="pods in the burst workload")
    c.add_argument("--pods", type=int, default=None, help="agent pods of the steady, churn and mix workloads")
    c.add_argument("--profile", action="store_true", help="also run agent-standalone's burst under cProfile")
    c.add_argument(
        "--no-volcano",
        action="store_true",
        help="do not locate or try to build Volcano's agent-scheduler (unless a volcano-agent-* scheduler is named)",
    )
    c.add_argument(
        "--volcano-binary",
        default="",
        help="Volcano's agent-scheduler binary (default $VOLCANO_AGENT_SCHEDULER); with one, the default "
        "schedulers include volcano-agent-1w and volcano-agent-4w",
    )
    c.add_argument(
        "--volcano-src",
        type=Path,
        default=None,
        help="a checkout of volcano-sh/volcano to build ./cmd/agent-scheduler in (when no binary is given)",
    )
    c.add_argument(
        "--stall", type=float, default=None, help="stop waiting after this many seconds without a bind"
    )
    c.add_argument("--timeout", type=float, default=None, help="stop waiting this long after the last create")
    c.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per scheduler × workload; the first undisturbed one is kept",
    )
    c.add_argument(
        "--quiet-wait",
        type=float,
        default=None,
        help="seconds to wait before each run for other processes to quieten (default 120; --quick 15; 0: off)",
    )
    c.add_argument(
        "--pull-delay",
        type=float,
        default=None,
        help="simulated seconds to pull each image an agent pod's node lacks; create->running is then "
        "reported (default 2; 0: no pulls, create->bound only)",
    )
    c.add_argument(
        "--prepulled",
        type=float,
        default=None,
        help="share of fleet nodes besides the warm ones that already list the agent image (default 0.2)",
    )

    s = subs.add_parser(
        "simulate",
        help="shard assignment + engine at 100k nodes / 1M pods in simulated time (no API server)",
    )
    s.add_argument("--nodes", type=int, default=100_000)
    s.add_argument("--pods", type=int, default=1_000_000)
    s.add_argument("--workers", type=_ints, default=[8, 16, 32, 64], help="comma-separated worker counts")
    s.add_argument("--sample", type=int, default=2000, help="pods decided and timed per simulated worker")
    s.add_argument("--sample-workers", type=int, default=4, help="workers simulated per configuration")
    s.add_argument(
        "--max-rounds", type=int, default=20, help="policy rounds per join/leave before estimating"
    )
    s.add_argument("--max-moves-per-round", type=int, default=None, help="default: the policy's own")
    s.add_argument(
        "--max-transit-fraction",
        type=float,
        default=None,
        help="default: the policy's own (0: the fixed budget)",
    )
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", type=Path, default=None, help="directory for simulate.json and simulate.md")

    f = subs.add_parser(
        "footprint",
        help="RSS and CPU per pod event of each scheduler as bound pods accumulate (and kube-scheduler's)",
        description="For each node count and scheduler, on a fresh local cluster: bound pods created in steps; "
        "after each, every process's RSS and CPU per pod event. Writes results.json and report.md into --out.",
    )
    f.add_argument("--nodes", type=_ints, default=None, help="comma-separated node counts (default 1000)")
    f.add_argument(
        "--pods",
        type=_ints,
        default=None,
        help="bound pods at the end, one or one per node count (default 10/node)",
    )
    f.add_argument(
        "--schedulers",
        type=_names,
        default=None,
        help="default: agent-standalone,agent-coord-1,agent-coord-2,kube-scheduler-qps5000",
    )
    f.add_argument("--steps", type=int, default=4, help="equal steps up to --pods (default 4)")
    f.add_argument(
        "--out", type=Path, default=None, help="results directory (default results/footprint-TIMESTAMP)"
    )
    f.add_argument(
        "--report", type=Path, default=None, help="only rebuild report.md of this results directory"
    )

    sh = subs.add_parser(
        "share",
        help="agent waves over a batch backlog: static split, Volcano's example and the tuned shard policy",
        description="One local cluster; per shard policy its own nodes, coordinator + worker and batch stand-in, "
        "all at once with the same agent arrivals (issue 15). Writes results.json, report.md and plots to --out.",
    )
    sh.add_argument("--nodes", type=int, default=32, help="nodes per configuration")
    sh.add_argument("--node-cpu", type=int, default=4, help="CPUs per node (4Gi of memory each)")
    sh.add_argument("--agent-nodes", type=int, default=10, help="agent nodes of the static split")
    sh.add_argument("--simulated", type=float, default=600.0, help="simulated seconds of waves (>= 600)")
    sh.add_argument("--compression", type=float, default=5.0, help="simulated seconds per real second")
    sh.add_argument("--wave-rate", type=float, default=5.0, help="agent arrivals per simulated s in a burst")
    sh.add_argument("--wave-period", type=float, default=120.0, help="simulated s from one wave to the next")
    sh.add_argument(
        "--wave-burst", type=float, default=20.0, help="simulated s of arrivals at a wave's start"
    )
    sh.add_argument("--lifetime-min", type=float, default=5.0, help="agent pod lifetime floor, simulated s")
    sh.add_argument(
        "--lifetime-max", type=float, default=300.0, help="agent pod lifetime ceiling, simulated s"
    )
    sh.add_argument("--backlog", type=int, default=3000, help="batch pods queued at the start")
    sh.add_argument("--batch-runtime", type=float, default=240.0, help="simulated s each batch pod runs")
    sh.add_argument(
        "--tuned-max-util", type=float, default=0.95, help="tuned: the agent shard's util ceiling"
    )
    sh.add_argument(
        "--tuned-free-cpu", type=float, default=28.0, help="tuned: cores of free CPU the agent keeps"
    )
    sh.add_argument("--tuned-sync", type=float, default=60.0, help="tuned: sync period, simulated s")
    sh.add_argument("--tuned-band-hysteresis", type=float, default=0.0)
    sh.add_argument("--tuned-rank-hysteresis", type=float, default=1.0)
    sh.add_argument("--tuned-max-moves", type=int, default=4, help="tuned: maxMovesPerSync")
    sh.add_argument(
        "--tuned-reclaim",
        action="store_true",
        help="tuned and scheduled: free-capacity reclaim (batch pods count as capacity that comes back), util cap 100%%",
    )
    sh.add_argument(
        "--scheduled-free-cpu-low", type=float, default=4.0, help="scheduled: free cores kept between waves"
    )
    sh.add_argument(
        "--scheduled-free-cpu-high", type=float, default=28.0, help="scheduled: free cores kept for a wave"
    )
    sh.add_argument(
        "--scheduled-lead",
        type=float,
        default=60.0,
        help="scheduled: simulated s the high target precedes a wave",
    )
    sh.add_argument(
        "--scheduled-hold",
        type=float,
        default=20.0,
        help="scheduled: simulated s the high target outlasts a burst",
    )
    sh.add_argument(
        "--scheduled-nodes-high",
        type=int,
        default=0,
        help="scheduled: switch node-limit's maxNodes to this for a wave instead of free CPU (0: free CPU)",
    )
    sh.add_argument(
        "--scheduled-nodes-low",
        type=int,
        default=1,
        help="scheduled: maxNodes between waves (with the above)",
    )
    sh.add_argument(
        "--tuned-residence",
        type=float,
        default=0.0,
        help="tuned and scheduled: minResidenceSeconds, simulated s (a node that moved stays that long; 0: off)",
    )
    sh.add_argument(
        "--tuned-batch-residence",
        type=float,
        default=0.0,
        help="tuned and scheduled: the batch shard's minResidenceSecondsByScheduler, simulated s (0: as above)",
    )
    sh.add_argument(
        "--configs",
        type=_names,
        default=None,
        help="default: static,volcano-example,tuned; also known: scheduled (tuned with a wave schedule)",
    )
    sh.add_argument("--seed", type=int, default=0)
    sh.add_argument(
        "--out", type=Path, default=None, help="results directory (default results/share-TIMESTAMP)"
    )

    pa = subs.add_parser(
        "paired",
        help="configurations alternately on one cluster, round after round: before/after changes of a few percent",
        description="One local cluster; each round runs every contender once with fresh processes (order "
        "reversed on odd rounds); reports each contender's mean CPU per pod, latency and rate over the rounds "
        "with their spread. Writes trials.json and summary.md to --out.",
    )
    pa.add_argument(
        "--run",
        dest="runs",
        action="append",
        required=True,
        metavar="LABEL=SCHEDULER[@CHECKOUT]",
        help="a contender (repeat, at least two): an agent configuration, no-decision or one kube-scheduler "
        "configuration; ours optionally run from "
        "another checkout of this project (e.g. a git worktree of the baseline)",
    )
    pa.add_argument("--nodes", type=int, default=1000)
    pa.add_argument("--workload", choices=("burst", "backlog", "steady"), default="burst")
    pa.add_argument("--pods", type=int, default=2000, help="pods per trial")
    pa.add_argument("--rate", type=float, default=None, help="the steady workload's pods/s")
    pa.add_argument(
        "--rounds", type=int, default=4, help="rounds after the warm-up trial (even: see the docs)"
    )
    pa.add_argument(
        "--pull-delay", type=float, default=0.0, help="simulated image pull seconds (0: pulls not simulated)"
    )
    pa.add_argument(
        "--quiet-wait", type=float, default=30.0, help="max seconds to wait for a quiet host before a trial"
    )
    pa.add_argument(
        "--idle",
        type=float,
        default=0.0,
        help="seconds each contender idles once ready, before its workload (a burst after a quiet spell)",
    )
    pa.add_argument(
        "--until-idle",
        type=float,
        default=0.0,
        help="once every pod is seen bound, count the scheduler's CPU until it and the API server are idle, for at most this many "
        "seconds (0: the window ends there; its Scheduled events are mostly posted after it)",
    )
    pa.add_argument(
        "--out", type=Path, default=None, help="results directory (default results/bench-paired-TIMESTAMP)"
    )

    r = subs.add_parser("report", help="rebuild report.md and the plots of a results directory")
    r.add_argument("dir", type=Path)


# The benchmarks that start a local cluster and measure on it: one at a time per machine (``scale.bench.lock``).
ON_A_CLUSTER = ("cluster", "footprint", "share", "paired")


def run(args: argparse.Namespace) -> int:
    rebuild_only = args.bench == "footprint" and getattr(args, "report", None) is not None
    if args.bench not in ON_A_CLUSTER or rebuild_only:
        return _run(args)
    from scale.bench.lock import BUSY, BenchRunning, exclusive
    from scale.cluster.processes import stop_on_sigterm

    # first: starting the cluster does it too, but ``bench cluster`` may build Volcano's agent scheduler
    # before, and a kill during that build must run the bench's cleanup as well
    stop_on_sigterm()

    try:
        with exclusive(f"bench {args.bench}"):
            return _run(args)
    except BenchRunning as e:
        print(f"agent-scheduler bench: error: {e}", file=sys.stderr)
        return BUSY


def _run(args: argparse.Namespace) -> int:
    if args.bench == "engine":
        from scale.bench import engine

        return engine.main(
            args.nodes or [1000, 5000, 10000],
            args.pods,
            as_json=args.json,
            feasible_nodes=args.feasible_nodes,
            mixes=args.mix,
            batching=not args.no_batching,
        )
    if args.bench == "cluster":
        from scale.bench import cluster

        return cluster.main(
            nodes=args.nodes,
            schedulers=args.schedulers,
            workloads=args.workloads,
            out=args.out,
            quick=args.quick,
            rate=args.rate,
            burst=args.burst,
            pods=args.pods,
            profile=args.profile,
            volcano=not args.no_volcano,
            stall_s=args.stall,
            timeout_s=args.timeout,
            repeat=args.repeat,
            quiet_wait_s=args.quiet_wait,
            pull_delay_s=args.pull_delay,
            prepulled=args.prepulled,
            volcano_binary=args.volcano_binary,
            volcano_src=args.volcano_src,
        )
    if args.bench == "simulate":
        from scale.bench import simulate

        return simulate.main(args)
    if args.bench == "footprint":
        from scale.bench import footprint, footprint_report

        if args.report is not None:
            print(f"wrote {footprint_report.rebuild(args.report)}")
            return 0
        return footprint.main(
            nodes=args.nodes, pods=args.pods, schedulers=args.schedulers, steps=args.steps, out=args.out
        )
    if args.bench == "share":
        from scale.bench import share_run

        return share_run.main(args)
    if args.bench == "paired":
        from scale.bench import paired

        return paired.main(
            runs=args.runs,
            nodes=args.nodes,
            workload=args.workload,
            pods=args.pods,
            rate=args.rate,
            rounds=args.rounds,
            out=args.out,
            pull_delay_s=args.pull_delay,
            quiet_wait_s=args.quiet_wait,
            idle_s=args.idle,
            until_idle_s=args.until_idle,
        )
    if args.bench == "report":
        from scale.bench import report

        path = report.rebuild(args.dir)
        print(f"wrote {path}")
        return 0
    raise SystemExit(f"unknown benchmark {args.bench!r}")
