"""The shard map at rest (``ShardMapLeader._round``): a round is skipped only when it would repeat one that
found nothing to do. Driven on the leader's own in-memory mirror, with no etcd: none of these rounds asks etcd
about a lease, and ``_write`` is replaced by a recorder (the etcd side is in
``tests/integration/etcd/test_etcd_shardmap.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, cast

from common.etcd.keys import KeyLayout, WorkerId
from common.etcd.kv import KeyValue
from common.etcd.schema import LoadReport, ShardAssignment, WorkerCapacity, WorkerRecord
from common.records import NodeName
from coordinator.leadership.election import LeaderTerm
from coordinator.workershards.shardmap import ShardMapLeader

KEYS = KeyLayout()
W0, W1 = WorkerId("w0"), WorkerId("w1")


def _leader(
    pool: Mapping[NodeName, float],
    members: Mapping[WorkerId, tuple[float, int]],
    assignments: list[ShardAssignment],
    *,
    clock: Callable[[], float] = lambda: 0.0,
    grant_delay: float = 5.0,
) -> tuple[ShardMapLeader, list[dict[WorkerId, ShardAssignment | None]]]:
    """A leader whose mirror holds ``members`` (worker -> capacity weight, lease) and ``assignments``."""
    leader = ShardMapLeader(
        cast(Any, None), cast(LeaderTerm, None), lambda: pool, keys=KEYS, clock=clock, grant_delay=grant_delay
    )
    items: dict[str, KeyValue] = {}
    revision = 0
    for worker, (weight, lease) in members.items():
        revision += 1
        record = WorkerRecord(worker, "127.0.0.1:9000", WorkerCapacity(weight))
        items[KEYS.member(worker)] = KeyValue(KEYS.member(worker), record.encode(), revision, revision, lease)
    for a in assignments:
        revision += 1
        items[KEYS.assignment(a.worker_id)] = KeyValue(
            KEYS.assignment(a.worker_id), a.encode(), revision, revision, 0
        )
    mirror = leader._mirror
    mirror._items.update(items)
    mirror.revision = revision
    written: list[dict[WorkerId, ShardAssignment | None]] = []

    async def write(diff: Mapping[WorkerId, ShardAssignment | None], snap: object) -> bool:
        written.append(dict(diff))
        return True

    leader._write = write  # type: ignore[method-assign]
    return leader, written


def _nodes(*names: str) -> frozenset[NodeName]:
    return frozenset(NodeName(n) for n in names)


def test_rounds_at_rest_are_skipped_until_an_input_changes() -> None:
    pool = {NodeName("a"): 1.0, NodeName("b"): 1.0}
    leader, written = _leader(
        pool,
        {W0: (1.0, 10), W1: (1.0, 11)},
        [ShardAssignment(W0, 10, 1, _nodes("a")), ShardAssignment(W1, 11, 1, _nodes("b"))],
    )
    for _ in range(3):
        assert asyncio.run(leader._round())
    assert (leader.rounds, leader.skipped, written) == (3, 2, [])

    pool[NodeName("c")] = 1.0  # in place: the pool is compared by its contents
    assert asyncio.run(leader._round())
    assert leader.skipped == 2
    assert [
        sorted(n for a in diff.values() if a for n in a.granted - _nodes("a", "b")) for diff in written
    ] == [["c"]]

    for worker, a in written[0].items():  # the write, as the mirror shows it
        assert a is not None
        key = KEYS.assignment(worker)
        leader._mirror._items[key] = KeyValue(key, a.encode(), 9, 9, 0)
    leader._mirror.revision = 9
    assert asyncio.run(leader._round()) and asyncio.run(leader._round())
    assert (leader.skipped, len(written)) == (3, 1)
    leader._mirror.relists += 1  # a relist replans: a cheap check that the keys' versions missed nothing
    assert asyncio.run(leader._round())
    assert leader.skipped == 3


def _report(leader: ShardMapLeader, worker: WorkerId, revision: int, **load: Any) -> None:
    """``worker``'s load report, as the mirror shows it once etcd took it at ``revision``."""
    key = KEYS.load(worker)
    leader._mirror._items[key] = KeyValue(key, LoadReport(**load).encode(), revision, revision, 0)


def test_a_lone_workers_load_reports_skip_the_round() -> None:
    """A lone worker's effective weight is its capacity weight whatever its load: its reports (one every few
    seconds while it works) leave the plan as it was, so they must not cost a round over the whole pool."""
    pool = {NodeName("a"): 1.0, NodeName("b"): 1.0}
    leader, written = _leader(pool, {W0: (1.0, 10)}, [ShardAssignment(W0, 10, 1, _nodes("a", "b"))])
    assert asyncio.run(leader._round())
    for revision, pending in enumerate((0, 400, 1_500, 3), start=10):
        _report(leader, W0, revision, pending_pods=pending, process_cpu=0.9, reported_at=float(revision))
        assert asyncio.run(leader._round())
    assert (leader.rounds, leader.skipped, written) == (5, 4, [])

    # Any other key is read by its version: an assignment that changed under the leader is planned again.
    key = KEYS.assignment(W0)
    leader._mirror._items[key] = KeyValue(key, ShardAssignment(W0, 10, 2, _nodes("a")).encode(), 30, 30, 0)
    assert asyncio.run(leader._round())
    assert leader.skipped == 4
    assert [{w: a.granted if a else None for w, a in diff.items()} for diff in written] == [
        {W0: _nodes("a", "b")}
    ]
    leader._mirror._items[key] = KeyValue(
        key, ShardAssignment(W0, 10, 3, _nodes("a", "b")).encode(), 31, 31, 0
    )
    assert asyncio.run(leader._round()) and asyncio.run(leader._round())
    assert leader.skipped == 5

    record = WorkerRecord(W1, "127.0.0.1:9001", WorkerCapacity(1.0))
    leader._mirror._items[KEYS.member(W1)] = KeyValue(KEYS.member(W1), record.encode(), 32, 32, 11)
    written.clear()
    assert asyncio.run(leader._round())
    assert leader.skipped == 5
    assert len(written) == 1
    w0 = written[0][W0]
    assert w0 is not None and len(w0.revoking) == 1  # w1's share, released by w0 first


def test_a_load_report_is_planned_when_it_may_move_a_node() -> None:
    """With two workers a report moves the shares when it changes the workers' pressures. A report that says
    the same again (a newer time) is skipped, and so is one that moves the shares too little to start
    rebalancing; one that moves them past the threshold is planned."""
    pool = {NodeName("a"): 1.0, NodeName("b"): 1.0}
    leader, written = _leader(
        pool,
        {W0: (1.0, 10), W1: (1.0, 11)},
        [ShardAssignment(W0, 10, 1, _nodes("a")), ShardAssignment(W1, 11, 1, _nodes("b"))],
    )
    _report(leader, W0, 20, pending_pods=0, reported_at=1.0)
    _report(leader, W1, 21, pending_pods=0, reported_at=1.0)
    assert asyncio.run(leader._round())
    _report(leader, W0, 22, pending_pods=0, reported_at=2.0)
    assert asyncio.run(leader._round())
    assert leader.skipped == 1
    _report(leader, W0, 23, pending_pods=100, reported_at=3.0)  # shares 0.95 and 1.05: skew 0.1
    assert asyncio.run(leader._round())
    assert leader.skipped == 2
    _report(leader, W0, 24, pending_pods=400, reported_at=4.0)  # shares 0.8 and 1.2: skew 0.42
    assert asyncio.run(leader._round())
    assert leader.skipped == 2
    assert written == []  # two nodes of one size: no move shrinks both deviations
    assert asyncio.run(leader._round())  # ... and that round found nothing to do: the next one is skipped
    assert leader.skipped == 3


def test_a_round_that_changed_what_it_carries_is_not_reused() -> None:
    """A new leader's first round finds node n1 revoking with no known destination and nothing to write; it
    learns where n1 goes (``_destinations``), and on the same inputs the next round plans differently (it
    revokes n0 from w0). That round must run."""
    pool = {NodeName("n0"): 1.0, NodeName("n1"): 8.0, NodeName("n2"): 4.0}
    leader, written = _leader(
        pool,
        {W0: (2.0, 1), W1: (3.0, 2)},
        [
            ShardAssignment(W0, 1, 1, _nodes("n0"), _nodes("n1")),
            ShardAssignment(W1, 2, 1, _nodes("n2")),
        ],
    )
    assert asyncio.run(leader._round())
    assert written == []
    assert asyncio.run(leader._round())
    assert leader.skipped == 0
    assert len(written) == 1
    w0 = written[0][W0]
    assert w0 is not None and NodeName("n0") in w0.revoking


def test_a_dead_lease_passing_its_grant_delay_during_a_round_is_seen_by_the_next() -> None:
    """The grant delay a round applies and the one it records for the skip are one clock reading: a lease that
    passes its delay just after the round read the clock frees its nodes in the next round."""
    ticks = iter([1.0] + [4.8 + 0.3 * i for i in range(20)])
    pool = {NodeName("a"): 1.0, NodeName("b"): 1.0}
    leader, written = _leader(
        pool,
        {W1: (1.0, 11)},
        [ShardAssignment(W0, 7, 1, revoking=_nodes("a")), ShardAssignment(W1, 11, 1, _nodes("b"))],
        clock=lambda: next(ticks),
        grant_delay=5.0,
    )
    # w0 crashed: etcd confirmed its lease gone at 0.0, so its node is free from 5.0
    leader._dead_leases[7] = 0.0
    assert asyncio.run(leader._round())  # 1.0: learns where a goes
    assert asyncio.run(leader._round())  # 4.8: not yet, and nothing else to do: the next may be skipped
    assert written == [] and leader._quiet is not None
    assert asyncio.run(leader._round())  # 5.1 and later: w0's assignment goes, a goes to w1
    assert leader.skipped == 0
    assert len(written) == 1 and W0 in written[0] and written[0][W0] is None
    w1 = written[0][W1]
    assert w1 is not None and w1.granted == _nodes("a", "b")
