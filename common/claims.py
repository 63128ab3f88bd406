"""Worker claims: which pending pods of ours a worker takes straight from its own pod watch, with no DISPATCH
from the leader, and which worker takes each. Leader and workers compute this alike, from the same parse of
the same object, so that in the common case exactly one worker claims a pod and the leader knows which.

Why: every worker already watches every pod (its topology counts are cluster-wide). For a pod no other shard's
decisions can make wrong, the leader's dispatch only chooses a worker; a hash of the pod's uid over the
workers the leader names chooses one just as well, with no frame, no acknowledgement and no answer per pod.

Rules:
- A pod is *claimable* (``claimable``) when it is ours, pending, not being deleted, parsed without error, not
  gated, not nominated (a preemption is under way for it: the leader's path), and *plain*: no rule of it
  reads pods on other nodes (``lane_rule`` is None; see ``coordinator.dispatch.lane``).
- Its *claimant* (``claimant``) is the worker of the claim set with the highest hash of (worker id, pod uid):
  rendezvous hashing, so a worker joining or leaving moves only the pods hashed to it. The claim set is the
  leader's (``protocol.Claims``): the ready workers that place pods and own nodes.
- A worker claims a claimable pod whose claimant it is, while it can place pods, unless it handed that pod to
  the leader before or the leader dispatched it (to any worker), or a pod pending in its own view states a
  cross-node required anti-affinity term that matches it (the leader's lane, rule 3, decides when such a pod
  may go). A claimed pod it cannot place it
  hands to the leader (RESULT with ``protocol.CLAIMED``): from there the leader's path, the other shards,
  preemption and the verdict.
- Disagreement is safe: while a claim set changes, two workers may claim one pod (the second binding gets
  409 Conflict, its assumption expires) or none may (the leader takes over a claimed pod its claimant has not
  placed within the dispatch timeout).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

from common.records import PodRecord, PodTerm

HOSTNAME: Final = "kubernetes.io/hostname"


def lane_rule(pod: PodRecord) -> str | None:
    """The rule that makes ``pod`` a lane pod (for logs and tests), or None for a plain pod."""
    rules = pod.inter_pod
    if rules is None:
        return None
    for c in rules.spread:
        if c.hard:
            return f"topology spread on {c.topology_key} (DoNotSchedule)"
    for term in rules.anti_affinity:
        if term.topology_key != HOSTNAME:
            return f"required pod anti-affinity on {term.topology_key}"
    if rules.affinity:
        return f"required pod affinity on {rules.affinity[0].topology_key}"
    return None


def cross_node_anti_affinity(pod: PodRecord) -> tuple[PodTerm, ...]:
    """The pod's required anti-affinity terms whose domain spans nodes (the lane's rule 3)."""
    rules = pod.inter_pod
    if rules is None:
        return ()
    return tuple(t for t in rules.anti_affinity if t.topology_key != HOSTNAME)


def claimable(pod: PodRecord, scheduler_name: str) -> bool:
    """May a worker claim ``pod`` (see the module docstring)?"""
    return (
        pod.scheduler_name == scheduler_name
        and not pod.node_name
        and not pod.deleting
        and not pod.terminal
        and pod.parse_error is None
        and not pod.gated
        and not pod.nominated_node
        and bool(pod.uid)
        and lane_rule(pod) is None
    )


def _score(worker: str, uid: str) -> bytes:
    return hashlib.blake2b(f"{worker}\0{uid}".encode(), digest_size=8).digest()


def claimant(uid: str, workers: Sequence[str]) -> str | None:
    """The worker of ``workers`` that claims the pod of ``uid`` (None: no worker, or no uid)."""
    if not uid or not workers:
        return None
    return max(workers, key=lambda w: (_score(w, uid), w))
