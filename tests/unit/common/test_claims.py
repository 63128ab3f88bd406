"""Which pods a worker may claim, and which worker claims each: the rule leader and workers compute alike."""

from __future__ import annotations

from collections import Counter

from common.claims import claimable, claimant
from common.records import pod_from_json
from common.wellknown import DEFAULT_SCHEDULER_NAME
from tests.builders import PodBuilder

ZONE = "topology.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"
UIDS = [f"uid-{i:05d}" for i in range(3000)]


def plain(name: str = "a") -> PodBuilder:
    return PodBuilder(name).req(cpu="100m").uid(f"uid-{name}")


def test_the_claimant_is_the_same_for_every_caller_and_order() -> None:
    workers = ["w1", "w2", "w3"]
    for uid in UIDS[:200]:
        assert (
            claimant(uid, workers) == claimant(uid, list(reversed(workers))) == claimant(uid, tuple(workers))
        )


def test_pods_spread_evenly_over_the_claim_set() -> None:
    counts = Counter(claimant(uid, ["w1", "w2", "w3"]) for uid in UIDS)
    assert set(counts) == {"w1", "w2", "w3"}
    assert all(800 <= n <= 1200 for n in counts.values()), counts  # a third each, give or take


def test_a_joining_worker_takes_pods_only_from_others_and_a_leaving_one_gives_only_its_own() -> None:
    before = {uid: claimant(uid, ["w1", "w2", "w3"]) for uid in UIDS}
    after = {uid: claimant(uid, ["w1", "w2", "w3", "w4"]) for uid in UIDS}
    moved = [uid for uid in UIDS if before[uid] != after[uid]]
    assert moved and all(after[uid] == "w4" for uid in moved)  # nothing moves between the others
    assert 500 <= len(moved) <= 1000  # about a quarter
    left = {uid: claimant(uid, ["w1", "w3"]) for uid in UIDS}
    assert all(left[uid] == before[uid] for uid in UIDS if before[uid] != "w2")


def test_no_claimant_without_workers_or_uid() -> None:
    assert claimant("uid-1", []) is None
    assert claimant("", ["w1"]) is None


def test_plain_pods_are_claimable() -> None:
    assert claimable(plain().record(), DEFAULT_SCHEDULER_NAME)
    # a hostname anti-affinity is shard-local, preferred terms and ScheduleAnyway are scores
    assert claimable(plain().pod_affinity(HOSTNAME, {"a": "b"}, anti=True).record(), DEFAULT_SCHEDULER_NAME)
    assert claimable(plain().pod_affinity(ZONE, {"a": "b"}, weight=5).record(), DEFAULT_SCHEDULER_NAME)
    assert claimable(plain().spread(ZONE, {"a": "b"}, hard=False).record(), DEFAULT_SCHEDULER_NAME)


def test_pods_for_the_leaders_path_are_not_claimable() -> None:
    name = DEFAULT_SCHEDULER_NAME
    assert not claimable(plain().spread(ZONE, {"a": "b"}).record(), name)  # the topology lane
    assert not claimable(plain().pod_affinity(ZONE, {"a": "b"}, anti=True).record(), name)
    assert not claimable(plain().pod_affinity(HOSTNAME, {"a": "b"}).record(), name)
    assert not claimable(plain().gate("wait").record(), name)
    assert not claimable(plain().nominated("n1").record(), name)  # a preemption under way
    assert not claimable(plain().deleting().record(), name)
    assert not claimable(plain().on("n1").record(), name)
    assert not claimable(plain().record(), "another-scheduler")
    assert not claimable(PodBuilder("a").req(cpu="100m").record(), name)  # no uid: nothing to hash
    bad = plain().req(cpu="lots").json()
    assert pod_from_json(bad).parse_error is not None
    assert not claimable(pod_from_json(bad), name)  # reported by the leader, never claimed
