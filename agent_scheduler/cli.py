"""``agent-scheduler`` subcommand dispatch.

Each subcommand is owned by the package that implements it; this module only maps names to modules and
imports the chosen one lazily, so ``agent-scheduler cluster`` does not pay for the scheduler's imports and a
broken optional part cannot break the others. A subcommand module provides ``add_arguments(parser)`` and
``run(args) -> int``. ``worker`` and ``coordinator`` also take ``--config FILE`` (``agent_scheduler.config``:
the same settings as a versioned YAML document; flags given on the command line override it).

What an operator sees when the command cannot start is one line on stderr and a non-zero exit, never a
traceback: a bad flag or configuration file (exit 2; a file's error names the field), a kubeconfig that is
missing, unreadable or not a kubeconfig (exit 1), and the development subcommands (``cluster``, ``bench``,
``demo``) in an installation without the ``scale`` package, such as the container image (exit 1). Any other
exception that escapes a subcommand is logged once through the configured log format (so JSON logs stay JSON)
and exits 1. A given ``--kubeconfig`` is also exported as ``KUBECONFIG`` for parts that load credentials
themselves (``common.metricsauth``).

SIGTERM stops ``worker`` and ``coordinator`` with exit 0 from the moment ``main`` runs (``common.stopping``):
once the command has handed it to its graceful stop (its event loop runs and, coordinated, etcd answered), by
a drain; before that (the imports take half a second or more on a busy node, then a coordinator or coordinated
worker waits for etcd), by abandoning the start, with one line on stderr. A pod deleted while it starts is stopped as asked, not killed by the signal.
Only the interpreter's own start and this module's standard-library imports come before: everything else this
module needs is imported once ``main`` has the handler in place.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
from types import ModuleType
from typing import NoReturn

from common import stopping

log = logging.getLogger("agent_scheduler")

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "cluster": ("scale.cluster.command", "local real cluster: kube-apiserver, etcd, kwok nodes"),
    "worker": ("worker.command", "run a worker process (standalone, or under a coordinator)"),
    "coordinator": ("coordinator.command", "run a coordinator replica (leader-elected)"),
    "status": ("coordinator.status", "show the leader, epoch and per-worker shards"),
    "bench": ("scale.bench.command", "benchmarks: engine, cluster, simulate, footprint"),
    "demo": ("scale.demo", "local cluster + coordinator + workers + a burst of agent pods"),
}
# Subcommands that read a kubeconfig (or the pod's service account) before doing anything else.
KUBE_COMMANDS = frozenset({"worker", "coordinator"})
DEVELOPMENT_PACKAGE = "scale"


class CommandError(Exception):
    """A reason the command cannot run, said in one line."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``prog: error: message (see --help)``), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def version() -> str:
    """The installed package's version, or ``unknown`` when running from a tree that was never installed."""
    from importlib import metadata

    try:
        return metadata.version("agent-scheduler")
    except metadata.PackageNotFoundError:
        return "unknown"


def _load(name: str) -> ModuleType:
    module = SUBCOMMANDS[name][0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if (
            module.startswith(DEVELOPMENT_PACKAGE + ".")
            and (e.name or "").split(".")[0] == DEVELOPMENT_PACKAGE
        ):
            raise CommandError(
                f"'{name}' is a development command: it needs the '{DEVELOPMENT_PACKAGE}' package, which this "
                "installation leaves out (run it from a source checkout: pip install -e .)"
            ) from None
        raise


def check_kubeconfig(kubeconfig: str | None) -> None:
    """Load the API credentials once up front, so a bad kubeconfig is one line before anything starts."""
    if kubeconfig:
        if not os.path.exists(kubeconfig):
            raise CommandError(f"kubeconfig {kubeconfig}: no such file")
        if not os.path.isfile(kubeconfig):
            raise CommandError(f"kubeconfig {kubeconfig}: not a file")
    from common.kube import load_credentials

    try:
        load_credentials(kubeconfig)
    except OSError as e:
        raise CommandError(f"kubeconfig {kubeconfig}: {e.strerror or e}") from None
    except Exception as e:
        if not type(e).__module__.startswith("kubernetes.config"):
            raise
        if kubeconfig:
            raise CommandError(f"kubeconfig {kubeconfig}: {_one_line(str(e))}") from None
        raise CommandError(
            "no --kubeconfig (or KUBECONFIG) given and not running in a pod "
            f"(in-cluster configuration: {_one_line(str(e))})"
        ) from None


def _one_line(text: str) -> str:
    return " ".join(text.split())[:500]


def _build_parser(chosen: str | None) -> argparse.ArgumentParser:
    from agent_scheduler import config

    parser = _Parser(prog="agent-scheduler", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--version", action="version", version=f"agent-scheduler {version()}")
    parser.add_argument("--log-level", default=os.environ.get("AGENT_SCHEDULER_LOG_LEVEL", "INFO"))
    parser.add_argument(
        "--log-format", choices=["text", "json"], default=os.environ.get("AGENT_SCHEDULER_LOG_FORMAT", "text")
    )
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, helptext) in SUBCOMMANDS.items():
        sub = subs.add_parser(name, help=helptext)
        if name == chosen:
            _load(name).add_arguments(sub)
            if name in config.KINDS:
                sub.add_argument(
                    "--config",
                    default=None,
                    help=f"a {config.KINDS[name]} YAML file (fields: these flags in camelCase); flags override it",
                )
                parser.set_defaults(_subparser=sub)
    return parser


def _apply_config(
    parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str]
) -> argparse.Namespace:
    """Re-parse with the ``--config`` file's settings as defaults, so flags given on the command line win."""
    from agent_scheduler import config

    path = getattr(args, "config", None)
    if not path:
        return args
    sub: argparse.ArgumentParser = args._subparser
    sub.set_defaults(**config.load(path, args.command, sub))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` (the process's arguments when None: run as the program)."""
    program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    # gRPC's C core logs every failed connection attempt (each TLS handshake to a misconfigured etcd) unless
    # told otherwise before it is imported; our etcd layer reports an outage once, in one line.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    chosen = next((a for a in argv if a in SUBCOMMANDS), None)
    if chosen not in KUBE_COMMANDS or threading.current_thread() is not threading.main_thread():
        return _main(argv, chosen)
    # Before the subcommand's imports: they are most of a start.
    previous: stopping.Handler = signal.SIG_DFL
    try:
        previous = stopping.catch_while_starting()
        return _main(argv, chosen)
    except stopping.Terminated:
        print(f"agent-scheduler {chosen}: stopped by SIGTERM while starting", file=sys.stderr)
        return 0
    finally:
        stopping.after_command(previous, program=program)


def _main(argv: list[str], chosen: str | None) -> int:
    from agent_scheduler import config
    from common import logs

    try:
        parser = _build_parser(chosen)
    except CommandError as e:
        print(f"agent-scheduler {chosen}: error: {e}", file=sys.stderr)
        return 1
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        args = _apply_config(parser, args, argv)
    except config.ConfigError as e:
        print(f"agent-scheduler {args.command}: error: config {e}", file=sys.stderr)
        return 2
    logs.configure(str(args.log_level), args.log_format)
    try:
        if args.command in KUBE_COMMANDS:
            kubeconfig = getattr(args, "kubeconfig", None)
            check_kubeconfig(kubeconfig)
            if kubeconfig:  # parts that load credentials themselves (common.metricsauth) use the same ones
                os.environ["KUBECONFIG"] = kubeconfig
        code: int = _load(args.command).run(args)
    except CommandError as e:
        print(f"agent-scheduler {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        if type(e).__module__.startswith("kubernetes.config"):
            print(f"agent-scheduler {args.command}: error: kubeconfig: {_one_line(str(e))}", file=sys.stderr)
            return 1
        log.exception("agent-scheduler %s failed: %s", args.command, _one_line(str(e)) or type(e).__name__)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
