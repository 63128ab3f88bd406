"""Where an unschedulable pod goes: standalone it stays in this worker's queue and is reported on the pod;
under a coordinator it is handed back (see ``worker.intake``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from common.kube import Credentials, KubeClient
from common.records import NodeName, PodRecord
from common.reporting import Reporter
from tests.builders import make_node, make_pod
from worker.outcomes import PodReports
from worker.scheduler import Scheduler
from worker.settings import WorkerSettings
from worker.shard import ShardView, WholeCluster


class RecordingReporter(Reporter):
    def __init__(self, client: KubeClient) -> None:
        super().__init__(client, component="agent-scheduler")
        self.failures: list[tuple[str, str]] = []

    def unschedulable(self, pod: PodRecord, message: str) -> None:
        self.failures.append((pod.key, message))


@pytest.fixture
async def client() -> AsyncIterator[KubeClient]:
    c = KubeClient(Credentials("http://127.0.0.1:9"))  # never called: no watch runs here
    yield c
    await c.close()


def scheduler(
    client: KubeClient,
    *,
    watch_pending: bool = True,
    preempt: bool = False,
    shard: ShardView | None = None,
    settings: WorkerSettings | None = None,
) -> Scheduler:
    """A worker over no cluster (nothing is watched here) that records the failures it reports; standalone
    unless given a ``shard``."""
    reporter = RecordingReporter(client)
    return Scheduler(
        client,
        settings or WorkerSettings(),
        shard=shard or WholeCluster(),
        outcomes=PodReports(reporter),
        reporter=reporter,
        watch_pending=watch_pending,
        preempt=preempt,
    )


async def test_standalone_unschedulable_pod_is_reported_and_kept_for_retry(client: KubeClient) -> None:
    sched = scheduler(client)
    sched.cache.upsert_node(make_node("n1", cpu="1").record())
    sched.submit(make_pod("big").req(cpu="2").record())
    qp = sched.queue.pop_nowait()
    assert qp is not None
    decision = sched.schedule_one(qp)
    assert decision is not None and decision.node is None
    assert sched.queue.where(qp.pod.key) == "unschedulable"
    assert isinstance(sched.reporter, RecordingReporter)
    assert sched.reporter.failures == [("default/big", "0/1 nodes are available: 1 Insufficient cpu.")]
    assert sched.unschedulable == 1


async def test_a_paused_loop_with_pods_waiting_still_yields(client: KubeClient) -> None:
    """Paused for a drain while activeQ holds pods: the loop must not spin, or the drain never runs."""
    sched = scheduler(client)
    sched.submit(make_pod("waiting").req(cpu="1").record())
    sched.pause()
    waits = 0
    real_wait = sched.queue.wait

    async def counting_wait(timeout: float | None = None) -> None:
        nonlocal waits
        waits += 1
        if waits > 100:  # returning at once each time: a spin that never yields
            raise AssertionError("the paused scheduling loop spins")
        await real_wait(timeout)

    sched.queue.wait = counting_wait  # type: ignore[method-assign]
    loop = asyncio.create_task(sched.scheduling_loop())
    try:
        for _ in range(5):
            await asyncio.sleep(0.01)  # returns only if the scheduling loop yields
        assert not loop.done(), loop.exception()
        assert sched.queue.statistics()["active"] == 1 and sched.decisions == 0
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


async def test_the_leaders_preemption_choice_for_a_pod_goes_when_the_pod_goes(client: KubeClient) -> None:
    """``preempt_next`` keeps the node until the pod's next decision; a pod deleted, finished or bound
    elsewhere before that decision must not leave its entry behind (one per such pod, forever)."""
    sched = scheduler(client, watch_pending=False, preempt=True)
    feed = sched.watches.pods.handler
    deleted = make_pod("deleted").req(cpu="1").priority(10)
    finished = make_pod("finished").req(cpu="1").priority(10)
    elsewhere = make_pod("elsewhere").req(cpu="1").priority(10)
    kept = make_pod("kept").req(cpu="1").priority(10)
    for b in (deleted, finished, elsewhere, kept):
        sched.preempt_next(b.record().key, NodeName("n0"))
        feed.event("ADDED", b.json())
    feed.event("DELETED", deleted.json())
    finished.obj["status"] = {"phase": "Succeeded"}
    feed.event("MODIFIED", finished.json())
    feed.event("MODIFIED", elsewhere.on("n1").json())
    assert sched._preempt_on == {kept.record().key: "n0"}


async def test_an_idle_loop_wakes_for_every_way_into_active_q(client: KubeClient) -> None:
    """The loop waits without a timeout: a pod added, one whose backoff ends (housekeeping's flush) and one
    moved by a cluster change must each wake it."""
    now = [1000.0]
    reporter = RecordingReporter(client)
    sched = Scheduler(
        client,
        WorkerSettings(),
        shard=WholeCluster(),
        outcomes=PodReports(reporter),
        reporter=reporter,
        clock=lambda: now[0],
    )
    sched.cache.upsert_node(make_node("n1", cpu="1").record())
    loop = asyncio.create_task(sched.scheduling_loop())
    housekeeping = asyncio.create_task(sched.housekeeping())

    async def decided(n: int) -> None:
        for _ in range(500):  # up to 5 s
            if sched.decisions >= n:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{sched.decisions} decisions, expected {n}: the loop did not wake")

    try:
        await asyncio.sleep(0.1)  # the loop is idle now, waiting
        sched.submit(make_pod("added").req(cpu="100m").record())
        await decided(1)
        sched.queue.requeue(make_pod("backoff").req(cpu="100m").record(), attempts=1)
        await asyncio.sleep(0.1)
        assert sched.decisions == 1  # still backing off
        now[0] += 60.0  # its backoff is over: housekeeping's flush puts it in activeQ
        await decided(2)
        sched.submit(make_pod("big").req(cpu="2").record())
        await decided(3)  # unschedulable: parked until something changes
        assert sched.queue.where(make_pod("big").record().key) == "unschedulable"
        sched.cache.upsert_node(make_node("n2", cpu="4").record())
        now[0] += 60.0  # past its backoff: the move puts it straight into activeQ
        sched.queue.move_all()  # what the node feed does on a node change
        await decided(4)
        assert sched.cache.pod_node.get(make_pod("big").record().key) == "n2"
    finally:
        for task in (loop, housekeeping):
            task.cancel()
        await asyncio.gather(loop, housekeeping, return_exceptions=True)


async def test_a_node_release_waits_for_the_preemptions_under_way_on_it_too(client: KubeClient) -> None:
    """The shard's release hook (``Scheduler.release``) waits for the bindings and for the preemptions' writes
    to the released nodes (``Executor.drain``), not for those to other nodes."""
    sched = scheduler(client, preempt=True)
    assert sched.preemption is not None
    executor = sched.preemption.executor
    executor._in_flight.start(NodeName("n1"))  # a preemption onto n1 under way
    await asyncio.wait_for(sched.release(frozenset({NodeName("n2")})), 1)
    release = asyncio.create_task(sched.release(frozenset({NodeName("n1")})))
    await asyncio.sleep(0.05)
    assert not release.done()
    await executor._in_flight.end(NodeName("n1"))
    await asyncio.wait_for(release, 1)
