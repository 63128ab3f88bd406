"""Handoff rules: how the leader moves the stored shard map toward the policy's target without ever
letting two workers use one node. Pure functions over records; ``coordinator.workershards.shardmap`` does
the I/O.

A worker *holds* a node when the node is in its assignment's granted or revoking set. The rules:

1. A node is granted only if nobody holds it (``apply_targets``).
2. A granted node leaves its holder only through revoking: granted -> revoking -> (released) -> free.
3. A revoking node becomes free only when (``settle``)
   a. the holder acknowledged an epoch >= its assignment's epoch, under the assignment's lease: it has
      stopped using everything it was not granted, or
   b. etcd confirmed the assignment's lease gone, at least ``grant_delay`` ago: the holder fenced itself at
      TTL/2 and can no longer be granted anything under that lease, and a binding it sent before fencing
      has had the maximum binding time (``common.etcd.leases.MAX_BIND_TIME``) to land, so the new holder's
      catch-up, which starts after the grant, sees it. Until then the nodes stay held, as revoking.
   c. etcd confirmed the lease gone, and before that the holder acknowledged, under it, an epoch >= its
      assignment's epoch releasing every node it was granted (a graceful leave: the worker drained its
      bindings, acknowledged, then revoked its lease). No grant delay: its bindings had ended.
4. An assignment whose lease is not the live membership lease of its worker (the worker left, or came
   back as a new incarnation) keeps holding its nodes as revoking until 3a or 3b frees them. Only then
   does the new incarnation get a fresh, empty assignment.

Together with the worker's rules (``worker.shard``), 1-4 give the invariant: at any instant, at most
one worker may use a node. Every function returns new records; epochs are set by the writer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Set
from dataclasses import dataclass, replace

from common.etcd.keys import WorkerId
from common.etcd.schema import ReleaseAck, ShardAssignment
from common.records import NodeName

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Observed:
    """What the leader read from etcd, plus what it learned about leases."""

    assignments: Mapping[WorkerId, ShardAssignment]
    members: Mapping[WorkerId, int]  # live worker -> lease of its membership key
    acks: Mapping[WorkerId, ReleaseAck]
    dead_leases: Mapping[int, float]  # lease etcd has confirmed gone (time-to-live -1) -> when (leader clock)
    now: float = 0.0  # the leader's monotonic clock, for the grant delay
    grant_delay: float = 0.0  # seconds after the confirmation before a dead lease's nodes are free (3b)


def expired(observed: Observed, lease: int) -> bool:
    """Rule 3b's test: etcd confirmed ``lease`` gone at least ``grant_delay`` ago."""
    confirmed = observed.dead_leases.get(lease)
    return confirmed is not None and observed.now - confirmed >= observed.grant_delay


def released_all(a: ShardAssignment, ack: ReleaseAck | None) -> bool:
    """Rule 3c's test: an acknowledgement, under the assignment's lease and epoch, releasing all it granted."""
    return (
        ack is not None and ack.lease_id == a.lease_id and ack.epoch >= a.epoch and a.granted <= ack.released
    )


def suspect_leases(observed: Observed) -> set[int]:
    """Leases the leader must ask etcd about: assignment leases that are not a live membership lease."""
    return {
        a.lease_id
        for w, a in observed.assignments.items()
        if observed.members.get(w) != a.lease_id and a.lease_id not in observed.dead_leases
    }


def settle(observed: Observed) -> dict[WorkerId, ShardAssignment | None]:
    """Apply the facts that need no decision (rules 3 and 4). None means "delete this assignment"."""
    settled: dict[WorkerId, ShardAssignment | None] = {}
    for worker, a in observed.assignments.items():
        live_lease = observed.members.get(worker)
        if expired(observed, a.lease_id) or (
            a.lease_id in observed.dead_leases and released_all(a, observed.acks.get(worker))
        ):
            # 3b/3c: everything it held is free. A new incarnation starts from nothing.
            fresh = ShardAssignment(worker, live_lease, a.epoch) if live_lease is not None else None
            settled[worker] = fresh
            continue
        granted, revoking = a.granted, a.revoking
        ack = observed.acks.get(worker)
        if revoking and ack is not None and ack.lease_id == a.lease_id and ack.epoch >= a.epoch:
            revoking = frozenset()  # 3a
        if live_lease != a.lease_id:
            granted, revoking = frozenset(), revoking | granted  # 4
        if live_lease is None and not granted and not revoking:
            settled[worker] = None  # a departed worker that released everything: tidy up
            continue
        settled[worker] = replace(a, granted=granted, revoking=revoking)
    return settled


def holders(assignments: Mapping[WorkerId, ShardAssignment | None]) -> dict[NodeName, WorkerId]:
    """Node -> the worker holding it. A node held twice (a corrupt map) keeps its first holder by id and
    is logged; it is never granted, since it has a holder either way."""
    held: dict[NodeName, WorkerId] = {}
    for worker in sorted(w for w, a in assignments.items() if a is not None):
        a = assignments[worker]
        assert a is not None
        for node in a.held:
            if node in held:
                log.error("node %s held by both %s and %s", node, held[node], worker)
                continue
            held[node] = worker
    return held


def apply_targets(
    settled: Mapping[WorkerId, ShardAssignment | None],
    members: Mapping[WorkerId, int],
    target: Mapping[NodeName, WorkerId],
    pool: Set[NodeName],
) -> dict[WorkerId, ShardAssignment | None]:
    """Revoke granted nodes whose target is elsewhere (or that left the pool); grant free nodes (rule 1)."""
    held = holders(settled)
    result: dict[WorkerId, ShardAssignment | None] = dict(settled)
    for worker, lease in members.items():
        if result.get(worker) is None:
            result[worker] = ShardAssignment(worker, lease, 0)
    grants: dict[WorkerId, set[NodeName]] = {}
    for node, owner in target.items():
        if node in pool and node not in held and owner in members:
            grants.setdefault(owner, set()).add(node)
    for worker, a in result.items():
        if a is None:
            continue
        keep = frozenset(n for n in a.granted if n in pool and target.get(n) == worker)
        revoke = a.granted - keep
        added = grants.get(worker, set())
        if revoke or added:
            result[worker] = replace(a, granted=keep | added, revoking=a.revoking | revoke)
    return result


def changes(
    stored: Mapping[WorkerId, ShardAssignment], wanted: Mapping[WorkerId, ShardAssignment | None]
) -> dict[WorkerId, ShardAssignment | None]:
    """The assignments to write (None: delete), ignoring epochs."""
    out: dict[WorkerId, ShardAssignment | None] = {}
    for worker, new in wanted.items():
        old = stored.get(worker)
        if new is None:
            if old is not None:
                out[worker] = None
        elif old is None or (old.lease_id, old.granted, old.revoking) != (
            new.lease_id,
            new.granted,
            new.revoking,
        ):
            out[worker] = new
    return out
