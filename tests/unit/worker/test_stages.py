"""Per-stage latency on the worker (``common.metrics`` stages ``queued``, ``decided``, ``bind_sent``,
``bound``): each measured on the process's own injected clock, here a fake one the test moves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from prometheus_client import REGISTRY

from common import protocol
from common.keyring import StaticKeys
from common.kube import Credentials, KubeClient
from common.metrics import STAGE_METRIC
from common.records import NodeName, PodKey, PodRecord
from common.reporting import Reporter
from common.wellknown import DEFAULT_SCHEDULER_NAME
from tests.builders import PodBuilder, make_node, make_pod
from tests.unit.worker.helpers import FixedShard
from worker.binder import Binder
from worker.cache import Cache
from worker.feeds import PodFeed
from worker.intake import Intake, LeaderResults, LeaderStream
from worker.outcomes import PodReports
from worker.queue import SchedulingQueue
from worker.scheduler import Scheduler
from worker.settings import WorkerSettings
from worker.shard import WholeCluster

NODE = NodeName("n1")


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def stage(name: str) -> tuple[float, float]:
    """(count, sum) of the stage histogram so far."""
    count = REGISTRY.get_sample_value(f"{STAGE_METRIC}_count", {"stage": name}) or 0.0
    total = REGISTRY.get_sample_value(f"{STAGE_METRIC}_sum", {"stage": name}) or 0.0
    return count, total


def grew(before: tuple[float, float], name: str) -> tuple[float, float]:
    count, total = stage(name)
    return count - before[0], round(total - before[1], 9)


@pytest.fixture
async def client() -> AsyncIterator[KubeClient]:
    c = KubeClient(Credentials("http://127.0.0.1:9"))  # never called
    yield c
    await c.close()


async def test_decided_runs_from_entering_the_queue_to_the_assumption(client: KubeClient) -> None:
    clock = Clock()
    reporter = Reporter(client, component="agent-scheduler")
    sched = Scheduler(
        client,
        WorkerSettings(),
        shard=WholeCluster(),
        outcomes=PodReports(reporter),
        reporter=reporter,
        clock=clock,
    )
    sched.cache.upsert_node(make_node("n1", cpu="4").record())
    sched.submit(make_pod("p").req(cpu="1").record())
    clock.now += 2.5  # waits in the queue
    before = stage("decided")
    qp = sched.queue.pop_nowait()
    assert qp is not None
    decision = sched.schedule_one(qp)
    assert decision is not None and decision.node == NODE
    assert grew(before, "decided") == (1, 2.5)


async def test_an_unschedulable_attempt_observes_no_decided_stage(client: KubeClient) -> None:
    reporter = Reporter(client, component="agent-scheduler")
    sched = Scheduler(
        client, WorkerSettings(), shard=WholeCluster(), outcomes=PodReports(reporter), reporter=reporter
    )
    sched.cache.upsert_node(make_node("n1", cpu="1").record())
    sched.submit(make_pod("big").req(cpu="2").record())
    before = stage("decided")
    qp = sched.queue.pop_nowait()
    assert qp is not None
    sched.schedule_one(qp)
    assert grew(before, "decided") == (0, 0.0)


class SlowApi(KubeClient):
    """Binding POSTs that take ``took`` seconds of the fake clock."""

    def __init__(self, clock: Clock, took: float) -> None:
        super().__init__(Credentials("http://127.0.0.1:9"))
        self.clock, self.took = clock, took

    async def post(
        self, path: str, body: Any, params: dict[str, str] | None = None, *, timeout: float | None = None
    ) -> Any:
        self.clock.now += self.took
        return {"kind": "Status", "status": "Success"}


class NoOutcomes:
    def bound(self, pod: PodRecord, node: NodeName, *, assumed_at: float, bound_at: float) -> None:
        pass

    def unschedulable(self, pod: PodRecord, decision: object) -> None:
        pass

    def rejected(self, pod: PodRecord, message: str) -> None:
        pass

    def waiting(self, pod: PodRecord, node: NodeName) -> None:
        pass

    def gone(self, key: PodKey, uid: str) -> None:
        pass

    def retry(self, pod: PodRecord) -> bool:
        return True


class NoReports:
    def forget(self, key: PodKey) -> None:
        pass


async def test_bind_sent_waits_for_a_slot_and_bound_is_the_post() -> None:
    clock = Clock()
    cache = Cache()
    cache.upsert_node(make_node(NODE).record())
    pod = make_pod("p").req(cpu="1").record()
    cache.assume(pod, NODE)
    api = SlowApi(clock, took=0.25)
    binder = Binder(api, cache, NoOutcomes(), requeue=lambda pod, attempts: None, clock=clock, concurrency=1)
    sent, bound = stage("bind_sent"), stage("bound")
    binder.submit(pod, NODE, queued_at=0.0, attempts=1)
    clock.now += 1.5  # no binder slot yet: the binder is not running
    task = asyncio.create_task(binder.run())
    try:
        await asyncio.wait_for(binder.drain(), 5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()
    assert binder.bound == 1
    assert grew(sent, "bind_sent") == (1, 1.5)
    assert grew(bound, "bound") == (1, 0.25)


async def test_queued_runs_from_the_dispatch_read_to_the_queue(client: KubeClient) -> None:
    clock = Clock()
    reporter = Reporter(client, component="agent-scheduler")
    shard = FixedShard(["n1"])
    results = LeaderResults(reporter)
    sched = Scheduler(
        client,
        WorkerSettings(),
        shard=shard,
        outcomes=results,
        reporter=reporter,
        watch_pending=False,
        clock=clock,
    )
    submit = sched.submit

    def slow_submit(pod: PodRecord) -> None:
        clock.now += 0.75
        submit(pod)

    sched.submit = slow_submit  # type: ignore[method-assign]
    intake = Intake(
        sched,
        results,
        worker_id="w1",
        shard=shard,
        keys=StaticKeys(b"k" * 32),
        elected=lambda: 1,
        scheduler_name=DEFAULT_SCHEDULER_NAME,
    )
    sent: list[protocol.Message] = []

    class Stream:
        def send(self, message: protocol.Message) -> None:
            sent.append(message)

    before = stage("queued")
    # handle() takes the concrete LeaderStream (no protocol); a DISPATCH only uses its send(), over the
    # current stream
    stream = cast(LeaderStream, Stream())
    results.stream = stream
    intake.handle(protocol.Dispatch(1, PodBuilder("p").req(cpu="1").obj), stream)
    assert sent == [protocol.Ack(1)]
    assert grew(before, "queued") == (1, 0.75)


def test_standalone_queued_runs_from_the_watch_event_to_the_queue() -> None:
    clock = Clock()
    queue = SchedulingQueue(clock)
    add = queue.add

    def slow_add(pod: PodRecord) -> None:
        clock.now += 0.5
        add(pod)

    queue.add = slow_add  # type: ignore[method-assign]
    # PodFeed takes the concrete Reporter (no protocol); the feed only calls its forget()
    reports = cast(Reporter, NoReports())
    feed = PodFeed(Cache(), queue, reports, scheduler_name=DEFAULT_SCHEDULER_NAME, watch_pending=True)
    before = stage("queued")
    feed.event("ADDED", PodBuilder("p").req(cpu="1").obj)
    assert grew(before, "queued") == (1, 0.5)
    feed.event("MODIFIED", PodBuilder("p").req(cpu="1").obj)  # already queued: not a second arrival
    assert grew(before, "queued") == (1, 0.5)
