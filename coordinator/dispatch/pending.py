"""The leader's pending table: every pending pod of our scheduler, where it is, and the verdict over it.

A pod in the table is in exactly one of these states:
- waiting: not gated, not dispatched, not claimed, not parked; it is in (or will be put back into) the ready queue;
- gated: it has scheduling gates; it waits for an update that lifts them;
- dispatched: ``worker`` names the worker it is on its way to, under ``dispatch_id`` (since
  ``dispatched_at``), until that worker's final RESULT, the watch showing it bound or deleted, the worker's
  stream dying, or ``DISPATCH_TIMEOUT`` passing without a RESULT (then it is dispatched again;
  ``QUEUED_LIMIT`` while the worker answers other dispatches, ``PREEMPTION_WAIT_LIMIT`` after a RESULT
  ``waiting``: ``expired``);
- claimed: ``claimant`` names the worker that takes it from its own pod watch (``common.claims``), since
  ``claimed_at``, until the watch shows it bound or deleted, the worker hands it back (a RESULT with id 0),
  the claim set changes (it is claimed by the pod's claimant in the new set, or dispatched if there is none),
  or the claim expires as a dispatch would (``claim_expired``): then it is dispatched as any pod;
- parked: declared unschedulable at ``parked_at``; retried after ``UNSCHEDULABLE_RETRY``, or at once when a
  worker's capacity grows or the set of workers changes. Malformed pods are parked for good.

``tried`` holds the workers that said no (RESULT unschedulable over at least one node) since the pod was
last parked; each one's latest unschedulable answer (its node count and reasons) is in the pod's tally. A
RESULT rejected is never a no: it means "try later" (the worker is fenced or draining, still catching up on
granted nodes, or the binding was refused, which kube-scheduler also retries with backoff), and so does an
unschedulable answer over zero nodes (the worker saw no usable node when it decided: fenced, or catching up). Such a pod waits until ``not_before``
(``REJECT_BACKOFF`` doubling per rejection up to ``REJECT_BACKOFF_MAX``) and is then dispatched again. A pod
is one object: its entry is replaced when a pod of the same name with another uid appears.

Verdict (``verdict``): a pod is unschedulable only when every live worker with nodes has said no or its
summary rules the pod out, and no connected worker that has not said no is still settling (no summary yet on
its stream, granted nodes it is still catching up on, or not placing pods for now). The message sums the
answers kube-style ("0/40 nodes are available: ..."); a worker ruled out by its summary counts its nodes as
"Insufficient cpu". While the shard map moves nodes the dispatcher holds a verdict back (``SETTLE_LIMIT``).

Preemption (``choice``'s module docstring): before a pod is declared unschedulable, the workers its summary
ruled out are asked too (when it may preempt), and then, up to ``MAX_PREEMPTIONS`` times, the best candidate
the shards proposed is sent to its worker to carry out. A pod sent to preempt stays dispatched (in flight)
until its worker binds it, re-checks and answers no, or the dispatch is lost; once its worker has answered
RESULT ``waiting`` (it preempted, and the pod waits there for the victims to go, which may take longer than
``DISPATCH_TIMEOUT``: their graceful termination), the dispatch is not withdrawn for that. The same answer
comes for an ordinary dispatch of a pod nominated to that worker's node whose victims are still terminating.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from common import protocol
from common.records import PodKey, PodRecord
from common.reporting import unschedulable_message
from coordinator.dispatch.choice import Worker

UNSCHEDULABLE_RETRY = 30.0
DISPATCH_TIMEOUT = 60.0  # a dispatch without RESULT for this long is withdrawn and dispatched again ...
# ... unless its worker is working through its queue (it answered another dispatch within DISPATCH_TIMEOUT):
# then only after this long. A burst larger than a worker decides in a minute (preemptors at 5,000 nodes:
# a failed pass and a dry run each) is not sent again, as duplicates, to the worker still deciding it.
QUEUED_LIMIT = 600.0
# A dispatch whose worker answered RESULT waiting (the pod is nominated where it preempted and waits there for
# its victims) is withdrawn only this long after that answer: a backstop against a worker that lost it.
PREEMPTION_WAIT_LIMIT = 900.0
# A verdict is held back at most this long per pod while the shard map moves nodes (``Dispatcher``): a handoff
# ends within a lease TTL and a grant delay, and a map that never settles must not keep a pod unanswered.
SETTLE_LIMIT = 30.0
REJECT_BACKOFF = 1.0  # first wait after a RESULT rejected (kube-scheduler's initial pod backoff)
REJECT_BACKOFF_MAX = 10.0  # longest wait (kube-scheduler's maximum pod backoff)


def _overdue(now: float, since: float, answered_at: float | None) -> bool:
    if now <= since + DISPATCH_TIMEOUT:
        return False
    progressing = answered_at is not None and now - answered_at <= DISPATCH_TIMEOUT
    return not progressing or now > since + QUEUED_LIMIT


@dataclass(slots=True)
class PendingPod:
    obj: dict[str, Any]
    record: PodRecord
    tried: set[str] = field(default_factory=set)
    worker: str | None = None
    dispatch_id: int = 0
    seen_at: float = 0.0  # the watch showed it pending (or its gate lifted): start of the "dispatched" stage
    dispatched_at: float = 0.0
    not_before: float = 0.0  # after a RESULT rejected: not dispatched again before this
    rejections: int = 0
    # each worker's latest "no" since the pod was last parked: (nodes considered, reasons); a worker asked
    # again (a preemption re-checked and found stale) replaces its answer, it does not add a second one
    answers: dict[str, tuple[int, dict[str, int]]] = field(default_factory=dict)
    parked_at: float | None = None  # set while declared unschedulable
    # Preemption across shards: the candidate each worker proposed with its "no" (since the pod was last
    # parked), and how many times the leader has sent it to carry one out
    candidates: dict[str, protocol.Candidate] = field(default_factory=dict)
    preemptions: int = 0
    waiting_since: float | None = None  # the dispatch in flight was answered RESULT waiting at this time
    # its verdict was first held back for moving shards at this time, since it was last dispatched or parked
    # (``SETTLE_LIMIT``)
    deferred_since: float | None = None
    # the worker that claimed it (``common.claims``) since ``claimed_at``, until it is placed or handed back
    claimant: str | None = None
    claimed_at: float = 0.0

    def expired(self, now: float, answered_at: float | None) -> bool:
        """Is the dispatch in flight to be withdrawn, without a final RESULT by ``now``? After
        ``DISPATCH_TIMEOUT``, unless its worker answered another dispatch within that long (``answered_at``,
        None: never on this stream): a live worker working through a long queue gets to this pod too, up to
        ``QUEUED_LIMIT``. After its worker said the pod waits there for its preemption's victims, as a
        standalone scheduler's pod would, ``PREEMPTION_WAIT_LIMIT`` from that answer: their graceful
        termination may take longer than the timeout, and a withdrawal would send it to preempt again
        elsewhere, a second set of victims, while the first room stays reserved for it."""
        if self.waiting_since is not None:
            return now > self.waiting_since + PREEMPTION_WAIT_LIMIT
        return _overdue(now, self.dispatched_at, answered_at)

    def claim_expired(self, now: float, answered_at: float | None) -> bool:
        """Is the claim to be taken over by the leader (its claimant has neither placed the pod nor handed it
        back)? As ``expired`` for a dispatch: its claimant is progressing while the watch shows it placing
        other pods it claimed, or it answers dispatches."""
        return _overdue(now, self.claimed_at, answered_at)

    @property
    def waiting(self) -> bool:
        return (
            self.worker is None and self.claimant is None and self.parked_at is None and not self.record.gated
        )

    def answered_no(self, worker_id: str, result: protocol.Result) -> None:
        """An unschedulable RESULT: one more worker that cannot take the pod, and its reasons."""
        self.tried.add(worker_id)
        self.candidates.pop(worker_id, None)
        if result.preemption is not None:
            self.candidates[worker_id] = result.preemption
        self.answers[worker_id] = (result.nodes, dict(result.reasons))

    def tally(self) -> tuple[int, dict[str, int]]:
        """The workers' latest answers summed: nodes considered, and nodes per reason."""
        nodes, reasons = 0, dict[str, int]()
        for n, rs in self.answers.values():
            nodes += n
            for reason, count in rs.items():
                reasons[reason] = reasons.get(reason, 0) + count
        return nodes, reasons

    def rejected(self, now: float) -> None:
        """A RESULT rejected: try again later, with backoff; not a no."""
        self.rejections += 1
        self.not_before = now + min(REJECT_BACKOFF_MAX, REJECT_BACKOFF * 2 ** min(self.rejections - 1, 16))

    def unpark(self) -> None:
        self.parked_at, self.tried, self.answers, self.deferred_since = None, set(), {}, None
        self.candidates, self.preemptions = {}, 0


# kube-scheduler's "preemption: ..." suffix, as the leader can say it: the shards' dry runs are summed only
# as "a candidate or none" (their per-node preemption reasons stay in the workers' RESULT messages).
NEVER = "preemption: not eligible due to preemptionPolicy=Never."
NO_CANDIDATE = "preemption: no node of any shard has lower-priority pods whose removal would make room."
STALE = "preemption: the chosen candidates were no longer valid when re-checked; retried later."
MAX_PREEMPTIONS = 3  # candidates carried out per pod before it is parked (each one re-checked by its worker)


def verdict(pod: PendingPod, workers: Mapping[str, Worker]) -> str | None:
    """The unschedulable message if no live worker can take ``pod`` (see the module docstring), else None."""
    live = {wid for wid, w in workers.items() if w.ready and w.nodes > 0}
    if not live:
        return None
    ruled_out = pod.tried | {wid for wid in live if not workers[wid].fits(pod.record)}
    if not live <= ruled_out:
        return None
    if any(w.settling for wid, w in workers.items() if wid not in pod.tried):
        return None
    nodes, reasons = pod.tally()
    for wid in live - pod.tried:
        n = workers[wid].nodes
        nodes += n
        reasons["Insufficient cpu"] = reasons.get("Insufficient cpu", 0) + n
    if not nodes:
        return "no worker owns any node"
    if pod.record.preempt_never:
        suffix = NEVER
    elif pod.preemptions:
        suffix = STALE
    else:
        suffix = NO_CANDIDATE
    return f"{unschedulable_message(nodes, reasons)} {suffix}"


class PendingTable:
    """The pods by key, and the ready queue of keys to (re)consider; ``wakeup`` is set whenever a key is
    queued. A key may be queued more than once: considering a pod that is not waiting is a no-op."""

    def __init__(self) -> None:
        self.pods: dict[PodKey, PendingPod] = {}
        self.ready: deque[PodKey] = deque()
        self.wakeup = asyncio.Event()

    def __len__(self) -> int:
        return len(self.pods)

    def __contains__(self, key: object) -> bool:
        return key in self.pods

    def __iter__(self) -> Iterator[PodKey]:
        return iter(self.pods)

    def get(self, key: PodKey) -> PendingPod | None:
        return self.pods.get(key)

    def record_of(self, key: PodKey) -> PodRecord | None:
        p = self.pods.get(key)
        return p.record if p is not None else None

    def enqueue(self, key: PodKey) -> None:
        self.ready.append(key)
        self.wakeup.set()

    def requeue_waiting(self) -> None:
        """Queue every waiting pod again (they wait for a worker to become able)."""
        self.ready.extend(k for k, p in self.pods.items() if p.waiting)

    def parked(self) -> int:
        return sum(1 for p in self.pods.values() if p.parked_at is not None)

    def retry_parked(self, now: float, *, force: bool = False) -> int:
        """Unpark and queue the parked pods whose retry is due (all of them with ``force``); malformed pods
        stay parked. Returns how many."""
        n = 0
        for key, p in self.pods.items():
            if (
                p.parked_at is not None
                and p.record.parse_error is None
                and (force or now - p.parked_at >= UNSCHEDULABLE_RETRY)
            ):
                p.unpark()
                self.enqueue(key)
                n += 1
        return n
