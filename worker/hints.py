"""Queueing hints for node events: which unschedulable pods a node added, changed or newly usable may help
(kube-scheduler's QueueingHint for node events, reduced to one rule that holds for every filter this engine
runs). Without it every such event moves every unschedulable pod, and a backlog that fits nowhere is decided
again, and reported again, for every node an autoscaler adds.

The rule: a node event can help a pod only by offering that node, unless the pod's feasibility elsewhere
depends on the node's labels or pods. That is so for a pod with inter-pod rules or topology spread of its own
(``PodRecord.inter_pod``), claims (volume topology), or a default DoNotSchedule spread constraint that may
apply to it (``spread_defaults``, standalone only), and, for a changed node, for any pod
while some placed pod has required anti-affinity (its domain follows its node's labels). Every other pod is
moved only if its requests could fit the node's allocatable at all (CPU, memory, ephemeral storage, every
extended resource, room for a pod); one that exceeds it can never be placed there, and stays in the
unschedulable pool. Conservative: a node whose allocatable could not be read moves every pod, and the pool's
periodic flush still retries every pod (``SchedulingQueue.flush_unschedulable``). One indirect way a node
event helps another pod is handled where it happens: a nominated pod placed on another node than its
nomination (the new one, say) frees the room it kept there, and the scheduler then moves every pod of no
higher priority (``Scheduler.schedule_one``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from common.records import NodeRecord, PodRecord
from worker.cache import Cache

Helps = Callable[[PodRecord], bool] | None  # None: every pod may be helped (``SchedulingQueue.move_if``)


def exceeds(pod: PodRecord, node: NodeRecord) -> bool:
    """Can ``pod`` never fit ``node``, even empty? (Its requests exceed the allocatable, or it allows no pod.)"""
    req, alloc = pod.requests, node.allocatable
    return (
        alloc.pods < 1
        or req.milli_cpu > alloc.milli_cpu
        or req.memory > alloc.memory
        or req.ephemeral_storage > alloc.ephemeral_storage
        or any(amount > alloc.scalar.get(name, 0) for name, amount in req.scalar.items() if amount > 0)
    )


def local(pod: PodRecord) -> bool:
    """Does the pod's feasibility on a node depend on that node alone, default spread constraints aside? (Any
    inter-pod term, preferred ones too, counts against it: conservative.)"""
    return pod.inter_pod is None and not pod.claims


class NodeHints:
    """The rule of the module docstring over one worker's cache. ``defaults``: a default topology spread
    constraint with DoNotSchedule is configured (it may apply to any pod without spread constraints of its
    own; soft ones only score), so every node event may help every pod."""

    def __init__(self, cache: Cache, *, defaults: bool) -> None:
        self.cache = cache
        self.defaults = defaults

    def after(self, nodes: Iterable[NodeRecord], *, added: bool) -> Helps:
        """The pods the event on ``nodes`` (added to the cache or to the usable set if ``added``, else changed)
        may help."""
        nodes = list(nodes)
        if self.defaults or not nodes or any(n.allocatable_error is not None for n in nodes):
            return None
        if not added and self.cache.topology.anti_groups:
            return None
        return lambda pod: not local(pod) or not all(exceeds(pod, n) for n in nodes)
