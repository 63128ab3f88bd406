"""The dispatch server over a real local TCP stream: DISPATCH, RESULTs for each outcome, leader terms."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TypeVar

import pytest

from common import protocol
from common.kube import Credentials, KubeClient
from common.records import NodeName, PodRecord
from common.reporting import Reporter
from tests.builders import make_node, make_pod
from tests.unit.worker.helpers import FixedShard
from worker.intake import Intake, LeaderResults
from worker.scheduler import Scheduler
from worker.settings import WorkerSettings

TIMEOUT = 5.0
M = TypeVar("M", bound=protocol.Message)


class RecordingReporter(Reporter):
    def __init__(self, client: KubeClient) -> None:
        super().__init__(client, component="agent-scheduler")
        self.scheduled_pods: list[tuple[str, str]] = []
        self.failures: list[tuple[str, str]] = []

    def scheduled(self, pod: PodRecord, node: str) -> None:
        self.scheduled_pods.append((pod.key, node))

    def unschedulable(self, pod: PodRecord, message: str) -> None:
        self.failures.append((pod.key, message))


@dataclass
class Worker:
    sched: Scheduler
    results: LeaderResults
    intake: Intake
    shard: FixedShard
    reporter: RecordingReporter
    address: tuple[str, int]
    placing: list[bool]


@pytest.fixture
async def worker() -> AsyncIterator[Worker]:
    client = KubeClient(Credentials("http://127.0.0.1:9"))  # never called: no watch runs here
    reporter = RecordingReporter(client)
    shard = FixedShard(["n1"])
    results = LeaderResults(reporter)
    sched = Scheduler(
        client, WorkerSettings(), shard=shard, outcomes=results, reporter=reporter, watch_pending=False
    )
    sched.cache.upsert_node(make_node("n1", cpu="4").record())
    placing = [True]
    intake = Intake(sched, results, worker_id="w1", shard=shard, can_place=lambda: placing[0])
    listener = socket.create_server(("127.0.0.1", 0))
    address = listener.getsockname()[:2]
    await intake.start(listener)
    try:
        yield Worker(sched, results, intake, shard, reporter, address, placing)
    finally:
        await intake.close()
        await client.close()


class Leader:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.capacity: protocol.Capacity | None = None

    @classmethod
    async def connect(cls, w: Worker, term: int) -> Leader:
        reader, writer = await asyncio.open_connection(*w.address)
        leader = cls(reader, writer)
        leader.send(protocol.Hello(leader="l", term=term))
        return leader

    def send(self, message: protocol.Message) -> None:
        self.writer.write(protocol.encode(message))

    async def next(self, kind: type[M]) -> M:
        """The next message of ``kind``; CAPACITY summaries in between are remembered, others fail."""
        async with asyncio.timeout(TIMEOUT):
            while True:
                msg = await protocol.read_message(self.reader)
                if isinstance(msg, kind):
                    return msg
                if isinstance(msg, protocol.Capacity):
                    self.capacity = msg
                    continue
                raise AssertionError(f"expected {kind.__name__}, got {msg}")

    async def closed(self) -> bool:
        async with asyncio.timeout(TIMEOUT):
            try:
                while True:
                    await protocol.read_message(self.reader)
            except asyncio.IncompleteReadError:
                return True

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


async def test_dispatch_is_acked_and_queued(worker: Worker) -> None:
    leader = await Leader.connect(worker, term=3)
    assert (await leader.next(protocol.Welcome)).term == 3
    leader.send(protocol.Dispatch(id=7, pod=make_pod("p").req(cpu="1").json()))
    assert (await leader.next(protocol.Ack)).id == 7
    assert worker.sched.queue.where("default/p") == "active"  # type: ignore[arg-type]
    assert worker.results.pending == {"default/p": 7}
    await leader.close()


async def test_dispatch_is_rejected_at_once_while_fenced_or_draining(worker: Worker) -> None:
    worker.placing[0] = False
    leader = await Leader.connect(worker, term=1)
    await leader.next(protocol.Welcome)
    leader.send(protocol.Dispatch(id=8, pod=make_pod("p").json()))
    result = await leader.next(protocol.Result)
    assert (result.id, result.outcome) == (8, protocol.REJECTED)
    assert "default/p" not in worker.sched.queue and not worker.results.pending  # type: ignore[operator]
    capacity = await leader.next(protocol.Capacity)
    assert capacity.nodes == 0 and capacity.max_cpu == 0  # the leader will not choose us
    await leader.close()


async def test_bound_pod_gets_a_result_and_its_scheduled_event(worker: Worker) -> None:
    leader = await Leader.connect(worker, term=1)
    await leader.next(protocol.Welcome)
    leader.send(protocol.Dispatch(id=9, pod=make_pod("p").req(cpu="1").json()))
    await leader.next(protocol.Ack)
    qp = worker.sched.queue.pop_nowait()
    assert qp is not None
    decision = worker.sched.schedule_one(qp)
    assert decision is not None and decision.node == "n1"
    # What the binder does after a 201:
    worker.results.bound(qp.pod, NodeName("n1"), assumed_at=1.0, bound_at=2.0)
    result = await leader.next(protocol.Result)
    assert (result.id, result.outcome, result.node) == (9, protocol.BOUND, "n1")
    assert worker.reporter.scheduled_pods == [("default/p", "n1")]
    assert worker.results.binds_per_second() > 0
    await leader.close()


async def test_unschedulable_pod_goes_back_to_the_leader_and_leaves_the_queue(worker: Worker) -> None:
    leader = await Leader.connect(worker, term=1)
    await leader.next(protocol.Welcome)
    leader.send(protocol.Dispatch(id=10, pod=make_pod("big").req(cpu="64").json()))
    await leader.next(protocol.Ack)
    qp = worker.sched.queue.pop_nowait()
    assert qp is not None
    worker.sched.schedule_one(qp)
    result = await leader.next(protocol.Result)
    assert (result.id, result.outcome, result.nodes) == (10, protocol.UNSCHEDULABLE, 1)
    assert result.reasons == {"Insufficient cpu": 1}
    assert "default/big" not in worker.sched.queue  # type: ignore[operator]
    assert not worker.reporter.failures  # the leader reports it when no shard can take it
    await leader.close()


async def test_rejected_binding_gets_a_result_and_a_report(worker: Worker) -> None:
    leader = await Leader.connect(worker, term=1)
    await leader.next(protocol.Welcome)
    pod = make_pod("p").json()
    leader.send(protocol.Dispatch(id=11, pod=pod))
    await leader.next(protocol.Ack)
    worker.results.rejected(make_pod("p").record(), "binding rejected: forbidden")
    result = await leader.next(protocol.Result)
    assert (result.id, result.outcome) == (11, protocol.REJECTED)
    assert result.message == "binding rejected: forbidden"
    assert worker.reporter.failures == [("default/p", "binding rejected: forbidden")]
    await leader.close()


async def test_higher_term_replaces_the_stream_and_gets_older_results(worker: Worker) -> None:
    old = await Leader.connect(worker, term=1)
    await old.next(protocol.Welcome)
    old.send(protocol.Dispatch(id=12, pod=make_pod("p").json()))
    await old.next(protocol.Ack)
    new = await Leader.connect(worker, term=2)
    assert (await new.next(protocol.Welcome)).term == 2
    assert await old.closed()
    await old.close()
    worker.results.bound(make_pod("p").record(), NodeName("n1"), assumed_at=1.0, bound_at=2.0)
    result = await new.next(protocol.Result)
    assert (result.id, result.outcome) == (12, protocol.BOUND)
    await new.close()


async def test_lower_term_is_refused_and_the_current_stream_stays(worker: Worker) -> None:
    current = await Leader.connect(worker, term=5)
    await current.next(protocol.Welcome)
    stale = await Leader.connect(worker, term=4)
    error = await stale.next(protocol.Error)
    assert "older" in error.message
    assert await stale.closed()
    await stale.close()
    current.send(protocol.Ping(ts=123))
    assert (await current.next(protocol.Pong)).ts == 123
    assert worker.results.term == 5
    await current.close()


async def test_capacity_summary_comes_from_the_index(worker: Worker) -> None:
    worker.sched.cache.upsert_node(make_node("n2", cpu="8").record())  # not in the shard: not counted
    worker.shard.syncing_nodes = 1
    leader = await Leader.connect(worker, term=1)
    await leader.next(protocol.Welcome)
    capacity = await leader.next(protocol.Capacity)
    assert (capacity.nodes, capacity.free_cpu, capacity.max_cpu) == (1, 4000, 4000)
    assert capacity.syncing == 1 and capacity.pending == 0
    await leader.close()
