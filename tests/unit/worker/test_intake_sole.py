"""The worker's side of the sole worker (``Intake``, SOLE) over a real local TCP stream: what it takes, how it
answers and reports, when it refuses, how it waits while granted nodes catch up, and how the period ends (a
usable node leaves, the stream ends)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from common import protocol
from common.kube import ApiError
from common.records import NodeName, PodKey
from common.wellknown import DEFAULT_SCHEDULER_NAME
from tests.builders import make_node, make_pod
from tests.unit.worker.test_intake import TIMEOUT, Leader, Worker, capacity_until, fast, running_worker
from worker.audit import AuditLog
from worker.claims import Claims
from worker.engine import Decision
from worker.framework import Code

__all__ = ["fast"]  # the imported autouse fixture: short handshake timeouts


@pytest.fixture
async def worker(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Worker]:
    def claims(can_place: Callable[[], bool]) -> Claims:  # as under a coordinator: never off
        return Claims("w1", DEFAULT_SCHEDULER_NAME, can_place=can_place, refuse=lambda pod, message: None)

    async with running_worker(preempt=True, claims=claims) as w:
        listed: list[dict[str, Any]] = [make_pod("old").req(cpu="1").json()]

        async def list_pending() -> list[dict[str, Any]]:
            return listed  # the pending pods the watch passed over before SOLE

        monkeypatch.setattr(w.sched.watches, "list_pending", list_pending)
        yield w


async def become_sole(worker: Worker) -> Leader:
    leader = await Leader.connect(worker, term=1)
    leader.send(protocol.Sole())
    await capacity_until(leader, worker, lambda c: c.sole)
    return leader


def queued(worker: Worker) -> set[str]:
    return {p.key for p in worker.sched.queue.records()}


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_the_sole_worker_takes_every_pending_pod_of_ours_and_answers_none(
    worker: Worker, tmp_path: Path
) -> None:
    worker.results.audit = AuditLog(str(tmp_path / "audit.jsonl"), worker="w1", epoch=lambda: 1)
    leader = await become_sole(worker)
    await settle()
    assert queued(worker) == {"default/old"}  # listed: the watch had passed over it
    # the pod watch's events are admitted from now on, as standalone
    worker.sched.watches.pod_feed.event("ADDED", make_pod("new").req(cpu="1").json())
    worker.sched.watches.pod_feed.event("ADDED", make_pod("huge").req(cpu="64").json())
    assert queued(worker) == {"default/old", "default/new", "default/huge"}
    for _ in range(3):
        qp = worker.sched.queue.pop_nowait()
        assert qp is not None
        decision = worker.sched.schedule_one(qp)
        if decision is not None and decision.node is not None:
            worker.results.bound(qp.pod, decision.node, assumed_at=1.0, bound_at=2.0)
    # bound: its Scheduled event, no RESULT; unschedulable: reported on the pod, kept here to retry
    assert sorted(k for k, _ in worker.reporter.scheduled_pods) == ["default/new", "default/old"]
    assert [k for k, _ in worker.reporter.failures] == ["default/huge"]
    assert worker.sched.queue.where(PodKey("default/huge")) is not None
    worker.results.audit.close()
    trail = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert {(t["pod"], t["via"]) for t in trail} == {("default/old", "sole"), ("default/new", "sole")}
    summary = await capacity_until(leader, worker, lambda c: c.ts > 0)  # ``next`` fails on any RESULT
    assert summary.sole
    await leader.close()


async def test_sole_is_refused_while_fenced(worker: Worker) -> None:
    worker.placing[0] = False
    leader = await Leader.connect(worker, term=1)
    leader.send(protocol.Sole())
    assert await leader.closed()  # the leader dispatches again over a new stream
    await leader.close()
    assert not worker.results.sole and not worker.sched.watch_pending
    assert queued(worker) == set()


async def test_a_usable_node_leaving_ends_it_and_the_next_stream_counts_its_bindings(worker: Worker) -> None:
    worker.shard.set(["n1", "n2"])
    leader = await become_sole(worker)
    await settle()
    worker.sched.watches.pod_feed.event("ADDED", make_pod("next").req(cpu="1").json())
    worker.sched.cache.assume(make_pod("old").record(), NodeName("n1"))  # its binding is under way
    worker.shard.set(["n1"])  # revoked: it may be on its way to a worker that joins
    assert not worker.results.sole  # at once, before the next decision
    assert await leader.closed()
    await leader.close()
    assert not worker.results.sole and not worker.sched.watch_pending
    assert queued(worker) == set()  # the leader dispatches them again
    worker.sched.watches.pod_feed.event("ADDED", make_pod("later").req(cpu="1").json())
    assert queued(worker) == set()
    new = await Leader.connect(worker, term=1)
    assert (await capacity_until(new, worker, lambda c: c.ts > 0)).earlier == 1  # rule 6 waits for it
    await new.close()


async def test_a_newly_elected_leaders_stream_ends_it_at_once(worker: Worker) -> None:
    leader = await become_sole(worker)
    await settle()
    worker.elected[0] = 2
    new = await Leader.connect(worker, term=2)
    assert not worker.results.sole and not worker.sched.watch_pending and queued(worker) == set()
    assert not (await capacity_until(new, worker, lambda c: c.ts > 0)).sole
    assert await leader.closed()
    await leader.close()
    await new.close()


async def test_the_stream_ending_ends_it(worker: Worker) -> None:
    leader = await become_sole(worker)
    await settle()
    await leader.close()
    for _ in range(int(TIMEOUT / 0.01)):  # the worker reads the end of the stream
        if not worker.results.sole:
            break
        await asyncio.sleep(0.01)
    assert not worker.sched.watch_pending and queued(worker) == set()
    worker.sched.watches.pod_feed.event("ADDED", make_pod("later").req(cpu="1").json())
    assert queued(worker) == set()


async def test_being_fenced_ends_it(worker: Worker) -> None:
    leader = await become_sole(worker)
    worker.placing[0] = False
    worker.intake.poke()
    assert await leader.closed()
    await leader.close()
    assert not worker.results.sole and queued(worker) == set()


async def test_a_node_granted_keeps_it_and_holds_verdicts_and_preemption_until_it_is_usable(
    worker: Worker,
) -> None:
    """The autoscaler's case: a node is granted while pods wait. The period goes on; while the node catches up
    a pod that fits nowhere usable is neither reported nor preempts (the new node may fit it), and waits in the
    pool. Once no granted node catches up both are decided again, "huge" too, which the new node cannot fit
    (its node event's hint alone would leave it): "hi" binds on n2, and the low-priority pod it would have
    evicted stays; "huge" gets its verdict over both nodes."""
    low = make_pod("low").req(cpu="4").priority(1).on("n1").record()
    worker.sched.cache.upsert_pod(low)
    leader = await become_sole(worker)
    await settle()
    queue = worker.sched.queue
    queue.pop_nowait()  # "old", listed at SOLE: not part of this test
    worker.shard.syncing_nodes = 2  # granted n2 and n3: catching up
    worker.intake.shard_reevaluated()
    assert worker.results.sole and worker.sched.watch_pending
    hi, huge = make_pod("hi").req(cpu="4").priority(10), make_pod("huge").req(cpu="64").priority(10)
    for pod in (hi, huge):
        worker.sched.watches.pod_feed.event("ADDED", pod.json())
        qp = queue.pop_nowait()
        assert qp is not None and qp.pod.key == pod.record().key
        decision = worker.sched.schedule_one(qp)
        assert decision is not None and decision.node is None
        assert pod.record().key not in worker.sched.cache.nominated_node  # no preemption
        assert queue.where(pod.record().key) == "unschedulable"  # parked, not decided again and again
    assert worker.reporter.failures == []  # no verdict over part of the shard
    # a decision over no usable node is no verdict either
    worker.results.unschedulable(hi.record(), Decision(None, Code.UNSCHEDULABLE, "no", nodes=0))
    assert worker.reporter.failures == []
    # n2 caught up, n3 still catching up: usable, and n2's hint moves "hi" (it fits) but not "huge"
    worker.sched.cache.upsert_node(make_node("n2", cpu="4").record())
    worker.shard.syncing_nodes = 1
    worker.shard.set(["n1", "n2"])
    worker.intake.shard_reevaluated()
    assert queue.where(huge.record().key) == "unschedulable"
    assert queue.where(hi.record().key) != "unschedulable"
    # n3 revoked before it caught up: none catches up now, and every held pod is decided again
    worker.shard.syncing_nodes = 0
    worker.intake.shard_reevaluated()
    assert worker.results.sole
    assert queue.where(huge.record().key) != "unschedulable"
    clock = queue.clock
    queue.clock = lambda: clock() + 60.0  # their backoff served
    queue.flush_backoff()
    decided = {}
    while (qp := queue.pop_nowait()) is not None:
        decision = worker.sched.schedule_one(qp)
        assert decision is not None
        decided[qp.pod.name] = decision
    assert decided["hi"].node == "n2"
    assert worker.sched.cache.pod_node.get(low.key) == "n1"  # not evicted
    assert decided["huge"].node is None and decided["huge"].nodes == 2
    assert [k for k, _ in worker.reporter.failures] == ["default/huge"]
    assert queue.where(huge.record().key) == "unschedulable"  # its verdict given, it waits for an event
    leader.send(protocol.Ping(ts=3.0))  # the stream is still up
    assert (await leader.next(protocol.Pong)).ts == 3.0
    assert worker.results.sole
    await leader.close()


async def test_a_malformed_pod_is_reported_by_the_sole_worker_even_while_nodes_catch_up(
    worker: Worker,
) -> None:
    """Its verdict is about the pod, not the shard (its decision counts no node): nobody else would report it,
    since the leader's pending watch is stopped while a worker is sole."""
    leader = await become_sole(worker)
    await settle()
    queue = worker.sched.queue
    queue.pop_nowait()  # "old"
    for syncing, name in ((0, "bad"), (1, "worse")):
        worker.shard.syncing_nodes = syncing
        bad = make_pod(name).req(cpu="lots")
        assert bad.record().parse_error is not None
        worker.sched.watches.pod_feed.event("ADDED", bad.json())
        qp = queue.pop_nowait()
        assert qp is not None
        decision = worker.sched.schedule_one(qp)
        assert decision is not None and decision.nodes == 0
    assert [k for k, _ in worker.reporter.failures] == ["default/bad", "default/worse"]
    await leader.close()


async def test_the_sole_worker_preempts_at_once_when_no_node_catches_up(worker: Worker) -> None:
    """The same pod with every granted node usable: its verdict is the cluster's, and it preempts."""
    low = make_pod("low").req(cpu="4").priority(1).on("n1").record()
    worker.sched.cache.upsert_pod(low)
    leader = await become_sole(worker)
    await settle()
    worker.sched.queue.pop_nowait()
    hi = make_pod("hi").req(cpu="4").priority(10)
    worker.sched.watches.pod_feed.event("ADDED", hi.json())
    qp = worker.sched.queue.pop_nowait()
    assert qp is not None
    worker.sched.schedule_one(qp)
    assert worker.sched.cache.nominated_node[hi.record().key] == "n1"
    await leader.close()


async def test_a_silent_leader_ends_it(worker: Worker, monkeypatch: pytest.MonkeyPatch) -> None:
    """A leader cut off from this worker may already dispatch again (its link declared the stream dead)."""
    monkeypatch.setattr(protocol, "DEAD_AFTER", 0.3)
    leader = await become_sole(worker)
    for _ in range(10):  # a leader that PINGs keeps it
        leader.send(protocol.Ping(ts=0.0))
        await asyncio.sleep(0.1)
        worker.intake.poke()
    assert worker.results.sole
    assert await leader.closed()  # no PING came: the worker closed the stream
    await leader.close()
    assert not worker.results.sole


async def test_the_listed_pods_are_taken_unless_placed_assumed_or_older_than_the_watchs(
    worker: Worker,
) -> None:
    feed = worker.sched.watches.pod_feed
    worker.sched.set_sole(True)
    worker.sched.cache.upsert_pod(make_pod("placed").req(cpu="1").on("n1").record())
    worker.sched.cache.assume(make_pod("assumed").record(), NodeName("n1"))
    newer = make_pod("newer").req(cpu="1").json()
    newer["metadata"]["resourceVersion"] = "20"
    feed.event("MODIFIED", newer)
    listed = [make_pod(name).req(cpu="1").json() for name in ("placed", "assumed", "newer", "fresh")]
    for obj in listed:
        obj["metadata"]["resourceVersion"] = "10"
    feed.take_listed(listed)
    assert queued(worker) == {"default/newer", "default/fresh"}
    (newer_queued,) = [p for p in worker.sched.queue.records() if p.key == "default/newer"]
    assert newer_queued.resource_version == "20"


async def test_a_pod_the_watch_removed_while_the_list_was_read_is_not_taken(worker: Worker) -> None:
    feed = worker.sched.watches.pod_feed
    worker.sched.set_sole(True)
    feed.removed_since_list = set()
    gone = make_pod("gone").req(cpu="1").json()
    feed.event("DELETED", gone)  # after the list was served, before it is taken
    feed.take_listed([gone, make_pod("kept").req(cpu="1").json()])
    assert queued(worker) == {"default/kept"}


async def test_a_failed_list_ends_it(worker: Worker, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nobody else would place the pods it could not list: the leader must list and dispatch them."""

    async def failing() -> list[dict[str, Any]]:
        raise ApiError(500, "etcdserver: request timed out")

    monkeypatch.setattr(worker.sched.watches, "list_pending", failing)
    leader = await Leader.connect(worker, term=1)
    leader.send(protocol.Sole())
    assert await leader.closed()
    await leader.close()
    assert not worker.results.sole and worker.sched.watches.pod_feed.removed_since_list is None


async def test_the_sole_worker_sends_a_change_of_its_free_amounts_only_with_the_heartbeat(
    worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its leader dispatches nothing: an assumption's change of the free amounts does not wake it (it goes out
    with the heartbeat; a dispatching leader's worker sends it at the next capacity interval)."""
    monkeypatch.setattr(protocol, "HEARTBEAT_INTERVAL", 3600.0)  # no heartbeat within this test
    leader = await become_sole(worker)
    await settle()
    free = worker.intake.capacity().free_cpu
    worker.sched.cache.assume(make_pod("old").req(cpu="1").record(), NodeName("n1"))
    assert worker.intake.capacity().free_cpu == free - 1000
    await asyncio.sleep(5 * protocol.CAPACITY_INTERVAL)
    leader.send(protocol.Ping(ts=2.0))
    assert (await leader.next(protocol.Pong)).ts == 2.0
    # ``next`` keeps any summary it skipped: none, or one sent before the assumption
    assert leader.capacity is None or leader.capacity.free_cpu == free
    await leader.close()
