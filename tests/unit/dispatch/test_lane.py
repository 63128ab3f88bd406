"""The topology lane in the dispatcher (``coordinator.dispatch.lane``), over fake links and a fake clock: lane
pods go out one at a time, each DISPATCH carries the right ``min_rv``, the anti-affinity waits of rule 3 hold
both ways, a lost lane dispatch holds the lane, and the watch (events and relists) settles lane pods."""

from __future__ import annotations

from typing import Any

from common import protocol
from common.claims import lane_rule
from common.records import PodKey
from coordinator import metrics as coordinator_metrics
from coordinator.dispatch.lane import (
    ANTI_AFFINITY,
    BUSY,
    LOST,
    LOST_HOLD,
    MAX_IN_FLIGHT,
    _Interactions,
    interact,
)
from tests.builders import PodBuilder
from tests.unit.dispatch.fakes import FakeLink, Rig

ZONE = "topology.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"


def key(name: str) -> PodKey:
    return PodKey(f"default/{name}")


def spread(name: str, group: str = "s") -> dict[str, Any]:
    return PodBuilder(name).req(cpu="100m").label("group", group).spread(ZONE, {"group": group}).obj


def zone_anti(name: str, owner: str = "o") -> dict[str, Any]:
    b = PodBuilder(name).req(cpu="100m").label("owner", owner)
    return b.pod_affinity(ZONE, {"owner": owner}, anti=True).obj


def plain(name: str, **labels: str) -> dict[str, Any]:
    b = PodBuilder(name).req(cpu="100m")
    for k, v in labels.items():
        b.label(k, v)
    return b.obj


def dispatches(link: FakeLink, name: str) -> list[protocol.Dispatch]:
    return [m for m in link.dispatches() if m.pod["metadata"]["name"] == name]


def left_pending(rig: Rig, obj: dict[str, Any], rv: int) -> None:
    """The pending watch shows the pod leave the pending set (bound or deleted) at ``rv``."""
    gone = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(rv)}}
    rig.d.reflector.handler.event("DELETED", gone)


def waits(reason: str) -> float:
    value = coordinator_metrics.lane_waits.labels(reason)._value.get()
    assert isinstance(value, float)
    return value


def one_worker(rig: Rig) -> FakeLink:
    (w1,) = rig.workers("w1")
    w1.up().summary()
    return w1


def test_which_pods_are_lane_pods() -> None:
    assert lane_rule(PodBuilder("a").spread(ZONE, {"a": "b"}).record()) is not None
    assert lane_rule(PodBuilder("a").spread(HOSTNAME, {"a": "b"}).record()) is not None  # skew spans shards
    assert lane_rule(PodBuilder("a").spread(ZONE, {"a": "b"}, hard=False).record()) is None  # a score
    assert lane_rule(PodBuilder("a").pod_affinity(ZONE, {"a": "b"}, anti=True).record()) is not None
    assert lane_rule(PodBuilder("a").pod_affinity(HOSTNAME, {"a": "b"}, anti=True).record()) is None
    assert lane_rule(PodBuilder("a").pod_affinity(HOSTNAME, {"a": "b"}).record()) is not None
    assert lane_rule(PodBuilder("a").pod_affinity(ZONE, {"a": "b"}, weight=5).record()) is None
    assert lane_rule(PodBuilder("a").pod_affinity(ZONE, {"a": "b"}, anti=True, weight=5).record()) is None
    assert lane_rule(PodBuilder("a").record()) is None


async def test_lane_pods_go_one_at_a_time_and_carry_the_last_placement(rig: Rig) -> None:
    w1 = one_worker(rig)
    busy_before = waits(BUSY)
    for name in ("s1", "s2", "s3"):
        rig.d.observe(spread(name))
    rig.step()
    [first] = dispatches(w1, "s1")
    assert first.min_rv == 0
    assert dispatches(w1, "s2") == dispatches(w1, "s3") == []
    assert waits(BUSY) == busy_before + 2
    assert rig.d.statistics()["waiting_for_lane"] == 2

    w1.bound(first.id)  # a RESULT bound does not settle it: the binding's resourceVersion is not known yet
    rig.step()
    assert dispatches(w1, "s2") == []

    left_pending(rig, spread("s1"), 120)
    rig.step()
    [second] = dispatches(w1, "s2")
    assert second.min_rv == 120  # the worker decides s2 only once its watch has shown s1's binding
    assert dispatches(w1, "s3") == []
    left_pending(rig, spread("s2"), 130)
    rig.step()
    [third] = dispatches(w1, "s3")
    assert third.min_rv == 130
    assert waits(BUSY) == busy_before + 2  # counted once per wait, however often the pod was considered


def test_which_lane_pods_interact() -> None:
    """Rule 1: one's labels match a selector of the other's required rules, either way."""
    s1 = PodBuilder("s1").label("group", "a").spread(ZONE, {"group": "a"}).record()
    s2 = PodBuilder("s2").label("group", "a").spread(ZONE, {"group": "a"}).record()
    other = PodBuilder("o").label("group", "b").spread(ZONE, {"group": "b"}).record()
    assert interact(s1, s2) and not interact(s1, other)
    # a spread selector counts pods of its own namespace only
    elsewhere = PodBuilder("e", namespace="x").label("group", "a").spread(ZONE, {"group": "z"}).record()
    assert not interact(s1, elsewhere)
    # the symmetric rule: b's anti-affinity term matches a, whose own rules do not read b
    anti = PodBuilder("n").label("k", "v").pod_affinity(ZONE, {"group": "a"}, anti=True).record()
    assert interact(s1, anti) and interact(anti, s1)
    # affinity to a group, and the group
    near = PodBuilder("near").label("g", "n").pod_affinity(ZONE, {"group": "b"}).record()
    assert interact(near, other) and not interact(near, s1)
    # a score does not make pods interact
    soft = PodBuilder("soft").label("g", "s").spread(ZONE, {"group": "a"}, hard=False).record()
    assert not interact(soft, PodBuilder("x").label("q", "r").record())
    assert not interact(
        s1, PodBuilder("soft2").label("g", "s").pod_affinity(ZONE, {"group": "a"}, weight=3).record()
    )


def test_lane_pods_that_could_count_one_pod_interact() -> None:
    """Rule 1's second half: when one pod could count for a rule of each, both decisions read it."""
    web = PodBuilder("w").label("app", "web").spread(ZONE, {"app": "web"}).record()
    front = PodBuilder("f").label("x", "2").spread(ZONE, {"tier": "front"}).record()
    other_app = PodBuilder("o").label("x", "3").spread(ZONE, {"app": "db"}).record()
    assert interact(web, front)  # a pod labelled app=web, tier=front counts for both
    assert not interact(web, other_app)  # app=web and app=db: no pod is both
    not_web = PodBuilder("n").label("x", "4")
    not_web.pod_affinity(ZONE, expressions=[{"key": "app", "operator": "NotIn", "values": ["web"]}])
    assert not interact(web, not_web.record())
    absent = PodBuilder("a").label("x", "5")
    absent.pod_affinity(ZONE, expressions=[{"key": "app", "operator": "DoesNotExist"}])
    assert not interact(web, absent.record())
    other_ns = PodBuilder("e", namespace="elsewhere").label("x", "6").spread(ZONE, {"app": "web"}).record()
    assert not interact(web, other_ns)  # spread selectors count their own namespace only
    everywhere = PodBuilder("v", namespace="elsewhere").label("x", "7")
    everywhere.pod_affinity(ZONE, {"app": "web"}, namespace_selector={})
    assert interact(web, everywhere.record())


def test_the_lanes_remembered_interactions_agree_with_interact() -> None:
    """``interact`` per pair of shapes (namespace, labels, rules): the same answer for every pair, a pod whose
    labels changed gets its new shape, and after the memory starts over no old shape id names a new shape."""
    pods = [
        PodBuilder("s1").label("group", "a").spread(ZONE, {"group": "a"}).record(),
        PodBuilder("s2").label("group", "a").spread(ZONE, {"group": "a"}).record(),
        PodBuilder("o").label("group", "b").spread(ZONE, {"group": "b"}).record(),
        PodBuilder("e", namespace="x").label("group", "a").spread(ZONE, {"group": "z"}).record(),
        PodBuilder("n").label("k", "v").pod_affinity(ZONE, {"group": "a"}, anti=True).record(),
        PodBuilder("near").label("g", "n").pod_affinity(ZONE, {"group": "b"}).record(),
        PodBuilder("w").label("app", "web").spread(ZONE, {"app": "web"}).record(),
        PodBuilder("f").label("x", "2").spread(ZONE, {"tier": "front"}).record(),
    ]
    memo = _Interactions()
    for _ in range(2):  # the second round answers from memory
        for a in pods:
            for b in pods:
                assert memo.between(a, memo.shape(a), b, memo.shape(b)) == interact(a, b), (a.key, b.key)
    assert memo.shape(pods[0]) == memo.shape(pods[1])  # one template, one shape
    relabelled = PodBuilder("s1").label("group", "b").spread(ZONE, {"group": "a"}).record()
    assert memo.shape(relabelled) == memo.shape(
        PodBuilder("z").label("group", "b").spread(ZONE, {"group": "a"}).record()
    )
    assert memo.between(relabelled, memo.shape(relabelled), pods[2], memo.shape(pods[2]))  # now in group b
    old = memo.shape(pods[2])
    memo.start_over()  # as past MAX_SHAPES
    assert all(memo.shape(p) != old for p in pods if p is not pods[2])
    # a pod in flight keeps its old id: asked against a new shape, the pair is decided again, correctly
    assert memo.between(pods[0], memo.shape(pods[0]), pods[2], old) == interact(pods[0], pods[2])


async def test_a_departure_wakes_as_many_pods_waiting_for_room_as_there_is_room(rig: Rig) -> None:
    """Pods waiting for room in a full lane are woken as many as there is room, first come first, not all of
    them on every departure (each woken pod is checked against every lane pod in flight)."""
    w1 = one_worker(rig)
    extra = 5
    for i in range(MAX_IN_FLIGHT + extra):
        rig.d.observe(spread(f"g{i}", group=f"g{i}"))
    rig.step()
    assert rig.d.lane.in_flight == MAX_IN_FLIGHT and rig.d.lane_waiting() == extra
    left_pending(rig, spread("g0", group="g0"), 10)
    assert len(rig.d.table.ready) == 1  # one slot: one pod woken, the first that waited
    rig.step()
    assert [m.pod["metadata"]["name"] for m in w1.dispatches()][-1] == f"g{MAX_IN_FLIGHT}"
    left_pending(rig, spread("g1", group="g1"), 11)
    left_pending(rig, spread("g2", group="g2"), 12)
    rig.step()
    names = [m.pod["metadata"]["name"] for m in w1.dispatches()]
    assert names[-2:] == [f"g{MAX_IN_FLIGHT + 1}", f"g{MAX_IN_FLIGHT + 2}"]
    assert rig.d.lane.in_flight == MAX_IN_FLIGHT and rig.d.lane_waiting() == extra - 3


async def test_independent_lane_pods_go_side_by_side(rig: Rig) -> None:
    w1 = one_worker(rig)
    rig.d.observe(spread("a1", group="a"))
    rig.d.observe(spread("a2", group="a"))
    rig.d.observe(spread("b1", group="b"))
    rig.d.observe(zone_anti("o1", owner="o"))
    rig.step()
    # o1's anti-affinity (owner=o) and a1's spread (group=a) could both count one pod labelled with both
    assert [len(dispatches(w1, n)) for n in ("a1", "a2", "b1", "o1")] == [1, 0, 1, 0]
    assert rig.d.lane.in_flight == 2
    left_pending(rig, spread("b1", group="b"), 50)  # b's settling does not release a2
    rig.step()
    assert dispatches(w1, "a2") == []
    left_pending(rig, spread("a1", group="a"), 60)
    rig.step()
    [a2] = dispatches(w1, "a2")
    assert a2.min_rv == 60


async def test_the_lane_holds_at_most_max_in_flight(rig: Rig) -> None:
    w1 = one_worker(rig)
    for i in range(MAX_IN_FLIGHT + 2):
        rig.d.observe(spread(f"g{i}", group=f"g{i}"))
    rig.step()
    assert rig.d.lane.in_flight == MAX_IN_FLIGHT
    assert len(w1.dispatches()) == MAX_IN_FLIGHT
    left_pending(rig, spread("g0", group="g0"), 10)
    rig.step()
    assert rig.d.lane.in_flight == MAX_IN_FLIGHT and len(w1.dispatches()) == MAX_IN_FLIGHT + 1


async def test_plain_pods_flow_while_a_lane_pod_is_in_flight(rig: Rig) -> None:
    w1 = one_worker(rig)
    rig.d.observe(spread("s1"))
    rig.step()
    for i in range(5):
        rig.d.observe(
            plain(f"p{i}", group="s")
        )  # matches the spread selector: no wait (see the lane's rules)
    rig.step()
    assert all(len(dispatches(w1, f"p{i}")) == 1 for i in range(5))
    assert rig.d.lane.in_flight == 1
    [s1] = dispatches(w1, "s1")
    w1.bound(s1.id)
    left_pending(rig, spread("s1"), 200)
    assert rig.d.lane.in_flight == 0
    rig.d.observe(plain("late"))
    rig.step()
    [late] = dispatches(w1, "late")
    assert (
        late.min_rv == 200
    )  # plain pods see every settled lane placement (whose anti-affinity may bind them)


async def test_plain_pods_min_rv_ignores_plain_placements(rig: Rig) -> None:
    """A plain pod's decision needs the lane placements only: plain bindings do not raise its min_rv, but
    they do raise a lane pod's."""
    w1 = one_worker(rig)
    rig.d.observe(plain("p1"))
    rig.step()
    left_pending(rig, plain("p1"), 300)
    rig.d.observe(plain("p2"))
    rig.d.observe(spread("s1"))
    rig.step()
    assert dispatches(w1, "p2")[0].min_rv == 0
    assert dispatches(w1, "s1")[0].min_rv == 300


async def test_a_plain_pod_matching_the_lane_pods_anti_affinity_waits(rig: Rig) -> None:
    """Rule 3, first half: the intruder would be kept out of the lane pod's zone by the symmetric rule, but
    its worker cannot see the lane pod until it is bound."""
    w1 = one_worker(rig)
    before = waits(ANTI_AFFINITY)
    rig.d.observe(zone_anti("a1"))
    rig.step()
    rig.d.observe(plain("intruder", owner="o"))
    rig.d.observe(plain("stranger", owner="other"))
    rig.step()
    assert dispatches(w1, "intruder") == [] and len(dispatches(w1, "stranger")) == 1
    assert waits(ANTI_AFFINITY) == before + 1
    [a1] = dispatches(w1, "a1")
    w1.bound(a1.id)
    rig.step()
    assert dispatches(w1, "intruder") == []  # bound, but not seen yet: still in flight
    left_pending(rig, zone_anti("a1"), 410)
    rig.step()
    [intruder] = dispatches(w1, "intruder")
    assert intruder.min_rv == 410


async def test_a_lane_pod_with_anti_affinity_waits_for_matching_pods_in_flight(rig: Rig) -> None:
    """Rule 3, second half: a matching pod dispatched (or bound and not yet seen) may land in any zone; the
    lane pod's worker must see it first."""
    w1 = one_worker(rig)
    rig.d.observe(plain("intruder", owner="o"))
    rig.step()
    [intruder] = dispatches(w1, "intruder")
    rig.d.observe(zone_anti("a1"))
    rig.step()
    assert dispatches(w1, "a1") == []
    assert rig.d.lane.in_flight == 0  # waiting for a pod in flight does not take the lane
    rig.d.observe(spread("s1"))  # another lane pod may go meanwhile
    rig.step()
    [s1] = dispatches(w1, "s1")
    w1.bound(s1.id)
    left_pending(rig, spread("s1"), 500)

    w1.bound(intruder.id)
    rig.step()
    assert dispatches(w1, "a1") == []  # answered bound, not yet seen by the watch
    left_pending(rig, plain("intruder", owner="o"), 510)
    rig.step()
    [a1] = dispatches(w1, "a1")
    assert a1.min_rv == 510


async def test_anti_affinity_waits_count_the_namespace(rig: Rig) -> None:
    w1 = one_worker(rig)
    rig.d.observe(zone_anti("a1"))
    rig.step()
    other_ns = PodBuilder("intruder", namespace="elsewhere").req(cpu="100m").label("owner", "o").obj
    rig.d.observe(other_ns)  # the term's namespaces default to the pod's own: no match
    rig.step()
    assert [m for m in w1.dispatches() if m.pod["metadata"]["name"] == "intruder"]


async def test_hostname_anti_affinity_is_not_in_the_lane(rig: Rig) -> None:
    w1 = one_worker(rig)
    for i in range(3):
        rig.d.observe(PodBuilder(f"h{i}").label("g", "h").pod_affinity(HOSTNAME, {"g": "h"}, anti=True).obj)
    rig.step()
    assert all(len(dispatches(w1, f"h{i}")) == 1 for i in range(3))
    assert rig.d.lane.in_flight == 0


async def test_an_answer_without_placement_frees_the_lane(rig: Rig) -> None:
    w1 = one_worker(rig)
    rig.d.observe(spread("s1"))
    rig.d.observe(spread("s2"))
    rig.step()
    [s1] = dispatches(w1, "s1")
    w1.rejected(s1.id)
    rig.step()
    [s2] = dispatches(w1, "s2")
    assert s2.min_rv == 0
    w1.unschedulable(s2.id, 4, {"node(s) didn't match pod topology spread constraints": 4})
    assert rig.d.lane.in_flight == 0


async def test_a_lane_pod_no_shard_can_place_is_tried_everywhere_then_declared(rig: Rig) -> None:
    w1, w2 = rig.workers("w1", "w2")
    w1.up().summary()
    w2.up().summary()
    rig.d.observe(spread("s1"))
    rig.step()
    first = w1 if dispatches(w1, "s1") else w2
    second = w2 if first is w1 else w1
    first.unschedulable(dispatches(first, "s1")[0].id, 4, {"skew": 4})
    rig.step()
    [again] = dispatches(second, "s1")
    second.unschedulable(again.id, 4, {"skew": 4})
    rig.step()
    assert rig.reporter.keys() == [key("s1")]
    assert rig.d.lane.in_flight == 0


async def test_a_lost_lane_dispatch_holds_the_lane(rig: Rig) -> None:
    """Rule 4: the worker that had the pod may still bind it, so no other lane pod goes out for a while; the
    lost pod itself may go out again at once."""
    w1, w2 = rig.workers("w1", "w2")
    w1.up().summary()
    w2.up().summary(nodes=0, placing=False)  # connected (it binds nothing of an earlier term), not placing
    rig.d.observe(spread("s1"))
    rig.d.observe(spread("s2"))
    rig.step()
    assert len(dispatches(w1, "s1")) == 1
    before = waits(LOST)
    w2.up().summary()
    w1.down()
    rig.step()
    assert len(dispatches(w2, "s1")) == 1  # the lost pod again, elsewhere
    [s1] = dispatches(w2, "s1")
    w2.unschedulable(s1.id, 4, {"skew": 4})
    rig.step()
    assert dispatches(w2, "s2") == []  # w1 might still bind s1: hold
    assert waits(LOST) == before + 1
    rig.clock.advance(LOST_HOLD + 1)
    rig.rescan()
    rig.step()
    assert len(dispatches(w2, "s2")) == 1


async def test_the_hold_ends_when_the_watch_shows_the_lost_pod(rig: Rig) -> None:
    w1, w2 = rig.workers("w1", "w2")
    w1.up().summary()
    rig.d.observe(spread("s1"))
    rig.d.observe(spread("s2"))
    rig.step()
    w2.up().summary()
    w1.down()  # s1 lost; before it goes out again, the watch shows it bound (w1 had bound it after all)
    left_pending(rig, spread("s1"), 700)
    rig.step()
    [s2] = dispatches(w2, "s2")
    assert s2.min_rv == 700


async def test_a_relist_settles_the_lane_pod_it_no_longer_lists(rig: Rig) -> None:
    w1 = one_worker(rig)
    rig.d.observe(spread("s1"))
    rig.d.observe(spread("s2"))
    rig.step()
    [s1] = dispatches(w1, "s1")
    w1.bound(s1.id)
    rig.d.reflector.resource_version = "900"
    rig.d.reflector.handler.replace([spread("s2")])  # s1's binding happened while the watch was down
    rig.step()
    [s2] = dispatches(w1, "s2")
    assert s2.min_rv == 900
    assert rig.d.lane.unseen == {}


async def test_a_deleted_lane_pod_frees_the_lane(rig: Rig) -> None:
    w1 = one_worker(rig)
    rig.d.observe(spread("s1"))
    rig.d.observe(spread("s2"))
    rig.step()
    left_pending(rig, spread("s1"), 40)
    rig.step()
    assert len(dispatches(w1, "s2")) == 1


async def test_lane_statistics_and_backlog(rig: Rig) -> None:
    one_worker(rig)
    rig.d.observe(spread("s1"))
    rig.d.observe(spread("s2"))
    rig.step()
    stats = rig.d.statistics()
    assert stats["lane"]["in_flight"] == [key("s1")]
    assert stats["waiting_for_lane"] == 1
    assert rig.d.lane.in_flight == 1 and rig.d.lane_waiting() == 1


async def test_a_lost_plain_pod_still_counts_for_anti_affinity(rig: Rig) -> None:
    """Rule 4 for any pod: the worker whose stream died may still bind the intruder, so a lane pod whose
    anti-affinity matches it waits until the watch shows it or the hold ends."""
    w1, w2 = rig.workers("w1", "w2")
    w1.up().summary()
    w2.up().summary(nodes=0, placing=False)  # connected (it binds nothing of an earlier term), not placing
    rig.d.observe(plain("intruder", owner="o"))
    rig.step()
    assert len(dispatches(w1, "intruder")) == 1
    w1.down()  # lost; w2 places nothing, so the intruder waits in the table, dispatched nowhere
    rig.d.observe(zone_anti("a1"))
    w2.up().summary()
    rig.step()
    [again] = dispatches(w2, "intruder")
    w2.unschedulable(again.id, 4, {"no": 4})  # the new dispatch placed nothing; the lost one still may
    rig.step()
    assert dispatches(w2, "a1") == []
    rig.clock.advance(LOST_HOLD + 1)
    assert rig.d.lane.expire(rig.clock())
    rig.rescan()
    rig.step()
    assert len(dispatches(w2, "a1")) == 1


async def test_independent_lane_pods_pass_a_lost_one(rig: Rig) -> None:
    w1, w2 = rig.workers("w1", "w2")
    w1.up().summary()
    rig.d.observe(spread("a1", group="a"))
    rig.step()
    w2.up().summary()
    w1.down()
    rig.d.observe(spread("a2", group="a"))
    rig.d.observe(spread("b1", group="b"))
    rig.step()
    assert len(dispatches(w2, "b1")) == 1  # does not interact with the lost a1
    assert len(dispatches(w2, "a1")) == 1  # the lost pod itself goes out again at once
    assert dispatches(w2, "a2") == []
