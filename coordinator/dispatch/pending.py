"""The leader's pending table: every pending pod of our scheduler, where it is, and the verdict over it.

A pod in the table is in exactly one of these states:
- waiting: not gated, not dispatched, not parked; it is in (or will be put back into) the ready queue;
- gated: it has scheduling gates; it waits for an update that lifts them;
- dispatched: ``worker`` names the worker it is on its way to, under ``dispatch_id``, until that worker's
  RESULT, the watch showing it bound or deleted, or the worker's stream dying;
- parked: declared unschedulable at ``parked_at``; retried after ``UNSCHEDULABLE_RETRY``, or at once when a
  worker's capacity grows or the set of workers changes. Malformed pods are parked for good.

``tried`` holds the workers that said no (RESULT unschedulable or rejected) since the pod was last parked;
an unschedulable answer adds its node count and reasons to the pod's tally.

Verdict (``verdict``): a pod is unschedulable only when every live worker with nodes has said no or its
summary rules the pod out, and no connected worker that has not said no is still settling (no summary yet on
its stream, or granted nodes it is still catching up on). The message sums the answers kube-style ("0/40
nodes are available: ..."); a worker ruled out by its summary counts its nodes as "Insufficient cpu".
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


@dataclass(slots=True)
class PendingPod:
    obj: dict[str, Any]
    record: PodRecord
    tried: set[str] = field(default_factory=set)
    worker: str | None = None
    dispatch_id: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    nodes: int = 0
    parked_at: float | None = None  # set while declared unschedulable

    @property
    def waiting(self) -> bool:
        return self.worker is None and self.parked_at is None and not self.record.gated

    def answered_no(self, worker_id: str, result: protocol.Result) -> None:
        self.tried.add(worker_id)
        if result.outcome == protocol.UNSCHEDULABLE:
            self.nodes += result.nodes
            for reason, n in result.reasons.items():
                self.reasons[reason] = self.reasons.get(reason, 0) + n

    def unpark(self) -> None:
        self.parked_at, self.tried, self.reasons, self.nodes = None, set(), {}, 0


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
    nodes, reasons = pod.nodes, dict(pod.reasons)
    for wid in live - pod.tried:
        n = workers[wid].nodes
        nodes += n
        reasons["Insufficient cpu"] = reasons.get("Insufficient cpu", 0) + n
    return unschedulable_message(nodes, reasons) if nodes else "no worker owns any node"


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
