"""``agent-scheduler coordinator``: one coordinator replica. Run two or more; one leads (elected through
etcd), the others stand by and take over within the lease TTL when the leader dies.

Flags pick the API server (``--kubeconfig``), etcd (``--etcd-endpoints``, ``--etcd-prefix``), the lease TTL,
the scheduler name whose pods are dispatched, and the agent node pool (``--agent-node-selector``), which the
shard-policy ConfigMap (``--policy-configmap``, ``--policy-namespace``) narrows when it exists.
``--dispatch-secret-file`` is the dispatch channel's shared secret (the workers must have the same). etcd may
be TLS with client certificates and/or etcd auth (``common.etcd.flags``).

Probes: ``/readyz`` passes while this replica leads and its term makes progress, or stands by with a healthy
lease (either is a replica doing its job); a leader whose agent pool is empty stays ready and says why in the
body (``coordinator.leadership.emptypool``); ``/healthz`` fails when the process is wedged (the campaign ended,
or a stalled term could not step down) or the API server has refused its credentials for a lasting time.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import time

from common import aiotools, heap, metrics, stopping
from common.etcd.flags import add_security_arguments, endpoints_from, security_from
from common.etcd.keys import KeyLayout
from common.etcd.kv import EtcdConfigError, connect, wait_ready
from common.etcd.schema import LeaderRecord
from common.keyring import load_keys
from common.kube import KubeClient, load_credentials
from common.wellknown import DEFAULT_ETCD_PREFIX, DEFAULT_SCHEDULER_NAME
from coordinator.leadership.election import LeaderElection, run_as_leader
from coordinator.leadership.emptypool import PoolVerdict
from coordinator.leadership.progress import DEFAULT_BOUND
from coordinator.leadership.term import LeaderOptions, run_term
from coordinator.nodeshards import ShardingOptions
from coordinator.nodeshards.policy import DEFAULT_CONFIGMAP_NAME, DEFAULT_CONFIGMAP_NAMESPACE

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="default: in-cluster")
    p.add_argument("--etcd-endpoints", default=os.environ.get("AGENT_SCHEDULER_ETCD", "127.0.0.1:2379"))
    p.add_argument("--etcd-prefix", default=DEFAULT_ETCD_PREFIX)
    p.add_argument("--lease-ttl", type=int, default=10, help="seconds; a dead leader is replaced within it")
    p.add_argument("--scheduler-name", default=DEFAULT_SCHEDULER_NAME)
    p.add_argument("--agent-node-selector", default="", help="label selector of the agent node pool")
    p.add_argument(
        "--policy-configmap",
        default=None,
        help=f"sharding ConfigMap (default {DEFAULT_CONFIGMAP_NAME}; until it exists the label pool is used, "
        "or Volcano's default policy when this flag is given); empty: no shard policy, no NodeShards",
    )
    p.add_argument("--policy-namespace", default=DEFAULT_CONFIGMAP_NAMESPACE)
    p.add_argument("--kube-api-qps", type=float, default=2000.0)
    p.add_argument("--kube-api-burst", type=int, default=2000)
    p.add_argument("--report-qps", type=float, default=50.0, help="unschedulable reports per second")
    p.add_argument(
        "--worker-claims",
        action="store_true",
        help="experimental: each worker takes the plain pods hashed to it from its own pod watch instead of a "
        "dispatch (docs/architecture.md, 'Worker claims': known gaps); no worker is made sole while it is on",
    )
    p.add_argument(
        "--sole-worker",
        action=argparse.BooleanOptionalAction,
        default=None,  # on; None tells an explicit --sole-worker (refused with --worker-claims) from the default
        help="while one worker is live and owns every node, it places every pod from its own watch as a "
        "standalone worker does, and the leader neither watches nor dispatches pods (docs/architecture.md, "
        "'The sole worker'); --no-sole-worker keeps the leader dispatching every pod (default: on, off with "
        "--worker-claims)",
    )
    p.add_argument("--metrics-address", default="127.0.0.1:0", help="host:port of /metrics, /healthz")
    p.add_argument("--id", default="", help="candidate identity (default hostname-pid)")
    p.add_argument(
        "--dispatch-secret-file",
        default=os.environ.get("AGENT_SCHEDULER_DISPATCH_SECRET_FILE", ""),
        help="shared secret of the dispatch channel (the workers' too); re-read when it changes",
    )
    p.add_argument(
        "--progress-timeout",
        type=float,
        default=DEFAULT_BOUND,
        help="seconds the leader's shard map or pending-pod watch may make no progress before it steps down",
    )
    add_security_arguments(p)
    aiotools.add_event_loop_argument(p)
    aiotools.add_pace_argument(p)


def sole_worker(args: argparse.Namespace) -> bool:
    """Whether the leader offers a lone worker the whole per-pod path (on unless ``--no-sole-worker``). Never
    with ``--worker-claims``: a claim set splits the pods by hash among the workers, and the offer needs none.
    Raises ValueError when both are asked for."""
    if args.worker_claims and args.sole_worker:
        raise ValueError(
            "--sole-worker and --worker-claims exclude each other (claims split the pods by hash)"
        )
    return args.sole_worker is not False and not args.worker_claims


def sharding_options(args: argparse.Namespace) -> ShardingOptions | None:
    """The shard-policy options from the flags; None when ``--policy-configmap`` is empty."""
    if args.policy_configmap == "":
        return None
    return ShardingOptions(
        configmap=args.policy_configmap or DEFAULT_CONFIGMAP_NAME,
        namespace=args.policy_namespace,
        use_default=args.policy_configmap is not None,
        scheduler_name=args.scheduler_name,
        node_selector=args.agent_node_selector,
    )


class Probes:
    """The coordinator's readiness and liveness, from the election, the current term and the API client."""

    def __init__(
        self,
        election: LeaderElection,
        client: KubeClient,
        *,
        progress_bound: float,
        pool: PoolVerdict | None = None,
    ) -> None:
        self.election = election
        self.pool = pool or PoolVerdict()
        self.client = client
        self.progress_bound = progress_bound
        self.campaign: asyncio.Task[None] | None = None

    def ready(self) -> bool | str:
        term = self.election.term
        if term is not None:
            stalled = term.progress.stalled()
            if stalled is not None:
                return f"leading, but {stalled}"
            # An empty pool leaves the leader ready: a standby taking over would not fill it.
            return metrics.Ready(f"leading; {self.pool.reason}") if self.pool.reason else True
        if self.election.standing_by:
            return True
        return "neither leading nor standing by with a healthy lease"

    def healthy(self) -> bool | str:
        if self.campaign is not None and self.campaign.done():
            return "the campaign has ended"
        term = self.election.term
        if term is not None:
            # A stalled term steps down within a second; one still stalled long after could not.
            worst = max(term.progress.statistics().values(), default=0.0)
            if worst > 2 * self.progress_bound + 10:
                return f"leading without progress for {worst:.0f} s"
        return self.client.auth.healthy()


async def _main(args: argparse.Namespace) -> int:
    candidate = args.id or f"{socket.gethostname()}-{os.getpid()}"
    keys = KeyLayout(args.etcd_prefix)
    security = security_from(args)
    etcd = await connect(endpoints_from(args), security, probe_key=keys.root)
    creds = load_credentials(args.kubeconfig)
    async with KubeClient(creds, qps=args.kube_api_qps, burst=args.kube_api_burst) as client:
        host, _, port = args.metrics_address.rpartition(":")
        probes: Probes | None = None
        # Serve the probes first: waiting for an unreachable etcd is not a reason to be restarted.
        runner = await metrics.serve(
            host or "127.0.0.1",
            int(port or 0),
            lambda: probes.ready() if probes else "waiting for etcd",
            lambda: probes.healthy() if probes else client.auth.healthy(),
        )
        try:
            await wait_ready(etcd, security, probe_key=keys.root)
        except BaseException:
            await runner.cleanup()
            await etcd.close()
            raise
        election = LeaderElection(
            etcd,
            LeaderRecord(
                candidate_id=candidate, address=(metrics.addresses(runner) or [""])[0], started_at=time.time()
            ),
            keys=keys,
            ttl=args.lease_ttl,
        )
        options = LeaderOptions(
            scheduler_name=args.scheduler_name,
            node_selector=args.agent_node_selector,
            keys=keys,
            report_qps=args.report_qps,
            claims=args.worker_claims,
            sole=sole_worker(args),
            sharding=sharding_options(args),
            dispatch_keys=load_keys(args.dispatch_secret_file),
            progress_bound=args.progress_timeout,
        )
        probes = Probes(election, client, progress_bound=args.progress_timeout, pool=options.pool_verdict)
        log.info(
            "coordinator %s campaigning (etcd %s, prefix %s)", candidate, args.etcd_endpoints, keys.prefix
        )
        stop = asyncio.Event()
        stopping.stop_on_signals(stop)
        work = asyncio.create_task(
            run_as_leader(election, lambda term: run_term(term, etcd, client, options))
        )
        probes.campaign = work
        stopper = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if work in done:
            work.result()
        work.cancel()  # resigns: the lease is revoked so a standby takes over at once
        await asyncio.gather(work, return_exceptions=True)
        stopper.cancel()
        await runner.cleanup()
    await etcd.close()
    log.info(
        "coordinator %s stopped (idle passes paced: %d, %.3f s)",
        candidate,
        aiotools.PACER.sleeps,
        aiotools.PACER.slept,
    )
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        sole_worker(args)
    except ValueError as e:
        log.error("%s", e)
        return 2
    heap.freeze_imports()
    try:
        return aiotools.run(_main(args), args.event_loop, pace_ms=args.pace)
    except EtcdConfigError as e:
        log.error("etcd: %s", e)
        return 2
