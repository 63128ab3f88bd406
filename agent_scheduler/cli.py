"""``agent-scheduler`` subcommand dispatch.

Each subcommand is owned by the package that implements it; this module only maps names to modules and
imports the chosen one lazily, so ``agent-scheduler cluster`` does not pay for the scheduler's imports and a
broken optional part cannot break the others. A subcommand module provides ``add_arguments(parser)`` and
``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from types import ModuleType

from common import logs

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "cluster": ("scale.cluster.command", "local real cluster: kube-apiserver, etcd, kwok nodes"),
    "worker": ("worker.command", "run a worker process (standalone, or under a coordinator)"),
    "coordinator": ("coordinator.command", "run a coordinator replica (leader-elected)"),
    "status": ("coordinator.status", "show the leader, epoch and per-worker shards"),
    "bench": ("scale.bench.command", "benchmarks: engine, cluster, simulate"),
    "demo": ("scale.demo", "local cluster + coordinator + workers + a burst of agent pods"),
}


def _load(name: str) -> ModuleType:
    return importlib.import_module(SUBCOMMANDS[name][0])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # gRPC's C core logs every failed connection attempt (each TLS handshake to a misconfigured etcd) unless
    # told otherwise before it is imported; our etcd layer reports an outage once, in one line.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    parser = argparse.ArgumentParser(prog="agent-scheduler", description=__doc__.split("\n")[0])
    parser.add_argument("--log-level", default=os.environ.get("AGENT_SCHEDULER_LOG_LEVEL", "INFO"))
    parser.add_argument(
        "--log-format", choices=["text", "json"], default=os.environ.get("AGENT_SCHEDULER_LOG_FORMAT", "text")
    )
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((a for a in argv if a in SUBCOMMANDS), None)
    for name, (_, helptext) in SUBCOMMANDS.items():
        sub = subs.add_parser(name, help=helptext)
        if name == chosen:
            _load(name).add_arguments(sub)
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    logs.configure(str(args.log_level), args.log_format)
    code: int = _load(args.command).run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
