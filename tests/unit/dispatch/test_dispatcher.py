"""The dispatcher's state machine over fake links, a fake clock and a seeded rng: where each pod goes, when
it is declared unschedulable, and what happens when workers answer, go away or stall."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import random
from types import SimpleNamespace
from typing import Any

import pytest

from common import aiotools, protocol
from common.etcd.keys import WorkerId
from common.records import PodKey, pod_from_json
from coordinator.dispatch import UNSCHEDULABLE_RETRY
from coordinator.dispatch.pending import (
    DISPATCH_TIMEOUT,
    MAX_PREEMPTIONS,
    NEVER,
    NO_CANDIDATE,
    PREEMPTION_WAIT_LIMIT,
    QUEUED_LIMIT,
    REJECT_BACKOFF,
    REJECT_BACKOFF_MAX,
    SETTLE_LIMIT,
    STALE,
)
from tests.builders import PodBuilder
from tests.unit.dispatch.fakes import GIB, FakeLink, Rig


def pod(name: str, cpu: str = "500m", memory: str = "1Gi") -> dict[str, Any]:
    return PodBuilder(name).req(cpu=cpu, memory=memory).obj


def with_uid(obj: dict[str, Any], uid: str) -> dict[str, Any]:
    obj["metadata"]["uid"] = uid
    return obj


def key(name: str) -> PodKey:
    return PodKey(f"default/{name}")


async def test_dispatches_to_a_summarised_worker(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    rig.d.observe(pod("a"))
    rig.step()
    assert w1.dispatches() == []  # not connected yet
    w1.up().summary()
    rig.rescan()
    rig.step()
    [sent] = w1.dispatches()
    assert sent.pod == pod("a")
    assert rig.d.table.pods[key("a")].worker == "w1"
    assert rig.d.statistics()["workers"]["w1"]["in_flight"] == 1


async def test_a_dispatch_carries_the_pod_without_its_managed_fields(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary()
    obj = pod("a")
    obj["metadata"]["managedFields"] = [{"manager": "m", "operation": "Update", "fieldsV1": {"f:spec": {}}}]
    rig.d.observe(obj)
    rig.step()
    [sent] = w1.dispatches()
    assert "managedFields" not in sent.pod["metadata"] and "managedFields" in obj["metadata"]
    assert sent.pod == pod("a")


async def test_no_verdict_while_a_worker_has_sent_no_summary(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up()  # connected, no CAPACITY yet: settling
    rig.d.observe(pod("a"))
    rig.step()
    assert w1.dispatches() == [] and rig.reporter.verdicts == []


async def test_pod_goes_only_where_it_fits(rig: Rig) -> None:
    small, large = rig.workers("small", "large")
    small.up().summary(max_cpu=1000)
    large.up().summary(max_cpu=8000)
    for i in range(5):
        rig.d.observe(pod(f"big-{i}", cpu="2"))
    rig.step()
    assert small.dispatches() == [] and len(large.dispatches()) == 5


async def test_best_of_two_prefers_the_shorter_queue(rig: Rig) -> None:
    busy, idle = rig.workers("busy", "idle")
    busy.up().summary()
    for i in range(3):
        rig.d.observe(pod(f"early-{i}"))
    rig.step()
    assert len(busy.dispatches()) == 3
    idle.up().summary()
    rig.d.observe(pod("late"))
    rig.step()
    assert idle.ids_for("late") and not busy.ids_for("late")


async def test_a_no_sends_the_pod_to_another_worker_never_back(rig: Rig) -> None:
    w1, w2 = rig.workers("w1", "w2")
    w1.up().summary()
    rig.d.observe(pod("a"))
    rig.step()
    [first] = w1.ids_for("a")
    w2.up().summary()
    w1.unschedulable(first, nodes=4, reasons={"Insufficient cpu": 4})
    rig.step()
    assert len(w2.ids_for("a")) == 1 and w1.ids_for("a") == [first]
    assert rig.d.table.pods[key("a")].tried == {"w1"}
    assert rig.reporter.verdicts == []


async def test_unschedulable_only_when_every_live_shard_said_no(rig: Rig) -> None:
    w1, w2 = rig.workers("w1", "w2")
    w1.up().summary(nodes=2)
    w2.up().summary(nodes=3)
    rig.d.observe(pod("a"))
    rig.step()
    nodes = {w1: 2, w2: 3}
    (first,) = w1.dispatches() + w2.dispatches()
    said_no, other = (w1, w2) if w1.dispatches() else (w2, w1)
    said_no.unschedulable(first.id, nodes=nodes[said_no], reasons={"Insufficient cpu": 1})
    rig.step()
    assert rig.reporter.verdicts == []  # the other shard has not answered yet
    [second] = other.dispatches()
    other.unschedulable(second.id, nodes=nodes[other], reasons={"node(s) had untolerated taint": 2})
    rig.step()
    assert rig.reporter.verdicts == [
        (
            key("a"),
            "0/5 nodes are available: 1 Insufficient cpu, 2 node(s) had untolerated taint. " + NO_CANDIDATE,
        )
    ]
    p = rig.d.table.pods[key("a")]
    assert p.parked_at == rig.clock.now and p.worker is None
    assert rig.d.statistics()["parked"] == 1 and rig.d.declared_unschedulable == 1


async def test_a_shard_whose_summary_rules_the_pod_out_counts_as_a_no(rig: Rig) -> None:
    """... for a pod that may not preempt (one that may is asked there too: see the preemption tests)."""
    w1, w2 = rig.workers("w1", "w2")
    w1.up().summary(nodes=2, max_cpu=8000)
    w2.up().summary(nodes=5, max_cpu=1000)  # cannot fit 2 CPUs on any node
    rig.d.observe(PodBuilder("a").req(cpu="2", memory="1Gi").never_preempt().obj)
    rig.step()
    [sent] = w1.dispatches()
    w1.unschedulable(sent.id, nodes=2, reasons={"Insufficient memory": 2})
    rig.step()
    assert rig.reporter.verdicts == [
        (key("a"), "0/7 nodes are available: 5 Insufficient cpu, 2 Insufficient memory. " + NEVER)
    ]
    assert w2.dispatches() == []


def candidate(node: str, *, top: int = 10, victims: int = 1, violations: int = 0) -> protocol.Candidate:
    return protocol.Candidate(node, violations, top, victims * (top + 2**31), victims, 100.0)


async def test_a_shard_ruled_out_by_its_summary_is_asked_for_a_preemption_candidate(rig: Rig) -> None:
    w1, w2 = rig.workers("w1", "w2")
    w1.up().summary(nodes=2, max_cpu=8000)
    w2.up().summary(nodes=5, max_cpu=1000)  # full: only preemption could make room there
    rig.d.observe(pod("a", cpu="2"))
    rig.step()
    [sent] = w1.dispatches()
    w1.unschedulable(sent.id, nodes=2, reasons={"Insufficient memory": 2})
    rig.step()
    assert rig.reporter.verdicts == []
    [asked] = w2.dispatches()
    assert asked.preempt == ""  # an ordinary dispatch: the worker may place it, or propose a candidate
    w2.unschedulable(asked.id, nodes=5, reasons={"Insufficient cpu": 5})
    rig.step()
    assert rig.reporter.verdicts == [
        (key("a"), "0/7 nodes are available: 5 Insufficient cpu, 2 Insufficient memory. " + NO_CANDIDATE)
    ]


def answer_no_with(
    rig: Rig, proposals: dict[FakeLink, protocol.Candidate | None], *, rounds: int, nodes: int
) -> None:
    """``rounds`` passes of the dispatch loop, each worker answering every dispatch in flight to it with a "no"
    over ``nodes`` nodes and its proposal."""
    for _ in range(rounds):
        rig.step()
        for w, c in proposals.items():
            for d in w.dispatches():
                if d.id in rig.d.workers[w.worker_id].in_flight:
                    w.unschedulable(d.id, nodes=nodes, reasons={"Insufficient cpu": nodes}, preemption=c)


async def test_the_best_candidate_across_shards_is_carried_out_by_its_worker(rig: Rig) -> None:
    w1, w2, w3 = rig.workers("w1", "w2", "w3")
    for w in (w1, w2, w3):
        w.up().summary(nodes=2, max_cpu=8000)
    rig.d.observe(pod("a", cpu="2"))
    proposals = {
        w1: candidate("n1", top=50),
        w2: candidate("n2", top=10, victims=3),  # lowest highest priority wins over fewer victims
        w3: None,
    }
    answer_no_with(rig, proposals, rounds=3, nodes=2)
    rig.step()
    [preempt] = [d for d in w2.dispatches() if d.preempt]
    assert preempt.preempt == "n2"
    assert [d for d in w1.dispatches() + w3.dispatches() if d.preempt] == []
    assert rig.reporter.verdicts == []
    p = rig.d.table.pods[key("a")]
    assert p.worker == "w2" and p.preemptions == 1
    w2.bound(preempt.id, "n2")
    rig.step()
    assert key("a") not in rig.d.table.pods and rig.reporter.verdicts == []


async def test_a_pod_waiting_for_its_victims_is_kept_past_the_dispatch_timeout(rig: Rig) -> None:
    """Its worker preempted and holds it until the victims are gone (their graceful termination may take longer
    than the dispatch timeout); withdrawing it would send it to preempt again on the other shard's candidate."""
    w1, w2 = rig.workers("w1", "w2")
    for w in (w1, w2):
        w.up().summary(nodes=1, max_cpu=8000)
    rig.d.observe(pod("a", cpu="2"))
    proposals: dict[FakeLink, protocol.Candidate | None] = {
        w1: candidate("n1", top=1),
        w2: candidate("n2", top=2),
    }
    answer_no_with(rig, proposals, rounds=2, nodes=1)
    rig.step()
    [go] = [d for d in w1.dispatches() if d.preempt]
    assert go.preempt == "n1"
    w1.ack(go.id)
    rig.clock.advance(DISPATCH_TIMEOUT - 10)
    w1.waiting(go.id, "n1")
    rig.clock.advance(DISPATCH_TIMEOUT)
    assert rig.d.expire_dispatches() == 0
    rig.step()
    assert [d for d in w2.dispatches() if d.preempt] == [] and rig.d.table.pods[key("a")].worker == "w1"
    assert rig.d.workers["w1"].in_flight == {go.id: key("a")}  # still in flight: it holds w1's room
    w1.waiting(go.id, "n1")  # said again (a retry while the victims terminate): the wait is not extended
    rig.clock.advance(PREEMPTION_WAIT_LIMIT - DISPATCH_TIMEOUT + 1)
    assert rig.d.expire_dispatches() == 1  # a backstop for a worker that lost it


async def test_the_final_result_follows_a_waiting_one(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary(nodes=1, max_cpu=8000)
    rig.d.observe(pod("a"))
    rig.step()
    [sent] = w1.dispatches()
    w1.waiting(sent.id, "n1")
    w1.waiting(sent.id + 100, "n1")  # for no dispatch of ours: ignored
    p = rig.d.table.pods[key("a")]
    assert p.worker == "w1" and p.waiting_since is not None
    w1.bound(sent.id, "n1")
    assert key("a") not in rig.d.table


async def test_a_redispatched_pod_starts_with_the_ordinary_timeout(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary(nodes=1, max_cpu=8000)
    rig.d.observe(pod("a"))
    rig.step()
    [sent] = w1.dispatches()
    w1.waiting(sent.id, "n1")
    w1.down()  # the stream died: the pod is dispatched again, and that dispatch waits for no victims yet
    assert rig.d.table.pods[key("a")].waiting_since is None
    w1.up().summary(nodes=1, max_cpu=8000)
    rig.step()
    assert rig.d.table.pods[key("a")].worker == "w1"
    rig.clock.advance(DISPATCH_TIMEOUT + 1)
    assert rig.d.expire_dispatches() == 1


async def test_a_stale_candidate_gets_the_next_best_then_a_verdict(rig: Rig) -> None:
    w1, w2 = rig.workers("w1", "w2")
    for w in (w1, w2):
        w.up().summary(nodes=1, max_cpu=8000)
    rig.d.observe(pod("a", cpu="2"))
    rig.step()
    (first,) = w1.dispatches() + w2.dispatches()
    a, b = (w1, w2) if w1.dispatches() else (w2, w1)
    a.unschedulable(first.id, nodes=1, reasons={"Insufficient cpu": 1}, preemption=candidate("na", top=1))
    rig.step()
    [second] = b.dispatches()
    b.unschedulable(second.id, nodes=1, reasons={"Insufficient cpu": 1}, preemption=candidate("nb", top=2))
    rig.step()
    [go] = [d for d in a.dispatches() if d.preempt]
    assert go.preempt == "na"
    # re-checked, no longer a candidate there (and no fresh one): the next best shard's candidate
    a.unschedulable(go.id, nodes=1, reasons={"Insufficient cpu": 1})
    rig.step()
    [go2] = [d for d in b.dispatches() if d.preempt]
    assert go2.preempt == "nb"
    b.unschedulable(go2.id, nodes=1, reasons={"Insufficient cpu": 1})
    rig.step()
    [(k, message)] = rig.reporter.verdicts
    assert k == key("a") and message.endswith(STALE)
    # each shard asked twice: its latest answer counts once (not "0/4 nodes")
    assert message.startswith("0/2 nodes are available: 2 Insufficient cpu.")


async def test_preemption_rounds_are_bounded(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary(nodes=1, max_cpu=8000)
    rig.d.observe(pod("a", cpu="2"))
    # a worker that always proposes a candidate it then finds stale
    answer_no_with(rig, {w1: candidate("n")}, rounds=MAX_PREEMPTIONS + 2, nodes=1)
    rig.step()
    assert len([d for d in w1.dispatches() if d.preempt]) == MAX_PREEMPTIONS
    assert len(rig.reporter.verdicts) == 1


async def test_no_verdict_while_a_shard_is_syncing(rig: Rig) -> None:
    w1, w2 = rig.workers("w1", "w2")
    w1.up().summary(nodes=2)
    w2.up().summary(nodes=0, max_cpu=0, syncing=3)  # granted nodes, still catching up
    rig.d.observe(pod("a"))
    rig.step()
    [sent] = w1.dispatches()
    w1.unschedulable(sent.id, nodes=2, reasons={"Insufficient cpu": 2})
    rig.step()
    assert rig.reporter.verdicts == []
    w2.summary(nodes=3, max_cpu=4000)  # caught up: now it can answer
    rig.rescan()
    rig.step()
    assert len(w2.ids_for("a")) == 1 and rig.reporter.verdicts == []


async def test_rejections_everywhere_are_try_later_never_no(rig: Rig) -> None:
    w1, w2 = rig.workers("w1", "w2")
    w1.up().summary()
    w2.up().summary()
    rig.d.observe(pod("a"))
    for _ in range(3):
        rig.step()
        for w in (w1, w2):
            for m in w.dispatches():
                w.rejected(m.id)
        rig.step()
        rig.clock.advance(REJECT_BACKOFF_MAX)
        rig.rescan()
    assert rig.reporter.verdicts == []  # fenced or refused bindings are not "no worker owns any node"
    assert len(w1.dispatches()) + len(w2.dispatches()) == 3  # dispatched again after each backoff
    assert rig.d.table.pods[key("a")].tried == set()


async def test_a_rejected_pod_waits_its_backoff(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary()
    rig.d.observe(pod("a"))
    rig.step()
    w1.rejected(w1.ids_for("a")[0])
    rig.step()
    rig.rescan()
    rig.step()
    assert len(w1.dispatches()) == 1  # backing off
    rig.clock.advance(REJECT_BACKOFF)
    rig.rescan()
    rig.step()
    assert len(w1.dispatches()) == 2
    w1.rejected(w1.ids_for("a")[1])
    rig.clock.advance(REJECT_BACKOFF)  # the second wait is twice as long
    rig.rescan()
    rig.step()
    assert len(w1.dispatches()) == 2
    rig.clock.advance(REJECT_BACKOFF)
    rig.rescan()
    rig.step()
    assert len(w1.dispatches()) == 3


async def test_every_worker_fenced_gives_no_verdict(rig: Rig) -> None:
    w1, w2 = rig.workers("w1", "w2")
    w1.up().summary(nodes=0, max_cpu=0, placing=False)  # fenced: reports nothing usable
    w2.up().summary()
    rig.d.observe(pod("a"))
    rig.step()
    w2.unschedulable(w2.ids_for("a")[0], nodes=4, reasons={"Insufficient cpu": 4})
    rig.step()
    rig.clock.advance(60)
    rig.rescan()
    rig.step()
    assert rig.reporter.verdicts == []  # w1 may own nodes that fit once it is not fenced
    w1.summary(nodes=4, placing=True)
    rig.rescan()
    rig.step()
    assert w1.ids_for("a")


async def test_a_dispatch_without_result_is_dispatched_again(rig: Rig) -> None:
    w1, w2 = rig.workers("w1", "w2")
    w1.up().summary()
    w2.up().summary()
    rig.d.observe(pod("a"))
    rig.step()
    first = rig.d.table.pods[key("a")]
    stalled = rig.links[first.worker or ""]
    [old_id] = stalled.ids_for("a")
    stalled.ack(old_id)
    rig.clock.advance(DISPATCH_TIMEOUT - 1)
    assert rig.d.expire_dispatches() == 0
    rig.clock.advance(2)
    assert rig.d.expire_dispatches() == 1
    assert rig.d.statistics()["workers"][stalled.worker_id]["in_flight"] == 0
    rig.step()
    p = rig.d.table.pods[key("a")]
    assert p.worker is not None and p.dispatch_id != old_id
    stalled.bound(old_id)  # the late answer to the withdrawn dispatch is ignored
    assert rig.d.table.pods[key("a")].worker == p.worker
    rig.links[p.worker].bound(p.dispatch_id)
    assert key("a") not in rig.d.table


async def test_a_worker_answering_other_dispatches_keeps_its_queue_past_the_timeout(rig: Rig) -> None:
    """A live worker deciding a burst longer than the timeout is not sent its own queue again as duplicates;
    one that answers nothing for the timeout loses its dispatches as before."""
    (w1,) = rig.workers("w1")
    w1.up().summary(nodes=4, max_cpu=8000)
    for name in ("a", "b", "c"):
        rig.d.observe(pod(name))
    rig.step()
    w1.ack_all()
    [a], [b], [c] = w1.ids_for("a"), w1.ids_for("b"), w1.ids_for("c")
    rig.clock.advance(DISPATCH_TIMEOUT - 5)
    w1.bound(a)
    rig.clock.advance(10)  # b and c are past the timeout, but w1 answered 10 s ago
    assert rig.d.expire_dispatches() == 0
    w1.bound(b)
    rig.clock.advance(QUEUED_LIMIT)  # still answering now and then, but c has waited too long
    w1.bound(b)  # (a late duplicate answer counts as a sign of life too)
    assert rig.d.expire_dispatches() == 1
    rig.step()
    assert rig.d.table.pods[key("c")].dispatch_id != c


async def test_a_silent_worker_loses_its_dispatches_after_the_timeout(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary(nodes=4, max_cpu=8000)
    rig.d.observe(pod("a"))
    rig.d.observe(pod("b"))
    rig.step()
    w1.ack_all()
    [a] = w1.ids_for("a")
    w1.bound(a)
    rig.clock.advance(DISPATCH_TIMEOUT + 1)  # its last answer is as old as the timeout
    assert rig.d.expire_dispatches() == 1


async def test_a_recreated_pod_is_a_new_pod(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary()
    rig.d.observe(with_uid(pod("a"), "uid-1"))
    rig.step()
    [old_id] = w1.ids_for("a")
    rig.d.observe(with_uid(pod("a"), "uid-2"))  # deleted and created again
    assert rig.d.statistics()["workers"]["w1"]["in_flight"] == 0
    rig.step()
    [_, new_id] = w1.ids_for("a")
    w1.bound(old_id, uid="uid-1")
    assert rig.d.table.pods[key("a")].dispatch_id == new_id  # the old pod's result is not the new pod's
    w1.bound(new_id, uid="uid-1")  # a result naming another uid is not taken either
    assert key("a") in rig.d.table
    w1.bound(new_id, uid="uid-2")
    assert key("a") not in rig.d.table


async def test_no_verdict_without_live_workers(rig: Rig) -> None:
    rig.d.observe(pod("a"))
    rig.step()
    (w1,) = rig.workers("w1")
    w1.up().summary(nodes=0, max_cpu=0)  # connected, owns nothing
    rig.rescan()
    rig.step()
    assert rig.reporter.verdicts == [] and key("a") in rig.d.table


async def test_dead_link_redispatches_its_pods(rig: Rig) -> None:
    w1, w2 = rig.workers("w1", "w2")
    w1.up().summary()
    for name in ("a", "b"):
        rig.d.observe(pod(name))
    rig.step()
    old_ids = [m.id for m in w1.dispatches()]
    assert len(old_ids) == 2
    w1.down()
    assert rig.d.redispatched == 2
    w2.up().summary()
    rig.step()
    assert {m.pod["metadata"]["name"] for m in w2.dispatches()} == {"a", "b"}
    # the first stream's answers arrive late over a new stream: they are not the current dispatches
    w1.up().summary()
    for dispatch_id in old_ids:
        w1.bound(dispatch_id)
    assert {key("a"), key("b")} <= set(rig.d.table)
    assert rig.d.statistics()["workers"]["w2"]["in_flight"] == 2


async def test_a_worker_that_leaves_hands_back_its_pods(rig: Rig) -> None:
    w1, w2 = rig.workers("w1", "w2")
    w1.up().summary()
    rig.d.observe(pod("a"))
    rig.step()
    [sent] = w1.dispatches()
    w2.up().summary()
    rig.d.set_workers({"w2": "w2:7000"})
    assert w1.stopped and "w1" not in rig.d.workers
    rig.step()
    assert len(w2.ids_for("a")) == 1
    w1.bound(sent.id)  # from the dropped link: ignored
    assert rig.d.table.pods[key("a")].worker == "w2"


async def test_a_moved_worker_gets_a_new_link(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary()
    rig.d.observe(pod("a"))
    rig.step()
    rig.d.set_workers({"w1": "elsewhere:7000"})
    new = rig.links["w1"]
    assert new is not w1 and w1.stopped and new.address == "elsewhere:7000"
    w1.summary()  # the old link's last frame: ignored
    assert rig.d.workers["w1"].capacity is None
    new.up().summary()
    rig.step()
    assert len(new.ids_for("a")) == 1


async def test_malformed_pods_are_reported_at_once_and_never_dispatched(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary()
    rig.d.observe(pod("bad", cpu="lots"))
    [(reported, message)] = rig.reporter.verdicts
    assert reported == key("bad") and "invalid pod spec" in message
    rig.clock.advance(UNSCHEDULABLE_RETRY * 2)
    assert rig.d.retry_parked() == 0 and rig.d.retry_parked(force=True) == 0
    rig.rescan()
    rig.step()
    assert w1.dispatches() == []


async def test_gated_pods_wait_for_their_gates_to_lift(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary()
    gated = PodBuilder("a").req(cpu="100m").gate("example.com/quota")
    rig.d.observe(gated.obj)
    rig.rescan()
    rig.step()
    assert w1.dispatches() == [] and rig.reporter.verdicts == []
    rig.d.observe(PodBuilder("a").req(cpu="100m").obj)
    rig.step()
    assert len(w1.ids_for("a")) == 1


def _park(rig: Rig, name: str, **request: str) -> None:
    """Dispatch ``name`` to the single worker, which says no: the pod is parked."""
    w1 = rig.links["w1"]
    rig.d.observe(pod(name, **request))
    rig.step()
    w1.unschedulable(w1.ids_for(name)[-1], nodes=4, reasons={"Insufficient cpu": 4})
    rig.step()
    assert rig.reporter.keys()[-1] == key(name)


async def test_parked_pods_retry_after_the_retry_interval(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary()
    _park(rig, "a")
    rig.clock.advance(UNSCHEDULABLE_RETRY - 1)
    assert rig.d.retry_parked() == 0
    rig.step()
    assert len(w1.ids_for("a")) == 1
    rig.clock.advance(1)
    assert rig.d.retry_parked() == 1
    p = rig.d.table.pods[key("a")]
    assert p.parked_at is None and p.tried == set() and p.tally() == (0, {})
    rig.step()
    assert len(w1.ids_for("a")) == 2


async def test_parked_pods_retry_when_capacity_grows(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary(max_cpu=4000)
    _park(rig, "a")
    w1.summary(max_cpu=4000)  # same: stays parked
    rig.step()
    assert len(w1.ids_for("a")) == 1
    w1.summary(max_cpu=6000)
    rig.step()
    assert len(w1.ids_for("a")) == 2


async def test_parked_pods_retry_when_a_worker_joins(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary()
    _park(rig, "a")
    _, w2 = rig.workers("w1", "w2")
    w2.up().summary()
    rig.step()
    assert len(w2.ids_for("a")) + len(w1.ids_for("a")) == 2


async def test_results_end_the_dispatch_and_duplicates_are_ignored(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary()
    for name in ("a", "b", "c"):
        rig.d.observe(pod(name))
    rig.step()
    [a], [b], [c] = w1.ids_for("a"), w1.ids_for("b"), w1.ids_for("c")
    w1.bound(a)
    w1.events.received(w1, protocol.Result(b, "default/b", protocol.GONE))
    assert key("a") not in rig.d.table and key("b") not in rig.d.table
    assert rig.d.workers["w1"].bound == 1
    w1.bound(a)  # duplicate
    w1.unschedulable(a, nodes=9, reasons={"x": 9})  # late, contradicting
    w1.bound(12345)  # never dispatched
    assert rig.d.workers["w1"].bound == 1 and rig.reporter.verdicts == []
    assert rig.d.table.pods[key("c")].worker == "w1"
    assert rig.d.workers["w1"].in_flight == {c: key("c")}


async def test_the_watch_seeing_a_pod_bound_or_deleted_ends_it(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary()
    rig.d.observe(pod("a"))
    rig.d.observe(pod("b"))
    rig.step()
    w = rig.d.workers["w1"]
    assert w.reserved_cpu == 1000
    bound = pod("a")
    bound["spec"]["nodeName"] = "node-1"
    rig.d.observe(bound)
    rig.d.forget(key("b"))
    assert len(rig.d.table) == 0 and w.in_flight == {} and w.reserved_cpu == 0
    assert set(rig.reporter.forgotten) == {key("a"), key("b")}
    for m in w1.dispatches():
        w1.bound(m.id)  # late results for pods no longer tracked
    assert w.bound == 0


async def test_summaries_account_for_pods_still_in_flight(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary()
    rig.d.observe(pod("a", cpu="1", memory="2Gi"))
    rig.d.observe(pod("b", cpu="1", memory="2Gi"))
    rig.step()
    w = rig.d.workers["w1"]
    assert (w.reserved_cpu, w.reserved_memory) == (2000, 4 * GIB)
    w1.bound(w1.ids_for("a")[0])
    w1.summary()
    assert (w.reserved_cpu, w.reserved_memory) == (1000, 2 * GIB)


async def test_ack_window_bounds_unacknowledged_dispatches(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary()
    extra = 5
    for i in range(protocol.MAX_UNACKED + extra):
        rig.d.observe(pod(f"p-{i}", cpu="1m", memory="1Ki"))
    rig.step()
    sent = w1.dispatches()
    assert len(sent) == protocol.MAX_UNACKED
    assert rig.reporter.verdicts == []  # a full window is not a "no"
    for _ in range(3):  # the idle rescans consider them again; each is still counted once
        rig.rescan()
        rig.step()
    assert rig.d.statistics()["waiting_for_window"] == extra
    w1.ack(sent[0].id)
    rig.step()
    assert len(w1.dispatches()) == protocol.MAX_UNACKED + 1
    assert rig.d.statistics()["workers"]["w1"]["unacked"] == protocol.MAX_UNACKED
    w1.ack_all()
    rig.step()
    assert len(w1.dispatches()) == protocol.MAX_UNACKED + extra
    assert rig.d.statistics()["workers"]["w1"]["in_flight"] == protocol.MAX_UNACKED + extra


def full_window(rig: Rig) -> tuple[FakeLink, protocol.Dispatch]:
    """One worker, its ACK window full and one pod more waiting for room; the worker and its first dispatch."""
    (w1,) = rig.workers("w1")
    w1.up().summary()
    for i in range(protocol.MAX_UNACKED + 1):
        rig.d.observe(pod(f"p-{i}", cpu="1m", memory="1Ki"))
    rig.step()
    return w1, w1.dispatches()[0]


async def test_a_result_frees_the_window_like_an_ack(rig: Rig) -> None:
    w1, first = full_window(rig)
    w1.rejected(first.id)  # sent instead of an ACK
    rig.step()
    assert len(w1.dispatches()) == protocol.MAX_UNACKED + 1


async def test_a_result_naming_another_pod_is_no_answer_and_frees_no_window(rig: Rig) -> None:
    """The answer to a dispatch of an earlier stream that happens to carry the id of one in flight now (a new
    leader numbers its dispatches afresh; workers of earlier builds sent those), or any RESULT whose pod is
    not the one dispatched under its id: ignored, the window kept full, the dispatch still in flight."""
    w1, first = full_window(rig)
    assert w1.key_of(first.id) == "default/p-0"
    w1.events.received(w1, protocol.Result.bound(first.id, "default/elsewhere", "node-1"))
    rig.step()
    assert len(w1.dispatches()) == protocol.MAX_UNACKED  # no room freed
    assert rig.d.table.pods[key("p-0")].worker == "w1"  # still in flight, unanswered
    w1.bound(first.id)  # its own answer
    rig.step()
    assert len(w1.dispatches()) == protocol.MAX_UNACKED + 1
    assert key("p-0") not in rig.d.table.pods


async def test_a_full_window_sends_the_burst_to_other_workers(rig: Rig) -> None:
    w1, w2 = rig.workers("w1", "w2")
    w1.up().summary()
    for i in range(protocol.MAX_UNACKED + 10):
        rig.d.observe(pod(f"p-{i}", cpu="1m", memory="1Ki"))
    rig.step()
    assert len(w1.dispatches()) == protocol.MAX_UNACKED
    w2.up().summary()
    rig.rescan()
    rig.step()
    assert len(w2.dispatches()) == 10
    w1.down()  # its window and its pods go with the stream; what waited for its window is queued again
    assert rig.d.statistics()["waiting_for_window"] == 0
    rig.step()
    assert rig.d.workers["w1"].unacked == set()
    # w2 takes what its own window allows; the rest waits for its ACKs
    assert len(w2.dispatches()) == protocol.MAX_UNACKED
    assert sum(1 for p in rig.d.table.pods.values() if p.worker is None) == 10
    w2.ack_all()
    rig.step()
    assert len(w2.dispatches()) == protocol.MAX_UNACKED + 10


async def test_a_dead_link_clears_the_window(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary()
    for i in range(protocol.MAX_UNACKED):
        rig.d.observe(pod(f"p-{i}", cpu="1m", memory="1Ki"))
    rig.step()
    w1.down()
    w1.up().summary()
    rig.step()
    assert len(w1.dispatches()) == 2 * protocol.MAX_UNACKED
    assert rig.d.redispatched == protocol.MAX_UNACKED


async def test_pending_feed_relist_forgets_pods_no_longer_listed(rig: Rig) -> None:
    feed = rig.d.reflector.handler
    feed.replace([pod("a"), pod("b")])
    assert set(rig.d.table) == {key("a"), key("b")}
    feed.replace([pod("b")])
    assert set(rig.d.table) == {key("b")}
    feed.event("DELETED", pod("b"))
    assert len(rig.d.table) == 0
    feed.event("ADDED", pod("c"))
    assert set(rig.d.table) == {key("c")}


def at(obj: dict[str, Any], rv: int, *, node: str = "", phase: str = "Pending") -> dict[str, Any]:
    """``obj`` as the watch shows it at resourceVersion ``rv``: bound to ``node`` if given, in ``phase``."""
    obj = copy.deepcopy(obj)
    obj["metadata"]["resourceVersion"] = str(rv)
    if node:
        obj["spec"]["nodeName"] = node
    obj.setdefault("status", {})["phase"] = phase
    return obj


async def test_pending_feed_a_pod_leaves_at_its_binding_and_its_later_events_while_it_starts_change_nothing(
    rig: Rig,
) -> None:
    # The leader's watch holds the pods of ours in phase Pending (``pending_selector``): a bound pod stays in
    # it until its kubelet reports it running, and then leaves it as DELETED.
    (w1,) = rig.workers("w1")
    w1.up().summary()
    feed = rig.d.reflector.handler
    feed.event("ADDED", at(pod("a"), 10))
    rig.step()
    [sent] = w1.dispatches()
    feed.event("MODIFIED", at(pod("a"), 12, node="node-1"))  # the binding
    assert key("a") not in rig.d.table
    assert rig.d.lane.settled_rv == 12
    assert rig.d.statistics()["workers"]["w1"]["in_flight"] == 0
    starting = at(pod("a"), 15, node="node-1")
    starting["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
    feed.event("MODIFIED", starting)
    feed.event("DELETED", at(pod("a"), 17, node="node-1", phase="Running"))
    rig.rescan()
    rig.step()
    assert key("a") not in rig.d.table and w1.dispatches() == [sent]
    assert rig.d.lane.settled_rv == 12  # the later events are no placements: passed over
    # a relist lists the pods still starting: none of them is pending
    feed.replace([starting, at(pod("b"), 20)])
    assert set(rig.d.table) == {key("b")}


async def test_an_answer_over_no_nodes_is_try_later(rig: Rig) -> None:
    """A worker fenced with pods in its queue decides them over no usable node: that is not a no."""
    w1, w2 = rig.workers("w1", "w2")
    w1.up().summary()
    w2.up().summary()
    rig.d.observe(pod("a"))
    for _ in range(4):
        rig.step()
        for w in (w1, w2):
            for m in w.dispatches()[-1:]:
                w.unschedulable(m.id, nodes=0, reasons={})
        rig.clock.advance(REJECT_BACKOFF_MAX)
        rig.rescan()
    assert rig.reporter.verdicts == [] and rig.d.table.pods[key("a")].tried == set()


async def test_updates_of_a_pending_pod_give_the_record_a_full_parse_gives(rig: Rig) -> None:
    # ``observe`` hands the pod's last record to ``pod_from_json`` as ``previous``: whatever the updates, the
    # table must hold what a parse without it gives (random updates of status, labels, gates, requests,
    # spread constraints, uid).
    rng = random.Random(14)
    for trial in range(30):
        name = f"p{trial}"
        obj = PodBuilder(name).req(cpu="500m", memory="1Gi").obj
        obj["metadata"]["uid"] = "u0"
        obj["spec"]["schedulingGates"] = [{"name": "g"}]
        for step in range(12):
            obj = copy.deepcopy(obj)
            meta, spec = obj["metadata"], obj["spec"]
            change = rng.choice(["status", "label", "gates", "requests", "spread", "uid", "nothing"])
            if change == "status":
                obj["status"] = {
                    "phase": "Pending",
                    "conditions": [{"type": "PodScheduled", "reason": f"r{step}"}],
                }
            elif change == "label":
                meta.setdefault("labels", {})[rng.choice("ab")] = str(rng.randrange(3))
            elif change == "gates":
                spec["schedulingGates"] = [] if spec.get("schedulingGates") else [{"name": "g"}]
            elif change == "requests":
                spec["containers"][0]["resources"]["requests"]["cpu"] = f"{rng.randrange(1, 4) * 100}m"
            elif change == "spread":
                spec["topologySpreadConstraints"] = [
                    {
                        "maxSkew": 1,
                        "topologyKey": "topology.kubernetes.io/zone",
                        "whenUnsatisfiable": rng.choice(["DoNotSchedule", "ScheduleAnyway"]),
                        "labelSelector": {"matchLabels": {"a": "1"}},
                    }
                ]
            elif change == "uid":
                meta["uid"] = f"u{step}"
            meta["resourceVersion"] = str(100 * trial + step + 1)
            rig.d.observe(obj)
            held = rig.d.table.pods[key(name)]
            assert held.record == pod_from_json(copy.deepcopy(obj)), (trial, step, change)
            assert held.obj == obj


async def test_a_summary_that_changes_nothing_decisive_never_frees_a_waiting_pod(rig: Rig) -> None:
    # The dispatcher does not wake the loop for a summary equal to the last one in what ``choice`` decides
    # by (``decisive``). That is exact only if reconsidering every waiting pod after such a summary could
    # never send one anywhere: check it against the full path (a rescan after it), randomly, with summaries
    # that change only the other fields and summaries that may change anything.
    rng = random.Random(1)
    links = rig.workers("w1", "w2")
    for i in range(40):
        rig.d.observe(pod(f"p{i}", cpu=f"{rng.randrange(1, 9) * 500}m"))
    shapes = [
        (n, c, s, ok) for n in (0, 4) for c in (1000, 2500, 4000) for s in (0, 1) for ok in (True, False)
    ]

    def summary(shape: tuple[int, int, int, bool], **noise: Any) -> protocol.Capacity:
        nodes, max_cpu, syncing, placing = shape
        fields: dict[str, Any] = {
            "free_cpu": 0,
            "free_memory": 0,
            "pending": 0,
            "binds_per_s": 0.0,
            "ts": 0.0,
        }
        fields.update(noise)
        return protocol.Capacity(
            nodes=nodes, max_cpu=max_cpu, max_memory=16 * GIB, syncing=syncing, placing=placing, **fields
        )

    considered = 0
    for _ in range(400):
        shape = {}
        for link in links:  # fresh streams: every pod in flight is waiting again
            link.down()
            link.up()
            shape[link.worker_id] = rng.choice(shapes)
            link.events.received(link, summary(shape[link.worker_id]))
        rig.rescan()
        rig.step()  # every pod that can go somewhere has gone
        waiting = [p for p in rig.d.table.pods.values() if p.waiting]
        considered += len(waiting)
        sent = sum(len(link.dispatches()) for link in links)
        declared = rig.d.declared_unschedulable
        rig.d.table.wakeup.clear()
        link = rng.choice(links)
        noise = {
            "free_cpu": rng.randrange(10**6),
            "free_memory": rng.randrange(10**9),
            "pending": rng.randrange(9),
            "binds_per_s": rng.random(),
            "ts": rng.random(),
        }
        same = rng.random() < 0.3
        new = list(shape[link.worker_id])
        if not same:  # one field changed at random (perhaps to the value it had)
            field = rng.choice([0, 1, 2, 2, 3, 3])  # syncing and placing more often: rarer to matter
            new[field] = rng.choice([s[field] for s in shapes])
        link.events.received(link, summary((new[0], new[1], new[2], bool(new[3])), **noise))
        woke = rig.d.table.wakeup.is_set()
        assert not (same and woke)
        rig.rescan()
        rig.step()
        if not woke:  # the full path sends nothing and declares nothing either
            assert sum(len(link.dispatches()) for link in links) == sent
            assert rig.d.declared_unschedulable == declared
    assert considered > 1000  # many pods were waiting when the summaries came


async def test_a_summary_that_changes_what_choice_reads_wakes_the_loop(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary(max_cpu=1000)
    rig.d.table.wakeup.clear()
    w1.summary(max_cpu=1000)
    assert not rig.d.table.wakeup.is_set()
    for change in ({"max_cpu": 999}, {"nodes": 3}, {"max_memory": GIB}, {"syncing": 1}, {"placing": False}):
        w1.summary(max_cpu=1000)
        rig.d.table.wakeup.clear()
        w1.summary(**{"max_cpu": 1000, **change})  # type: ignore[arg-type]
        assert rig.d.table.wakeup.is_set(), change


async def test_pods_a_few_ms_behind_the_first_go_out_in_its_write(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop, woken by a burst's first pod, waits ``protocol.COALESCE`` for the next ones: one write (and
    one wake-up of the worker) for all of them. Longer here than in production, so the test does not race a
    busy host's clock."""
    monkeypatch.setattr(protocol, "COALESCE", 0.2)
    (w1,) = rig.workers("w1")
    w1.up().summary()
    loop = asyncio.create_task(rig.d._loop())
    try:
        for _ in range(3):
            await asyncio.sleep(0)  # the loop starts, finds nothing to do, and waits
        rig.d.observe(pod("a"))
        for _ in range(3):
            await asyncio.sleep(0)  # the loop wakes, and waits for the rest of the burst
        assert not w1.dispatches()
        rig.d.observe(pod("b"))
        rig.d.observe(pod("c"))
        await asyncio.sleep(2 * protocol.COALESCE)
        names = [
            [m.pod["metadata"]["name"] for m in w if isinstance(m, protocol.Dispatch)] for w in w1.writes
        ]
        assert names == [["a", "b", "c"]]
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop


async def test_a_pod_queued_again_does_not_wait_for_a_burst(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only an arrival makes the loop wait ``protocol.COALESCE``: a waiting pod queued again when a worker
    can take it goes at once."""
    monkeypatch.setattr(protocol, "COALESCE", 3600.0)
    (w1,) = rig.workers("w1")
    rig.d.observe(pod("a"))  # no worker can take it yet
    loop = asyncio.create_task(rig.d._loop())
    try:
        for _ in range(3):
            await asyncio.sleep(0)  # the loop's pass finds no worker for it: it waits
        assert not w1.dispatches()
        w1.up().summary()  # wakes the loop, which queues the waiting pod again
        for _ in range(10):
            await asyncio.sleep(0)  # a few loop passes: far less than COALESCE
        assert [m.pod["metadata"]["name"] for m in w1.dispatches()] == ["a"]
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop


async def test_without_claims_every_pod_is_dispatched(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary()
    rig.d.observe(pod("a"))
    rig.step()
    assert not any(isinstance(m, protocol.Claims) for m in w1.sent) and len(w1.dispatches()) == 1


# ----- no verdict while the shard map moves nodes ---------------------------------------------------------


def huge() -> dict[str, Any]:
    """A pod no shard fits, that may not preempt (so no dry run is asked for before the verdict)."""
    return PodBuilder("huge").req(cpu="64").never_preempt().obj


async def test_no_verdict_while_nodes_are_between_workers(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary()
    granted = {WorkerId("w1"): 4, WorkerId("w2"): 4}  # w2 granted nodes, not yet connected
    rig.d.granted = lambda: granted
    rig.d.observe(huge())
    rig.step()
    assert rig.reporter.verdicts == []
    granted.pop(WorkerId("w2"))
    rig.d.in_transit = lambda: 4  # released by w2, not yet granted again
    rig.rescan()
    rig.step()
    assert rig.reporter.verdicts == []
    rig.clock.advance(SETTLE_LIMIT)  # a map that does not settle holds no pod unanswered
    rig.rescan()
    rig.step()
    [(_, message)] = rig.reporter.verdicts
    assert message.startswith("0/4 nodes are available")


async def test_a_verdict_once_the_map_has_settled(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary()
    rig.d.granted = lambda: {WorkerId("w1"): 4}
    rig.d.observe(huge())
    rig.step()
    assert len(rig.reporter.verdicts) == 1


async def test_a_later_move_holds_the_verdict_back_again(rig: Rig) -> None:
    """The deferral's limit counts from the pod's latest dispatch: a pod held back once, then dispatched
    when the map settled, is held back again by a move that starts long after the first."""
    w1, w2 = rig.workers("w1", "w2")
    w1.up().summary()
    granted = {WorkerId("w1"): 4, WorkerId("w2"): 4}
    rig.d.granted = lambda: granted
    rig.d.observe(pod("a"))
    rig.step()
    [first] = w1.dispatches()
    w1.unschedulable(first.id, 4, {"Insufficient memory": 4})
    rig.step()
    assert rig.reporter.verdicts == []  # w2 granted nodes but not connected: held back
    w2.up().summary()  # settled
    rig.rescan()
    rig.step()
    [second] = w2.dispatches()
    rig.clock.advance(SETTLE_LIMIT + 1)
    rig.d.in_transit = lambda: 4  # a new move, while w2 decides
    w2.unschedulable(second.id, 4, {"Insufficient memory": 4})
    rig.step()
    assert rig.reporter.verdicts == []
    rig.d.in_transit = lambda: 0
    rig.rescan()
    rig.step()
    [(_, message)] = rig.reporter.verdicts
    assert message.startswith("0/8 nodes are available: 8 Insufficient memory.")


async def test_the_pacers_backlog_is_the_pods_queued_or_unacknowledged_not_those_a_worker_holds(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    pokes: list[int] = []
    monkeypatch.setattr(aiotools, "PACER", SimpleNamespace(poke=lambda: pokes.append(rig.d.backlog())))
    (w1,) = rig.workers("w1")
    for name in ("a", "b", "c"):
        rig.d.observe(pod(name))
    assert rig.d.backlog() == 3  # queued for the loop's next pass
    w1.up().summary()
    rig.step()
    assert pokes == [3, 3, 3]  # one poke per dispatch, each after the pod moved from queued to unacknowledged
    assert rig.d.backlog() == 3  # sent, none acknowledged yet
    ids = [d.id for d in w1.dispatches()]
    w1.ack_all()
    assert rig.d.backlog() == 0  # the worker holds them: however long they wait there, the leader is idle
    w1.bound(ids[0])
    w1.unschedulable(ids[1], 1, {"Insufficient cpu": 1})  # every shard said no: parked
    rig.step()
    assert rig.d.table.parked() == 1 and rig.d.backlog() == 0


async def test_the_dispatcher_counts_in_the_pacers_backlog_while_it_runs(rig: Rig) -> None:
    before = aiotools.PACER.backlog()
    rig.d.observe(pod("a"))
    task = asyncio.create_task(rig.d.run())
    await asyncio.sleep(0)
    assert aiotools.PACER.backlog() == before + 1
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert aiotools.PACER.backlog() == before
