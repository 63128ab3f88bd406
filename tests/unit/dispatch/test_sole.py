"""The leader's side of the sole worker (``Dispatcher.check_sole``) over fake links: when SOLE is offered, what
the leader stops doing once it is taken, and how the period ends (a worker joins, nodes move, the stream
ends) with the term inheriting again (the lane's rule 6)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest_asyncio

from common import protocol
from common.etcd.keys import WorkerId
from common.kube import KubeClient
from common.records import PodKey
from coordinator.dispatch.lane import LOST_HOLD
from tests.builders import PodBuilder
from tests.unit.dispatch.fakes import FakeLink, Rig

ZONE = "topology.kubernetes.io/zone"


@pytest_asyncio.fixture
async def rig(client: KubeClient) -> Rig:
    return Rig(client, sole=True)


def pod(name: str) -> dict[str, Any]:
    return PodBuilder(name).req(cpu="500m", memory="1Gi").uid(f"uid-{name}").obj


def lane_pod(name: str) -> dict[str, Any]:
    """A pod with a required cross-node anti-affinity term: a lane pod (``common.claims.lane_rule``)."""
    return (
        PodBuilder(name)
        .req(cpu="500m", memory="1Gi")
        .uid(f"uid-{name}")
        .label("app", "db")
        .pod_affinity(ZONE, {"app": "db"}, anti=True)
        .obj
    )


def soles(link: FakeLink) -> int:
    return sum(isinstance(m, protocol.Sole) for m in link.sent)


def sole_worker(rig: Rig, nodes: int = 4) -> FakeLink:
    """One worker owning every granted node, connected and summarised: SOLE goes to it at once."""
    rig.granted = {WorkerId("w1"): nodes}
    (w1,) = rig.workers("w1")
    w1.up().summary(nodes=nodes)
    return w1


async def test_the_only_worker_owning_every_node_is_offered_sole_and_nothing_is_dispatched_meanwhile(
    rig: Rig,
) -> None:
    w1 = sole_worker(rig)
    assert soles(w1) == 1 and rig.d.sole_worker == "w1" and not rig.d.sole_taken
    rig.d.observe(pod("a"))
    rig.step()
    assert w1.dispatches() == []  # offered: the worker may already be placing it
    rig.d.housekeep()
    assert soles(w1) == 1  # offered once


async def test_taking_sole_stops_the_leaders_per_pod_work(rig: Rig) -> None:
    w1 = sole_worker(rig)
    rig.d.observe(pod("a"))
    w1.summary(sole=True)
    assert rig.d.sole_taken and rig.d.sole_periods == 1
    assert len(rig.d.table) == 0 and not rig.d.table.ready
    assert PodKey("default/a") in rig.reporter.forgotten
    # an event the stopped watch had already delivered: the pod is recorded, neither dispatched nor judged
    rig.d.observe(PodBuilder("huge").req(cpu="64").uid("uid-huge").obj)
    rig.d.housekeep()
    rig.step()
    assert w1.dispatches() == [] and rig.reporter.verdicts == []


async def test_no_offer_unless_one_worker_owns_every_node_with_nothing_in_flight(client: KubeClient) -> None:
    # two workers
    rig = Rig(client, sole=True)
    rig.granted = {WorkerId("w1"): 2, WorkerId("w2"): 2}
    w1, w2 = rig.workers("w1", "w2")
    w1.up().summary(nodes=2)
    w2.up().summary(nodes=2)
    assert soles(w1) == soles(w2) == 0
    # one worker, but nodes in transit, or granted nodes still catching up, or a summary that counts fewer
    for in_transit, syncing, nodes in ((1, 0, 4), (0, 1, 3), (0, 0, 3)):
        rig = Rig(client, sole=True)
        rig.granted, rig.in_transit = {WorkerId("w1"): 4}, in_transit
        (w1,) = rig.workers("w1")
        w1.up().summary(nodes=nodes, syncing=syncing)
        assert soles(w1) == 0, (in_transit, syncing, nodes)
    # a dispatch in flight: offered only once it is answered
    rig = Rig(client, sole=True)
    rig.d.observe(pod("a"))
    rig.granted = {WorkerId("w1"): 4}
    (w1,) = rig.workers("w1")
    w1.up()
    rig.d.sole = False  # (the dispatch goes out first)
    w1.summary()
    rig.step()
    (sent,) = w1.dispatches()
    rig.d.sole = True
    w1.summary()
    assert soles(w1) == 0
    w1.bound(sent.id)
    w1.summary()
    assert soles(w1) == 1
    # a term still inheriting (a worker binding an earlier stream's pod): not before it says none is
    rig = Rig(client, sole=True)
    rig.granted = {WorkerId("w1"): 4}
    (w1,) = rig.workers("w1")
    w1.up().summary(earlier=1)
    assert soles(w1) == 0 and rig.d.inheriting
    w1.summary()
    assert soles(w1) == 1
    # off: never
    rig = Rig(client)
    rig.granted = {WorkerId("w1"): 4}
    (w1,) = rig.workers("w1")
    w1.up().summary()
    assert soles(w1) == 0


async def test_a_second_worker_ends_the_period_with_a_new_stream_and_the_term_inherits_again(
    rig: Rig,
) -> None:
    first = sole_worker(rig)
    first.summary(sole=True)
    rig.granted = {WorkerId("w1"): 2, WorkerId("w2"): 2}
    rig.workers("w1", "w2")
    assert first.stopped  # the sole worker's stream ends: the worker stops being sole when it does
    w1, w2 = rig.links["w1"], rig.links["w2"]
    assert w1 is not first
    assert rig.d.sole_worker is None and not rig.d.sole_taken
    assert rig.d.inheriting  # w1 may still be binding pods this term never saw (rule 6)
    # the pending watch lists again (here by hand): a plain pod goes out, a lane pod waits for rule 6
    rig.d.observe(pod("plain"))
    rig.d.observe(lane_pod("lane"))
    rig.d.listed(10)
    w1.up().summary(nodes=2, earlier=3, revision=12)
    w2.up().summary(nodes=2)
    rig.step()
    sent = [m.pod["metadata"]["name"] for m in (*w1.dispatches(), *w2.dispatches())]
    assert sent == ["plain"]
    assert soles(w1) == soles(w2) == 0
    w1.summary(nodes=2, earlier=0, revision=15)  # its bindings are all shown by its watch
    assert not rig.d.inheriting
    rig.step()
    (lane,) = [m for m in (*w1.dispatches(), *w2.dispatches()) if m.pod["metadata"]["name"] == "lane"]
    assert lane.min_rv >= 15  # decided on a view that holds every binding the sole worker made


async def test_the_sole_workers_stream_ending_ends_the_period(rig: Rig) -> None:
    w1 = sole_worker(rig)
    w1.summary(sole=True)
    w1.down()  # the worker closed it: its nodes changed, or it was fenced or is draining
    assert rig.d.sole_worker is None and rig.d.inheriting
    assert not w1.stopped and rig.links["w1"] is w1  # the link connects again by itself
    rig.d.observe(pod("a"))
    w1.up().summary(syncing=1)  # catching up on a new node: no offer, and pods are dispatched
    rig.step()
    assert [m.pod["metadata"]["name"] for m in w1.dispatches()] == ["a"]
    assert soles(w1) == 1  # (the one before)


async def test_nodes_moving_end_the_period_at_the_next_housekeeping(rig: Rig) -> None:
    first = sole_worker(rig)
    first.summary(sole=True)
    rig.in_transit = 1
    rig.d.housekeep()
    assert first.stopped and rig.d.sole_worker is None and rig.d.inheriting


async def test_an_offer_not_taken_leaves_the_pods_to_be_dispatched_when_it_ends(rig: Rig) -> None:
    w1 = sole_worker(rig)
    rig.d.observe(pod("a"))
    rig.step()
    assert w1.dispatches() == []
    w1.down()  # the worker refused (it could not be the sole worker): it closed the stream
    w1.up().summary(earlier=0)
    rig.d.listed(0)  # the pending watch's new list
    rig.step()
    assert [m.pod["metadata"]["name"] for m in w1.dispatches()] == ["a"]


async def test_a_period_ending_with_the_term_starts_no_watch(rig: Rig) -> None:
    """The term's end stops the dispatcher's tasks, then its links report their streams down: ending the period
    then must not start the pending watch in a task group that takes no new task."""
    running = asyncio.create_task(rig.d.run())
    await asyncio.sleep(0)
    w1 = sole_worker(rig)
    w1.summary(sole=True)
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running
    w1.down()
    assert rig.d.sole_worker is None


async def test_the_pending_watch_stops_while_sole_and_lists_again_after(rig: Rig) -> None:
    running = asyncio.create_task(rig.d.run())
    await asyncio.sleep(0)
    watching = rig.d._watch
    assert watching is not None and not watching.done()
    w1 = sole_worker(rig)
    w1.summary(sole=True)
    await asyncio.sleep(0)
    assert watching.cancelled() and rig.d._watch is None
    w1.down()
    assert rig.d._watch is not None and not rig.d._watch.done()  # a new run: it lists first
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running


async def test_the_sole_worker_coming_back_under_another_address_ends_the_period(rig: Rig) -> None:
    first = sole_worker(rig)
    first.summary(sole=True)
    rig.d.set_workers(
        {"w1": "w1:7001"}
    )  # restarted elsewhere: a new link, which the worker takes as a new stream
    assert first.stopped and rig.links["w1"] is not first
    assert rig.d.sole_worker is None and rig.d.inheriting


async def test_an_end_before_the_take_was_heard_holds_what_a_pending_lane_pods_anti_affinity_matches(
    rig: Rig,
) -> None:
    """The worker may have taken SOLE (its summary on the way) and be placing the lane pod: until it says it
    binds nothing, a plain pod that pod's anti-affinity matches must not go to another worker (rule 6)."""
    w1 = sole_worker(rig)
    rig.d.observe(lane_pod("lane"))
    rig.d.observe(PodBuilder("plain").req(cpu="100m").uid("uid-plain").label("app", "db").obj)
    rig.d.observe(pod("other"))
    rig.granted = {WorkerId("w1"): 2, WorkerId("w2"): 2}
    rig.workers("w1", "w2")
    w1, w2 = rig.links["w1"], rig.links["w2"]
    w1.up().summary(nodes=2, earlier=1)
    w2.up().summary(nodes=2)
    rig.step()
    sent = sorted(m.pod["metadata"]["name"] for m in (*w1.dispatches(), *w2.dispatches()))
    assert sent == ["other"]


async def test_after_the_period_a_worker_still_binding_is_waited_for_past_lost_hold(rig: Rig) -> None:
    """A sole worker's binder may be far behind its decisions (volume pods wait for their claims): the lane
    holds its pods for as long as the worker says it binds some, not only for ``LOST_HOLD``."""
    first = sole_worker(rig)
    first.summary(sole=True)
    rig.granted = {WorkerId("w1"): 2, WorkerId("w2"): 2}
    rig.workers("w1", "w2")
    w1, w2 = rig.links["w1"], rig.links["w2"]
    rig.d.observe(lane_pod("lane"))
    rig.d.listed(10)
    w1.up().summary(nodes=2, earlier=5, revision=12)
    w2.up().summary(nodes=2)
    rig.clock.advance(LOST_HOLD + 1)
    rig.d.housekeep()
    rig.step()
    assert rig.d.inheriting and w1.dispatches() == w2.dispatches() == []
    w1.summary(nodes=2, earlier=0, revision=40)
    rig.step()
    assert not rig.d.inheriting
    assert [m.pod["metadata"]["name"] for m in (*w1.dispatches(), *w2.dispatches())] == ["lane"]


async def test_another_worker_holding_nodes_ends_the_period(rig: Rig) -> None:
    """A worker not live in membership any more may still hold nodes in the shard map until its grant is
    revoked: the sole worker then no longer owns the whole pool."""
    first = sole_worker(rig)
    first.summary(sole=True)
    rig.granted = {WorkerId("w1"): 4, WorkerId("w0"): 1}
    rig.d.housekeep()
    assert first.stopped and rig.d.sole_worker is None and rig.d.inheriting
