"""What the leader knows of each worker, and which worker a pod goes to.

``Worker`` holds one worker's link, its last CAPACITY summary and what is on its way to it: the dispatches
without a RESULT yet (``in_flight``, with the CPU and memory they reserve until the next summary accounts for
them) and the dispatches without an ACK yet (``unacked``, at most ``protocol.MAX_UNACKED``).

Choosing: among the ready workers whose summary says the pod can fit (its CPU and memory requests within the
largest free amounts on one node), that have not already said no for this pod and whose ACK window has room,
take the better of two picked at random: the one with fewer pods in flight to it (join the shorter queue;
ties go to more free CPU). Capacity decides *whether* a shard can take a pod, queue length *which* one should:
that keeps every worker's decision and binding capacity busy during a burst, and best-of-two avoids the herd
effect of always picking the minimum.

Preemption across shards (issue 12 item 3, ``worker.preemption``'s module docstring): a pod no shard can
place is first sent to every live shard its summary ruled out, if the pod may preempt (``for_candidates``):
only a worker's dry run can say whether evicting lower-priority pods there would make room. Among the
candidates the shards then proposed, ``pick_candidate`` takes the best in kube-scheduler's order
(``protocol.Candidate.rank``: fewest budget violations, lowest highest victim priority, smallest priority
sum, fewest victims, latest start; ties to the lowest worker id, so the choice does not depend on the order
the answers arrived in), among workers that are ready and have room in their ACK window.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass, field

from common import protocol
from common.records import PodKey, PodRecord
from coordinator.dispatch.links import Transport


@dataclass(slots=True, eq=False)
class Worker:
    worker_id: str
    address: str  # "host:port" from the worker's membership record
    link: Transport
    capacity: protocol.Capacity | None = None  # None until the current stream's first summary
    in_flight: dict[int, PodKey] = field(default_factory=dict)
    unacked: set[int] = field(default_factory=set)
    reserved_cpu: int = 0
    reserved_memory: int = 0
    dispatched: int = 0
    bound: int = 0
    # when (leader's clock) the latest RESULT came over the current stream, or the watch showed a pod it
    # claimed leave the pending set (placed or deleted)
    answered_at: float | None = None

    @property
    def connected(self) -> bool:
        return self.link.connected

    @property
    def ready(self) -> bool:
        """Connected and summarised: the worker can be chosen and its answers count."""
        return self.link.connected and self.capacity is not None

    @property
    def nodes(self) -> int:
        return self.capacity.nodes if self.capacity is not None else 0

    @property
    def settling(self) -> bool:
        """Connected but unable to give a final answer yet: no summary on this stream, granted nodes its
        cache is still catching up on, or not placing pods for now (fenced or draining: it may own nodes)."""
        cap = self.capacity
        return self.link.connected and (cap is None or cap.syncing > 0 or not cap.placing)

    @property
    def window_full(self) -> bool:
        return len(self.unacked) >= protocol.MAX_UNACKED

    def fits(self, pod: PodRecord) -> bool:
        cap = self.capacity
        if cap is None or not self.link.connected or cap.nodes <= 0:
            return False
        return pod.requests.milli_cpu <= cap.max_cpu and pod.requests.memory <= cap.max_memory

    def load(self) -> tuple[int, float]:
        """Lower is better: pods on their way to or waiting in the worker, then less free CPU."""
        free_cpu = self.capacity.free_cpu if self.capacity is not None else 0
        return (len(self.in_flight), -float(free_cpu - self.reserved_cpu))

    def assign(self, dispatch_id: int, pod: PodRecord) -> None:
        self.in_flight[dispatch_id] = pod.key
        self.unacked.add(dispatch_id)
        self.reserved_cpu += pod.requests.milli_cpu
        self.reserved_memory += pod.requests.memory
        self.dispatched += 1

    def release(self, dispatch_id: int, pod: PodRecord) -> None:
        """The dispatch ended (a RESULT, or withdrawn by the leader): no longer in flight."""
        if self.in_flight.pop(dispatch_id, None) is not None:
            self.reserved_cpu -= pod.requests.milli_cpu
            self.reserved_memory -= pod.requests.memory

    def acknowledged(self, dispatch_id: int) -> bool:
        """Record an ACK (or a RESULT, which ends the dispatch too). True if this freed a full window."""
        was_full = self.window_full
        self.unacked.discard(dispatch_id)
        return was_full and not self.window_full

    def summarised(self, capacity: protocol.Capacity, pod_of: Callable[[PodKey], PodRecord | None]) -> bool:
        """Take a new summary. True if the largest free CPU on one node grew (parked pods may fit now)."""
        grew = capacity.max_cpu > (self.capacity.max_cpu if self.capacity is not None else 0)
        self.capacity = capacity
        # the summary now includes what we had reserved for pods that have been placed meanwhile
        pods = [p for p in map(pod_of, self.in_flight.values()) if p is not None]
        self.reserved_cpu = sum(p.requests.milli_cpu for p in pods)
        self.reserved_memory = sum(p.requests.memory for p in pods)
        return grew

    def disconnected(self) -> list[PodKey]:
        """The stream closed: forget its summary and window; returns the pods that were in flight over it."""
        keys = list(self.in_flight.values())
        self.capacity = None
        self.answered_at = None
        self.in_flight.clear()
        self.unacked.clear()
        self.reserved_cpu = self.reserved_memory = 0
        return keys


def decisive(capacity: protocol.Capacity | None) -> tuple[int, int, int, int, bool] | None:
    """What of a summary decides *whether* its worker can take a pod or counts for a verdict (``fits``,
    ``ready``, ``settling``, ``nodes``): a new summary equal in these can change where a pod goes (by load),
    never whether a waiting pod can go anywhere."""
    if capacity is None:
        return None
    return (capacity.nodes, capacity.max_cpu, capacity.max_memory, capacity.syncing, capacity.placing)


def choose(workers: Iterable[Worker], pod: PodRecord, tried: Set[str], rng: random.Random) -> Worker | None:
    options = [w for w in workers if w.worker_id not in tried and not w.window_full and w.fits(pod)]
    if not options:
        return None
    if len(options) == 1:
        return options[0]
    a, b = rng.sample(options, 2)
    return a if a.load() <= b.load() else b


def for_candidates(workers: Iterable[Worker], pod: PodRecord, tried: Set[str]) -> Worker | None:
    """A live worker with nodes that has not answered for ``pod`` yet although its summary ruled the pod out:
    it may have a preemption candidate. None when the pod may not preempt or every such worker answered."""
    if pod.preempt_never:
        return None
    options = [
        w
        for w in workers
        if w.ready and w.nodes > 0 and w.worker_id not in tried and not w.window_full and not w.fits(pod)
    ]
    return min(options, key=lambda w: (w.load(), w.worker_id), default=None)


def pick_candidate(
    candidates: Mapping[str, protocol.Candidate], workers: Mapping[str, Worker]
) -> tuple[Worker, protocol.Candidate] | None:
    """The best candidate whose worker can take a dispatch now, and that worker (see the module docstring)."""
    best: tuple[Worker, protocol.Candidate] | None = None
    for wid in sorted(candidates):
        w = workers.get(wid)
        if w is None or not w.ready or w.window_full:
            continue
        c = candidates[wid]
        if best is None or c.rank() < best[1].rank():
            best = (w, c)
    return best
