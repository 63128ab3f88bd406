"""Preemption, with kube-scheduler's DefaultPreemption semantics (PostFilter), inside one worker's nodes.

When the engine finds no node for a pod (``Preemption.post_filter``, called by ``worker.scheduler``):

1. Eligibility: a pod with ``preemptionPolicy: Never`` never preempts; a pod nominated to a node that still
   has a lower-priority pod terminating because a scheduler preempted it (deletionTimestamp and the
   ``DisruptionTarget`` condition of reason ``PreemptionByScheduler``) waits for it instead of preempting
   again, unless its nominated node is now unresolvable for it. Nor does a pod whose earlier preemption is
   still being carried out (``Executor.busy``: kube-scheduler's PreEnqueue check of async preemption).
   A victim this worker has chosen counts as terminating from that decision on, before the watch shows its
   deletion (``Evaluator.evicting``; a deliberate step beyond kube-scheduler, which reads only its informer
   and has the same window): otherwise, with two pods nominated to one node (the second took the first's
   victim into account and chose one more), the first, retried when its own victim is gone and before the
   second's victim is seen terminating, finds the second's nomination holding that room and would preempt
   again elsewhere -- a victim too many (1,159 preemptions for 1,000 preemptors on 1,000 kwok nodes). An
   eviction that does not happen takes its victim back out and wakes the waiting pods (``not_evicted``).
2. Potential nodes: the usable nodes whose verdict is Unschedulable (not UnschedulableAndUnresolvable: a
   taint, a node selector, a missing topology key cannot be cured by removing pods).
3. Dry run per node (kube-scheduler's SelectVictimsOnNode), from a random offset, until ``max(10% of the
   potential nodes, 100)`` candidates are found with at least one that violates no budget: every pod of
   lower priority is set aside; if the pod does not fit even then, the node is not a candidate. Otherwise
   the set-aside pods are put back one by one, most important first (priority, then the earlier start
   time), PodDisruptionBudget-violating ones first (``worker.budgets``); a pod the preemptor still fits with
   stays (is reprieved), the others are the victims.
   "With the victims removed" is evaluated on the live cache, not a copy of it: ``Cache.set_aside`` /
   ``put_back`` take a pod off its node and out of the topology counts (``worker.topology``), so every filter
   -- resources, host ports, inter-pod affinity and anti-affinity, topology spread -- sees the node as it would
   be, and the counts are exact. All of it is synchronous, and every pod is put back before the dry run
   returns, so nothing else ever sees the intermediate state; the cost is that of the pods moved, not of the
   world.
   Shortcuts that answer exactly what that dry run answers (``tests/unit/worker/test_preemption_fast.py``
   compares them on random worlds): (a) when the only filter whose verdict for the pod depends on the pods
   placed is NodeResourcesFit (every other filter declares it does not, ``FilterPlugin.node_pods``: no host
   port, no inter-pod rule or hard spread constraint, own or defaulted, no claim, no placed pod with a
   required anti-affinity term: ``Evaluator.arithmetic``), the reprieve is computed on numbers -- the same order, the
   same test "request <= allocatable - requested" per resource the pod asks for and the pod count, with the
   node's nominated pods of at least the pod's priority counted as the engine counts them -- and kept per node
   until the node's pods, the pod's priority and requests, those nominations, the budgets
   or (for pods without a start time) the order against the clock change; a node where the pod does not fit
   even with every lower pod removed goes through the full dry run, for its exact reasons. (b) The potential
   nodes are read from the verdicts of the failed decision's full scan (``Engine.scan_of``) when it was for
   this very pod and nothing changed since. A full dry run restores the node's pod order, so that ties
   between equally important pods break the same way whichever path ran before.
4. Choice among candidates (kube-scheduler's pickOneNodeForPreemption): fewest budget violations, then the
   lowest highest-victim priority, the smallest sum of victim priorities, the fewest victims, the latest
   start among the highest-priority victims, then the first found.
5. Nomination at once (in memory, ``Cache.nominate``): from this decision on, pods of lower priority are
   filtered as if the preemptor were on that node (``worker.engine``), so the room being freed is reserved
   for it until it binds, is deleted, or preempts elsewhere. Lower-priority pods nominated to the same node
   lose their nomination.
6. The API work runs off the decision path (``Executor``, like kube-scheduler's async preemption): the
   preemptor's ``status.nominatedNodeName`` is patched (so a restarted worker, or the next owner of the node,
   honours the nomination from its watch); lower-priority pods nominated there are cleared; each victim not
   already terminating gets the ``DisruptionTarget`` condition, a graceful delete and a ``Preempted`` event
   naming the preemptor's UID and the node. Each of these writes is fenced as a binding is (``Executor``,
   ``Binder.budget``): sent only while the node is usable and the lease's fencing deadline leaves time for it,
   with that time as its deadline here and at the API server; a write not sent ends that part of the
   preemption (victims not evicted stop counting as terminating); a write to a pod that got no answer keeps the
   node counted for ``MAX_BIND_TIME``, and a release of the node waits for the writes under way and those
   (``Executor.drain``). The preemptor is not tried again until that finishes; then it
   waits, like any unschedulable pod, for the victims' deletion to free the room. No victim is touched unless
   the nomination's PATCH answered with the preemptor itself, unbound: a pod deleted (404), recreated under
   another uid or already bound when its preemption is carried out (under a coordinator, a DISPATCH can reach
   a worker after its pod watch showed the pod deleted) would have pods evicted for nothing. Such a
   preemptor is dropped from this worker (``gone``: out of the queue, its nomination in the cache ended).

The message: on success, the failure stays the plain one (the pod is not bound yet); otherwise kube-scheduler's
``preemption: ...`` suffix: "not eligible due to preemptionPolicy=Never.", "not eligible due to a terminating
pod on the nominated node.", or a node histogram such as "0/3 nodes are available: 1 No preemption victims
found for incoming pod, 2 Preemption is not helpful for scheduling.".

Metrics: ``scheduler_preemption_attempts_total`` counts every post-filter call (eligible or not), and
``scheduler_preemption_victims`` observes the victims of each preemption carried out, as kube-scheduler's.

Under a coordinator (issue 12 item 3) a worker never preempts on its own initiative: its shard saying no does
not mean the cluster has no room, and a worker only knows (and may only evict) its own shard's pods.
- ``propose``: when no owned node fits, steps 1-4 run as above and the best candidate goes back to the leader
  as a summary (``Summary.wire``, RESULT ``unschedulable`` with ``preemption``); nothing is nominated or
  evicted, and no pod lists cross the wire.
- When every live shard has said no, the leader picks the best summary in the same order (``better``) and
  dispatches the pod again to that worker, naming the node (DISPATCH ``preempt``). ``carry_out`` re-runs the
  dry run on that node only, if this worker still owns it and can use it (its cache may have moved on since
  the summary): if the node is still a candidate, steps 5-6 are carried out exactly as standalone and the pod
  stays in this worker's queue until the room is free and it binds (RESULT ``bound``). Otherwise, if this
  shard's best candidate now ranks no worse than the summary the leader chose (the best of every shard's
  proposals, so this one is at least as good as any the leader knew; ``proposed`` keeps each pod's last
  proposal), that one is carried out at once; else the answer is ``unschedulable`` again with the fresh
  summary (or none), and the leader chooses again.
- A nomination survives a worker's death and a node's handoff because it is in the pod's status: every
  worker's pod watch nominates it in its cache (``worker.feeds``), so the node's next owner reserves the room
  and tries the pod's nominated node first when the leader dispatches it there.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from common import metrics, protocol
from common.etcd.leases import MAX_BIND_TIME
from common.events import NORMAL, ObjectRef, event_body, events_path, rfc3339
from common.kube import ApiError, KubeClient, NotFound, ServerError
from common.records import CPU, EPHEMERAL_STORAGE, MEMORY, NodeName, PodKey, PodRecord
from common.reporting import unschedulable_message
from worker.binder import MIN_ATTEMPT
from worker.budgets import Budgets
from worker.cache import Cache
from worker.engine import Decision, Engine
from worker.framework import Code, Status
from worker.inflight import InFlight
from worker.nodeinfo import NodeInfo
from worker.plugins.resources import NodeResourcesFit

log = logging.getLogger(__name__)

MIN_CANDIDATE_NODES_PERCENTAGE = 10  # kube-scheduler's DefaultPreemptionArgs defaults
MIN_CANDIDATE_NODES_ABSOLUTE = 100
EXECUTORS = 16  # preemptions carried out at once
HOPELESS_KEPT = 4096  # pod shapes whose "preemption cannot help" verdict is kept
PROPOSALS_KEPT = 65536  # pods whose last proposal to the leader is kept (under a coordinator)
VICTIMS_KEPT = 65536  # nodes whose arithmetic dry run is kept
EVICTING_PRUNE = 1024  # victims being evicted before that set is pruned of the ones it holds for nothing

NOT_HELPFUL = "Preemption is not helpful for scheduling"
NO_VICTIMS = Status.unresolvable("No preemption victims found for incoming pod")
NEVER = "not eligible due to preemptionPolicy=Never."
TERMINATING = "not eligible due to a terminating pod on the nominated node."
_PRIORITY_OFFSET = 2**31  # kube-scheduler adds MaxInt32+1 so that negative priorities sum sensibly


def importance(pod: PodRecord, now: float) -> tuple[int, float]:
    """Sort key, most important first: higher priority, then the earlier start (a pod not started yet, as
    kube-scheduler's GetPodStartTime, counts as starting now)."""
    return (-pod.priority, pod.start_time if pod.start_time is not None else now)


@dataclass(frozen=True, slots=True)
class Summary:
    """What chooses between candidate nodes; all a shard would send its leader (see the module docstring)."""

    node: NodeName
    pdb_violations: int
    highest_priority: int
    priority_sum: int
    victims: int
    earliest_start: float  # of the highest-priority victims

    def wire(self) -> protocol.Candidate:
        """The summary as the leader receives it (``common.protocol.Candidate``, the same order)."""
        return protocol.Candidate(
            node=self.node,
            pdb_violations=self.pdb_violations,
            highest_priority=self.highest_priority,
            priority_sum=self.priority_sum,
            victims=self.victims,
            earliest_start=self.earliest_start,
        )

    def rank(self) -> tuple[int, int, int, int, float]:
        """Smaller is better (``common.protocol.candidate_rank``, the rule the leader applies too)."""
        return protocol.candidate_rank(self)


def better(a: Summary, b: Summary) -> bool:
    """Is candidate ``a`` strictly preferred to ``b``?"""
    return a.rank() < b.rank()


def pick(summaries: Sequence[Summary]) -> int:
    """Index of the preferred candidate; among equals the first."""
    best = 0
    for i in range(1, len(summaries)):
        if better(summaries[i], summaries[best]):
            best = i
    return best


@dataclass(frozen=True, slots=True)
class Candidate:
    node: NodeName
    victims: tuple[PodRecord, ...]  # most important first
    pdb_violations: int

    def summary(self, now: float) -> Summary:
        top = max(v.priority for v in self.victims)
        starts = [
            v.start_time if v.start_time is not None else now for v in self.victims if v.priority == top
        ]
        return Summary(
            node=self.node,
            pdb_violations=self.pdb_violations,
            highest_priority=top,
            priority_sum=sum(v.priority + _PRIORITY_OFFSET for v in self.victims),
            victims=len(self.victims),
            earliest_start=min(starts),
        )


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of one post-filter: a candidate to carry out, or why not (the text after "preemption: ")."""

    candidate: Candidate | None
    message: str
    clear_nomination: bool = False  # no candidate at all: the pod's nomination, if any, is dropped


class Evaluator:
    """Steps 1-4 of the module docstring, over the live cache; no I/O."""

    def __init__(
        self,
        cache: Cache,
        engine: Engine,
        budgets: Budgets,
        *,
        min_percentage: int = MIN_CANDIDATE_NODES_PERCENTAGE,
        min_absolute: int = MIN_CANDIDATE_NODES_ABSOLUTE,
        rng: random.Random | None = None,
        wall: Callable[[], float] = time.time,
        fast: bool = True,
    ) -> None:
        self.cache = cache
        self.engine = engine
        self.budgets = budgets
        self.min_percentage = min_percentage
        self.min_absolute = min_absolute
        self.rng = rng or random.Random()
        self.wall = wall
        self.fast = fast
        self.dry_runs = 0
        self.arithmetic_runs = 0
        self.memo_hits = 0
        self.scans_reused = 0
        # node name -> (its NodeInfo, generation, (priority, requests, budgets version), valid while this < the clock
        # (None: always), answer)
        self._victims: dict[str, tuple[NodeInfo, int, tuple[Any, ...], float | None, Candidate | Status]] = {}
        self._hopeless: dict[tuple[Any, ...], tuple[tuple[int, int], Verdict]] = {}
        # Victims this worker chose whose deletion the watch may not have shown yet (step 1 of the module
        # docstring): key -> (uid, evictions under way). Added by ``Preemption._execute`` (two preemptors may
        # choose one victim), taken back when an eviction did not happen (``not_evicted``); an entry whose pod
        # the cache holds as deleting, no longer holds, or holds under another uid (recreated under the same
        # name) counts for nothing and is pruned (``evicted``).
        self.evicting: dict[PodKey, tuple[str, int]] = {}
        self._evicting_pruned_at = EVICTING_PRUNE

    def ineligible(self, pod: PodRecord) -> str | None:
        """Why ``pod`` may not preempt now (kube-scheduler's PodEligibleToPreemptOthers), else None."""
        if pod.preempt_never:
            return NEVER
        name = pod.nominated_node or self.cache.nominated_node.get(pod.key)
        if name:
            info = self.cache.nodes.get(NodeName(name))
            if info is not None and name in self.cache.known:
                st = self.engine.verdict(pod, info)
                if st is not None and st.code == Code.UNRESOLVABLE:
                    return None
                for p in info.pods.values():
                    if p.priority < pod.priority and ((p.deleting and p.preempted) or self._being_evicted(p)):
                        return TERMINATING
        return None

    def _being_evicted(self, pod: PodRecord) -> bool:
        entry = self.evicting.get(pod.key)
        return entry is not None and entry[0] == pod.uid

    def evicted(self, victims: Sequence[PodRecord]) -> None:
        """``victims`` are being evicted by this worker: they count as terminating from now on, before the watch
        shows their deletion (see the module docstring, step 1)."""
        evicting = self.evicting
        for v in victims:
            if not v.deleting:
                entry = evicting.get(v.key)
                count = entry[1] if entry is not None and entry[0] == v.uid else 0
                evicting[v.key] = (v.uid, count + 1)
        if len(evicting) >= self._evicting_pruned_at:
            # an entry counts for nothing once the cache holds its pod as deleting (the record says it), not at
            # all (deleted), or under another uid; amortised: the next prune waits until the set has doubled
            placed = self.cache.placed
            self.evicting = evicting = {
                k: entry
                for k, entry in evicting.items()
                if (p := placed(k)) is not None and not p.deleting and p.uid == entry[0]
            }
            self._evicting_pruned_at = max(EVICTING_PRUNE, 2 * len(evicting))

    def not_evicted(self, victim: PodRecord) -> None:
        """An eviction of ``victim`` this worker started did not happen (an API error, the pod already gone, or
        the preemption's API work stopped before it): one fewer under way."""
        entry = self.evicting.get(victim.key)
        if entry is None or entry[0] != victim.uid:
            return
        if entry[1] > 1:
            self.evicting[victim.key] = (entry[0], entry[1] - 1)
        else:
            del self.evicting[victim.key]

    def owned(self) -> list[NodeInfo]:
        cache = self.cache
        usable = cache.usable_now()
        return [info for name, info in cache.nodes.items() if name in cache.known and usable(name)]

    def evaluate(self, pod: PodRecord) -> Verdict:
        why = self.ineligible(pod)
        if why is not None:
            return Verdict(None, why)
        # A burst of pods that preemption cannot help must not cost a scan of every node each: a verdict
        # without a candidate is kept per pod shape while nothing it depends on changed (the cache's
        # generation covers nodes, nominations and freed capacity; the topology version every pod accounted or
        # unaccounted, so a new lower-priority pod, a possible victim, invalidates it).
        r = pod.requests
        shape = (
            pod.signature,
            (r.milli_cpu, r.memory, r.ephemeral_storage, tuple(sorted(r.scalar.items()))),
            pod.priority,
            pod.namespace,
            tuple(sorted(pod.labels.items()))
            if pod.inter_pod is not None or self.cache.topology.anti_groups
            else (),
            pod.inter_pod,
        )
        nominated = bool(pod.nominated_node) or pod.key in self.cache.nominated_node
        state = (self.cache.generation, self.cache.topology.version)
        kept = self._hopeless.get(shape)
        if kept is not None and kept[0] == state and not nominated:
            return kept[1]
        verdict = self._evaluate(pod)
        if verdict.candidate is None and not nominated:
            if len(self._hopeless) >= HOPELESS_KEPT:
                self._hopeless.clear()
            self._hopeless[shape] = ((self.cache.generation, self.cache.topology.version), verdict)
        return verdict

    def _evaluate(self, pod: PodRecord) -> Verdict:
        nodes = self.owned()
        potential: list[NodeInfo] = []
        scan = self.engine.scan_of(pod) if self.fast else None
        if (
            scan is not None
            and len(scan) == len(nodes)
            and all(seen is info for (seen, _), info in zip(scan, nodes, strict=True))
        ):
            # the failed decision just filtered every one of these nodes, nothing changed since: same verdicts
            potential = [info for info, st in scan if st.code == Code.UNSCHEDULABLE]
            self.scans_reused += 1
        else:
            for info in nodes:
                st = self.engine.verdict(pod, info)
                if st is not None and st.code == Code.UNSCHEDULABLE:
                    potential.append(info)
        reasons: dict[str, int] = {}
        if potential:
            wanted = max(len(potential) * self.min_percentage // 100, self.min_absolute)
            wanted = min(wanted, len(potential))
            offset = self.rng.randrange(len(potential))
            fine: list[Candidate] = []
            violating: list[Candidate] = []
            now = self.wall()
            for i in range(len(potential)):
                info = potential[(offset + i) % len(potential)]
                found = self.select_victims(pod, info, now)
                if isinstance(found, Status):
                    for r in found.reasons:
                        reasons[r] = reasons.get(r, 0) + 1
                    continue
                group = fine if found.pdb_violations == 0 else violating
                if len(group) < wanted:
                    group.append(found)
                if fine and len(fine) + len(violating) >= wanted:
                    break
            candidates = fine + violating
            if candidates:
                summaries = [c.summary(now) for c in candidates]
                return Verdict(candidates[pick(summaries)], "")
        # no candidate: every potential node was examined and has its reasons; the others are "not helpful"
        absent = len(nodes) - len(potential)
        if absent:
            reasons[NOT_HELPFUL] = reasons.get(NOT_HELPFUL, 0) + absent
        return Verdict(None, unschedulable_message(len(nodes), reasons), clear_nomination=True)

    def arithmetic(self, pod: PodRecord) -> bool:
        """May ``pod``'s dry runs be decided by resource arithmetic (see the module docstring)? True when
        NodeResourcesFit, whose test ``_by_arithmetic`` reproduces, is the only filter whose verdict for the pod
        depends on the pods placed: every other dynamic filter declares it does not (``node_pods``), so
        setting victims aside cannot change its verdict. The exact type: a subclass may test something else."""
        if not self.fast:
            return False
        return all(type(f) is NodeResourcesFit or not f.node_pods(pod) for f in self.engine.dynamic_filters)

    def select_victims(self, pod: PodRecord, info: NodeInfo, now: float) -> Candidate | Status:
        """The fewest pods to remove from ``info`` for ``pod`` to fit (kube-scheduler's SelectVictimsOnNode),
        or why removing pods cannot help there. The cache is as before when this returns."""
        self.dry_runs += 1
        cache = self.cache
        nominated = cache.nominated_for(pod, NodeName(info.node.name)) if cache.nominated else []
        if not self.arithmetic(pod) or any(p.key in info.pods for p in nominated):
            lower = [p for p in info.pods.values() if p.priority < pod.priority]
            return self._by_filters(pod, info, lower, now) if lower else NO_VICTIMS
        st = self.engine.static_verdict(pod, info)
        if st is not None:
            return st  # what the full dry run answers first, whatever is set aside
        # The arithmetic answer is a function of the node's pods (its generation), the pod's priority and
        # requests, the budgets and, when a lower pod has no start time yet, the clock: kept per node for as
        # long as those are the same (a burst dry-runs mostly the same nodes, unchanged, decision after
        # decision).
        r = pod.requests
        key = (
            pod.priority,
            r.milli_cpu,
            r.memory,
            r.ephemeral_storage,
            tuple(sorted(r.scalar.items())) if r.scalar else (),
            self.budgets.version,
            tuple(sorted((p.key, *_shape(p)) for p in nominated)) if nominated else (),
        )
        kept = self._victims.get(info.node.name)
        if (
            kept is not None
            and kept[0] is info
            and kept[1] == info.generation
            and kept[2] == key
            and (kept[3] is None or kept[3] < now)
        ):
            self.memo_hits += 1
            return kept[4]
        lower = [p for p in info.pods.values() if p.priority < pod.priority]
        if not lower:
            return NO_VICTIMS
        found = self._by_arithmetic(pod, info, lower, nominated, now)
        if found is None:
            # the pod does not fit even with every lower pod removed: the full dry run says why, exactly
            return self._by_filters(pod, info, lower, now)
        self.arithmetic_runs += 1
        # A lower pod without a start time counts as starting ``now``; the order of reprieve then depends on
        # the clock only through which start times are before it: the answer holds while the latest known
        # start is still before the clock (None: it does not depend on the clock at all).
        clock: float | None = None
        if any(p.start_time is None for p in lower):
            starts = [p.start_time for p in lower if p.start_time is not None]
            if starts:
                latest = max(starts)
                clock = latest if latest < now else math.inf
        if len(self._victims) >= VICTIMS_KEPT:
            self._victims.clear()
        self._victims[info.node.name] = (info, info.generation, key, clock, found)
        return found

    def _by_arithmetic(
        self,
        pod: PodRecord,
        info: NodeInfo,
        lower: list[PodRecord],
        nominated: list[PodRecord],
        now: float,
    ) -> Candidate | Status | None:
        """``_by_filters`` when only NodeResourcesFit can fail (``arithmetic``): the same order of reprieve, the
        same test (request <= allocatable - requested, per resource the pod asks for, and the pod count), on
        numbers instead of on the NodeInfo. None when the pod does not fit with every lower pod removed."""
        req = pod.requests
        alloc = info.node.allocatable
        used = info.requested
        # slack per resource the pod asks for (the filter tests only those), with every lower pod removed
        dims: list[str] = []
        slack: list[int] = []
        if req.milli_cpu:
            dims.append(CPU)
            slack.append(alloc.milli_cpu - used.milli_cpu - req.milli_cpu)
        if req.memory:
            dims.append(MEMORY)
            slack.append(alloc.memory - used.memory - req.memory)
        if req.ephemeral_storage:
            dims.append(EPHEMERAL_STORAGE)
            slack.append(alloc.ephemeral_storage - used.ephemeral_storage - req.ephemeral_storage)
        for name, amount in req.scalar.items():
            dims.append(name)
            slack.append(alloc.scalar.get(name, 0) - used.scalar.get(name, 0) - amount)
        vectors = {p.key: [p.requests.get(d) for d in dims] for p in lower}
        for p in lower:
            v = vectors[p.key]
            for i in range(len(slack)):
                slack[i] += v[i]
        # the engine filters with the node's nominated pods of at least this priority counted first, and
        # passes only if the pod fits with them (then it fits without them too: resources are monotone)
        for p in nominated:
            for i, d in enumerate(dims):
                slack[i] -= p.requests.get(d)
        room = (
            alloc.pods - (len(info.pods) - len(lower)) - len(nominated) - 1
        )  # pods that may still come back
        if room < 0 or any(x < 0 for x in slack):
            return None
        lower.sort(key=lambda p: importance(p, now))
        violating, fine = self.budgets.split(lower)
        victims: list[PodRecord] = []
        violations = 0
        n = len(slack)
        for group, violates in ((violating, True), (fine, False)):
            for p in group:
                v = vectors[p.key]
                if room > 0 and all(slack[i] >= v[i] for i in range(n)):
                    room -= 1  # reprieved: it stays, and the pod still fits
                    for i in range(n):
                        slack[i] -= v[i]
                else:
                    victims.append(p)
                    violations += violates
        if violating and fine:
            victims.sort(key=lambda p: importance(p, now))
        if not victims:
            return Status(Code.ERROR, (f"expected at least one victim pod on node {info.node.name}",))
        return Candidate(NodeName(info.node.name), tuple(victims), violations)

    def _by_filters(
        self, pod: PodRecord, info: NodeInfo, lower: list[PodRecord], now: float
    ) -> Candidate | Status:
        """The dry run itself: every filter re-run on the node with pods set aside and put back."""
        cache = self.cache
        engine = self.engine
        # The inter-pod filters read the topology counts only for a pod with inter-pod rules of its own, or
        # when some placed pod has a required anti-affinity term (which may match it); otherwise no filter
        # reads a count, and moving the pods in and out of NodeInfo alone is the same dry run, for less.
        counts = pod.inter_pod is not None or bool(cache.topology.anti_groups)
        aside: dict[PodKey, PodRecord] = {}
        order = list(info.pods)
        try:
            for p in lower:
                cache.set_aside(info, p, counts=counts)
                aside[p.key] = p
            st = engine.verdict(pod, info)
            if st is not None:
                return st
            lower.sort(key=lambda p: importance(p, now))
            violating, fine = self.budgets.split(lower)
            victims: list[PodRecord] = []
            violations = 0
            for group, violates in ((violating, True), (fine, False)):
                for p in group:
                    cache.put_back(info, p, counts=counts)
                    del aside[p.key]
                    if engine.verdict(pod, info) is not None:
                        cache.set_aside(info, p, counts=counts)
                        aside[p.key] = p
                        victims.append(p)
                        violations += violates
            if violating and fine:
                victims.sort(key=lambda p: importance(p, now))
        finally:
            for p in aside.values():
                cache.put_back(info, p, counts=counts)
            # put back pods come last in the node's pod map; its order breaks ties between equally important
            # pods in later dry runs, so it is restored (the answer must not depend on earlier dry runs)
            if list(info.pods) != order:
                pods = info.pods
                for k in order:
                    pods[k] = pods.pop(k)
        if not victims:
            # the pod fits with nothing removed: only nominated pods kept it out (kube-scheduler's error)
            return Status(Code.ERROR, (f"expected at least one victim pod on node {info.node.name}",))
        return Candidate(NodeName(info.node.name), tuple(victims), violations)


def _shape(pod: PodRecord) -> tuple[int, int, int, tuple[tuple[str, int], ...]]:
    r = pod.requests
    return (r.milli_cpu, r.memory, r.ephemeral_storage, tuple(sorted(r.scalar.items())))


class Executor:
    """Step 6 of the module docstring: the API calls of a preemption, off the decision path.

    Fenced as bindings are: every write of a preemption onto a node (the preemptor's nomination, the clearing
    of lower-priority nominations there, each victim's condition and delete, its event) is sent only with at
    least ``MIN_ATTEMPT`` of the node's ``budget`` left (``worker.binder.Binder.budget``: 0 unless the node is
    usable, else up to the lease's fencing deadline less a margin) and must end within it, here and at the API
    server. A preemption counts as in flight on its node until its last write ended, and a write to a pod that
    got no answer (a timeout, a broken connection, a 5xx: it may still be applied) keeps the node counted for
    ``unanswered_hold`` more; a release of the node waits for both (``drain``)."""

    def __init__(
        self,
        client: KubeClient,
        *,
        component: str,
        instance: str,
        done: Callable[[PodKey], None],
        not_evicted: Callable[[PodRecord], None],
        gone: Callable[[PodRecord], None],
        budget: Callable[[NodeName], float],
        unanswered_hold: float = MAX_BIND_TIME,
    ) -> None:
        self.client = client
        self.component = component
        self.instance = instance
        self.done = done  # the preemptor may be tried again (the queue's activate)
        self.not_evicted = not_evicted  # a victim's eviction did not happen (``Evaluator.not_evicted``)
        # the preemptor no longer exists as it was decided (step 6): nothing more for it here
        self.gone = gone
        self.budget = budget
        self.unanswered_hold = unanswered_hold
        self._work: asyncio.Queue[tuple[PodRecord, Candidate | None, list[PodRecord]]] = asyncio.Queue()
        self._busy: set[PodKey] = set()
        self._in_flight = InFlight()  # preemptions under way, and writes left unanswered, per node
        self.carried_out = 0
        self.errors = 0
        self.abandoned = 0  # preemptions not carried out: the preemptor was gone (step 6)
        self.fenced = 0  # writes not sent: the node no longer usable, or its fencing deadline too close

    def busy(self, key: PodKey) -> bool:
        return key in self._busy

    def submit(self, pod: PodRecord, candidate: Candidate, lower: list[PodRecord]) -> None:
        """Carry out ``candidate`` for ``pod``; ``lower``: lower-priority pods nominated there, to clear."""
        self._busy.add(pod.key)
        self._work.put_nowait((pod, candidate, lower))

    def clear(self, pod: PodRecord) -> None:
        """Drop ``pod``'s nomination in the API (preemption cannot help it any more). Not fenced: it writes
        no node, only takes a reservation away, and only a standalone worker (whose shard is the whole
        cluster) sends it."""
        self._work.put_nowait((pod, None, []))

    async def drain(self, nodes: Iterable[NodeName]) -> None:
        """Wait until no preemption onto these nodes is under way and no unanswered write to them may still
        land (a node release waits for it, as for the bindings: the next owner must not meet this worker's
        nominations or evictions on its node after the handover)."""
        await self._in_flight.idle(nodes)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for _ in range(EXECUTORS):
                tg.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            pod, candidate, lower = await self._work.get()
            try:
                if candidate is None:
                    await self._nominate(pod, None, None)
                else:
                    await self._carry_out(pod, candidate, lower)
            except ApiError as e:
                self.errors += 1
                log.warning("preemption for %s: %s", pod.key, e)
            finally:
                if candidate is not None:
                    self._busy.discard(pod.key)
                    self.done(pod.key)

    async def _carry_out(self, pod: PodRecord, c: Candidate, lower: list[PodRecord]) -> None:
        victims = [v for v in c.victims if not v.deleting]
        evicted: set[PodKey] = set()
        results: list[bool | BaseException] = []
        self._in_flight.start(c.node)
        try:
            nominated = await self._nominate(pod, c.node, c.node)
            if nominated is None:
                return  # fenced: nothing written; the preemptor is tried again (``done``)
            if not nominated:
                self.abandoned += 1
                log.info("preemption abandoned: the preemptor is gone or bound", extra={"pod": pod.key})
                self.gone(pod)
                return
            metrics.preemption_victims.observe(len(c.victims))
            for other in lower:
                if await self._nominate(other, None, c.node) is None:
                    break  # fenced: a nomination left in place only reserves room
            results = await asyncio.gather(
                *(self._evict(pod, c.node, v) for v in victims), return_exceptions=True
            )
            evicted = {v.key for v, r in zip(victims, results, strict=True) if r is True}
        finally:
            # victims not evicted (an error, already gone, fenced, or never reached) stop counting as terminating
            for v in victims:
                if v.key not in evicted:
                    self.not_evicted(v)
            await self._in_flight.end(c.node)
        failed = [r for r in results if isinstance(r, BaseException)]
        self.carried_out += 1
        if failed:
            raise failed[0]

    async def _write(
        self, node: NodeName, send: Callable[[float], Awaitable[Any]], *, hold: bool = True
    ) -> tuple[bool, Any]:
        """``send(budget)`` for ``node`` if its budget allows: (False, None) when it must not be sent, else
        (True, its answer). It must end within the budget here (``asyncio.timeout``, from now: the rate limit's
        wait included) and at the API server (``send`` passes it as the request's ``timeout``). A write that got
        no answer raises ``ServerError`` and, with ``hold`` (a write to the node's pods, not an event), keeps
        ``node`` counted in flight for ``unanswered_hold``."""
        budget = self.budget(node)
        if budget < MIN_ATTEMPT:  # immediately before sending: nothing awaits in between
            self.fenced += 1
            metrics.preemption_writes_fenced.inc()
            log.warning(
                "preemption write not sent: node %s not usable or its fencing deadline too close", node
            )
            return False, None
        try:
            async with asyncio.timeout(budget):
                return True, await send(budget)
        except (TimeoutError, ServerError) as e:  # no answer, a 5xx, a broken connection: it may still land
            if hold:
                self._hold(node)
            if isinstance(e, TimeoutError):
                raise ServerError(
                    0, f"preemption write for node {node}: no answer within {budget:.3f}s"
                ) from e
            raise

    def _hold(self, node: NodeName) -> None:
        self._in_flight.start(node)
        self._in_flight.end_later(node, self.unanswered_hold)

    async def _nominate(self, pod: PodRecord, node: NodeName | None, fence: NodeName | None) -> bool | None:
        """Patch ``pod``'s nomination to ``node`` (None: clear it), a write for node ``fence`` (None: not
        fenced, ``clear``); True when the answer is that very pod (same uid), still unbound; None if fenced."""
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status"
        body = {"status": {"nominatedNodeName": node}}
        try:
            if fence is None:
                answer = await self.client.patch(path, body, kind="merge")
            else:
                sent, answer = await self._write(
                    fence, lambda budget: self.client.patch(path, body, kind="merge", timeout=budget)
                )
                if not sent:
                    return None
        except NotFound:
            return False  # the pod is gone: nothing to nominate
        if not isinstance(answer, dict):
            return False
        meta, spec = answer.get("metadata") or {}, answer.get("spec") or {}
        return (not pod.uid or meta.get("uid") == pod.uid) and not spec.get("nodeName")

    async def _evict(self, preemptor: PodRecord, node: NodeName, victim: PodRecord) -> bool:
        """Delete ``victim`` as kube-scheduler does (condition, graceful delete, event), each write fenced
        (``_write``); False: already gone, or fenced before its delete."""
        path = f"/api/v1/namespaces/{victim.namespace}/pods/{victim.name}"
        condition = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "PreemptionByScheduler",
            "message": f"{self.component}: preempting to accommodate a higher priority pod",
            "lastTransitionTime": rfc3339(),
        }
        status = {"status": {"conditions": [condition]}}
        try:
            sent, _ = await self._write(
                node,
                lambda budget: self.client.patch(path + "/status", status, kind="strategic", timeout=budget),
            )
            if not sent:
                return False
            sent, _ = await self._write(node, lambda budget: self.client.delete(path, timeout=budget))
            if not sent:
                return False
        except NotFound:
            return False  # already gone: nothing to preempt
        body = event_body(
            ObjectRef.pod(victim.namespace, victim.name, victim.uid),
            type_=NORMAL,
            reason="Preempted",
            message=f"Preempted by pod {preemptor.uid} on node {node}",
            component=self.component,
            instance=self.instance,
        )
        body["action"] = "Preempting"
        body["related"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": preemptor.namespace,
            "name": preemptor.name,
            "uid": preemptor.uid,
        }
        try:
            # within the node's budget too, so that a release of the node does not wait for it past the fence; not
            # held when unanswered: a late event changes nothing on the node
            await self._write(
                node,
                lambda budget: self.client.post(events_path(victim.namespace), body, timeout=budget),
                hold=False,
            )
        except ApiError as e:
            log.warning("pod %s: could not record Preempted event: %s", victim.key, e)
        return True


class Preemption:
    """The post-filter the scheduler calls when no node fits (see the module docstring)."""

    def __init__(self, cache: Cache, evaluator: Evaluator, executor: Executor) -> None:
        self.cache = cache
        self.evaluator = evaluator
        self.executor = executor
        # under a coordinator: the summary last proposed to the leader for each pod (``carry_out``)
        self.proposed: dict[PodKey, Summary] = {}

    def busy(self, key: PodKey) -> bool:
        return self.executor.busy(key)

    def post_filter(self, pod: PodRecord, decision: Decision) -> Decision:
        """Try preemption for ``pod``, which ``decision`` found no node for; the decision to report."""
        metrics.preemption_attempts.inc()
        verdict = self.evaluator.evaluate(pod)
        c = verdict.candidate
        if c is None:
            if verdict.clear_nomination:
                had = self.cache.unnominate(pod.key) is not None
                if had or pod.nominated_node:
                    self.executor.clear(pod)
            return replace(decision, message=f"{decision.message} preemption: {verdict.message}")
        self._execute(pod, c)
        return decision

    def _execute(self, pod: PodRecord, c: Candidate) -> None:
        """Steps 5-6: nominate ``pod`` to ``c.node`` at once, and hand the API work to the executor."""
        lower = [p for p in self.cache.nominated.get(c.node, {}).values() if p.priority < pod.priority]
        for p in lower:
            self.cache.unnominate(p.key)
        self.cache.nominate(pod, c.node)
        self.evaluator.evicted(c.victims)
        self.executor.submit(pod, c, lower)
        log.info(
            "preempting %d pod(s) on %s for %s",
            len(c.victims),
            c.node,
            pod.key,
            extra={"pod": pod.key, "node": c.node},
        )

    # ----- under a coordinator (see the module docstring) --------------------------------------------------

    def waiting(self, pod: PodRecord) -> NodeName | None:
        """The node of this shard ``pod`` is nominated to, if its victims there are still terminating: then it
        waits here for the room, as a standalone worker's pod would, instead of going back to the leader."""
        name = pod.nominated_node or self.cache.nominated_node.get(pod.key)
        if not name:
            return None
        node = NodeName(name)
        if self.cache.usable(node) and self.evaluator.ineligible(pod) == TERMINATING:
            return node
        return None

    def propose(self, pod: PodRecord, decision: Decision) -> Decision:
        """Steps 1-4 only: ``decision`` with this shard's best candidate for the leader, or with the reason
        there is none. Nothing is nominated or evicted."""
        metrics.preemption_attempts.inc()
        return self._propose(pod, decision)

    def _propose(self, pod: PodRecord, decision: Decision, verdict: Verdict | None = None) -> Decision:
        verdict = verdict or self.evaluator.evaluate(pod)
        c = verdict.candidate
        if c is None:
            self.proposed.pop(pod.key, None)
            return replace(decision, message=f"{decision.message} preemption: {verdict.message}")
        summary = c.summary(self.evaluator.wall())
        if len(self.proposed) >= PROPOSALS_KEPT:
            self.proposed.clear()
        self.proposed[pod.key] = summary
        return replace(decision, preemption=summary.wire())

    def forget(self, key: PodKey) -> None:
        """``key`` is gone (deleted, finished or placed): its proposal is of no further use."""
        self.proposed.pop(key, None)

    def carry_out(self, pod: PodRecord, node: NodeName, decision: Decision) -> Decision | None:
        """The leader chose ``node`` for ``pod``'s preemption: re-check the victims there now and, if it is
        still a candidate, carry it out (None: the pod waits here for the room); else carry out this shard's
        best candidate if it ranks no worse than the proposal the leader chose. Otherwise ``propose``'s answer,
        a fresh candidate or none. Only a node this worker owns and can use is ever touched. One post-filter
        call, counted once in ``scheduler_preemption_attempts_total`` whichever way it ends."""
        metrics.preemption_attempts.inc()
        ev = self.evaluator
        info = self.cache.nodes.get(node)
        owned = info is not None and node in self.cache.known and self.cache.usable(node)
        proposed = self.proposed.pop(pod.key, None)
        if info is not None and owned and ev.ineligible(pod) is None:
            st = ev.engine.verdict(pod, info)
            if st is not None and st.code == Code.UNSCHEDULABLE:
                found = ev.select_victims(pod, info, ev.wall())
                if isinstance(found, Candidate):
                    self._execute(pod, found)
                    return None
        verdict = ev.evaluate(pod)
        fresh = verdict.candidate
        if fresh is not None and proposed is not None and fresh.summary(ev.wall()).rank() <= proposed.rank():
            # The leader chose this shard's proposal as the best of every shard's; a candidate here now at
            # least as good as that proposal is at least as good as any the leader knew: carried out at once,
            # instead of a round trip that would most likely send it back here (several pods proposed on one
            # node in a burst: only the first finds it still a candidate)
            self._execute(pod, fresh)
            return None
        return self._propose(pod, decision, verdict)
