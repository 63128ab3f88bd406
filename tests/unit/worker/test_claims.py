"""A worker's claims (``worker.claims``) over a real local leader stream: the pods it takes from its own pod
watch under the claim set, the ones it leaves or hands back, and what it answers for each."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from common import protocol
from common.claims import claimant
from common.records import NodeName, PodKey, PodRecord
from common.wellknown import DEFAULT_SCHEDULER_NAME
from tests.builders import PodBuilder
from tests.unit.worker import test_intake as intake_tests
from tests.unit.worker.test_intake import Leader
from worker import intake as intake_module
from worker.audit import AuditLog
from worker.claims import Claims
from worker.intake import LeaderResults
from worker.scheduler import Scheduler

ZONE = "topology.kubernetes.io/zone"


@dataclass
class Worker:
    inner: intake_tests.Worker
    claims: Claims
    refused: list[tuple[PodKey, str]]

    @property
    def sched(self) -> Scheduler:
        return self.inner.sched

    @property
    def results(self) -> LeaderResults:
        return self.inner.results

    @property
    def address(self) -> tuple[str, int]:
        return self.inner.address

    @property
    def placing(self) -> list[bool]:
        return self.inner.placing

    def watch(self, kind: str, obj: dict[str, Any]) -> None:
        """The pod watch delivers an event."""
        self.sched.watches.pod_feed.event(kind, obj)

    def queued(self, name: str) -> bool:
        return PodKey(f"default/{name}") in self.sched.queue


@pytest.fixture(autouse=True)
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(protocol, "HELLO_TIMEOUT", 0.5)
    monkeypatch.setattr(intake_module, "TERM_WAIT", 0.1)


@pytest.fixture
async def worker() -> AsyncIterator[Worker]:
    refused: list[tuple[PodKey, str]] = []
    made: list[Claims] = []
    results: list[LeaderResults] = []

    def refuse(pod: PodRecord, message: str) -> None:
        refused.append((pod.key, message))
        results[0].refuse_claim(pod, message)

    def claims(can_place: Callable[[], bool]) -> Claims:
        made.append(Claims("w1", DEFAULT_SCHEDULER_NAME, can_place=can_place, refuse=refuse))
        return made[0]

    async with intake_tests.running_worker(claims=claims) as inner:
        results.append(inner.results)
        yield Worker(inner, made[0], refused)


def pod(name: str, cpu: str = "1") -> PodBuilder:
    return PodBuilder(name).req(cpu=cpu).uid(f"uid-{name}")


def hashed(want: str, workers: tuple[str, ...], count: int = 1) -> list[str]:
    """``count`` pod names whose claimant in ``workers`` is ``want``."""
    out: list[str] = []
    i = 0
    while len(out) < count:
        if claimant(f"uid-p{i}", workers) == want:
            out.append(f"p{i}")
        i += 1
    return out


async def claim_set(w: Worker, leader: Leader, workers: tuple[str, ...]) -> None:
    leader.send(protocol.Claims(workers))
    leader.send(protocol.Ping(ts=1.0))  # answered after the CLAIMS was handled (one stream, in order)
    await leader.next(protocol.Pong)
    assert w.claims.workers == workers


async def test_the_claimant_takes_its_pods_from_the_watch_and_answers_nothing_when_bound(
    worker: Worker,
) -> None:
    leader = await Leader.connect(worker.inner, term=1)
    await claim_set(worker, leader, ("w1", "w2"))
    (mine,) = hashed("w1", ("w1", "w2"))
    (theirs,) = hashed("w2", ("w1", "w2"))
    worker.watch("ADDED", pod(mine).json())
    worker.watch("ADDED", pod(theirs).json())
    assert worker.queued(mine) and not worker.queued(theirs)
    assert set(worker.claims.claimed) == {f"default/{mine}"}
    assert f"default/{theirs}" in worker.claims.unread  # left unparsed
    qp = worker.sched.queue.pop_nowait()
    assert qp is not None and worker.sched.schedule_one(qp) is not None
    worker.results.bound(qp.pod, NodeName("n1"), assumed_at=1.0, bound_at=2.0)
    assert not worker.claims.claimed
    leader.send(protocol.Ping(ts=2.0))
    await leader.next(protocol.Pong)  # no RESULT before it: the leader's watch shows the binding
    await leader.close()


async def test_a_claimed_pod_that_does_not_fit_is_handed_back_with_its_reasons(worker: Worker) -> None:
    leader = await Leader.connect(worker.inner, term=1)
    await claim_set(worker, leader, ("w1",))
    worker.watch("ADDED", pod("big", cpu="64").json())
    qp = worker.sched.queue.pop_nowait()
    assert qp is not None
    worker.sched.schedule_one(qp)
    result = await leader.next(protocol.Result)
    assert (result.id, result.outcome, result.nodes, result.uid) == (
        protocol.CLAIMED,
        protocol.UNSCHEDULABLE,
        1,
        "uid-big",
    )
    assert result.reasons == {"Insufficient cpu": 1}
    assert not worker.queued("big")
    worker.watch("MODIFIED", pod("big", cpu="64").json())  # e.g. the leader's condition: not claimed again
    assert not worker.queued("big") and not worker.claims.claimed
    await leader.close()


async def test_nothing_is_claimed_without_a_claim_set_or_while_not_placing(worker: Worker) -> None:
    a, b = hashed("w1", ("w0", "w1"), count=2)  # claimed here under ("w1",) and ("w0", "w1")
    worker.watch("ADDED", pod(a).json())  # no leader stream, claims not on: nothing is kept for it
    assert not worker.queued(a)
    leader = await Leader.connect(worker.inner, term=1)
    worker.placing[0] = False
    await claim_set(worker, leader, ("w1",))
    worker.watch("ADDED", pod(b).json())
    assert not worker.queued(b)
    worker.placing[0] = True
    await claim_set(worker, leader, ("w0", "w1"))  # the set changes: the pods kept are read again
    assert worker.queued(b)
    # seen before claims were on: taken at its next event (or dispatched once the leader's claim expires)
    assert not worker.queued(a)
    worker.watch("MODIFIED", pod(a).json())
    assert worker.queued(a)
    await leader.close()


async def test_a_claim_set_change_moves_pods_both_ways(worker: Worker) -> None:
    leader = await Leader.connect(worker.inner, term=1)
    await claim_set(worker, leader, ("w1", "w2"))
    names = hashed("w2", ("w1", "w2"), count=10)
    for name in names:
        worker.watch("ADDED", pod(name).json())
    assert not any(worker.queued(n) for n in names)
    await claim_set(worker, leader, ("w1",))  # w2 left: its pods are ours now
    assert all(worker.queued(n) for n in names)
    await claim_set(worker, leader, ("w1", "w2"))  # back: let go of them (none was being placed)
    assert not any(worker.queued(n) for n in names) and not worker.claims.claimed
    await leader.close()
    for _ in range(50):
        if worker.results.stream is None:
            break
        await asyncio.sleep(0.01)
    assert worker.claims.workers == ()  # no stream: nothing new is claimed


async def test_a_pod_matching_a_pending_pods_cross_node_anti_affinity_is_handed_back_at_once(
    worker: Worker,
) -> None:
    leader = await Leader.connect(worker.inner, term=1)
    await claim_set(worker, leader, ("w1",))
    lane = pod("lane").pod_affinity(ZONE, {"app": "web"}, anti=True)
    worker.watch("ADDED", lane.json())  # the leader's pod (its lane): not claimed, but its terms are kept
    assert not worker.queued("lane")
    worker.watch("ADDED", pod("web").label("app", "web").json())
    assert not worker.queued("web")
    assert worker.refused == [
        ("default/web", "matches a required anti-affinity term of pending pod default/lane")
    ]
    result = await leader.next(protocol.Result)
    assert (result.id, result.outcome, result.uid) == (protocol.CLAIMED, protocol.REJECTED, "uid-web")
    worker.watch("ADDED", pod("other").label("app", "db").json())
    assert worker.queued("other")  # matches no term
    placed = lane.on("n1").json()
    worker.watch("MODIFIED", placed)  # the lane pod placed: the cache has it, its terms no longer held
    assert not worker.claims.anti
    worker.watch("ADDED", pod("web2").label("app", "web").json())
    assert worker.queued("web2")  # the filter sees the placed pod's anti-affinity from here
    await leader.close()


async def test_a_dispatch_of_a_claimed_pod_is_answered_as_a_dispatch(worker: Worker) -> None:
    leader = await Leader.connect(worker.inner, term=1)
    await claim_set(worker, leader, ("w1",))
    worker.watch("ADDED", pod("big", cpu="64").json())
    leader.send(protocol.Dispatch(id=4, pod=pod("big", cpu="64").json()))  # the leader took it over
    await leader.next(protocol.Ack)
    qp = worker.sched.queue.pop_nowait()
    assert qp is not None
    worker.sched.schedule_one(qp)
    result = await leader.next(protocol.Result)
    assert (result.id, result.outcome) == (4, protocol.UNSCHEDULABLE)
    leader.send(protocol.Ping(ts=3.0))
    await leader.next(protocol.Pong)  # and nothing else for the claim
    await leader.close()


async def test_a_claimed_pod_the_watch_shows_bound_first_is_still_audited_as_claimed(
    worker: Worker, tmp_path: Path
) -> None:
    leader = await Leader.connect(worker.inner, term=1)
    await claim_set(worker, leader, ("w1",))
    worker.watch("ADDED", pod("a").json())
    qp = worker.sched.queue.pop_nowait()
    assert qp is not None and worker.sched.schedule_one(qp) is not None
    worker.watch("MODIFIED", pod("a").on("n1").json())  # the watch shows the binding before its answer
    assert not worker.claims.claimed
    worker.results.audit = AuditLog(str(tmp_path / "audit.jsonl"), worker="w1", epoch=lambda: 1)
    worker.results.bound(qp.pod, NodeName("n1"), assumed_at=1.0, bound_at=2.0)  # the binder's answer
    worker.results.audit.close()
    [trail] = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert (trail["pod"], trail["via"]) == ("default/a", "claim")
    leader.send(protocol.Ping(ts=2.0))
    await leader.next(protocol.Pong)  # no RESULT before it: nothing is owed for a claimed pod
    await leader.close()


async def test_with_claims_off_a_worker_keeps_nothing_per_pod(worker: Worker) -> None:
    leader = await Leader.connect(worker.inner, term=1)  # a leader that sends no CLAIMS: claims are off
    worker.watch("ADDED", pod("a").json())
    worker.watch("ADDED", pod("lane").pod_affinity(ZONE, {"app": "web"}, anti=True).json())
    leader.send(protocol.Dispatch(id=1, pod=pod("a").json()))
    await leader.next(protocol.Ack)
    c = worker.claims
    assert not c.active and not (c.unread or c.anti or c.claimed or c.handed_back)
    await leader.close()


async def stream_gone(w: Worker) -> None:
    """Wait until the worker has seen its leader stream end."""
    for _ in range(500):  # polled: nothing signals it (within 5 s)
        if w.inner.results.stream is None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the leader stream did not end")


async def test_a_claim_requeued_while_no_stream_is_up_is_dropped_when_the_next_one_begins(
    worker: Worker,
) -> None:
    """The topology lane's rule 6 with claims: a claimed pod whose binding failed while the worker had no leader
    is not decided under the next stream unseen (its leader hands it out again)."""
    leader = await Leader.connect(worker.inner, term=1)
    await claim_set(worker, leader, ("w1",))
    (mine,) = hashed("w1", ("w1",))
    worker.watch("ADDED", pod(mine).json())
    qp = worker.sched.queue.pop_nowait()
    assert qp is not None and worker.sched.schedule_one(qp) is not None  # assumed, its binding under way
    await leader.close()
    await stream_gone(worker)
    worker.sched.cache.forget(qp.pod.key)  # the binding fails transiently: the binder gives it back
    worker.sched._requeue(qp.pod, 1)
    assert worker.sched.queue.where(qp.pod.key) == "backoff"  # no stream: nothing marks it another's
    worker.inner.elected[0] = 2
    new = await Leader.connect(worker.inner, term=2)
    assert worker.sched.queue.where(qp.pod.key) is None
    capacity = await intake_tests.capacity_until(new, worker.inner, lambda c: True)
    assert capacity.earlier == 0
    await new.close()


async def test_a_pod_the_new_stream_claims_again_is_retried_after_its_binding_fails(worker: Worker) -> None:
    leader = await Leader.connect(worker.inner, term=1)
    await claim_set(worker, leader, ("w1",))
    (mine,) = hashed("w1", ("w1",))
    worker.watch("ADDED", pod(mine).json())
    qp = worker.sched.queue.pop_nowait()
    assert qp is not None and worker.sched.schedule_one(qp) is not None
    worker.inner.elected[0] = 2
    new = await Leader.connect(worker.inner, term=2)
    await leader.close()
    assert set(worker.inner.results.earlier) == {qp.pod.key}
    await claim_set(worker, new, ("w1",))  # the new leader's claim set gives it to this worker again
    assert worker.claims.claimed.get(qp.pod.key) == qp.pod.uid
    worker.sched.cache.forget(qp.pod.key)
    worker.sched._requeue(qp.pod, 1)
    assert worker.sched.queue.where(qp.pod.key) == "backoff"  # the new leader counts it claimed here
    assert worker.inner.results.earlier == {}
    await new.close()
