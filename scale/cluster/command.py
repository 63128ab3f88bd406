"""``agent-scheduler cluster up|down|status``: the command-line face of ``scale.cluster``.

This module only parses flags, calls the lifecycle functions and prints for a person at a terminal; all the
behaviour lives in ``lifecycle``. Exit codes: 0 done, 1 failed (the message says why and what to do next).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from scale.cluster.config import DEFAULT_BIN_DIR, DEFAULT_DIR, ClusterOptions
from scale.cluster.errors import ClusterError, NoCluster
from scale.cluster.lifecycle import Cluster, ClusterStatus, start_cluster, stop_cluster

_DEFAULTS = ClusterOptions()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    up = actions.add_parser(
        "up",
        help="start etcd, kube-apiserver, kwok, kube-controller-manager (and kube-scheduler) and create nodes",
    )
    _dir_argument(up)
    up.add_argument("--nodes", type=int, default=0, help="fake kwok nodes to create (default 0)")
    up.add_argument("--seed", type=int, default=_DEFAULTS.node_seed, help="node generator seed")
    up.add_argument("--with-kube-scheduler", action="store_true", help="also run kube-scheduler")
    up.add_argument(
        "--without-controller-manager",
        action="store_true",
        help="do not run kube-controller-manager (no workload controllers, garbage collection or PV binding)",
    )
    up.add_argument("--force", action="store_true", help="stop and wipe whatever an earlier run left in DIR")
    up.add_argument("--max-requests-inflight", type=int, default=_DEFAULTS.max_requests_inflight)
    up.add_argument(
        "--max-mutating-requests-inflight", type=int, default=_DEFAULTS.max_mutating_requests_inflight
    )
    up.add_argument(
        "--scheduler-qps", type=float, default=_DEFAULTS.scheduler_qps, help="kube-scheduler client QPS"
    )
    up.add_argument(
        "--scheduler-burst", type=int, default=_DEFAULTS.scheduler_burst, help="kube-scheduler burst"
    )
    up.add_argument(
        "--etcd-fsync", action="store_true", help="let etcd fsync its WAL (off: faster, not durable)"
    )
    up.add_argument(
        "--ready-timeout", type=float, default=_DEFAULTS.ready_timeout, help="seconds per component"
    )
    up.add_argument("--bin-dir", type=Path, default=DEFAULT_BIN_DIR, help="where the pinned binaries are")

    down = actions.add_parser("down", help="stop every process of the cluster (by PID) and remove DIR")
    _dir_argument(down)
    down.add_argument("--grace", type=float, default=_DEFAULTS.stop_grace, help="seconds before SIGKILL")

    status = actions.add_parser("status", help="which processes run, on which ports, how many nodes")
    _dir_argument(status)
    status.add_argument("--json", action="store_true", help="machine-readable output")


def _dir_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir", type=Path, default=DEFAULT_DIR, help=f"cluster directory (default {DEFAULT_DIR})"
    )


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "up":
            return _up(args)
        if args.action == "down":
            return _down(args)
        return _status(args)
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; every process started so far was stopped", file=sys.stderr)
        return 130


def _up(args: argparse.Namespace) -> int:
    options = ClusterOptions(
        max_requests_inflight=args.max_requests_inflight,
        max_mutating_requests_inflight=args.max_mutating_requests_inflight,
        scheduler_qps=args.scheduler_qps,
        scheduler_burst=args.scheduler_burst,
        node_seed=args.seed,
        etcd_fsync=args.etcd_fsync,
        ready_timeout=args.ready_timeout,
        bin_dir=args.bin_dir.resolve(),
    )
    began = time.monotonic()
    cluster = start_cluster(
        args.dir,
        nodes=args.nodes,
        with_kube_scheduler=args.with_kube_scheduler,
        with_controller_manager=not args.without_controller_manager,
        force=args.force,
        options=options,
    )
    took = time.monotonic() - began
    scheduler = "with kube-scheduler" if args.with_kube_scheduler else "without kube-scheduler"
    controllers = "without" if args.without_controller_manager else "with"
    print(
        f"cluster up in {took:.1f}s: {args.nodes} kwok nodes, {scheduler}, "
        f"{controllers} kube-controller-manager"
    )
    print(f"  API server  {cluster.server}")
    print(f"  etcd        {cluster.etcd_endpoint}")
    print(f"  kubeconfig  {cluster.kubeconfig}")
    print(f"  logs        {cluster.layout.logs}/")
    print("use it:")
    print(f"  export KUBECONFIG={cluster.kubeconfig}")
    print("  kubectl get nodes")
    print("stop it:")
    print(f"  agent-scheduler cluster down --dir {cluster.dir}")
    return 0


def _down(args: argparse.Namespace) -> int:
    try:
        stopped = stop_cluster(args.dir, grace=args.grace)
    except NoCluster:
        print(f"no cluster in {args.dir.resolve()}; nothing to stop")
        return 0
    what = ", ".join(stopped) if stopped else "no process was running"
    print(f"cluster in {args.dir.resolve()} is down ({what}); directory removed")
    return 0


def _status(args: argparse.Namespace) -> int:
    try:
        status = Cluster.open(args.dir).status()
    except NoCluster:
        print(f"no cluster in {args.dir.resolve()}")
        return 1
    if args.json:
        print(json.dumps(asdict(status), indent=2))
    else:
        _print_status(status)
    return 0 if status.healthy else 1


def _print_status(status: ClusterStatus) -> None:
    print(f"cluster {status.dir}: {status.phase}")
    print(f"  API server  {status.server or '-'}")
    print(f"  etcd        {status.etcd_endpoint or '-'}")
    print(f"  kubeconfig  {status.kubeconfig or '-'}")
    if status.nodes is not None:
        print(f"  nodes       {status.nodes}")
    elif status.nodes_error:
        print(f"  nodes       unknown ({status.nodes_error})")
    print(f"  {'PROCESS':<24}{'PID':>8}  {'STATE':<9}{'RSS':>10}  LOG")
    for c in status.components:
        rss = f"{c.rss_bytes / 2**20:.0f}Mi" if c.rss_bytes is not None else "-"
        state = "running" if c.running else "gone"
        print(f"  {c.name:<24}{c.pid:>8}  {state:<9}{rss:>10}  {c.log}")
    if status.ports:
        print("  ports       " + ", ".join(f"{k}={v}" for k, v in sorted(status.ports.items())))
