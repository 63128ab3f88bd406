"""A worker under a coordinator: the same ``Scheduler`` as standalone, with an etcd ``Shard`` and the leader
as its outcome receiver.

``CoordinatedWorker`` builds, in this order, each piece from the ones before it:
1. the dispatch listener socket, bound first because its address goes into the membership record;
2. the ``Shard`` (``worker.shard``): registration under the lease, the assignment, fencing, acks, catch-up;
3. ``Claims`` (``worker.claims``) and ``LeaderResults`` (``worker.intake``): the pods this worker claims
   from its own watch under the leader's claim set; the outcome receiver, RESULTs to the leader (a claimed
   pod it cannot place is handed back), Scheduled events and the optional audit trail;
4. ``Scheduler(shard=..., outcomes=..., watch_pending=False, preempt=True, claims=...)``: the cache still
   watches every node and pod (all pods use capacity), but only the leader's dispatch and this worker's
   claims feed the queue, and only usable nodes of the shard are candidates; preemption only proposes
   candidates, and is carried out only on the owned node the leader chose (``worker.preemption``);
5. the ``Intake`` server on the listener, with the dispatch keys (``common.keyring``; without a secret only
   a loopback listener is allowed, unless ``insecure_dispatch``) and a mirror of the election prefix, whose
   lowest key names the only leader whose stream it accepts.
``run`` then starts the scheduler and the shard; the shard is given the scheduler's pod watch (granted
nodes become usable after the cache caught up with them) and the scheduler's ``release`` as its release hook
(the acknowledgement waits for the bindings and the preemptions' writes in flight to the released nodes).

Load reports (pending pods, free capacity, binds/s, process CPU) go to etcd for the leader's balancing: read
every ``LOAD_REPORT_PERIOD``, written when they changed (``load_changed``: process CPU only when it moved by
``LOAD_CPU_STEP`` or more) and at least every ``LOAD_REFRESH``. Every write wakes the leader's shard map,
which plans a round on it; a worker at rest writes one report per ``LOAD_REFRESH``, not one per period.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from dataclasses import dataclass, field, replace

import psutil
from etcd3aio import Etcd3Client

from common import metrics, stopping
from common.etcd.keys import KeyLayout, worker_id
from common.etcd.kv import EtcdSecurity, connect, wait_ready
from common.etcd.mirror import KeyMirror
from common.etcd.schema import LoadReport, WorkerCapacity, WorkerRecord
from common.keyring import Keys, NoSecret, load_keys
from common.kube import KubeClient, load_credentials
from common.records import PodRecord
from common.wellknown import DEFAULT_ETCD_PREFIX
from worker.audit import AuditLog
from worker.claims import Claims
from worker.intake import Intake, LeaderResults, elected_term
from worker.outcomes import new_reporter
from worker.scheduler import Scheduler
from worker.settings import WorkerSettings
from worker.shard import Shard

log = logging.getLogger(__name__)

LOAD_REPORT_PERIOD = 2.0
# A report unchanged is written again this often (``agent-scheduler status`` shows a report's age).
LOAD_REFRESH = 30.0
# Process CPU, in cores, moves by this much before it alone makes a report worth writing: at rest it jitters by
# a few hundredths, and the leader's load factor is bounded and hysteretic (coordinator.workershards.assignment).
LOAD_CPU_STEP = 0.05
DRAIN_TIMEOUT = 60.0


@dataclass(slots=True)
class CoordinatedOptions:
    etcd_endpoints: list[str]
    etcd_prefix: str = DEFAULT_ETCD_PREFIX
    lease_ttl: int = 10
    listen_host: str = "127.0.0.1"
    listen_port: int = 0
    advertise_host: str = "127.0.0.1"
    weight: float = 1.0
    audit_log: str = ""
    dispatch_secret_file: str = ""  # the dispatch channel's shared secret; empty: none (see _dispatch_keys)
    insecure_dispatch: bool = False  # allow no secret on a non-loopback listener
    etcd_security: EtcdSecurity = field(default_factory=EtcdSecurity)  # TLS / auth (common.etcd.flags)


def _is_loopback(host: str) -> bool:
    try:
        infos = socket.getaddrinfo(host or None, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def _dispatch_keys(options: CoordinatedOptions) -> Keys:
    """The dispatch keys. Without a secret anyone who reaches the port could pose as the leader, so that is
    refused on a listener beyond loopback unless ``insecure_dispatch`` says otherwise."""
    keys = load_keys(options.dispatch_secret_file)
    if isinstance(keys, NoSecret) and not options.insecure_dispatch and not _is_loopback(options.listen_host):
        raise SystemExit(
            f"refusing to listen on {options.listen_host!r} without --dispatch-secret-file "
            "(give --insecure-dispatch to allow it)"
        )
    return keys


def _listen(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket for ``host`` (IPv4 or IPv6, as the name resolves; "" is every IPv4
    interface) and ``port`` (0: any free port)."""
    family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    return socket.create_server((host, port), family=family)


class CoordinatedWorker:
    """One worker process under a coordinator (see the module docstring for the wiring)."""

    def __init__(
        self, settings: WorkerSettings, options: CoordinatedOptions, client: KubeClient, etcd: Etcd3Client
    ) -> None:
        self.settings = settings
        self.worker_id = worker_id(settings.worker_id)
        keys = _dispatch_keys(options)
        self.listener = _listen(options.listen_host, options.listen_port)
        port = int(self.listener.getsockname()[1])
        record = WorkerRecord(
            worker_id=self.worker_id,
            address=f"{options.advertise_host}:{port}",
            capacity=WorkerCapacity(weight=options.weight),
            started_at=time.time(),
        )
        layout = KeyLayout(options.etcd_prefix)
        self.shard = Shard(etcd, record, keys=layout, ttl=options.lease_ttl)
        self.election = KeyMirror(
            etcd, layout.election_prefix, prefix=True, name="election", on_change=self._election_changed
        )
        self.audit = (
            AuditLog(options.audit_log, worker=self.worker_id, epoch=self._epoch)
            if options.audit_log
            else None
        )
        reporter = new_reporter(client, settings)
        self.draining = False
        self.claims = Claims(
            self.worker_id,
            settings.scheduling.scheduler_name,
            can_place=self.can_place,
            refuse=self._refuse_claim,
        )
        self.results = LeaderResults(
            reporter, audit=self.audit, catching_up=self.shard.syncing, claims=self.claims
        )
        self.sched = Scheduler(
            client,
            settings,
            shard=self.shard,
            outcomes=self.results,
            reporter=reporter,
            watch_pending=False,
            preempt=True,  # proposes candidates; preempts only where the leader says (worker.preemption)
            claims=self.claims,
        )
        self.intake = Intake(
            self.sched,
            self.results,
            worker_id=self.worker_id,
            shard=self.shard,
            keys=keys,
            elected=lambda: elected_term(self.election.items),
            scheduler_name=settings.scheduling.scheduler_name,
            can_place=self.can_place,
        )
        # The capacity check at rest waits for a poke (``Intake.poke``): the index's summary going stale (set
        # by the intake), the shard looked at again (grants, catch-ups, the lease's health), the election.
        self.shard.on_reevaluated(self.intake.shard_reevaluated)

    def _election_changed(self) -> None:
        self.intake.poke()  # a stream whose term is no longer elected is closed at its next check

    def _refuse_claim(self, pod: PodRecord, message: str) -> None:
        self.results.refuse_claim(pod, message)

    def _epoch(self) -> int:
        return self.shard.epoch

    def can_place(self) -> bool:
        """May the leader dispatch to us? Not while fenced or draining."""
        return not self.draining and self.shard.healthy

    def ready(self) -> bool | str:
        if not (self.sched.ready() and self.shard.healthy):
            return False
        if not self.shard.owned():
            # Ready all the same: a restart would not bring nodes; the leader's /readyz says why if the pool
            # is empty.
            return metrics.Ready(
                "owns no nodes: the coordinator granted none (the agent pool is empty, or every node is "
                "held by other workers)"
            )
        return True

    async def run(self) -> int:
        """Run until SIGTERM/SIGINT, then drain: no new decisions, every node given back once its bindings
        are done, the lease revoked."""
        election_task = asyncio.create_task(self._follow_election(), name="election-mirror")
        await self.intake.start(self.listener)
        host, port = self.listener.getsockname()[:2]
        runner = await metrics.serve(
            self.settings.metrics_host, self.settings.metrics_port, self.ready, self.sched.client.auth.healthy
        )
        stop = asyncio.Event()
        stopping.stop_on_signals(stop)
        sched_task = asyncio.create_task(self.sched.run(), name="scheduler")
        await self.shard.start(pods=self.sched.watches, on_release=self.sched.release)
        log.info(
            "worker %s registered (lease %x), dispatch on %s:%d, metrics on %s",
            self.worker_id,
            self.shard.lease_id,
            host,
            port,
            metrics.addresses(runner),
        )
        load_task = asyncio.create_task(self._report_load(), name="load")
        stopper = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({sched_task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if sched_task in done:
            sched_task.result()
        self.draining = True
        self.intake.poke()  # the leader learns at once that we take no more pods
        self.sched.pause()
        try:
            async with asyncio.timeout(DRAIN_TIMEOUT):
                await self.shard.drain()
                await self.sched.binder.drain()
        except TimeoutError:
            log.warning("drain did not finish in %.0fs; closing (the lease expires by itself)", DRAIN_TIMEOUT)
            await self.shard.close()
        for task in (load_task, sched_task, stopper, election_task):
            task.cancel()
        await asyncio.gather(load_task, sched_task, stopper, election_task, return_exceptions=True)
        await self.intake.close()
        await runner.cleanup()
        if self.audit is not None:
            self.audit.close()
        log.info("worker %s stopped: %s", self.worker_id, self.sched.statistics())
        return 0

    async def _follow_election(self) -> None:
        """Keep the election mirror running: without it no new leader would ever be accepted."""
        while True:
            try:
                await self.election.run()
            except Exception:
                log.exception("election mirror failed; restarting it")
                await asyncio.sleep(1.0)

    async def _report_load(self) -> None:
        proc = psutil.Process()
        proc.cpu_percent(None)
        written_at = float("-inf")
        while True:
            await asyncio.sleep(LOAD_REPORT_PERIOD)
            cap = self.intake.capacity()
            report = LoadReport(
                pending_pods=cap.pending,
                free_milli_cpu=max(0, cap.free_cpu),
                free_memory=max(0, cap.free_memory),
                binds_per_second=cap.binds_per_s,
                process_cpu=proc.cpu_percent(None) / 100.0,
                reported_at=time.time(),
                usable_nodes=cap.nodes,
            )
            now = time.monotonic()
            # Against what etcd holds under the current lease: after a new registration that is nothing, or
            # what the registration republished, whatever this loop wrote before.
            if now - written_at < LOAD_REFRESH and not load_changed(report, self.shard.written_load()):
                continue
            if await self.shard.report_load(report):
                written_at = now


def load_changed(report: LoadReport, written: LoadReport | None) -> bool:
    """Does ``report`` say something ``written`` (the latest report etcd took) did not? Its time aside, and
    its process CPU unless that moved by ``LOAD_CPU_STEP`` or more."""
    if written is None or abs(report.process_cpu - written.process_cpu) >= LOAD_CPU_STEP:
        return True
    return replace(report, process_cpu=written.process_cpu, reported_at=written.reported_at) != written


async def run_coordinated(settings: WorkerSettings, options: CoordinatedOptions) -> int:
    """Connect to the API server and etcd, run one ``CoordinatedWorker`` until it stops; its exit code."""
    creds = load_credentials(settings.api.kubeconfig)
    root = KeyLayout(options.etcd_prefix).root
    etcd = await connect(options.etcd_endpoints, options.etcd_security, probe_key=root)
    try:
        # Retried, like the coordinator does; the probes answer meanwhile (alive, not ready), so waiting for
        # etcd is no reason to be restarted.
        waiting = await metrics.serve(
            settings.metrics_host, settings.metrics_port, lambda: "waiting for etcd"
        )
        try:
            await wait_ready(etcd, options.etcd_security, probe_key=root)
        finally:
            await waiting.cleanup()
        async with KubeClient(
            creds,
            qps=settings.api.qps,
            burst=settings.api.burst,
            max_connections=settings.api.max_connections,
        ) as client:
            return await CoordinatedWorker(settings, options, client, etcd).run()
    finally:
        await etcd.close()
