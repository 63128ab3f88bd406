"""``agent-scheduler bench engine|cluster|simulate``: argument parsing only; each benchmark owns its module."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    subs = p.add_subparsers(dest="bench", metavar="BENCH", required=True)
    e = subs.add_parser("engine", help="the decision engine in-process on synthetic nodes and pods")
    e.add_argument(
        "--nodes", type=int, action="append", help="node count (repeatable; default 1000, 5000, 10000)"
    )
    e.add_argument("--pods", type=int, default=20000)
    e.add_argument("--feasible-nodes", type=int, default=16)
    e.add_argument("--json", action="store_true", help="one JSON object per line")


def run(args: argparse.Namespace) -> int:
    if args.bench == "engine":
        from scale.bench import engine

        return engine.main(
            args.nodes or [1000, 5000, 10000],
            args.pods,
            as_json=args.json,
            feasible_nodes=args.feasible_nodes,
        )
    raise SystemExit(f"unknown benchmark {args.bench!r}")
