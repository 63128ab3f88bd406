"""One worker's scheduler: watches (``worker.feeds``) feed the cache and queue; a loop pops pods, decides,
assumes and hands the binding to the binder. Everything runs in one asyncio thread, so there is no lock
anywhere, and no lock is shared with any other worker process.

Seams, all given to the constructor (so the coordinator can drive a worker without this module knowing it):
- ``shard`` (``worker.shard.ShardView``): which nodes this worker may place on right now (standalone: all;
  under a coordinator: its shard, fenced by its lease). The cache asks it and re-indexes on its changes;
  the queue's unschedulable pods retry on them.
- ``outcomes`` (``worker.outcomes.Outcomes``): who is told that a pod was bound, is unschedulable, or had
  its binding rejected (standalone: the pod itself; under a coordinator: the leader).
- ``watch_pending``: in standalone mode the pod watch admits every pending pod of our scheduler name, and an
  unschedulable pod, or one whose binding the API server refused, stays in this worker's queue to retry
  with backoff; otherwise pods arrive through ``submit`` and an unschedulable or refused one leaves the
  queue, handed back to the leader with the verdict (the leader retries a refused one with backoff).
- ``claims`` (``worker.claims``, under a coordinator): the pod watch also admits the pending pods this worker
  claims; they are decided as dispatched pods are; one placed is not answered (the leader's watch shows
  it), one not placed is handed back (``worker.intake.LeaderResults``).

- ``set_sole``: under a coordinator, the sole worker runs as standalone does (``watch_pending`` on) until its
  leader stream ends (``worker.intake``), except that while granted nodes catch up a pod that fits nowhere
  does not preempt and waits until they are usable (``release_held``).

- ``preempt``: when no node fits, try preemption (``worker.preemption``). It adds a watch of
  PodDisruptionBudgets, synced before the first decision. Standalone, the worker preempts at once. Under a
  coordinator (``watch_pending`` false) a shard's "no" is not the cluster's: the worker only proposes its best
  candidate to the leader with the unschedulable verdict, and preempts only on the node the leader chose for
  that pod (``preempt_next``, from DISPATCH ``preempt``), after re-checking it; the pod then stays in this
  worker's queue until it binds.

Invariants: a pod is assumed at most once (the cache refuses a second assume); a pod already placed or
assumed is never scheduled again; every failed binding returns its capacity (see ``worker.binder``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from common import aiotools, metrics
from common.kube import KubeClient
from common.records import NodeName, PodKey, PodRecord
from common.reporting import Reporter
from common.watching import Reflector
from worker.binder import Binder
from worker.budgets import Budgets
from worker.cache import Cache
from worker.claims import Claims
from worker.engine import Decision, Engine
from worker.feeds import Watches
from worker.framework import Code
from worker.hints import NodeHints
from worker.outcomes import Outcomes
from worker.plugins import default_profile, default_registry, spread_defaults
from worker.preemption import Evaluator, Executor, Preemption
from worker.queue import QueuedPod, SchedulingQueue
from worker.settings import WorkerSettings
from worker.shard import ShardChange, ShardView

log = logging.getLogger(__name__)

YIELD_EVERY = 64  # decisions between yields to the event loop, so watches and binds keep flowing
HOUSEKEEPING_PERIOD = 0.05  # a paused loop looks again this often
EXPIRY_PERIOD = 1.0
UNSCHEDULABLE_FLUSH_PERIOD = 30.0


def spread_args(settings: WorkerSettings) -> dict[str, Any]:
    """The PodTopologySpread plugins' arguments (kube-scheduler's PodTopologySpreadArgs)."""
    s = settings.scheduling
    return {"defaultingType": s.spread_defaulting, "defaultConstraints": s.spread_default_constraints}


def build_engine(settings: WorkerSettings, cache: Cache) -> Engine:
    s = settings.scheduling
    profile = default_profile()
    if s.strategy not in ("MostAllocated", "LeastAllocated"):
        raise ValueError(f"unknown strategy {s.strategy!r}: MostAllocated or LeastAllocated")
    if s.strategy == "LeastAllocated":
        # in MostAllocated's place: within each of the engine's groups of scores, the profile's order is the
        # order in which they are summed (``worker.engine``)
        profile.scores = {
            ("LeastAllocated" if name == "MostAllocated" else name): weight
            for name, weight in profile.scores.items()
        }
    for name, weight in s.score_weights.items():
        profile.scores[name] = weight
    warm_key, _, warm_value = s.warm_label.partition("=")
    profile.args["WarmNode"] = {"label": warm_key, "value": warm_value or "true"}
    profile.args["SessionLocality"] = {"label": s.session_label}
    profile.args["PodTopologySpread"] = profile.args["PodTopologySpreadScore"] = spread_args(settings)
    filters, scores = default_registry().build(profile)
    return Engine(cache, filters, scores, feasible_nodes=s.feasible_nodes, session_label=s.session_label)


class Scheduler:
    """One worker's scheduling cycle over its cache, queue, binder and watches (see the module docstring)."""

    def __init__(
        self,
        client: KubeClient,
        settings: WorkerSettings,
        *,
        shard: ShardView,
        outcomes: Outcomes,
        reporter: Reporter,
        watch_pending: bool = True,
        preempt: bool = False,
        claims: Claims | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.settings = settings
        # the node the leader chose for a dispatched pod's preemption (coordinated), until its next decision
        # or until the pod is gone (``_gone``: deleted, finished or placed before that decision)
        self._preempt_on: dict[PodKey, NodeName] = {}
        self.clock = clock
        self.shard = shard
        self.outcomes = outcomes
        self.reporter = reporter
        self.watch_pending = watch_pending
        s = settings.scheduling
        self.cache = Cache(
            shard=shard,
            ascending=s.strategy != "LeastAllocated",
            session_label=s.session_label,
            assume_ttl=settings.binding.assume_ttl,
        )
        self.queue = SchedulingQueue(clock)
        # After the cache (subscribers are called in order): re-indexed first, then the waiting pods retry.
        shard.subscribe(self._shard_changed)
        self.engine = build_engine(settings, self.cache)
        defaults = spread_defaults(spread_args(settings))
        hard_defaults = any(c.hard for c in defaults.constraints)
        self.hints = NodeHints(self.cache, defaults=hard_defaults)
        if not watch_pending and hard_defaults:
            # a default DoNotSchedule constraint spans shards, and the leader cannot see which pods get it
            raise ValueError(
                "default topology spread constraints with whenUnsatisfiable DoNotSchedule are supported by a "
                "standalone worker only"
            )
        self.binder = Binder(
            client,
            self.cache,
            outcomes,
            requeue=self._requeue,
            shard=shard,
            requeue_rejected=watch_pending,
            concurrency=settings.binding.concurrency,
            retries=settings.binding.retries,
            clock=clock,
        )
        self.watches = Watches(
            client,
            self.cache,
            self.queue,
            reporter,
            scheduler_name=s.scheduler_name,
            node_selector=s.node_selector,
            watch_pending=watch_pending,
            # no default constraint: the Services and controllers are not needed, not watched
            watch_workloads=bool(defaults.constraints),
            gone=self._gone,
            claims=claims,
            hints=self.hints,
        )
        self.preemption: Preemption | None = None
        self.budgets: Reflector | None = None
        if preempt:
            budgets = Budgets()
            self.budgets = Reflector(
                client, "/apis/policy/v1/poddisruptionbudgets", budgets, name="poddisruptionbudgets"
            )
            self.preemption = Preemption(
                self.cache,
                Evaluator(self.cache, self.engine, budgets),
                Executor(
                    client,
                    component=s.scheduler_name,
                    instance=settings.worker_id or s.scheduler_name,
                    done=self.queue.activate,
                    not_evicted=self._not_evicted,
                    gone=self._preemptor_gone,
                    budget=self.binder.budget,  # its writes fenced as a binding's
                ),
            )
        # the ``profile`` label of the scheduling metrics: the scheduler name, as in kube-scheduler
        self.profile = s.scheduler_name
        # Label children of the per-decision metrics, resolved once (``labels()`` costs a locked lookup).
        self._attempts = {
            r: (
                metrics.schedule_attempts.labels(r, self.profile),
                metrics.attempt_duration.labels(r, self.profile),
            )
            for r in ("scheduled", "unschedulable", "error")
        }
        self._index = {hit: metrics.index_lookups.labels("hit" if hit else "miss") for hit in (True, False)}
        self.decisions = 0
        self.unschedulable = 0
        self.paused = False
        # pods whose "no" came while granted nodes caught up (a sole worker's): parked, moved by ``release_held``
        self._held: set[PodKey] = set()

    def _shard_changed(self, change: ShardChange) -> None:
        """Usable nodes added move the pods they may help (``worker.hints``); any removed, every pod."""
        if change.removed:
            self.queue.move_all()
            return
        # (a node the cache has no record of: every pod; one only its pods have shown has a placeholder
        # record, whose allocatable_error does the same)
        nodes = self.cache.nodes
        added = [nodes[n].node for n in change.added if n in nodes]
        self.queue.move_if(self.hints.after(added, added=True) if len(added) == len(change.added) else None)

    def _not_evicted(self, victim: PodRecord) -> None:
        """An eviction the preemption executor started did not happen: the victim no longer counts as
        terminating, so the pods that waited for it may preempt again (no cache event says so)."""
        if self.preemption is not None:
            self.preemption.evaluator.not_evicted(victim)
        self.queue.move_all()

    def _preemptor_gone(self, pod: PodRecord) -> None:
        """The preemption executor found ``pod`` deleted, recreated under another uid or bound when it came to
        carry out its preemption (no pod watch event may follow: a DISPATCH can come after the watch showed
        the deletion): it leaves this worker's queue and its nomination here ends."""
        queued = self.queue.queued(pod.key)
        if queued is None or not pod.uid or queued.uid == pod.uid:
            self.queue.delete(pod.key)  # a pod recreated under the name and queued since stays
        self.cache.unnominate(pod.key)
        self._gone(pod.key, pod.uid)

    def _gone(self, key: PodKey, uid: str) -> None:
        """The pod watch saw ``key`` deleted, finished or placed: nothing kept for its next decision stays."""
        self._preempt_on.pop(key, None)
        if self.preemption is not None:
            self.preemption.forget(key)
        self.outcomes.gone(key, uid)

    def _requeue(self, pod: PodRecord, attempts: int) -> None:
        """The binder gives ``pod`` back (its binding failed transiently): queued again if its outcome receiver
        still wants it decided here (``Outcomes.retry``)."""
        if self.outcomes.retry(pod):
            self.queue.requeue(pod, attempts)

    def withdraw_all(self, *, parked: Iterable[PodKey] = ()) -> None:
        """No pod queued here, nor ``parked`` (dispatched and not yet released to the queue), is this worker's to
        decide any more (the leader stream that sent them was replaced): the queue is emptied, with the
        leader's choices of preemption nodes and the preemption proposals."""
        withdrawn = [pod.key for pod in self.queue.records()]
        for key in withdrawn:
            self.queue.delete(key)
        if self.preemption is not None:
            # proposals of no further use; evictions already under way end as they would (the pod's nomination
            # is its status's, kept until the pod is placed or deleted, as the leader's path reads it)
            for key in (*withdrawn, *parked):
                self.preemption.forget(key)
        self._preempt_on.clear()  # every one was chosen by a leader of an earlier stream

    def set_sole(self, on: bool) -> None:
        """Under a coordinator: become (``on``) or stop being the sole worker (``worker.intake``): while sole,
        the pod watch admits every pending pod of ours, and an unschedulable or refused pod stays in this
        worker's queue and preempts at once, as standalone (``watch_pending``). Stopping empties the queue
        (``withdraw_all``): the leader dispatches those pods again."""
        self.watch_pending = self.watches.pod_feed.watch_pending = self.binder.requeue_rejected = on
        if not on:
            self._held.clear()
            self.withdraw_all()

    def release_held(self) -> None:
        """No granted node catches up any more (``worker.intake``, the sole worker): the pods whose "no" came
        while some did are decided again, over the whole shard, whatever the node events' hints said."""
        if self._held:
            held, self._held = self._held, set()
            self.queue.move_if(lambda pod: pod.key in held)

    def preempt_next(self, key: PodKey, node: NodeName) -> None:
        """The leader chose ``node`` for ``key``'s preemption: the pod's next decision may carry it out."""
        self._preempt_on[key] = node

    def submit(self, pod: PodRecord) -> None:
        """A pod handed to this worker from outside (the coordinator's dispatch)."""
        if self.cache.is_assumed(pod.key):
            return  # our binding of it is under way: its outcome follows
        if not pod.node_name and pod.key not in self.cache.pod_node:
            self.queue.add(pod)
        else:
            # already placed (the watch showed it bound, by us or another worker): no decision and no outcome
            # follow here for this dispatch
            self.outcomes.gone(pod.key, pod.uid)

    # ----- the loop --------------------------------------------------------------------------------------

    def schedule_one(self, qp: QueuedPod) -> Decision | None:
        pod = qp.pod
        key: PodKey = pod.key
        if self.cache.is_assumed(key) or key in self.cache.pod_node:
            self.queue.done(qp, scheduled=True)
            return None
        preemption = self.preemption
        if preemption is not None and preemption.busy(key):
            # its preemption is still being carried out: not tried until it ends (kube-scheduler's PreEnqueue)
            self.queue.done(qp, scheduled=False, message=qp.last_message)
            return None
        start = self.clock()
        decision = self.engine.schedule(pod)
        target = self._preempt_on.pop(key, None)
        if (
            decision.node is None
            and preemption is not None
            and decision.code != Code.ERROR
            and pod.parse_error is None
        ):
            if self.watch_pending:
                if not self.shard.syncing():
                    # (a sole worker whose granted nodes catch up waits: one of them may fit the pod without
                    # evicting anything, and the pod is decided again when they are usable)
                    decision = preemption.post_filter(pod, decision)
            elif (nominated := preemption.waiting(pod)) is not None:
                # nominated here, its victims still terminating: it waits here for the room (the leader
                # still has it in flight to us, and is told so), as a standalone worker's pod would
                self.queue.done(qp, scheduled=False, message=decision.message)
                self.outcomes.waiting(pod, nominated)
                return None
            elif target is not None:
                chosen = preemption.carry_out(pod, target, decision)
                if chosen is None:
                    # preempting: the pod waits here, activated when the evictions are done, and binds
                    # when the room is free (the leader is told it waits, then hears RESULT bound)
                    self.queue.done(qp, scheduled=False, message=decision.message)
                    self.outcomes.waiting(pod, target)
                    return None
                decision = chosen
            else:
                decision = preemption.propose(pod, decision)
        elapsed = self.clock() - start
        self.decisions += 1
        metrics.nodes_evaluated.observe(decision.evaluated)
        self._index[decision.index_hit].inc()
        if decision.node is not None:
            plan = self.engine.volume_plan(pod, decision.node) if pod.claims else None
            if plan is not None and plan.nothing_to_do:
                plan = None
            nominated = self.cache.assume(pod, decision.node)
            if nominated is not None and nominated != decision.node:
                # the room its nomination kept on another node is free: a pod that lacked it may fit now (one
                # of no higher priority: ``Cache.nominated_for``), and no node event says so (``worker.hints``
                # moves only the pods an event may help)
                priority = pod.priority
                self.queue.move_if(lambda p: p.priority <= priority)
            if plan is not None:
                # kube's AssumePodVolumes: the next decisions see the PVs taken and the claims annotated
                self.cache.volumes.assume(plan)
            self.queue.done(qp, scheduled=True)
            self.binder.submit(pod, decision.node, qp.added_at, qp.attempts, volumes=plan)
            metrics.observe_stage("decided", start + elapsed - qp.added_at)
            log.debug("assumed", extra={"pod": key, "node": decision.node})
            count, duration = self._attempts["scheduled"]
            count.inc()
            duration.observe(elapsed)
            return decision
        count, duration = self._attempts["error" if decision.code == Code.ERROR else "unschedulable"]
        count.inc()
        duration.observe(elapsed)
        self.unschedulable += 1
        log.debug("unschedulable: %s", decision.message, extra={"pod": key})
        if self.watch_pending:
            if decision.code != Code.ERROR and self.shard.syncing():
                # A "no" while granted nodes catch up (a sole worker's) is over part of the shard, no verdict:
                # the pod waits in the pool until they are usable (``release_held``), whatever the hints say.
                self._held.add(key)
            self.queue.done(qp, scheduled=False, retry=decision.code == Code.ERROR, message=decision.message)
        else:
            # The pod came from the leader: it goes back there with the verdict, and the leader may place it
            # on another shard (or dispatch it here again); retrying it here as well would race that.
            self.queue.leave(qp)
        self.outcomes.unschedulable(pod, decision)
        return decision

    def pause(self) -> None:
        """Stop making decisions (bindings under way go on); used for a graceful stop or a drain."""
        self.paused = True

    async def scheduling_loop(self) -> None:
        while True:
            if self.paused:
                # Not queue.wait: it returns at once while activeQ holds pods, and a paused loop pops none,
                # so it would spin without ever yielding and starve the drain it was paused for.
                await asyncio.sleep(HOUSEKEEPING_PERIOD)
                continue
            # No timeout: every way into activeQ (an add, a backoff flush, a move) wakes the loop, and an idle
            # worker should not wake up to find nothing to do.
            await self.queue.wait()
            n = 0
            while not self.paused and (qp := self.queue.pop_nowait()) is not None:
                self.schedule_one(qp)
                n += 1
                if n % YIELD_EVERY == 0:
                    await asyncio.sleep(0)

    async def housekeeping(self) -> None:
        """Backoffs ended (as each ends), assumptions expired and queue metrics (every ``EXPIRY_PERIOD``), the
        unschedulable pool's timeout. At rest, one wake-up per ``EXPIRY_PERIOD``."""
        last_expiry = last_flush = self.clock()
        while True:
            # (the check below is "at least EXPIRY_PERIOD since the last": waking a little before that, as a
            # timer may, would put it off by a whole period)
            await self.queue.wait_backoff(
                min(EXPIRY_PERIOD, max(0.0, last_expiry + EXPIRY_PERIOD - self.clock()))
            )
            self.queue.flush_backoff()
            now = self.clock()
            if now - last_expiry >= EXPIRY_PERIOD:
                last_expiry = now
                expired = self.cache.cleanup_expired(now)
                if expired:
                    metrics.assumed_expired.inc(len(expired))
                    self.queue.move_all()
                for where, n in self.queue.statistics().items():
                    metrics.pending_pods.labels(where).set(n)
                metrics.owned_nodes.set(len(self.cache.index))
            if now - last_flush >= UNSCHEDULABLE_FLUSH_PERIOD:
                last_flush = now
                self.queue.flush_unschedulable()

    def ready(self) -> bool:
        return self.watches.synced()

    async def release(self, nodes: frozenset[NodeName]) -> None:
        """The shard's release hook: wait until nothing this worker sends for ``nodes`` is under way, bindings
        (``Binder.drain``) and preemptions' nominations and evictions (``Executor.drain``). The nodes are no
        longer usable by then (``worker.shard``), so nothing new starts for them meanwhile."""
        await self.binder.drain(nodes)
        if self.preemption is not None:
            await self.preemption.executor.drain(nodes)

    async def run(self) -> None:
        """Run until cancelled. Pods are only scheduled once both caches have synced."""
        warm = self.settings.api.warm_connections
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.watches.nodes.run())
            if self.budgets is not None and self.preemption is not None:
                tg.create_task(self.budgets.run())
                tg.create_task(self.preemption.executor.run())
                await self.budgets.synced.wait()
            await self.watches.nodes.synced.wait()
            for reflector in self.watches.others:
                tg.create_task(reflector.run())
            for reflector in self.watches.others:
                await reflector.synced.wait()
            tg.create_task(self.watches.pods.run())
            await self.watches.pods.synced.wait()
            log.info("caches synced: %s", self.cache.statistics())
            # Opened now, not while the caches sync (whose reads they would slow), and before the first
            # decision: the first burst after a start (or a failover) binds without opening connections.
            tg.create_task(self.client.keep_warm(self.settings.binding.concurrency if warm is None else warm))
            tg.create_task(self.binder.run())
            tg.create_task(self.reporter.run())
            tg.create_task(self.housekeeping())
            tg.create_task(self.scheduling_loop())

    def statistics(self) -> dict[str, Any]:
        return {
            "queue": self.queue.statistics(),
            "cache": self.cache.statistics(),
            "decisions": self.decisions,
            "batched": self.engine.batched,  # decisions that reused their batch's run (``worker.engine``)
            "unschedulable": self.unschedulable,
            "bound": self.binder.bound,
            "binding_in_flight": self.binder.in_flight(),
            "reports_pending": self.reporter.pending(),
            # this process's idle passes that slept while work was queued, and for how long (``--pace``)
            "paced": {"sleeps": aiotools.PACER.sleeps, "seconds": round(aiotools.PACER.slept, 3)},
        }
