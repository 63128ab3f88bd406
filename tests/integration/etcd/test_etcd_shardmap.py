"""Shard ownership against a real etcd: joins, leaves, handoffs, dead workers, leader changes.

Every test runs under the ``shard_cluster`` fixture, whose ownership log fails the test if a node was ever
granted to two workers at once, or ``owns()`` was ever True on two workers for one node (sampled every
5 ms).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from common.etcd.keys import WorkerId
from common.etcd.kv import get_key, lease_service
from common.etcd.schema import LoadReport, ShardAssignment, ShardMapMeta
from common.records import NodeName
from coordinator.leadership.election import LeaderTerm
from coordinator.workershards.shardmap import ShardMapLeader
from tests.integration.etcd.etcd_harness import TTL, ShardCluster, eventually, node_names
from tests.integration.etcd.static_pool import StaticPool
from worker.shard import ReleaseHook, Shard

pytestmark = pytest.mark.integration

SETTLE = 10.0  # generous bound for a few shard-map rounds


async def test_join_and_graceful_leave(shard_cluster: ShardCluster) -> None:
    cluster = shard_cluster
    cluster.pool.set(node_names(12))
    await cluster.start_leader("coordinator-0")
    w1 = await cluster.start_worker("w1")
    await eventually(cluster.fully_assigned, SETTLE, "w1 owns the pool")
    assert w1.owned() == frozenset(cluster.pool())

    released: list[frozenset[NodeName]] = []
    w2 = await cluster.start_worker("w2", on_release=_recording(released))
    await eventually(lambda: cluster.fully_assigned() and len(w2.owned()) == 6, SETTLE, "w2 gets its half")
    assert len(w1.owned()) == 6
    w2_nodes = w2.owned()

    start = time.monotonic()
    await w2.drain()
    assert not w2.owned()
    assert frozenset().union(*released) == w2_nodes  # drain handed everything back through the hook
    await eventually(lambda: cluster.fully_assigned(["w1"]), SETTLE, "w1 owns the pool again")
    # A graceful leave does not wait for lease expiry: the leader sees the lease revoked at once.
    assert time.monotonic() - start < TTL
    member, _ = await get_key(await cluster.client(), cluster.keys.member(w2.worker_id))
    assert member is None


def _recording(sink: list[frozenset[NodeName]], delay: float = 0.0) -> ReleaseHook:
    async def on_release(nodes: frozenset[NodeName]) -> None:
        await asyncio.sleep(delay)
        sink.append(nodes)

    return on_release


async def test_revocation_handshake_release_precedes_grant(shard_cluster: ShardCluster) -> None:
    cluster = shard_cluster
    cluster.pool.set(node_names(10))
    await cluster.start_leader("coordinator-0")
    release_done: dict[NodeName, float] = {}
    release_started: dict[NodeName, float] = {}

    async def slow_release(nodes: frozenset[NodeName]) -> None:
        # The worker engine waits here for in-flight bindings; the nodes must already be unowned.
        for node in nodes:
            release_started[node] = time.monotonic()
            assert not w1.owns(node)
        await asyncio.sleep(0.3)
        for node in nodes:
            release_done[node] = time.monotonic()

    w1 = await cluster.start_worker("w1", on_release=slow_release)
    await eventually(cluster.fully_assigned, SETTLE, "w1 owns the pool")
    await cluster.start_worker("w2")
    await eventually(
        lambda: cluster.fully_assigned() and len(cluster.workers["w2"].owned()) == 5, SETTLE, "split"
    )

    moved = [n for n in node_names(10) if cluster.workers["w2"].owns(n)]
    assert len(moved) == 5
    for node in moved:
        removed = cluster.log.first(w1.worker_id, "removed", node)
        added = cluster.log.first(cluster.workers["w2"].worker_id, "added", node)  # w2 never had it before
        assert removed is not None and added is not None
        assert removed <= release_started[node] < release_done[node] < added
    # The sequence of ownership views was checked for double ownership at every step by the log.
    assert cluster.log.samples > 10


async def test_dead_worker_nodes_move_only_after_its_lease_expired(shard_cluster: ShardCluster) -> None:
    cluster = shard_cluster
    cluster.pool.set(node_names(8))
    await cluster.start_leader("coordinator-0")
    w1 = await cluster.start_worker("w1")
    w2 = await cluster.start_worker("w2")
    await eventually(lambda: cluster.fully_assigned() and len(w2.owned()) == 4, SETTLE, "split")
    orphans = w2.owned()

    stats = w2.keeper.statistics()
    crashed = time.monotonic()
    last_refresh_sent = crashed - stats.since_refresh
    await w2.close()  # crash: no release, no ack, no revoke
    assert not any(w2.owns(n) for n in orphans)

    await eventually(lambda: cluster.fully_assigned(["w1"]), TTL + SETTLE, "w1 takes over the orphans")
    for node in orphans:
        added = cluster.log.first(w1.worker_id, "added", node, after=crashed)
        assert added is not None
        # etcd expires the lease no earlier than TTL after the last refresh it received, which we sent.
        assert added >= last_refresh_sent + TTL - 0.05
    assert len(w1.owned()) == 8


async def test_leader_failover_keeps_ownership_and_old_leader_cannot_write(
    shard_cluster: ShardCluster,
) -> None:
    cluster = shard_cluster
    cluster.pool.set(node_names(6))
    a = await cluster.start_leader("coordinator-a")
    await eventually(lambda: cluster.leading() == ["coordinator-a"], SETTLE, "a leads")
    b = await cluster.start_leader("coordinator-b")
    w1 = await cluster.start_worker("w1")
    await eventually(cluster.fully_assigned, SETTLE, "w1 owns the pool")
    term_a = a.election.term
    assert term_a is not None
    events_before = len(cluster.log.events)

    await lease_service(a.client).revoke(term_a.lease_id, timeout=5)
    await eventually(lambda: cluster.leading() == ["coordinator-b"], TTL + 2, "b takes over")
    assert len(cluster.log.events) == events_before  # the workers did not notice
    assert w1.owned() == frozenset(cluster.pool())

    # The new leader keeps working: a new worker gets a share.
    w2 = await cluster.start_worker("w2")
    await eventually(lambda: cluster.fully_assigned() and len(w2.owned()) == 3, SETTLE, "b assigns w2")

    # A deposed leader that still believes in its term cannot change the map: it plans revocations for
    # a smaller pool, its guarded transaction is refused, and run() returns as deposed.
    client = await cluster.client()
    stale = LeaderTerm(term_a.record, term_a.key, term_a.create_revision, term_a.lease_id)
    stale_map = ShardMapLeader(client, stale, StaticPool(node_names(3)), keys=cluster.keys)
    await asyncio.wait_for(stale_map.run(), SETTLE)
    assert stale_map.writes == 0 and stale_map.rounds >= 1
    meta_kv, _ = await get_key(client, cluster.keys.shardmap)
    assert meta_kv is not None
    assert ShardMapMeta.decode(meta_kv.value).leader_id == "coordinator-b"
    assert cluster.fully_assigned()
    assert b.maps[-1].writes >= 1


async def test_lost_lease_means_reregistration_and_resumed_ownership(shard_cluster: ShardCluster) -> None:
    cluster = shard_cluster
    cluster.pool.set(node_names(6))
    await cluster.start_leader("coordinator-0")
    w1 = await cluster.start_worker("w1")
    await eventually(cluster.fully_assigned, SETTLE, "w1 owns the pool")
    old_lease = w1.lease_id
    report = LoadReport(pending_pods=4, reported_at=time.time())
    assert await w1.report_load(report)
    assert w1.written_load() == report

    # As if the lease had expired while the worker was cut off.
    await lease_service(await cluster.client()).revoke(old_lease, timeout=5)
    await eventually(lambda: not w1.owned(), TTL, "w1 notices the lost lease")
    await eventually(lambda: w1.lease_id != old_lease and cluster.fully_assigned(), SETTLE, "w1 is back")
    kv, _ = await get_key(await cluster.client(), cluster.keys.assignment(w1.worker_id))
    assert kv is not None
    assert ShardAssignment.decode(kv.value).lease_id == w1.lease_id
    assert w1.statistics().registrations == 2
    # The registration republished the report under the new lease, and says so (a coordinated worker compares
    # its next report with what etcd holds under its current lease).
    await eventually(lambda: w1.written_load() == report, SETTLE, "the report republished")
    kv, _ = await get_key(await cluster.client(), cluster.keys.load(w1.worker_id))
    assert kv is not None and kv.lease == w1.lease_id and LoadReport.decode(kv.value) == report


async def test_load_reports_reach_etcd_under_the_worker_lease(shard_cluster: ShardCluster) -> None:
    cluster = shard_cluster
    await cluster.start_leader("coordinator-0")
    w1 = await cluster.start_worker("w1")
    report = LoadReport(pending_pods=5, binds_per_second=12.5, process_cpu=0.4, reported_at=time.time())
    assert await w1.report_load(report)
    kv, _ = await get_key(await cluster.client(), cluster.keys.load(w1.worker_id))
    assert kv is not None
    assert kv.lease == w1.lease_id
    assert LoadReport.decode(kv.value) == report


async def test_pool_changes_grant_new_nodes_and_release_removed_ones(shard_cluster: ShardCluster) -> None:
    cluster = shard_cluster
    released: list[frozenset[NodeName]] = []
    cluster.pool.set(node_names(4))
    leader = await cluster.start_leader("coordinator-0")
    w1 = await cluster.start_worker("w1", on_release=_recording(released))
    await eventually(cluster.fully_assigned, SETTLE, "w1 owns the pool")

    cluster.pool.set(node_names(8))
    leader.maps[-1].poke()
    await eventually(lambda: w1.owned() == frozenset(node_names(8)), SETTLE, "new nodes granted")

    cluster.pool.set(node_names(8)[2:])
    leader.maps[-1].poke()
    await eventually(lambda: w1.owned() == frozenset(node_names(8)[2:]), SETTLE, "removed nodes released")
    # A revoked node leaves ``owned`` at once; its release hook runs after, in the shard's release loop.
    await eventually(
        lambda: frozenset().union(*released) == frozenset(node_names(2)), SETTLE, "the release hook ran"
    )
    # Once acknowledged, the removed nodes are held by nobody (not left in the revoking set).
    await eventually(lambda: leader.maps[-1].in_transit == 0, SETTLE, "handoffs finished")


async def test_restarted_worker_waits_for_its_previous_incarnation_to_expire(
    shard_cluster: ShardCluster,
) -> None:
    cluster = shard_cluster
    cluster.pool.set(node_names(4))
    await cluster.start_leader("coordinator-0")
    old = await cluster.start_worker("w1")
    await eventually(cluster.fully_assigned, SETTLE, "w1 owns the pool")
    last_refresh_sent = time.monotonic() - old.keeper.statistics().since_refresh
    await old.close()  # crash; its lease lives on until etcd expires it

    del cluster.workers["w1"]
    new = await cluster.start_worker("w1")  # blocks in registration until the old lease is gone
    registered = time.monotonic()
    assert registered >= last_refresh_sent + TTL - 0.05
    assert new.lease_id != old.lease_id
    await eventually(cluster.fully_assigned, SETTLE, "the new incarnation owns the pool")
    kv, _ = await get_key(await cluster.client(), cluster.keys.assignment(new.worker_id))
    assert kv is not None
    assert ShardAssignment.decode(kv.value).lease_id == new.lease_id


async def test_a_leader_at_rest_skips_its_rounds_and_still_sees_every_change(
    shard_cluster: ShardCluster,
) -> None:
    """A round that found nothing to do is not planned again while nothing it reads changed; a pool change
    nobody announced (no poke, the mapping changed in place), a member, and a load report that could move a
    node all still move it; a lone worker's load report does not, nor one that moves the shares too little."""
    cluster = shard_cluster
    cluster.pool.set(node_names(4))
    leader = await cluster.start_leader("coordinator-0")
    w1 = await cluster.start_worker("w1")
    await eventually(cluster.fully_assigned, SETTLE, "w1 owns the pool")
    shardmap = leader.maps[-1]
    await eventually(lambda: shardmap.skipped >= 2, SETTLE, "rounds skipped at rest")
    planned, writes = shardmap.rounds - shardmap.skipped, shardmap.writes
    await asyncio.sleep(1.5)  # three intervals of the harness's leader
    assert shardmap.rounds - shardmap.skipped == planned
    assert shardmap.writes == writes

    # In place, and no poke: only the periodic round can notice, and it must not skip.
    cluster.pool()[NodeName("node-99")] = 1.0  # type: ignore[index]
    await eventually(lambda: NodeName("node-99") in w1.owned(), SETTLE, "an unannounced pool change granted")

    def mirrored(worker: str, pending: int) -> bool:
        kv = shardmap._mirror.items.get(cluster.keys.load(WorkerId(worker)))
        return kv is not None and LoadReport.decode(kv.value).pending_pods == pending

    async def at_rest() -> tuple[int, int]:
        """Wait for two rounds and a quiet one; the planned rounds and the mirror's relists so far."""
        rounds = shardmap.rounds
        await eventually(
            lambda: shardmap.rounds >= rounds + 2 and shardmap._quiet is not None, SETTLE, "at rest"
        )
        return shardmap.rounds - shardmap.skipped, shardmap._mirror.relists

    async def skipped_after(worker: Shard, pending: int, since: tuple[int, int]) -> None:
        """``worker`` reports ``pending`` pods; once the report is mirrored and two more rounds passed, no round
        was planned but those a relist forces (one a minute: a relist replans)."""
        assert await worker.report_load(LoadReport(pending_pods=pending, reported_at=time.time()))
        await eventually(lambda: mirrored(worker.worker_id, pending), SETTLE, "the report mirrored")
        rounds = shardmap.rounds
        await eventually(lambda: shardmap.rounds >= rounds + 2, SETTLE, "rounds after the report")
        planned, relists = since
        assert shardmap.rounds - shardmap.skipped - planned <= shardmap._mirror.relists - relists

    # A lone worker's load moves no share: its report is read, and the round skipped.
    await skipped_after(w1, 3, await at_rest())

    # Six nodes, three each: a report that moves the shares a little is skipped too (w1 at 100 pending pods,
    # w2 at none: shares 2.85 and 3.15, skew 0.1); one that moves them past the threshold is planned (w1 at
    # 1,000: shares 1.5 and 4.5, skew 1.33).
    cluster.pool()[NodeName("node-98")] = 1.0  # type: ignore[index]
    w2 = await cluster.start_worker("w2")
    await eventually(lambda: cluster.fully_assigned() and len(w2.owned()) == 3, SETTLE, "w2 gets its share")
    await eventually(lambda: len(w1.owned()) == 3, SETTLE, "w1 keeps its share")
    assert await w2.report_load(LoadReport(pending_pods=0, reported_at=time.time()))
    await eventually(lambda: mirrored("w2", 0), SETTLE, "w2's report mirrored")
    await skipped_after(w1, 100, await at_rest())
    planned, _ = await at_rest()
    assert await w1.report_load(LoadReport(pending_pods=1000, reported_at=time.time()))
    await eventually(lambda: shardmap.rounds - shardmap.skipped > planned, SETTLE, "a load report planned")
