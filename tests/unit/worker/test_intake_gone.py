"""What a worker keeps per dispatched pod goes when the pod does (``LeaderResults.gone``).

A dispatched pod deleted while in this worker's queue, or placed by another worker, gets no outcome here, so
nothing would ever take its entry out of ``LeaderResults.pending``: a leak in a long-running worker. The pod
watch's "gone" drops it after ``GONE_GRACE``, while a binding of ours that the watch showed before the binder
heard its answer still sends its RESULT.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from common import protocol
from common.kube import Credentials, KubeClient
from common.records import NodeName, PodKey, PodRecord
from common.reporting import Reporter
from coordinator.dispatch.pending import PREEMPTION_WAIT_LIMIT, QUEUED_LIMIT
from tests.builders import make_node, make_pod
from tests.unit.worker.helpers import FixedShard
from worker.intake import GONE_GRACE, OWED_LIMIT, OWED_SWEEP, LeaderResults
from worker.scheduler import Scheduler
from worker.settings import WorkerSettings

P = PodKey("default/p")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Results(LeaderResults):
    """The RESULTs sent, instead of a leader stream."""

    def __init__(self, client: KubeClient, clock: Clock) -> None:
        super().__init__(Reporter(client, component="agent-scheduler"), clock=clock)
        self.sent: list[protocol.Message] = []

    def send(self, message: protocol.Message) -> None:
        self.sent.append(message)


@pytest.fixture
async def client() -> AsyncIterator[KubeClient]:
    c = KubeClient(Credentials("http://127.0.0.1:9"))  # never called
    yield c
    await c.close()


def scheduler(client: KubeClient, results: Results, *, preempt: bool = False) -> Scheduler:
    """A coordinated worker's scheduler over one node, answering to ``results``."""
    sched = Scheduler(
        client,
        WorkerSettings(),
        shard=FixedShard(["n1"]),
        outcomes=results,
        reporter=results.reporter,
        watch_pending=False,
        preempt=preempt,
    )
    sched.cache.upsert_node(make_node("n1", cpu="4").record())
    return sched


def pod(name: str = "p", uid: str = "u1") -> PodRecord:
    return make_pod(name).req(cpu="1").uid(uid).record()


async def test_a_pod_gone_without_an_outcome_leaves_pending_after_the_grace(client: KubeClient) -> None:
    clock = Clock()
    results = Results(client, clock)
    results.expect(7, pod())
    results.told_waiting[P] = 7
    results.gone(P, "u1")
    assert P in results.pending  # within the grace: a binding of ours may still answer
    clock.now += GONE_GRACE
    results.gone(PodKey("default/other"), "u9")  # any later pod event prunes, amortised
    assert results.pending == {} and results.told_waiting == {}
    assert results.sent == []


async def test_our_binding_seen_by_the_watch_first_still_sends_bound(client: KubeClient) -> None:
    clock = Clock()
    results = Results(client, clock)
    p = pod()
    results.expect(9, p)
    results.gone(P, "u1")  # the watch showed the pod on its node before the binder's POST returned
    clock.now += 1.0
    results.bound(p, NodeName("n1"), assumed_at=1.0, bound_at=2.0)
    assert [(m.id, m.outcome) for m in results.sent if isinstance(m, protocol.Result)] == [
        (9, protocol.BOUND)
    ]
    clock.now += GONE_GRACE
    results.gone(PodKey("default/other"), "u9")
    assert results.pending == {}


async def test_a_dispatch_after_the_gone_event_is_kept(client: KubeClient) -> None:
    clock = Clock()
    results = Results(client, clock)
    results.expect(7, pod())
    results.gone(P, "u1")
    results.expect(8, pod())  # dispatched again (the leader had not seen the event yet)
    clock.now += GONE_GRACE
    results.gone(PodKey("default/other"), "u9")
    assert results.pending == {P: (8, "u1")}


async def test_a_recreated_pod_is_not_dropped_for_its_predecessor(client: KubeClient) -> None:
    clock = Clock()
    results = Results(client, clock)
    # the DISPATCH of the new pod came before the watch's DELETED of the old
    results.expect(7, pod(uid="new"))
    results.gone(P, "old")
    clock.now += GONE_GRACE
    results.gone(PodKey("default/other"), "u9")
    assert results.pending == {P: (7, "new")}
    results.gone(P, "")  # a uid the event did not carry counts as this pod
    clock.now += GONE_GRACE
    results.gone(PodKey("default/other"), "u9")
    assert results.pending == {}


async def test_a_pod_deleted_in_the_queue_reaches_the_results_through_the_pod_watch(
    client: KubeClient,
) -> None:
    clock = Clock()
    results = Results(client, clock)
    sched = scheduler(client, results)
    obj = make_pod("p").req(cpu="1").uid("u1").json()
    results.expect(7, pod())
    sched.submit(pod())
    assert P in sched.queue
    sched.watches.pod_feed.event("DELETED", obj)
    assert P not in sched.queue
    clock.now += GONE_GRACE
    sched.watches.pod_feed.event("DELETED", make_pod("other").uid("u9").json())
    assert results.pending == {}
    assert results.sent == []  # no RESULT for a pod that is gone: the leader's own watch shows it


async def test_a_dispatch_id_reused_by_a_new_leader_for_a_recreated_pod_is_kept(client: KubeClient) -> None:
    clock = Clock()
    results = Results(client, clock)
    results.expect(5, pod(uid="u1"))
    results.gone(P, "u1")
    # recreated; a new leader term numbers its dispatches from the start again
    results.expect(5, pod(uid="u2"))
    clock.now += GONE_GRACE
    results.gone(PodKey("default/other"), "u9")
    assert results.pending == {P: (5, "u2")}


async def test_an_entry_no_event_clears_goes_once_the_leader_no_longer_keeps_its_dispatch(
    client: KubeClient,
) -> None:
    # the leader keeps a dispatch at most QUEUED_LIMIT unanswered, then PREEMPTION_WAIT_LIMIT after waiting
    assert OWED_LIMIT > QUEUED_LIMIT + PREEMPTION_WAIT_LIMIT
    clock = Clock()
    results = Results(client, clock)
    results.expect(1, pod("old", uid="a"))
    results.told_waiting[PodKey("default/old")] = 1
    clock.now += OWED_LIMIT - OWED_SWEEP
    results.expect(2, pod("young", uid="b"))
    assert set(results.pending) == {PodKey("default/old"), PodKey("default/young")}
    clock.now += OWED_SWEEP
    results.expect(3, pod("new", uid="c"))  # the next call after a sweep interval sweeps
    assert set(results.pending) == {PodKey("default/young"), PodKey("default/new")}
    assert results.told_waiting == {}


async def test_a_dispatch_of_a_pod_already_placed_is_dropped_after_the_grace(client: KubeClient) -> None:
    """The watch showed the pod bound (by another worker) before its DISPATCH reached this one: the pod is
    not queued and no outcome follows, so its entry must not stay."""
    clock = Clock()
    results = Results(client, clock)
    sched = scheduler(client, results)
    sched.cache.upsert_pod(make_pod("p").req(cpu="1").uid("u1").on("n1").record())
    results.expect(7, pod())
    sched.submit(pod())
    assert P not in sched.queue
    clock.now += GONE_GRACE
    results.gone(PodKey("default/other"), "u9")
    assert results.pending == {}


async def test_a_preemptor_found_gone_by_the_executor_leaves_the_queue_and_its_nomination(
    client: KubeClient,
) -> None:
    clock = Clock()
    results = Results(client, clock)
    sched = scheduler(client, results, preempt=True)
    results.expect(7, pod())
    sched.submit(pod())
    sched.cache.nominate(pod(), NodeName("n1"))
    sched._preemptor_gone(pod(uid="other"))  # a predecessor's preemption: the queued pod is not it
    assert P in sched.queue
    sched.cache.nominate(pod(), NodeName("n1"))
    sched._preemptor_gone(pod())
    assert P not in sched.queue and P not in sched.cache.nominated_node
    clock.now += GONE_GRACE
    results.gone(PodKey("default/other"), "u9")
    assert results.pending == {}
