"""``agent-scheduler worker``: the entry point of a worker process. Reads flags, builds settings, runs.

Standalone (``--standalone``): the worker owns every node (optionally those matching ``--node-selector``)
and takes every pending pod of ``--scheduler-name`` from its own watch; no coordinator, no etcd.

Coordinated (the default, ``worker.coordinated``): the worker registers in etcd under its lease
(``worker.shard``), places pods only on the nodes the leader granted it and only while its lease is healthy
(fencing), and takes pods from the leader's dispatch stream (``worker.intake``). SIGTERM drains: no new
decisions, revoked nodes wait for their bindings, the release is acknowledged, the lease is given back,
exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys

from common import aiotools, heap, metrics, stopping
from common.etcd.flags import add_security_arguments, endpoints_from, security_from
from common.etcd.kv import EtcdConfigError
from common.kube import KubeClient, load_credentials
from worker.outcomes import PodReports, new_reporter
from worker.scheduler import Scheduler
from worker.settings import BindingSettings, WorkerSettings
from worker.shard import WholeCluster

log = logging.getLogger(__name__)

DRAIN_TIMEOUT = 30.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--standalone", action="store_true", help="own every node; no coordinator")
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="default: in-cluster")
    p.add_argument("--scheduler-name", default="agent-scheduler")
    p.add_argument("--node-selector", default="", help="label selector of the nodes to use (standalone)")
    p.add_argument("--kube-api-qps", type=float, default=2000.0)
    p.add_argument("--kube-api-burst", type=int, default=2000)
    p.add_argument("--feasible-nodes", type=int, default=16, help="feasible nodes to score per pod")
    p.add_argument("--strategy", default="MostAllocated", choices=["MostAllocated", "LeastAllocated"])
    p.add_argument("--score-weight", action="append", default=[], metavar="PLUGIN=W", help="repeatable")
    p.add_argument("--session-label", default="agent-scheduler.io/session")
    p.add_argument("--warm-label", default="node.volcano.sh/warmup=true")
    p.add_argument(
        "--bind-concurrency",
        type=int,
        default=BindingSettings().concurrency,
        help="bindings in flight at once (default %(default)s: the write pool's connections)",
    )
    p.add_argument(
        "--warm-connections",
        type=int,
        default=None,
        help="API server connections held open while idle (default: --bind-concurrency; 0: none)",
    )
    p.add_argument("--report-qps", type=float, default=50.0)
    p.add_argument("--no-scheduled-events", action="store_true", help="do not emit Scheduled events")
    p.add_argument("--metrics-address", default="127.0.0.1:0", help="host:port of /metrics, /healthz")
    p.add_argument("--id", default="", help="worker identity (default hostname-pid)")
    p.add_argument("--etcd-endpoints", default=os.environ.get("AGENT_SCHEDULER_ETCD", "127.0.0.1:2379"))
    p.add_argument("--etcd-prefix", default="/agent-scheduler")
    p.add_argument("--lease-ttl", type=int, default=10, help="seconds; fenced after ttl/2 without keepalive")
    p.add_argument("--listen", default="127.0.0.1:0", help="host:port for the leader's dispatch stream")
    p.add_argument(
        "--advertise-host", default="", help="host the leader connects to (default: the listen host)"
    )
    p.add_argument("--weight", type=float, default=1.0, help="relative share of the pool this worker carries")
    p.add_argument("--audit-log", default="", help="append one JSON line per binding to this file")
    p.add_argument(
        "--dispatch-secret-file",
        default=os.environ.get("AGENT_SCHEDULER_DISPATCH_SECRET_FILE", ""),
        help="shared secret of the dispatch channel (the coordinator's too); re-read when it changes",
    )
    p.add_argument(
        "--insecure-dispatch",
        action="store_true",
        help="allow a dispatch listener beyond loopback without --dispatch-secret-file",
    )
    add_security_arguments(p)
    aiotools.add_event_loop_argument(p)
    aiotools.add_pace_argument(p)
    # no flags: set only by the --config file's podTopologySpread section (agent_scheduler.config)
    p.set_defaults(spread_defaulting="System", spread_default_constraints=[])


def settings_from(args: argparse.Namespace) -> WorkerSettings:
    s = WorkerSettings()
    s.api.kubeconfig = args.kubeconfig
    s.api.qps = args.kube_api_qps
    s.api.burst = args.kube_api_burst
    s.scheduling.scheduler_name = args.scheduler_name
    s.scheduling.node_selector = args.node_selector
    s.scheduling.feasible_nodes = args.feasible_nodes
    s.scheduling.strategy = args.strategy
    s.scheduling.session_label = args.session_label
    s.scheduling.warm_label = args.warm_label
    s.scheduling.spread_defaulting = args.spread_defaulting
    s.scheduling.spread_default_constraints = list(args.spread_default_constraints)
    for item in args.score_weight:
        name, _, weight = item.partition("=")
        s.scheduling.score_weights[name] = int(weight)
    s.binding.concurrency = args.bind_concurrency
    s.api.warm_connections = args.warm_connections
    s.reporting.qps = args.report_qps
    s.reporting.scheduled_events = not args.no_scheduled_events
    host, _, port = args.metrics_address.rpartition(":")
    s.metrics_host, s.metrics_port = host or "127.0.0.1", int(port or 0)
    s.worker_id = args.id or f"{socket.gethostname()}-{os.getpid()}"
    return s


async def run_standalone(settings: WorkerSettings) -> int:
    creds = load_credentials(settings.api.kubeconfig)
    async with KubeClient(
        creds, qps=settings.api.qps, burst=settings.api.burst, max_connections=settings.api.max_connections
    ) as client:
        reporter = new_reporter(client, settings)
        sched = Scheduler(
            client,
            settings,
            shard=WholeCluster(),
            outcomes=PodReports(reporter),
            reporter=reporter,
            preempt=True,
        )
        runner = await metrics.serve(
            settings.metrics_host, settings.metrics_port, sched.ready, client.auth.healthy
        )
        log.info("worker %s standalone; metrics on %s", settings.worker_id, metrics.addresses(runner))
        stop = asyncio.Event()
        stopping.stop_on_signals(stop)
        task = asyncio.create_task(sched.run())
        stopper = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()  # surface the crash
        # Graceful stop: no new decisions; let bindings under way finish, then stop the rest.
        sched.pause()
        try:
            await asyncio.wait_for(sched.binder.drain(), DRAIN_TIMEOUT)
        except TimeoutError:
            log.warning("%d bindings still in flight after %.0fs", sched.binder.in_flight(), DRAIN_TIMEOUT)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        log.info("worker %s stopped: %s", settings.worker_id, sched.statistics())
        await runner.cleanup()
    return 0


def run(args: argparse.Namespace) -> int:
    if args.warm_connections is not None and args.warm_connections < 0:
        print("agent-scheduler worker: error: --warm-connections must be 0 or more", file=sys.stderr)
        return 2
    settings = settings_from(args)
    if args.standalone:
        heap.freeze_imports()
        return aiotools.run(run_standalone(settings), args.event_loop, pace_ms=args.pace)
    from worker.coordinated import CoordinatedOptions, run_coordinated

    host, _, port = args.listen.rpartition(":")
    options = CoordinatedOptions(
        etcd_endpoints=endpoints_from(args),
        etcd_prefix=args.etcd_prefix,
        lease_ttl=args.lease_ttl,
        listen_host=host or "127.0.0.1",
        listen_port=int(port or 0),
        advertise_host=args.advertise_host or host or "127.0.0.1",
        weight=args.weight,
        audit_log=args.audit_log,
        dispatch_secret_file=args.dispatch_secret_file,
        insecure_dispatch=args.insecure_dispatch,
        etcd_security=security_from(args),
    )
    heap.freeze_imports()  # after the coordinated path's imports: they are frozen too
    try:
        return aiotools.run(run_coordinated(settings, options), args.event_loop, pace_ms=args.pace)
    except EtcdConfigError as e:
        log.error("etcd: %s", e)
        return 2
