"""A worker under a coordinator: etcd membership and fencing around the same ``Scheduler`` as standalone.

Wiring, and why each piece is there:
- ``Scheduler(owns=membership.owns, watch_pending=False)``: the cache still watches every node and pod (all
  pods use capacity), but only the leader's dispatch feeds the queue, and only granted nodes are candidates.
- released nodes leave the index at once; granted nodes join it only after the cache has caught up with
  the pods already bound there (``Scheduler.acquire``); a lease health change (fencing) re-indexes too, and
  while fenced ``owns`` is False for every node, so no decision can pick one.
- the release hook waits for the bindings in flight to the released nodes before ``common.ownership`` writes
  the acknowledgement: the new owner cannot see a node that still has our bindings on their way.
- load reports (pending pods, free capacity, binds/s, process CPU) go to etcd for the leader's balancing.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from dataclasses import dataclass

import psutil

from common import metrics
from common.etcd.keys import KeyLayout, worker_id
from common.etcd.kv import connect
from common.etcd.schema import LoadReport, WorkerCapacity, WorkerRecord
from common.kube import KubeClient, load_credentials
from common.ownership import OwnershipChange, ShardMembership
from common.records import NodeName
from worker.audit import AuditLog
from worker.intake import Intake
from worker.scheduler import Scheduler
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)

LOAD_REPORT_PERIOD = 2.0
DRAIN_TIMEOUT = 60.0


@dataclass(slots=True)
class CoordinatedOptions:
    etcd_endpoints: list[str]
    etcd_prefix: str = "/agent-scheduler"
    lease_ttl: int = 10
    listen_host: str = "127.0.0.1"
    listen_port: int = 0
    advertise_host: str = "127.0.0.1"
    weight: float = 1.0
    audit_log: str = ""


async def _report_load(membership: ShardMembership, sched: Scheduler, intake: Intake) -> None:
    proc = psutil.Process()
    proc.cpu_percent(None)
    while True:
        await asyncio.sleep(LOAD_REPORT_PERIOD)
        cap = intake.capacity()
        report = LoadReport(
            pending_pods=int(cap["pending"]),
            free_milli_cpu=max(0, int(cap["free_cpu"])),
            free_memory=max(0, int(cap["free_memory"])),
            binds_per_second=float(cap["binds_per_s"]),
            process_cpu=proc.cpu_percent(None) / 100.0,
            reported_at=time.time(),
        )
        await membership.report_load(report)
        metrics.owned_nodes.set(len(membership.owned()))


async def run_coordinated(settings: WorkerSettings, options: CoordinatedOptions) -> int:
    wid = worker_id(settings.worker_id)
    creds = load_credentials(settings.api.kubeconfig)
    etcd = await connect(options.etcd_endpoints)
    async with KubeClient(
        creds, qps=settings.api.qps, burst=settings.api.burst, max_connections=settings.api.max_connections
    ) as client:
        membership: ShardMembership | None = None

        def owns(node: NodeName) -> bool:
            return membership is not None and membership.owns(node) and sched.usable(node)

        sched = Scheduler(client, settings, owns=owns, watch_pending=False)
        draining = False
        intake = Intake(
            sched,
            worker_id=wid,
            can_place=lambda: not draining and membership is not None and membership.healthy,
        )
        host, port = await intake.start(options.listen_host, options.listen_port)

        async def on_release(nodes: frozenset[NodeName]) -> None:
            sched.ownership_changed(nodes)  # already not owned: take them out of the index first
            await sched.binder.drain(nodes)

        record = WorkerRecord(
            worker_id=wid,
            address=f"{options.advertise_host}:{port}",
            capacity=WorkerCapacity(weight=options.weight),
            started_at=time.time(),
        )
        membership = ShardMembership(
            etcd, record, keys=KeyLayout(options.etcd_prefix), ttl=options.lease_ttl, on_release=on_release
        )

        acquiring: set[asyncio.Task[None]] = set()

        def changed(change: OwnershipChange) -> None:
            if change.removed:
                sched.ownership_changed(set(change.removed))
            if change.added:
                task = asyncio.create_task(sched.acquire(change.added), name=f"acquire-{change.epoch}")
                acquiring.add(task)
                task.add_done_callback(acquiring.discard)
            log.info("shard epoch %d: +%d -%d nodes", change.epoch, len(change.added), len(change.removed))

        audit = (
            AuditLog(options.audit_log, worker=wid, epoch=lambda: membership.epoch if membership else 0)
            if options.audit_log
            else None
        )
        if audit is not None:
            sched.binder.audit = audit.bound
        membership.subscribe(changed)
        membership.keeper.add_listener(lambda healthy: sched.ownership_changed())
        runner = await metrics.serve(
            settings.metrics_host, settings.metrics_port, lambda: sched.ready() and owns_any()
        )

        def owns_any() -> bool:
            return membership is not None and membership.healthy

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        sched_task = asyncio.create_task(sched.run(), name="scheduler")
        await membership.start()
        log.info(
            "worker %s registered (lease %x), dispatch on %s:%d, metrics on %s",
            wid,
            membership.lease_id,
            host,
            port,
            metrics.addresses(runner),
        )
        load_task = asyncio.create_task(_report_load(membership, sched, intake), name="load")
        stopper = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({sched_task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if sched_task in done:
            sched_task.result()
        # Graceful drain: stop deciding, give every node back once its bindings are done, then leave.
        draining = True
        sched.pause()
        try:
            async with asyncio.timeout(DRAIN_TIMEOUT):
                await membership.drain()
                await sched.binder.drain()
        except TimeoutError:
            log.warning("drain did not finish in %.0fs; closing (the lease expires by itself)", DRAIN_TIMEOUT)
            await membership.close()
        for task in (load_task, sched_task):
            task.cancel()
        await asyncio.gather(load_task, sched_task, return_exceptions=True)
        await intake.close()
        await runner.cleanup()
        if audit is not None:
            audit.close()
        log.info("worker %s stopped: %s", wid, sched.statistics())
    await etcd.close()
    return 0
