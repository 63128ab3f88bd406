"""The topology lane's rule 6 in the dispatcher (``coordinator.dispatch.lane``): a new term holds back the pods
a placement of an earlier term could make wrong (lane pods, plain pods matching a pending pod's cross-node
anti-affinity) until its pending watch listed and every live worker said, over this term's stream, that it
binds no pod of an earlier stream; meanwhile the lane's versions follow the workers' watch revisions."""

from __future__ import annotations

from typing import Any

import pytest

from common.kube import KubeClient
from coordinator.dispatch.lane import EARLIER_TERM, LOST_HOLD
from tests.builders import PodBuilder
from tests.unit.dispatch.fakes import Rig
from tests.unit.dispatch.test_lane import dispatches, left_pending, plain, spread, waits, zone_anti


def at(obj: dict[str, Any], rv: int) -> dict[str, Any]:
    """``obj`` as the API server shows it at resourceVersion ``rv``."""
    return {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(rv)}}


@pytest.fixture
def unlisted(client: KubeClient) -> Rig:
    """A term whose pending watch has not listed yet."""
    return Rig(client, listed=False)


async def test_a_new_term_holds_lane_pods_until_every_worker_binds_nothing_earlier(rig: Rig) -> None:
    w1, w2 = rig.workers("w1", "w2")
    before = waits(EARLIER_TERM)
    w1.up().summary(revision=700)
    w2.up().summary(earlier=2, revision=650)  # still binding two pods an earlier stream dispatched
    rig.d.observe(spread("s1"))
    rig.d.observe(zone_anti("a1", owner="o"))  # a lane pod an earlier leader may have dispatched
    rig.d.observe(plain("near", owner="o"))  # matches a1's zone anti-affinity
    rig.d.observe(plain("free"))
    rig.step()
    sent = {m.pod["metadata"]["name"] for w in (w1, w2) for m in w.dispatches()}
    assert sent == {"free"}  # neither a lane pod nor one a pending pod's anti-affinity is about
    # it must see every placement the workers reported seeing (the newest pod w1's watch delivered)
    assert [m.min_rv for w in (w1, w2) for m in w.dispatches()] == [700]
    assert waits(EARLIER_TERM) == before + 3
    assert rig.d.statistics()["inheriting"] is True
    w2.summary(earlier=1, revision=660)
    rig.step()
    assert {m.pod["metadata"]["name"] for w in (w1, w2) for m in w.dispatches()} == {"free"}
    w2.summary(earlier=0, revision=720)  # the watch showed its last such binding
    rig.step()
    out = {m.pod["metadata"]["name"]: m for w in (w1, w2) for m in w.dispatches()}
    # a1 now waits for s1 (a pod could match both selectors: rule 1), and "near" no longer waits for it
    assert set(out) == {"free", "s1", "near"}
    assert out["s1"].min_rv == 720 and out["near"].min_rv == 720  # every reported binding is seen first
    assert rig.d.statistics()["inheriting"] is False


async def test_a_worker_that_never_answers_is_waited_for_lost_hold(rig: Rig) -> None:
    w1, _w2 = rig.workers("w1", "w2")  # w2 is live in membership but never connects
    w1.up().summary(revision=300)
    rig.d.observe(spread("s1"))
    rig.step()
    assert dispatches(w1, "s1") == []
    rig.clock.advance(LOST_HOLD - 1)
    rig.d.housekeep()
    rig.step()
    assert dispatches(w1, "s1") == []
    rig.clock.advance(2)
    rig.d.housekeep()  # no message comes: the hold ends with the time-out alone
    rig.step()
    [s1] = dispatches(w1, "s1")
    assert s1.min_rv == 300


async def test_a_worker_leaving_membership_is_no_longer_waited_for(rig: Rig) -> None:
    (w1, _w2) = rig.workers("w1", "w2")
    w1.up().summary(revision=40)
    rig.d.observe(spread("s1"))
    rig.step()
    assert dispatches(w1, "s1") == []
    rig.workers("w1")  # w2's membership lease ended
    rig.step()
    assert len(dispatches(w1, "s1")) == 1


async def test_nothing_ends_the_hold_before_the_pending_watch_listed(unlisted: Rig) -> None:
    rig = unlisted
    (w1,) = rig.workers("w1")
    w1.up().summary(revision=90)
    rig.d.observe(spread("s1"))  # (an event delivered before the list only in this test)
    rig.step()
    assert dispatches(w1, "s1") == []
    rig.d.reflector.resource_version = "130"  # the store's revision: a pod watch may not reach it soon
    rig.d.reflector._listed_version = 120  # its newest pod, as the reflector sets it before ``replace``
    rig.d.reflector.handler.replace(
        [at(spread("s1"), 95), at(PodBuilder("p1").req(cpu="100m").on("n1").obj, 120)]
    )
    rig.step()
    [s1] = dispatches(w1, "s1")
    assert s1.min_rv == 120  # the newest listed pod (bound and starting): every placement before it is seen


async def test_a_placement_this_term_did_not_order_raises_the_plain_pods_version(rig: Rig) -> None:
    """A lane pod placed by an earlier term's dispatch (this term never sent it) still counts for plain pods'
    ``min_rv``: their decisions must see its anti-affinity."""
    (w1,) = rig.workers("w1")
    w1.up().summary(earlier=1, revision=10)
    rig.d.observe(zone_anti("a1", owner="o"))
    rig.step()
    left_pending(rig, zone_anti("a1", owner="o"), 500)  # bound by the earlier dispatch
    w1.summary(earlier=0, revision=480)  # the worker's watch behind the leader's
    rig.d.observe(plain("near", owner="o"))
    rig.step()
    [near] = dispatches(w1, "near")
    assert near.min_rv == 500
    assert dispatches(w1, "a1") == []


async def test_a_relist_raises_both_versions(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary()
    rig.d.reflector.resource_version, rig.d.reflector._listed_version = "2100", 2000
    rig.d.reflector.handler.replace([at(plain("p1"), 1900), at(spread("s1"), 2000)])
    rig.step()
    assert [m.min_rv for m in w1.dispatches()] == [2000, 2000]
