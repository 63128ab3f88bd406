"""The leader's side of worker claims (``common.claims``) over fake links: the claim set it sends, the pods it
leaves to their claimant, and how a claim ends (placed, handed back, moved, taken over)."""

from __future__ import annotations

import copy
from typing import Any

import pytest_asyncio

from common import protocol
from common.claims import claimant
from common.kube import KubeClient
from common.records import PodKey
from coordinator.dispatch.pending import DISPATCH_TIMEOUT
from tests.builders import PodBuilder
from tests.unit.dispatch.fakes import FakeLink, Rig

ZONE = "topology.kubernetes.io/zone"


@pytest_asyncio.fixture
async def rig(client: KubeClient) -> Rig:
    return Rig(client, claims=True)


def pod(name: str, cpu: str = "500m") -> dict[str, Any]:
    return PodBuilder(name).req(cpu=cpu, memory="1Gi").uid(f"uid-{name}").obj


def key(name: str) -> PodKey:
    return PodKey(f"default/{name}")


def claims_sent(link: FakeLink) -> list[tuple[str, ...]]:
    return [m.workers for m in link.sent if isinstance(m, protocol.Claims)]


def ready(rig: Rig, *names: str) -> list[FakeLink]:
    """The workers ``names``, connected and summarised (in the claim set)."""
    links = rig.workers(*names)
    for link in links:
        link.up().summary()
    return links


def named(
    workers: tuple[str, ...], want: str, count: int = 1, *, uid_suffixes: tuple[str, ...] = ("",)
) -> list[str]:
    """``count`` pod names whose claimant in ``workers`` is ``want`` (for each uid ``uid-NAME`` + suffix)."""
    out: list[str] = []
    i = 0
    while len(out) < count:
        name = f"p{i}"
        if all(claimant(f"uid-{name}{suffix}", workers) == want for suffix in uid_suffixes):
            out.append(name)
        i += 1
    return out


def hand_back(link: FakeLink, name: str, *, nodes: int = 4, uid: str = "") -> None:
    """``link``'s worker hands back its claim of the pod ``name`` (uid ``uid-NAME`` unless given)."""
    result = protocol.Result.unschedulable(
        protocol.CLAIMED,
        str(key(name)),
        nodes=nodes,
        reasons={"Insufficient cpu": nodes} if nodes else {},
        message="no",
        uid=uid or f"uid-{name}",
    )
    link.events.received(link, result)


async def test_the_claim_set_goes_to_every_worker_once_it_is_ready(rig: Rig) -> None:
    w1, w2 = rig.workers("w1", "w2")
    w1.up()
    assert claims_sent(w1) == [()]  # a new stream gets the set at once (empty so far)
    w1.summary()
    assert claims_sent(w1) == [(), ("w1",)]
    w2.up()
    assert claims_sent(w2) == [("w1",)]  # not ready (no summary): not in the set yet
    w2.summary()
    assert claims_sent(w1)[-1] == ("w1", "w2") and claims_sent(w2) == [("w1",), ("w1", "w2")]
    w2.summary()  # the same again: nothing new
    assert claims_sent(w2) == [("w1",), ("w1", "w2")]
    w2.summary(nodes=0)  # owns no node: out of the set
    assert claims_sent(w1)[-1] == ("w1",)
    w2.summary(placing=False)
    assert claims_sent(w1)[-1] == ("w1",)


async def test_a_plain_pod_is_left_to_its_claimant_and_never_dispatched(rig: Rig) -> None:
    w1, w2 = ready(rig, "w1", "w2")
    (mine,) = named(("w1", "w2"), "w2")
    rig.d.observe(pod(mine))
    rig.step()
    assert w1.dispatches() == [] and w2.dispatches() == []
    p = rig.d.table.pods[key(mine)]
    assert p.claimant == "w2" and not p.waiting
    assert rig.d.statistics()["claims"]["claimed_now"] == 1
    bound = pod(mine)
    bound["spec"]["nodeName"] = "node-1"
    rig.d.observe(bound)  # the watch shows it placed
    assert key(mine) not in rig.d.table and rig.d.statistics()["claims"]["claimed_now"] == 0


async def test_pods_for_the_leaders_path_are_dispatched(rig: Rig) -> None:
    (w1,) = ready(rig, "w1")
    rig.d.observe(PodBuilder("lane").req(cpu="100m").uid("uid-lane").spread(ZONE, {"a": "b"}).obj)
    rig.d.observe(PodBuilder("gated").req(cpu="100m").uid("uid-gated").gate("g").obj)
    rig.step()
    assert [m.pod["metadata"]["name"] for m in w1.dispatches()] == ["lane"]
    ungated = PodBuilder("gated").req(cpu="100m").uid("uid-gated").obj
    rig.d.observe(ungated)  # its gate lifted: now plain and ready, so claimed
    rig.step()
    assert rig.d.table.pods[key("gated")].claimant == "w1" and len(w1.dispatches()) == 1


async def test_a_handed_back_pod_goes_the_leaders_way_and_its_no_counts(rig: Rig) -> None:
    w1, w2 = ready(rig, "w1", "w2")
    (name,) = named(("w1", "w2"), "w1")
    rig.d.observe(pod(name))
    rig.step()
    hand_back(w2, name)  # not its claimant: ignored
    assert rig.d.table.pods[key(name)].claimant == "w1"
    hand_back(w1, name)
    rig.step()
    assert w1.dispatches() == []  # it said no: not sent back there
    [sent] = w2.dispatches()
    w2.unschedulable(sent.id, 4, {"Insufficient memory": 4})
    rig.step()
    [(_, message)] = rig.reporter.verdicts
    assert message.startswith("0/8 nodes are available: 4 Insufficient cpu, 4 Insufficient memory.")
    assert rig.d.statistics()["claims"]["handed_back"] == 1


async def test_a_pod_handed_back_untried_may_go_anywhere(rig: Rig) -> None:
    (w1,) = ready(rig, "w1")
    rig.d.observe(pod("a"))
    hand_back(w1, "a", nodes=0)  # rejected or zero nodes: not a no
    rig.step()
    assert len(w1.dispatches()) == 1


async def test_a_departing_claimant_leaves_its_claims_to_the_others(rig: Rig) -> None:
    w1, w2 = ready(rig, "w1", "w2")
    names = named(("w1", "w2"), "w2", count=3)
    for name in names:
        rig.d.observe(pod(name))
    w2.down()
    assert claims_sent(w1)[-1] == ("w1",)
    rig.step()
    assert all(rig.d.table.pods[key(n)].claimant == "w1" for n in names)
    assert w1.dispatches() == []
    w1.down()  # nobody left to claim: they wait for a worker, and count as lost dispatches for the lane
    assert all(rig.d.table.pods[key(n)].claimant is None for n in names)
    assert set(rig.d.lane.lost_dispatches) == {key(n) for n in names}
    w1.up().summary()
    rig.step()
    assert {m.pod["metadata"]["name"] for m in w1.dispatches()} == set(names)


async def test_a_claim_not_placed_in_time_is_taken_over(rig: Rig) -> None:
    (w1,) = ready(rig, "w1")
    rig.d.observe(pod("a"))
    rig.clock.advance(DISPATCH_TIMEOUT - 1)
    assert rig.d.expire_claims() == 0
    rig.clock.advance(2)
    assert rig.d.expire_claims() == 1
    rig.step()
    assert len(w1.dispatches()) == 1
    assert rig.d.statistics()["claims"]["taken_over"] == 1
    assert key("a") in rig.d.lane.lost_dispatches  # its claimant may still place it


async def test_a_claimant_placing_other_claims_keeps_its_claims(rig: Rig) -> None:
    ready(rig, "w1")
    rig.d.observe(pod("a"))
    rig.clock.advance(DISPATCH_TIMEOUT - 1)
    rig.d.observe(pod("b"))
    rig.clock.advance(2)
    placed = pod("b")
    placed["spec"]["nodeName"] = "node-1"
    rig.d.observe(placed)  # progressing: working through a long queue
    assert rig.d.expire_claims() == 0


async def test_a_lane_pod_waits_for_a_claimed_pod_its_anti_affinity_matches(rig: Rig) -> None:
    (w1,) = ready(rig, "w1")
    plain = PodBuilder("web").req(cpu="100m").uid("uid-web").label("app", "web").obj
    rig.d.observe(plain)
    assert rig.d.table.pods[key("web")].claimant == "w1"
    lane = PodBuilder("lane").req(cpu="100m").uid("uid-lane").pod_affinity(ZONE, {"app": "web"}, anti=True)
    rig.d.observe(lane.obj)
    rig.step()
    assert w1.dispatches() == []  # the claimed pod may be placed without seeing it, and it without seeing it
    placed = PodBuilder("web").req(cpu="100m").uid("uid-web").label("app", "web").on("node-1").obj
    placed["metadata"]["resourceVersion"] = "77"
    rig.d.observe(placed)
    rig.step()
    [sent] = w1.dispatches()
    assert sent.pod["metadata"]["name"] == "lane" and sent.min_rv >= 77


async def test_a_hand_back_before_the_leaders_watch_shows_the_pod_is_kept_for_its_claim(rig: Rig) -> None:
    w1, w2 = ready(rig, "w1", "w2")
    (name,) = named(("w1", "w2"), "w1")
    hand_back(w1, name)  # the worker's watch is ahead of the leader's
    rig.d.observe(pod(name))
    rig.step()
    assert rig.d.table.pods[key(name)].claimant is None
    [sent] = w2.dispatches()  # at once, to the other shard: no wait for the claim timeout
    assert sent.pod["metadata"]["name"] == name
    assert rig.d.statistics()["claims"]["handed_back"] == 1


async def test_a_hand_back_while_the_leader_still_sees_the_pod_gated_is_kept_for_its_claim(rig: Rig) -> None:
    (w1,) = ready(rig, "w1")
    rig.d.observe(PodBuilder("a").req(cpu="100m").uid("uid-a").gate("g").obj)
    hand_back(w1, "a", nodes=0)  # the worker saw the gate lifted first, and could not place it yet
    rig.d.observe(pod("a"))
    rig.step()
    assert rig.d.table.pods[key("a")].claimant is None and len(w1.dispatches()) == 1


async def test_an_early_hand_back_is_forgotten_after_a_while(rig: Rig) -> None:
    w1, _ = ready(rig, "w1", "w2")
    first, second = named(("w1", "w2"), "w1", count=2)
    hand_back(w1, first)
    rig.clock.advance(31)
    hand_back(w1, second)  # sweeps the first
    rig.d.observe(pod(first))
    assert rig.d.table.pods[key(first)].claimant == "w1"


async def test_a_hand_back_for_the_recreated_pod_of_the_same_name_is_kept_for_its_claim(rig: Rig) -> None:
    w1, w2 = ready(rig, "w1", "w2")
    (name,) = named(("w1", "w2"), "w1", uid_suffixes=("", "-new"))
    rig.d.observe(pod(name))  # claimed by w1
    # The worker's watch is ahead: it saw the pod deleted and created again, claimed the new one and could
    # not place it. The leader still holds the old one.
    hand_back(w1, name, uid=f"uid-{name}-new")
    assert rig.d.table.pods[key(name)].claimant == "w1"  # the old pod's claim stands
    rig.d.observe(PodBuilder(name).req(cpu="500m", memory="1Gi").uid(f"uid-{name}-new").obj)
    rig.step()
    p = rig.d.table.pods[key(name)]
    assert p.record.uid == f"uid-{name}-new" and p.claimant is None
    [sent] = w2.dispatches()  # at once, to the other shard: no wait for the claim timeout
    assert sent.pod["metadata"]["uid"] == f"uid-{name}-new" and w1.dispatches() == []


async def test_a_hand_back_for_the_successor_of_a_bound_pod_survives_the_old_pods_later_events(
    rig: Rig,
) -> None:
    # The leader watches phase Pending, so a bound pod that is still starting stays in its watch: its
    # deletion and DELETED come after its binding. A successor of the same name, handed back by a worker
    # whose watch is ahead, must keep its hand-back through them.
    w1, w2 = ready(rig, "w1", "w2")
    (name,) = named(("w1", "w2"), "w1", uid_suffixes=("", "-new"))
    feed = rig.d.reflector.handler
    feed.event("ADDED", pod(name))  # claimed by w1
    old = pod(name)
    old["spec"]["nodeName"] = "node-1"
    old["status"] = {"phase": "Pending"}
    feed.event("MODIFIED", old)  # its binding: forgotten
    assert key(name) not in rig.d.table
    # the successor, handed back before the leader's watch shows it
    hand_back(w1, name, uid=f"uid-{name}-new")
    deleting = copy.deepcopy(old)
    deleting["metadata"]["deletionTimestamp"] = "2026-12-04T00:00:00Z"
    feed.event("MODIFIED", deleting)
    feed.event("DELETED", deleting)
    feed.event("ADDED", PodBuilder(name).req(cpu="500m", memory="1Gi").uid(f"uid-{name}-new").obj)
    rig.step()
    p = rig.d.table.pods[key(name)]
    assert p.record.uid == f"uid-{name}-new" and p.claimant is None
    [sent] = w2.dispatches()  # at once, to the other shard: no wait for the claim timeout
    assert sent.pod["metadata"]["uid"] == f"uid-{name}-new"
