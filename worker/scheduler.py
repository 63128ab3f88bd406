"""One worker's scheduler: watches feed the cache and queue; a loop pops pods, decides, assumes and hands the
binding to the binder. Everything runs in one asyncio thread, so there is no lock anywhere, and no lock is
shared with any other worker process.

Seams (so the coordinator can drive a worker without this module knowing about it):
- ``owns(node)``: which nodes this worker may place on right now (standalone: all; under a coordinator: its
  shard, fenced by its lease). Checked on every decision; ``ownership_changed`` re-indexes.
- intake: in standalone mode the pod watch admits every pending pod of our scheduler name; otherwise pods
  arrive through ``submit`` and only the cache is fed by the watch.
- ``on_unschedulable``: what to do with a pod no owned node can take (standalone: report it on the pod;
  under a coordinator: hand it back so another shard can try).

Invariants: a pod is assumed at most once (the cache refuses a second assume); a pod already placed or
assumed is never scheduled again; every failed binding returns its capacity (see ``worker.binder``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from common import metrics
from common.kube import KubeClient
from common.records import NodeName, PodKey, PodRecord, node_from_json, pod_from_json
from common.reporting import Reporter
from common.watching import Reflector
from worker.binder import Binder
from worker.cache import Cache
from worker.engine import Decision, Engine
from worker.framework import Code
from worker.plugins import default_profile, default_registry
from worker.queue import QueuedPod, SchedulingQueue
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)

CATCH_UP_TIMEOUT = 5.0  # seconds a newly granted node waits for the pod watch before a direct read is used
CATCH_UP_CONCURRENCY = 16
YIELD_EVERY = 64  # decisions between yields to the event loop, so watches and binds keep flowing
HOUSEKEEPING_PERIOD = 0.05
EXPIRY_PERIOD = 1.0
UNSCHEDULABLE_FLUSH_PERIOD = 30.0


def build_engine(settings: WorkerSettings, cache: Cache) -> Engine:
    s = settings.scheduling
    profile = default_profile()
    if s.strategy not in ("MostAllocated", "LeastAllocated"):
        raise ValueError(f"unknown strategy {s.strategy!r}: MostAllocated or LeastAllocated")
    if s.strategy == "LeastAllocated":
        profile.scores["LeastAllocated"] = profile.scores.pop("MostAllocated")
    for name, weight in s.score_weights.items():
        profile.scores[name] = weight
    warm_key, _, warm_value = s.warm_label.partition("=")
    profile.args["WarmNode"] = {"label": warm_key, "value": warm_value or "true"}
    profile.args["SessionLocality"] = {"label": s.session_label}
    filters, scores = default_registry().build(profile)
    return Engine(cache, filters, scores, feasible_nodes=s.feasible_nodes, session_label=s.session_label)


class _NodeFeed:
    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched

    def replace(self, objects: list[dict[str, Any]]) -> None:
        self.sched.cache.replace_nodes([node_from_json(o) for o in objects])
        self.sched.queue.move_all()

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        record = node_from_json(obj)
        if kind == "DELETED":
            self.sched.cache.remove_node(record.name)
        elif self.sched.cache.upsert_node(record):
            self.sched.queue.move_all()


class _PodFeed:
    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched

    def replace(self, objects: list[dict[str, Any]]) -> None:
        pods = [pod_from_json(o) for o in objects]
        self.sched.cache.replace_pods([p for p in pods if p.node_name and not p.terminal])
        for p in pods:
            self.sched.admit(p)

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        pod = pod_from_json(obj)
        s = self.sched
        if kind == "DELETED" or pod.terminal:
            s.queue.delete(pod.key)
            s.reporter.forget(pod.key)
            if s.cache.remove_pod(pod.key):
                s.queue.move_all()
            return
        if s.cache.upsert_pod(pod):
            s.queue.move_all()
        s.admit(pod)


class Scheduler:
    def __init__(
        self,
        client: KubeClient,
        settings: WorkerSettings,
        *,
        owns: Callable[[NodeName], bool] | None = None,
        watch_pending: bool = True,
        on_unschedulable: Callable[[PodRecord, Decision], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.settings = settings
        self.clock = clock
        self.watch_pending = watch_pending
        s = settings.scheduling
        self.cache = Cache(
            owns=owns,
            ascending=s.strategy != "LeastAllocated",
            session_label=s.session_label,
            assume_ttl=settings.binding.assume_ttl,
        )
        self.queue = SchedulingQueue(clock)
        self.engine = build_engine(settings, self.cache)
        self.reporter = Reporter(
            client,
            component=s.scheduler_name,
            instance=settings.worker_id,
            qps=settings.reporting.qps,
            scheduled_events=settings.reporting.scheduled_events,
        )
        self.binder = Binder(
            client,
            self.cache,
            concurrency=settings.binding.concurrency,
            retries=settings.binding.retries,
            clock=clock,
            on_bound=self.reporter.scheduled,
            on_requeue=self.queue.requeue,
            on_rejected=self.reporter.unschedulable,
        )
        self.on_unschedulable = on_unschedulable or (
            lambda pod, d: self.reporter.unschedulable(pod, d.message)
        )
        params = {"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"}
        self.pod_reflector = Reflector(client, "/api/v1/pods", _PodFeed(self), params=params, name="pods")
        node_params = {"labelSelector": s.node_selector} if s.node_selector else {}
        self.node_reflector = Reflector(
            client, "/api/v1/nodes", _NodeFeed(self), params=node_params, name="nodes"
        )
        self.decisions = 0
        self.unschedulable = 0
        self.paused = False
        self.syncing: set[NodeName] = set()

    # ----- intake ----------------------------------------------------------------------------------------

    def is_ours(self, pod: PodRecord) -> bool:
        return pod.scheduler_name == self.settings.scheduling.scheduler_name

    def admit(self, pod: PodRecord) -> None:
        """A pod from the watch: queue it if it is ours and waiting; drop it from the queue once placed."""
        if not self.is_ours(pod):
            return
        if pod.node_name or pod.deleting:
            self.queue.delete(pod.key)
            return
        if self.watch_pending and not self.cache.is_assumed(pod.key):
            self.queue.add(pod)

    def submit(self, pod: PodRecord) -> None:
        """A pod handed to this worker from outside (the coordinator's dispatch)."""
        if not pod.node_name and not self.cache.is_assumed(pod.key) and pod.key not in self.cache.pod_node:
            self.queue.add(pod)

    def ownership_changed(self, nodes: set[NodeName] | frozenset[NodeName] | None = None) -> None:
        self.cache.ownership_changed(nodes)
        self.queue.move_all()

    def usable(self, node: NodeName) -> bool:
        """Granted nodes are usable only once the cache has caught up with them (see ``acquire``)."""
        return node not in self.syncing

    async def acquire(self, nodes: frozenset[NodeName]) -> None:
        """Make newly granted nodes usable once this worker's cache holds every pod already bound there.

        The previous owner released a node only after its bindings completed, but our pod watch may not have
        delivered those bindings yet; placing before it has would overcommit the node. So a node granted at
        time g becomes usable when the cache reflects a consistent read made after g: either a (re)list that
        started after g, or, per node, a consistent LIST of the pods bound to it whose newest revision the
        watch has reached. If the watch lags more than ``CATCH_UP_TIMEOUT``, the listed pods are applied
        directly (a pod deleted meanwhile may then count until the next relist: conservative, never over).
        """
        granted_at = time.monotonic()
        self.syncing |= nodes
        try:
            await self.pod_reflector.synced.wait()
            if self.pod_reflector.list_started_at < granted_at:
                sem = asyncio.Semaphore(CATCH_UP_CONCURRENCY)

                async def one(node: NodeName) -> None:
                    async with sem:
                        await self._catch_up(node)

                await asyncio.gather(*(one(n) for n in nodes))
        finally:
            self.syncing -= nodes
            self.ownership_changed(nodes)

    async def _catch_up(self, node: NodeName) -> None:
        reply = await self.client.get("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"})
        items = reply.get("items") or []
        # resourceVersions are etcd revisions in every API server we know; compared as integers here only.
        target = max((int(i["metadata"]["resourceVersion"]) for i in items), default=0)
        deadline = time.monotonic() + CATCH_UP_TIMEOUT
        while int(self.pod_reflector.resource_version or 0) < target:
            if time.monotonic() >= deadline:
                log.warning(
                    "pod watch lags behind a granted node; applying a direct read", extra={"node": node}
                )
                for obj in items:
                    pod = pod_from_json(obj)
                    if not pod.terminal and pod.key not in self.cache.pod_node:
                        self.cache.upsert_pod(pod)
                return
            await asyncio.sleep(0.01)

    # ----- the loop --------------------------------------------------------------------------------------

    def schedule_one(self, qp: QueuedPod) -> Decision | None:
        pod = qp.pod
        key: PodKey = pod.key
        if self.cache.is_assumed(key) or key in self.cache.pod_node:
            self.queue.done(qp, scheduled=True)
            return None
        start = self.clock()
        decision = self.engine.schedule(pod)
        elapsed = self.clock() - start
        self.decisions += 1
        metrics.nodes_evaluated.observe(decision.evaluated)
        metrics.index_lookups.labels("hit" if decision.index_hit else "miss").inc()
        if decision.node is not None:
            self.cache.assume(pod, decision.node)
            self.queue.done(qp, scheduled=True)
            self.binder.submit(pod, decision.node, qp.added_at, qp.attempts)
            log.debug("assumed", extra={"pod": key, "node": decision.node})
            metrics.schedule_attempts.labels("scheduled", "agent").inc()
            metrics.attempt_duration.labels("scheduled", "agent").observe(elapsed)
            return decision
        result = "error" if decision.code == Code.ERROR else "unschedulable"
        metrics.schedule_attempts.labels(result, "agent").inc()
        metrics.attempt_duration.labels(result, "agent").observe(elapsed)
        self.unschedulable += 1
        log.debug("unschedulable: %s", decision.message, extra={"pod": key})
        self.queue.done(qp, scheduled=False, retry=decision.code == Code.ERROR, message=decision.message)
        self.on_unschedulable(pod, decision)
        return decision

    def pause(self) -> None:
        """Stop making decisions (bindings under way go on); used for a graceful stop or a drain."""
        self.paused = True

    async def scheduling_loop(self) -> None:
        while True:
            await self.queue.wait(HOUSEKEEPING_PERIOD)
            n = 0
            while not self.paused and (qp := self.queue.pop_nowait()) is not None:
                self.schedule_one(qp)
                n += 1
                if n % YIELD_EVERY == 0:
                    await asyncio.sleep(0)

    async def housekeeping(self) -> None:
        last_expiry = last_flush = self.clock()
        while True:
            await asyncio.sleep(HOUSEKEEPING_PERIOD)
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
        return self.pod_reflector.synced.is_set() and self.node_reflector.synced.is_set()

    async def run(self) -> None:
        """Run until cancelled. Pods are only scheduled once both caches have synced."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.node_reflector.run())
            await self.node_reflector.synced.wait()
            tg.create_task(self.pod_reflector.run())
            await self.pod_reflector.synced.wait()
            log.info("caches synced: %s", self.cache.statistics())
            tg.create_task(self.binder.run())
            tg.create_task(self.reporter.run())
            tg.create_task(self.housekeeping())
            tg.create_task(self.scheduling_loop())

    def statistics(self) -> dict[str, Any]:
        return {
            "queue": self.queue.statistics(),
            "cache": self.cache.statistics(),
            "decisions": self.decisions,
            "unschedulable": self.unschedulable,
            "bound": self.binder.bound,
            "binding_in_flight": self.binder.in_flight(),
            "reports_pending": self.reporter.pending(),
        }
