"""Handoff rules: release before grant, acks by epoch and lease, dead leases, departed workers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from common.etcd.keys import WorkerId
from common.etcd.schema import ReleaseAck, ShardAssignment
from common.records import NodeName
from coordinator.workershards import handoff

A, B = WorkerId("a"), WorkerId("b")


def ns(*names: str) -> frozenset[NodeName]:
    return frozenset(NodeName(n) for n in names)


def shard(
    worker: WorkerId, lease: int, epoch: int, granted: Iterable[str] = (), revoking: Iterable[str] = ()
) -> ShardAssignment:
    return ShardAssignment(worker, lease, epoch, ns(*granted), ns(*revoking))


def observed(
    assignments: Mapping[WorkerId, ShardAssignment],
    members: Mapping[WorkerId, int],
    acks: Mapping[WorkerId, ReleaseAck] | None = None,
    dead: Iterable[int] = (),
) -> handoff.Observed:
    return handoff.Observed(assignments, members, acks or {}, dict.fromkeys(dead, 0.0))


def assert_disjoint(assignments: Mapping[WorkerId, ShardAssignment | None]) -> None:
    seen: set[NodeName] = set()
    for a in assignments.values():
        if a is not None:
            assert not (a.held & seen)
            seen |= a.held


def test_move_is_revoke_then_grant_after_ack() -> None:
    pool = ns("x", "y")
    members = {A: 1, B: 2}
    stored = {A: shard(A, 1, 5, granted=["x", "y"]), B: shard(B, 2, 5)}
    target = {NodeName("x"): A, NodeName("y"): B}

    # Round 1: y is revoked from A; B gets nothing yet.
    wanted = handoff.apply_targets(handoff.settle(observed(stored, members)), members, target, pool)
    assert wanted[A] == shard(A, 1, 5, granted=["x"], revoking=["y"])
    assert wanted[B] == shard(B, 2, 5)
    assert_disjoint(wanted)

    # Written at epoch 6. An ack of an older epoch frees nothing.
    stored = {A: shard(A, 1, 6, granted=["x"], revoking=["y"]), B: shard(B, 2, 5)}
    old_ack = {A: ReleaseAck(A, 1, 5)}
    wanted = handoff.apply_targets(handoff.settle(observed(stored, members, old_ack)), members, target, pool)
    assert handoff.changes(stored, wanted) == {}

    # An ack under another lease frees nothing either.
    wrong_lease = {A: ReleaseAck(A, 99, 6)}
    wanted = handoff.apply_targets(
        handoff.settle(observed(stored, members, wrong_lease)), members, target, pool
    )
    assert handoff.changes(stored, wanted) == {}

    # The ack of epoch 6: y leaves A and goes to B in the same write.
    ack = {A: ReleaseAck(A, 1, 6, ns("y"))}
    wanted = handoff.apply_targets(handoff.settle(observed(stored, members, ack)), members, target, pool)
    assert wanted[A] == shard(A, 1, 6, granted=["x"])
    assert wanted[B] == shard(B, 2, 5, granted=["y"])
    assert_disjoint(wanted)


def test_departed_worker_keeps_holding_until_its_lease_is_confirmed_gone() -> None:
    pool = ns("x")
    stored = {A: shard(A, 1, 3, granted=["x"])}
    target = {NodeName("x"): B}
    members = {B: 2}
    obs = observed(stored, members)
    assert handoff.suspect_leases(obs) == {1}
    wanted = handoff.apply_targets(handoff.settle(obs), members, target, pool)
    assert wanted[A] == shard(A, 1, 3, revoking=["x"])
    assert wanted[B] == shard(B, 2, 0)
    assert_disjoint(wanted)

    # etcd says lease 1 is gone: A's assignment is deleted and x goes to B in the same write.
    obs = observed(stored, members, dead=[1])
    assert handoff.suspect_leases(obs) == set()
    wanted = handoff.apply_targets(handoff.settle(obs), members, target, pool)
    assert wanted[A] is None
    assert wanted[B] == shard(B, 2, 0, granted=["x"])
    assert handoff.changes(stored, wanted)[A] is None


def test_new_incarnation_starts_empty_only_after_the_old_lease_is_gone() -> None:
    pool = ns("x")
    stored = {A: shard(A, 1, 3, granted=["x"])}
    target = {NodeName("x"): A}
    members = {A: 7}  # A came back with lease 7
    wanted = handoff.apply_targets(handoff.settle(observed(stored, members)), members, target, pool)
    assert wanted[A] == shard(A, 1, 3, revoking=["x"])  # still the old incarnation's, nothing granted
    wanted = handoff.apply_targets(handoff.settle(observed(stored, members, dead=[1])), members, target, pool)
    assert wanted[A] == shard(A, 7, 3, granted=["x"])


def test_departed_worker_that_acked_everything_is_deleted_without_waiting_for_expiry() -> None:
    stored = {A: shard(A, 1, 4, revoking=["x"])}
    settled = handoff.settle(observed(stored, {}, {A: ReleaseAck(A, 1, 4)}))
    assert settled == {A: None}


def test_nodes_leaving_the_pool_are_revoked_and_never_granted() -> None:
    members = {A: 1, B: 2}
    stored = {A: shard(A, 1, 1, granted=["x", "gone"]), B: shard(B, 2, 1)}
    target = {NodeName("x"): A, NodeName("gone"): B}
    wanted = handoff.apply_targets(handoff.settle(observed(stored, members)), members, target, ns("x"))
    assert wanted[A] == shard(A, 1, 1, granted=["x"], revoking=["gone"])
    assert wanted[B] == shard(B, 2, 1)


def test_a_held_node_is_never_granted_even_if_the_target_says_so() -> None:
    members = {A: 1, B: 2}
    stored = {A: shard(A, 1, 1, revoking=["x"]), B: shard(B, 2, 1)}
    wanted = handoff.apply_targets(
        handoff.settle(observed(stored, members)), members, {NodeName("x"): B}, ns("x")
    )
    assert wanted[B] == shard(B, 2, 1)
    assert sum(len(a.revoking) for a in wanted.values() if a is not None) == 1


def test_corrupt_double_holding_grants_nothing_more() -> None:
    members = {A: 1, B: 2}
    stored = {A: shard(A, 1, 1, granted=["x"]), B: shard(B, 2, 1, granted=["x"])}
    held = handoff.holders(stored)
    assert held[NodeName("x")] == A
    wanted = handoff.apply_targets(
        handoff.settle(observed(stored, members)), members, {NodeName("x"): A}, ns("x")
    )
    assert wanted[B] == shard(B, 2, 1, revoking=["x"])  # B's claim is withdrawn through the normal path


def test_changes_ignore_epochs() -> None:
    stored = {A: shard(A, 1, 1, granted=["x"])}
    assert handoff.changes(stored, {A: shard(A, 1, 9, granted=["x"])}) == {}
    assert handoff.changes(stored, {A: shard(A, 2, 1, granted=["x"])}) == {A: shard(A, 2, 1, granted=["x"])}
    assert handoff.changes({}, {A: None}) == {}


def test_a_dead_lease_frees_its_nodes_only_after_the_grant_delay() -> None:
    """Rule 3b on a fake clock: confirmed gone at t=100; with a 5 s grant delay the node stays held (as
    revoking, granted to nobody) until t=105, so a binding its old holder sent before fencing has landed."""
    pool = ns("x")
    stored = {A: shard(A, 1, 3, granted=["x"])}
    target = {NodeName("x"): B}
    members = {B: 2}

    def at(now: float) -> dict[WorkerId, ShardAssignment | None]:
        obs = handoff.Observed(stored, members, {}, {1: 100.0}, now=now, grant_delay=5.0)
        assert handoff.suspect_leases(obs) == set()  # etcd is not asked again
        return handoff.apply_targets(handoff.settle(obs), members, target, pool)

    for now in (100.0, 102.5, 104.999):
        wanted = at(now)
        assert wanted[A] == shard(A, 1, 3, revoking=["x"])
        assert wanted[B] == shard(B, 2, 0)  # nothing granted yet
        assert_disjoint(wanted)
    wanted = at(105.0)
    assert wanted[A] is None
    assert wanted[B] == shard(B, 2, 0, granted=["x"])


def test_a_new_incarnation_waits_for_the_grant_delay_too() -> None:
    stored = {A: shard(A, 1, 3, granted=["x"])}
    members = {A: 7}
    target = {NodeName("x"): A}

    def at(now: float) -> ShardAssignment | None:
        obs = handoff.Observed(stored, members, {}, {1: 10.0}, now=now, grant_delay=5.0)
        return handoff.apply_targets(handoff.settle(obs), members, target, ns("x"))[A]

    assert at(14.0) == shard(A, 1, 3, revoking=["x"])
    assert at(15.0) == shard(A, 7, 3, granted=["x"])


def test_an_ack_under_a_live_lease_needs_no_grant_delay() -> None:
    """A graceful release (acknowledged after the holder's bindings to the node ended) moves at once."""
    stored = {A: shard(A, 1, 4, revoking=["x"])}
    members = {A: 1, B: 2}
    acks = {A: ReleaseAck(A, 1, 4, ns("x"))}
    obs = handoff.Observed(stored, members, acks, {}, now=0.0, grant_delay=5.0)
    wanted = handoff.apply_targets(handoff.settle(obs), members, {NodeName("x"): B}, ns("x"))
    assert wanted[B] == shard(B, 2, 0, granted=["x"])


def test_a_graceful_leave_needs_no_grant_delay() -> None:
    """The worker acknowledged releasing everything it was granted, then revoked its lease (rule 3c)."""
    stored = {A: shard(A, 1, 4, granted=["x", "y"])}
    members = {B: 2}
    target = {NodeName("x"): B, NodeName("y"): B}
    everything = {A: ReleaseAck(A, 1, 4, ns("x", "y"))}
    obs = handoff.Observed(stored, members, everything, {1: 10.0}, now=10.0, grant_delay=5.0)
    wanted = handoff.apply_targets(handoff.settle(obs), members, target, ns("x", "y"))
    assert wanted[A] is None and wanted[B] == shard(B, 2, 0, granted=["x", "y"])
    # Releasing only part of it, or under an older epoch, is not enough: the grant delay applies.
    for ack in (
        ReleaseAck(A, 1, 4, ns("x")),
        ReleaseAck(A, 1, 3, ns("x", "y")),
        ReleaseAck(A, 9, 4, ns("x", "y")),
    ):
        obs = handoff.Observed(stored, members, {A: ack}, {1: 10.0}, now=10.0, grant_delay=5.0)
        wanted = handoff.apply_targets(handoff.settle(obs), members, target, ns("x", "y"))
        assert wanted[A] == shard(A, 1, 4, revoking=["x", "y"]) and wanted[B] == shard(B, 2, 0)
