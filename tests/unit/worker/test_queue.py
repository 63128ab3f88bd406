"""Queue behaviour with a fake clock: order, backoff, the unschedulable pool, gates, in-flight updates."""

import asyncio
import time

from common.records import PodKey
from tests.builders import make_pod
from worker.queue import INITIAL_BACKOFF, MAX_BACKOFF, UNSCHEDULABLE_TIMEOUT, SchedulingQueue


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def names(q: SchedulingQueue) -> list[str]:
    out = []
    while (qp := q.pop_nowait()) is not None:
        out.append(qp.pod.name)
    return out


def test_priority_then_fifo() -> None:
    clock = FakeClock()
    q = SchedulingQueue(clock)
    for name, prio in [("a", 0), ("b", 100), ("c", 0), ("d", 100)]:
        q.add(make_pod(name).priority(prio).record())
        clock.now += 1
    assert names(q) == ["b", "d", "a", "c"]


def test_backoff_doubles_to_the_cap() -> None:
    clock = FakeClock()
    q = SchedulingQueue(clock)
    q.add(make_pod("a").record())
    waits = []
    for _ in range(6):
        qp = q.pop_nowait()
        assert qp is not None
        q.done(qp, scheduled=False, retry=True)
        start = clock.now
        while q.flush_backoff() == 0:
            clock.now += 0.25
        waits.append(clock.now - start)
    assert waits[0] == INITIAL_BACKOFF
    assert waits[1] == 2 * INITIAL_BACKOFF
    assert waits[-1] == MAX_BACKOFF


def test_unschedulable_pool_moves_on_event_and_on_timeout() -> None:
    clock = FakeClock()
    q = SchedulingQueue(clock)
    q.add(make_pod("a").record())
    qp = q.pop_nowait()
    assert qp is not None
    q.done(qp, scheduled=False, message="0/1 nodes are available")
    assert q.statistics()["unschedulable"] == 1
    assert q.pop_nowait() is None
    clock.now += 5  # past the backoff
    assert q.move_all() == 1
    qp = q.pop_nowait()
    assert qp is not None
    q.done(qp, scheduled=False)
    clock.now += UNSCHEDULABLE_TIMEOUT
    assert q.flush_unschedulable() == 1
    assert names(q) == ["a"]


def test_a_pod_refused_for_its_spec_waits_for_its_own_update_only() -> None:
    clock = FakeClock()
    q = SchedulingQueue(clock)
    refused = make_pod("a")
    refused.spec["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": "zone"}]
    q.add(refused.record())
    qp = q.pop_nowait()
    assert qp is not None
    q.done(qp, scheduled=False, message="pod uses spec.topologySpreadConstraints, ...")
    clock.now += UNSCHEDULABLE_TIMEOUT * 2
    assert q.move_all() == 0 and q.flush_unschedulable() == 0
    assert q.statistics()["unschedulable"] == 1
    q.add(make_pod("a").record())  # the pod was updated: tried again at once
    assert names(q) == ["a"]


def test_event_during_attempt_sends_failed_pod_to_backoff_not_the_pool() -> None:
    clock = FakeClock()
    q = SchedulingQueue(clock)
    q.add(make_pod("a").record())
    qp = q.pop_nowait()
    assert qp is not None
    q.move_all()  # e.g. a node was added while we were deciding
    q.done(qp, scheduled=False)
    assert q.where(PodKey("default/a")) == "backoff"


def test_gated_pods_wait_until_ungated() -> None:
    clock = FakeClock()
    q = SchedulingQueue(clock)
    q.add(make_pod("a").gate("quota").record())
    assert q.pop_nowait() is None and q.statistics()["gated"] == 1
    q.add(make_pod("a").record())
    assert names(q) == ["a"]


def test_update_and_delete_while_in_flight() -> None:
    clock = FakeClock()
    q = SchedulingQueue(clock)
    q.add(make_pod("a").record())
    q.add(make_pod("b").record())
    qa, qb = q.pop_nowait(), q.pop_nowait()
    assert qa is not None and qb is not None
    q.add(make_pod("a").label("v", "2").record())
    q.delete(PodKey("default/b"))
    q.done(qa, scheduled=False)
    q.done(qb, scheduled=False)
    assert PodKey("default/b") not in q
    assert q.where(PodKey("default/a")) == "backoff"
    clock.now += 10
    q.flush_backoff()
    qp = q.pop_nowait()
    assert qp is not None and qp.pod.labels == {"v": "2"}


def test_scheduled_pods_leave_the_queue() -> None:
    q = SchedulingQueue(FakeClock())
    q.add(make_pod("a").record())
    qp = q.pop_nowait()
    assert qp is not None
    q.done(qp, scheduled=True)
    assert PodKey("default/a") not in q and q.statistics() == dict.fromkeys(q.statistics(), 0)


def test_a_requeued_binding_backs_off_by_its_attempts_so_far() -> None:
    """A pod leaves the queue when assumed; a failed binding brings it back with the attempts it had made,
    so repeated refusals wait 1, 2, 4, 8, 10, 10 s, not 1 s each time."""
    clock = FakeClock()
    q = SchedulingQueue(clock)
    pod = make_pod("a").record()
    q.add(pod)
    waits = []
    for _ in range(6):
        qp = q.pop_nowait()
        assert qp is not None
        q.done(qp, scheduled=True)  # assumed: it leaves the queue
        assert pod.key not in q
        q.requeue(pod, qp.attempts)  # the binding was refused
        assert q.where(pod.key) == "backoff"
        start = clock.now
        while q.flush_backoff() == 0:
            clock.now += 0.25
        waits.append(clock.now - start)
    assert waits == [INITIAL_BACKOFF, 2.0, 4.0, 8.0, MAX_BACKOFF, MAX_BACKOFF]


def test_requeue_without_attempts_starts_at_the_first_step() -> None:
    clock = FakeClock()
    q = SchedulingQueue(clock)
    q.requeue(make_pod("a").record())
    clock.now += INITIAL_BACKOFF
    assert q.flush_backoff() == 1


async def test_the_backoff_wait_sleeps_to_its_limit_when_nothing_backs_off() -> None:
    """At rest the housekeeping's wait is its limit: no pod backing off, no wake-up."""
    q = SchedulingQueue(FakeClock())
    waiting = asyncio.create_task(q.wait_backoff(30.0))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    waiting.cancel()


async def test_the_backoff_wait_ends_when_the_first_backoff_does() -> None:
    clock = FakeClock()
    q = SchedulingQueue(clock)
    q.requeue(make_pod("a").record(), attempts=1)  # backs off until now + INITIAL_BACKOFF
    clock.now += INITIAL_BACKOFF - 0.2  # 0.2 s left of it
    started = time.monotonic()
    await asyncio.wait_for(q.wait_backoff(30.0), 5.0)  # not the 30-s limit
    assert time.monotonic() - started >= 0.15  # nor at once (a caller looping on it would spin)
    clock.now += 0.2
    assert q.flush_backoff() == 1


async def test_a_pod_backing_off_ahead_of_the_first_wakes_the_wait_and_one_behind_does_not() -> None:
    clock = FakeClock()
    q = SchedulingQueue(clock)
    q.requeue(make_pod("long").record(), attempts=4)  # 8 s
    waiting = asyncio.create_task(q.wait_backoff(30.0))
    await asyncio.sleep(0.05)
    q.requeue(make_pod("longer").record(), attempts=5)  # 10 s: behind the first
    await asyncio.sleep(0.05)
    assert not waiting.done()
    q.requeue(make_pod("short").record(), attempts=1)  # 1 s: now the first to end
    await asyncio.wait_for(waiting, 1.0)  # woken, to wait again for the new first end
