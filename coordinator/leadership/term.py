"""What the coordinator does while it leads one term: the shard map, the pod dispatcher, and the link
between them (the live workers' dispatch addresses, read from etcd membership). The agent node pool is the
label-selected ``LabelPool``, or, with a sharding ConfigMap configured, the ``PolicyPool`` that
``coordinator.nodeshards.ShardingController`` keeps (shard policy and NodeShard handoff); the controller also
hands the policy's ``rebalance`` settings to this term's ``AssignmentPolicy``.

Everything here runs inside ``run_term`` and is cancelled the moment the term is lost (see
``coordinator.leadership.election.run_as_leader``), so a deposed leader neither writes the map (its writes are
guarded in etcd anyway) nor dispatches pods. Each term starts from fresh state: nothing carries over from an
earlier term of this process.

The term registers its progress signals (``coordinator.leadership.progress``): the shard map must complete
rounds, and the pending-pod watch must stay connected (stopped while a sole worker places every pod, it
counts as idle, not stuck). If either stalls for ``progress_bound`` seconds, the
leader steps down instead of holding the lease while nothing is dispatched.

While it leads, the term shows itself to the coordinator's metrics (``coordinator.metrics.COLLECTOR``: term,
epoch, dispatch backlog, nodes per worker, pool size) and says why when the agent pool stays empty
(``coordinator.leadership.emptypool``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from etcd3aio import Etcd3Client

from common.etcd.keys import KeyFamily, KeyLayout
from common.etcd.mirror import KeyMirror
from common.etcd.schema import RecordError, WorkerRecord
from common.keyring import Keys
from common.kube import KubeClient
from common.reporting import Reporter
from common.wellknown import DEFAULT_SCHEDULER_NAME
from coordinator import metrics
from coordinator.dispatch import Dispatcher
from coordinator.leadership.election import LeaderTerm
from coordinator.leadership.emptypool import EmptyPoolNotice, PoolVerdict, own_pod
from coordinator.leadership.progress import DEFAULT_BOUND, advancing, reflector_healthy
from coordinator.nodeshards import ShardingController, ShardingOptions
from coordinator.nodeshards.eventsender import EventSender
from coordinator.workershards.assignment import AssignmentPolicy
from coordinator.workershards.pools import LabelPool, PolicyPool, label_pool_reason
from coordinator.workershards.shardmap import ShardMapLeader

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LeaderOptions:
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    node_selector: str = ""
    keys: KeyLayout = field(default_factory=KeyLayout)
    report_qps: float = 50.0
    sharding: ShardingOptions | None = None  # the shard-policy ConfigMap; None: the label pool only
    dispatch_keys: Keys | None = None  # the dispatch channel's shared secret (common.keyring); None: none
    progress_bound: float = DEFAULT_BOUND  # seconds a progress signal may stall before the leader steps down
    pool_verdict: PoolVerdict = field(default_factory=PoolVerdict)  # why the pool is empty, for /readyz
    claims: bool = False  # experimental: workers claim plain pods from their own watch (common.claims)
    sole: bool = False  # the sole worker places every pod while it is the only one (Dispatcher.check_sole)


async def run_term(term: LeaderTerm, etcd: Etcd3Client, client: KubeClient, options: LeaderOptions) -> None:
    log.info("leading: term %d (%s)", term.create_revision, term.record.candidate_id)
    pool = LabelPool(client, options.node_selector) if options.sharding is None else PolicyPool()
    assignment = AssignmentPolicy()
    shardmap = ShardMapLeader(etcd, term, pool, keys=options.keys, policy=assignment)
    pool.listeners.append(shardmap.poke)
    sharding = None
    if isinstance(pool, PolicyPool) and options.sharding is not None:
        sharding = ShardingController(
            client,
            etcd,
            term,
            options.sharding,
            pool=pool,
            held=shardmap.nodes_in_use,
            keys=options.keys,
            assignment=assignment,
        )
    reporter = Reporter(
        client, component=options.scheduler_name, instance=term.record.candidate_id, qps=options.report_qps
    )
    dispatcher = Dispatcher(
        client,
        reporter,
        scheduler_name=options.scheduler_name,
        leader_id=term.record.candidate_id,
        term=term.create_revision,
        keys=options.dispatch_keys,
        claims=options.claims,
        sole=options.sole,
        granted=shardmap.granted_counts,
        in_transit=lambda: shardmap.in_transit,
    )

    def members_changed() -> None:
        workers: dict[str, str] = {}
        for key, kv in members.items.items():
            parsed = options.keys.parse(key)
            if parsed is None or parsed[0] != KeyFamily.MEMBER:
                continue
            try:
                rec = WorkerRecord.decode(kv.value)
            except RecordError as e:
                log.warning("ignoring malformed membership record %s: %s", key, e)
                continue
            workers[rec.worker_id] = rec.address
        dispatcher.set_workers(workers)

    view = metrics.TermView(
        term=term.create_revision,
        epoch=lambda: shardmap.epoch,
        backlog=lambda: metrics.DispatchBacklog(
            pending=len(dispatcher.table),
            parked=dispatcher.table.parked(),
            in_flight={wid: len(w.in_flight) for wid, w in dispatcher.workers.items()},
            redispatched=dispatcher.redispatched,
            lane_in_flight=dispatcher.lane.in_flight,
            lane_waiting=dispatcher.lane_waiting(),
        ),
        nodes_per_worker=shardmap.granted_counts,
        agent_pool=lambda: len(pool()),
    )
    notice = EmptyPoolNotice(
        size=lambda: len(pool()),
        explain=sharding.why_empty
        if sharding is not None
        else lambda: label_pool_reason(options.node_selector),
        target=lambda: (sharding.policy_configmap() if sharding is not None else None) or own_pod(),
        events=EventSender(
            client,
            component=options.sharding.component if options.sharding else "agent-scheduler-coordinator",
            instance=term.record.candidate_id,
        ),
        verdict=options.pool_verdict,
    )

    term.progress.add("shard map rounds", advancing(lambda: shardmap.rounds), options.progress_bound)
    term.progress.add("pending-pod watch", reflector_healthy(dispatcher.reflector), options.progress_bound)
    members = KeyMirror(
        etcd, options.keys.members_prefix, prefix=True, on_change=members_changed, name="members"
    )
    metrics.COLLECTOR.lead(view)
    try:
        async with asyncio.TaskGroup() as tg:
            if sharding is not None:
                tg.create_task(sharding.run())
                await sharding.ready.wait()  # an unset pool would revoke everything
            elif isinstance(pool, LabelPool):
                tg.create_task(pool.run())
                await pool.reflector.synced.wait()  # an unlisted pool would revoke everything
            tg.create_task(shardmap.run())
            tg.create_task(members.run())
            tg.create_task(reporter.run())
            tg.create_task(dispatcher.run())
            tg.create_task(notice.run())
    finally:
        metrics.COLLECTOR.step_down(view)
        dispatcher.close()
