"""Asynchronous binding: the POST of each assumed pod's ``binding`` subresource, off the decision path.

A fixed pool of ``concurrency`` tasks takes (pod, node) pairs from a queue and binds them over the client's
kept-alive connections, in the order they were submitted. The binding of a pod with a required inter-pod rule
(``ordered``) is sent only after every binding submitted before it on this worker has finished: its decision
counted those pods (this worker's own assumptions), so under a coordinator the resourceVersion of its binding
must be above theirs: a later pod dispatched with ``min_rv`` at or above it then sees every pod it saw (the
topology lane, docs/architecture.md). Bindings are taken from the queue in order, and a pod with claims to bind
first never enters it (below), so the ones it waits for already hold a slot or a task of their own and the
wait cannot deadlock; it may last as long as an earlier pod's claims take (``volume_bind_timeout`` at most).
An unanswered earlier attempt counts as finished (it may
still be applied later; see ``unanswered_hold``), as does one that failed and handed its pod back.

Fencing (the binder's half of "no binding outside the fencing window"): immediately before each attempt
is sent, the shard (``worker.shard.ShardView.bind_deadline``) is asked whether the node is still usable
and until when the lease keeps it so. The attempt runs under a deadline of ``attempt_timeout`` seconds,
cut to end ``FENCE_MARGIN`` before the fencing deadline, and the POST carries what is left of it when it is
written (after the client's waits: its rate limit, a token refresh, a free connection) as its ``timeout``
parameter, so the API server abandons it then too; an attempt that would have less than ``MIN_ATTEMPT``
seconds is not sent. Such a binding is forgotten (capacity returned) and its pod handed back to this worker's
queue (``requeue``), like any transient failure: it is decided again, on a node this worker may still use, or
answered as unschedulable (to the leader, under a coordinator). Each write of a pod's volume binding (below) is fenced the same way, one check per write.
However long a binding waited in the queue, in backoff or for its volumes, nothing is sent after the worker
fenced itself.

Outcomes:
- success: the cache starts the assumption's TTL (``finish_binding``); the watch confirms it later.
- 409 Conflict (already bound, possibly by our own earlier attempt whose reply was lost): keep the assumption
  with its TTL running; the watch shows where the pod really is, or the assumption expires.
- 404 Not Found (the pod was deleted): forget the assumption, capacity returns.
- 429 / 5xx / timeout: retry with ``common.backoff`` (``RETRY_BACKOFF`` doubling to ``RETRY_BACKOFF_MAX``),
  at most ``retries`` times; then forget and ``requeue`` the pod in this worker's queue for another
  scheduling attempt. Unless an attempt went unanswered (a timeout, a broken connection, a 5xx: the API
  server may still apply it): then the assumption is kept, its capacity taken, until ``unanswered_hold``
  has passed and a read of the pod says what became of it (``_settle``): bound (anywhere) is handled as a
  409, unbound is forgotten and requeued, deleted is forgotten. Forgetting at once would free the node's
  capacity in this worker's cache while the API server binds the pod there: the next decisions would
  overcommit the node.
- node no longer usable, lease fenced, or too little time left before the fencing deadline: forget and
  ``requeue`` at once, without sending (after an unanswered attempt: as above, through ``_settle``).
- anything else (400/422/403, e.g. an admission policy): forget, and tell the outcome receiver it was
  ``rejected`` (API's message). With ``requeue_rejected`` (standalone: no leader will dispatch it again)
  the pod is also requeued, as kube-scheduler retries a failed binding.
``requeue`` is given the attempts the pod has made, so its backoff in the queue keeps growing across
failed bindings (kube-scheduler's per-pod backoff) instead of restarting at the first step each time.
Volumes first (kube's PreBind): a pod whose claims still need binding (``worker.volumes.VolumePlan``) has its
PV claimRefs and claim ``selected-node`` annotations written under the resourceVersions the decision saw, then
waits (in a task of its own, counted in flight for its node) until every claim is bound to a PV fitting the
node, for at most ``volume_bind_timeout``; only then does that task send the pod's binding itself. A pod using
a ReadWriteOncePod claim first takes it (an annotation naming the pod, written under the claim's
resourceVersion, refused while another pod named there still exists), so users of one such claim decided at
once by two workers are never both bound. A conflicting write, an undone binding or the timeout forgets the
pod, reverts the volume assumption and requeues the pod.
A success is told to the outcome receiver (``worker.outcomes``) as ``bound``, with the audit times.

Invariant: every path that does not end in a confirmed binding gives the capacity back (forget or expiry).
``in_flight(node)`` counts bindings under way per node, so a node release can wait for them (``drain``). An
attempt that got no answer (timed out, connection broken) may still be applied by the API server after we
gave up: its binding stays counted for ``unanswered_hold`` more (``MAX_BIND_TIME``, ``common.etcd.leases``),
or until ``_settle`` has read the pod when the binding failed, so a release acknowledged to the leader cannot
be overtaken by it either.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from common import aiotools, metrics
from common.backoff import Backoff
from common.etcd.leases import MAX_BIND_TIME
from common.kube import ApiError, Conflict, KubeClient, NotFound, ServerError, TooManyRequests
from common.records import NodeName, PodRecord
from worker.cache import Cache
from worker.inflight import InFlight
from worker.outcomes import Outcomes
from worker.shard import ShardView, WholeCluster
from worker.volumes import ANN_BOUND_BY_CONTROLLER, ANN_RWOP_HOLDER, ANN_SELECTED_NODE, VolumePlan

log = logging.getLogger(__name__)

RETRY_BACKOFF = 0.2
RETRY_BACKOFF_MAX = 2.0
DEFAULT_RETRIES = 4
ATTEMPT_TIMEOUT = 30.0  # one POST (the API client's request timeout); under a coordinator, < TTL/2 anyway
FENCE_MARGIN = 0.1  # an attempt's deadline ends this long before the fencing deadline (timer latency)
MIN_ATTEMPT = 0.05  # less time than this before the margin: not worth sending
VOLUME_BIND_TIMEOUT = 600.0  # kube-scheduler's VolumeBinding bindTimeoutSeconds default


class _Fenced(Exception):
    """A write for a node was not sent: the node is no longer usable, or its fencing deadline is too close."""


def ordered(pod: PodRecord) -> bool:
    """Does the pod state a required inter-pod rule (its binding waits for the earlier ones: see the module
    docstring)?"""
    rules = pod.inter_pod
    return rules is not None and bool(
        rules.affinity or rules.anti_affinity or any(c.hard for c in rules.spread)
    )


@dataclass(slots=True)
class BindRequest:
    pod: PodRecord
    node: NodeName
    queued_at: float  # when the pod entered the scheduling queue (SLI start)
    attempts: int
    assumed_at: float  # wall clock, for the audit trail
    unanswered: bool = False  # an attempt ended without a reply: the API server may still apply it
    settling: bool = False  # failed after an unanswered attempt: ``Binder._settle`` decides what it became
    submitted_at: float = 0.0  # on the binder's clock: start of the "bind_sent" stage
    volumes: VolumePlan | None = None  # claims to bind before the pod (kube's PreBind), None when none


class Binder:
    def __init__(
        self,
        client: KubeClient,
        cache: Cache,
        outcomes: Outcomes,
        *,
        requeue: Callable[[PodRecord, int], None],
        shard: ShardView | None = None,
        requeue_rejected: bool = False,
        concurrency: int = 128,
        retries: int = DEFAULT_RETRIES,
        clock: Callable[[], float] = time.monotonic,
        retry_backoff: float = RETRY_BACKOFF,
        attempt_timeout: float = ATTEMPT_TIMEOUT,
        unanswered_hold: float = MAX_BIND_TIME,
        volume_bind_timeout: float = VOLUME_BIND_TIMEOUT,
    ) -> None:
        self.client = client
        self.cache = cache
        self.outcomes = outcomes
        self.requeue = requeue
        self.shard: ShardView = shard if shard is not None else WholeCluster()
        self.requeue_rejected = requeue_rejected
        self.concurrency = concurrency
        self.retries = retries
        self.clock = clock
        self.retry_backoff = retry_backoff
        self.attempt_timeout = attempt_timeout
        self.unanswered_hold = unanswered_hold
        self._queue: asyncio.Queue[tuple[int, BindRequest]] = asyncio.Queue()
        self._seq = itertools.count()
        self._unfinished: set[int] = set()  # sequence numbers of bindings submitted and not finished
        self._earliest: list[int] = []  # heap of the same numbers; finished ones are dropped lazily
        self._finished = asyncio.Condition()
        self._in_flight = InFlight()
        self._settling: set[asyncio.Task[None]] = set()
        self._prebinding: dict[asyncio.Task[None], NodeName] = {}
        self.volume_bind_timeout = volume_bind_timeout
        self.bound = 0
        # bindings and volume writes dropped unsent: node not usable or fencing deadline too close (a volume
        # write's pod is counted in ``bind_results`` as "volumes", a binding's as "fenced")
        self.fenced = 0

    def submit(
        self,
        pod: PodRecord,
        node: NodeName,
        queued_at: float,
        attempts: int,
        *,
        volumes: VolumePlan | None = None,
    ) -> None:
        self._in_flight.start(node)
        req = BindRequest(
            pod, node, queued_at, attempts, time.time(), submitted_at=self.clock(), volumes=volumes
        )
        # The sequence number is taken at decision time, claims or not: a later pod's decision may have counted
        # this one (the topology lane's binding order, see the module docstring).
        seq = next(self._seq)
        self._unfinished.add(seq)
        heapq.heappush(self._earliest, seq)
        if volumes is None:
            self._queue.put_nowait((seq, req))
            aiotools.PACER.poke()
            return
        # The claims first, in a task of its own: waiting for the PV controller or a provisioner can take long
        # and must not hold one of the binding tasks. The task then sends the pod's binding itself, so the
        # queue only ever holds pods in sequence order and an ordered binding that waits in a binding task
        # never waits for one that needs a task (no deadlock).
        task = asyncio.get_running_loop().create_task(self._prebind(seq, req))
        self._prebinding[task] = node
        task.add_done_callback(lambda t: self._prebinding.pop(t, None))

    async def _prebind(self, seq: int, req: BindRequest) -> None:
        assert req.volumes is not None
        try:
            try:
                ok = await self._bind_volumes(req.pod, req.node, req.volumes)
            except asyncio.CancelledError:
                # ``drain``: the node is being released or the worker stops; nothing was sent for the pod itself
                log.info(
                    "volume binding abandoned; rescheduling", extra={"pod": req.pod.key, "node": req.node}
                )
                ok = False
            except Exception:
                log.exception("volume binding failed", extra={"pod": req.pod.key, "node": req.node})
                ok = False
            if ok:
                if ordered(req.pod):
                    await self._earlier_finished(seq)
                await self._bind(req)
                return
            metrics.bind_results.labels("volumes").inc()
            self.cache.volumes.revert(req.volumes)
            self.cache.forget(req.pod.key)
            self.requeue(req.pod, req.attempts)
        finally:
            await self._finish(seq, req)

    async def _take_exclusive(
        self, pod: PodRecord, node: NodeName, plan: VolumePlan, versions: dict[str, str]
    ) -> bool:
        """Give each ReadWriteOncePod claim to ``pod`` (``ANN_RWOP_HOLDER``) under the resourceVersion the
        decision saw, unless its last holder is another pod that still exists: of two workers placing users of
        one claim at once, one write fails (409) and that pod is rescheduled, then sees the other's."""
        me = f"{pod.namespace}/{pod.name}/{pod.uid}"
        for claim in plan.exclusive:
            holder = claim.annotations.get(ANN_RWOP_HOLDER, "")
            if holder and holder != me:
                namespace, _, rest = holder.partition("/")
                name, _, uid = rest.partition("/")
                try:
                    other = await self.client.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
                except NotFound:
                    other = None
                if other is not None:
                    meta, phase = other.get("metadata") or {}, (other.get("status") or {}).get("phase")
                    alive = phase not in ("Succeeded", "Failed") and not meta.get("deletionTimestamp")
                    if alive and meta.get("uid") == uid:
                        log.info("ReadWriteOncePod claim %s held by %s; rescheduling", claim.key, holder)
                        return False
            reply = await self._volume_write(
                node,
                f"/api/v1/namespaces/{claim.namespace}/persistentvolumeclaims/{claim.name}",
                {
                    "metadata": {
                        "resourceVersion": claim.resource_version,
                        "annotations": {ANN_RWOP_HOLDER: me},
                    }
                },
            )
            if isinstance(reply, dict):
                versions[claim.key] = str((reply.get("metadata") or {}).get("resourceVersion") or "")
        return True

    async def _bind_volumes(self, pod: PodRecord, node: NodeName, plan: VolumePlan) -> bool:
        """kube's BindPodVolumes: write the PV claimRefs and the claims' selected-node annotations, each under
        the resourceVersion the decision saw (a concurrent writer makes it fail with 409, never bind twice),
        then wait until the PV controller or a provisioner has bound every claim to a PV that fits the node.
        ReadWriteOncePod claims are taken for the pod first (``_take_exclusive``). Each write is fenced as a
        binding attempt is (``_volume_write``); once one may not be sent, none after it is."""
        versions: dict[str, str] = {}  # claims written here already: their new resourceVersion
        try:
            if not await self._take_exclusive(pod, node, plan, versions):
                return False
            for claim, pv in plan.static:
                await self._volume_write(
                    node,
                    f"/api/v1/persistentvolumes/{pv.name}",
                    {
                        "metadata": {
                            "resourceVersion": pv.resource_version,
                            "annotations": {ANN_BOUND_BY_CONTROLLER: "yes"},
                        },
                        "spec": {
                            "claimRef": {
                                "apiVersion": "v1",
                                "kind": "PersistentVolumeClaim",
                                "namespace": claim.namespace,
                                "name": claim.name,
                                "uid": claim.uid,
                                "resourceVersion": claim.resource_version,
                            }
                        },
                    },
                )
            for claim in plan.provision:
                await self._volume_write(
                    node,
                    f"/api/v1/namespaces/{claim.namespace}/persistentvolumeclaims/{claim.name}",
                    {
                        "metadata": {
                            "resourceVersion": versions.get(claim.key) or claim.resource_version,
                            "annotations": {ANN_SELECTED_NODE: node},
                        }
                    },
                )
        except _Fenced:
            self.fenced += 1
            log.warning(
                "volume binding write not sent: node not usable or fencing deadline too close; rescheduling",
                extra={"pod": pod.key, "node": node},
            )
            return False
        except (ApiError, TimeoutError) as e:
            log.info(
                "volume binding write failed (%s); rescheduling", e or type(e).__name__, extra={"node": node}
            )
            return False
        deadline = self.clock() + self.volume_bind_timeout
        store = self.cache.volumes
        while True:
            verdict = self._volumes_bound(node, plan)
            if verdict is not None:
                return verdict
            left = deadline - self.clock()
            if left <= 0:
                log.info("volume binding timed out; rescheduling", extra={"node": node})
                return False
            await store.wait_change(min(left, 1.0))

    async def _volume_write(self, node: NodeName, path: str, body: Any) -> Any:
        """One PV or claim PATCH of a pod's volume binding, for ``node``, fenced as a binding attempt is: sent
        only with at least ``MIN_ATTEMPT`` of the node's ``budget`` left (else ``_Fenced``), and ending within
        it here and at the API server (``common.kube.KubeClient._send``). A write left unanswered holds
        nothing: it takes no room on the node, it is made under the resourceVersion the decision saw, and the
        pod's own binding is not sent."""
        budget = self.budget(node)  # immediately before sending: nothing awaits in between
        if budget < MIN_ATTEMPT:
            raise _Fenced(node)
        async with asyncio.timeout(budget):
            return await self.client.patch(path, body, timeout=budget)

    def _volumes_bound(self, node: NodeName, plan: VolumePlan) -> bool | None:
        """kube's checkBindings: True when every claim is bound to a PV fitting the node, False when a binding
        was undone (claimRef removed, selected-node changed, claim gone), None while still under way."""
        store = self.cache.volumes
        info = self.cache.nodes.get(node)
        labels = info.node.labels if info is not None else {}
        static = {c.key: pv.name for c, pv in plan.static}
        waiting = False
        for key in plan.waits:
            claim = store.claims.get(key)
            if claim is None or claim.deleting:
                return False
            if claim.bound:
                pv = store.volumes.get(claim.volume_name)
                if pv is None:
                    waiting = True  # the PV watch has not shown it yet
                elif not pv.fits_node(node, labels):
                    return False
                continue
            if key in static:
                taken = store.volumes.get(static[key])
                if taken is None or not taken.bound_to(claim):
                    return False
            elif claim.selected_node != node:
                return False
            waiting = True
        return None if waiting else True

    def in_flight(self, node: NodeName | None = None) -> int:
        return self._in_flight.count(node)

    async def drain(self, nodes: Iterable[NodeName] | None = None) -> None:
        """Wait until no binding to these nodes (all when None) is under way; volume waits are abandoned."""
        wanted = set(nodes) if nodes is not None else None
        # Pods still waiting for their claims to be bound are not bound to these nodes at all: stop waiting
        # (they are scheduled again) rather than hold a release or a stop for up to volume_bind_timeout.
        for task, node in list(self._prebinding.items()):
            if wanted is None or node in wanted:
                task.cancel()
        await self._in_flight.idle(wanted)

    async def run(self) -> None:
        # bindings waiting for a binding task: they wait for the API server, so this process may pace
        with aiotools.PACER.backlog_of(self._queue.qsize):
            async with asyncio.TaskGroup() as tg:
                for _ in range(self.concurrency):
                    tg.create_task(self._work())

    async def _work(self) -> None:
        while True:
            seq, req = await self._queue.get()
            try:
                if ordered(req.pod):
                    await self._earlier_finished(seq)
                await self._bind(req)
            finally:
                await self._finish(seq, req)

    async def _finish(self, seq: int, req: BindRequest) -> None:
        """A binding ended (bound, failed, handed back or abandoned): later ordered bindings may go, and the
        node's in-flight count drops (at once, or after ``unanswered_hold`` for an unanswered attempt)."""
        self._unfinished.discard(seq)
        while self._earliest and self._earliest[0] not in self._unfinished:
            heapq.heappop(self._earliest)  # amortized: each number is pushed and popped once
        async with self._finished:
            self._finished.notify_all()
        if req.settling:
            pass  # ``_settle`` ends the node's in-flight count once it knows where the pod is
        elif req.unanswered:
            self._in_flight.end_later(req.node, self.unanswered_hold)
        else:
            await self._in_flight.end(req.node)

    async def _earlier_finished(self, seq: int) -> None:
        """Wait until every binding submitted before ``seq`` has finished."""
        async with self._finished:
            await self._finished.wait_for(lambda: self._first_unfinished() == seq)

    def _first_unfinished(self) -> int:
        return self._earliest[0]  # finished numbers are popped as they finish (``_work``)

    def budget(self, node: NodeName) -> float:
        """Seconds the next write for ``node`` may take (a binding attempt here, a preemption's writes in
        ``worker.preemption.Executor``); below ``MIN_ATTEMPT``: do not send it."""
        deadline = self.shard.bind_deadline(node)
        if deadline is None:
            return 0.0
        return min(self.attempt_timeout, deadline - FENCE_MARGIN - self.clock())

    async def _bind(self, req: BindRequest) -> None:
        pod, node = req.pod, req.node
        backoff = Backoff(self.retry_backoff, max(self.retry_backoff, RETRY_BACKOFF_MAX))
        for attempt in range(self.retries + 1):
            budget = self.budget(node)  # immediately before sending: nothing awaits in between
            if budget < MIN_ATTEMPT:
                metrics.bind_results.labels("fenced").inc()
                self.fenced += 1
                log.warning(
                    "bind not sent: node not usable or fencing deadline too close; rescheduling",
                    extra={"pod": pod.key, "node": node},
                )
                break
            start = self.clock()
            try:
                async with asyncio.timeout(budget):
                    await self.client.bind(pod.namespace, pod.name, pod.uid, node, timeout=budget)
            except Conflict as e:
                metrics.bind_results.labels("conflict").inc()
                log.info(
                    "bind conflict (%s); waiting for the watch",
                    e.message,
                    extra={"pod": pod.key, "node": node},
                )
                self.cache.finish_binding(pod.key, self.clock())
                return
            except NotFound:
                metrics.bind_results.labels("gone").inc()
                log.info("bind: pod is gone", extra={"pod": pod.key, "node": node})
                self.cache.forget(pod.key)
                self.outcomes.gone(pod.key, pod.uid)
                return
            except (TooManyRequests, ServerError, TimeoutError) as e:
                metrics.bind_results.labels("retried").inc()
                if not isinstance(e, TooManyRequests):
                    # No answer (timeout, broken connection), or a 5xx such as the API server's own 504
                    # timeout, after which its storage write may still complete: the binding may land.
                    req.unanswered = True
                if attempt < self.retries:
                    delay = backoff.next()
                    log.warning(
                        "bind failed (%s), retry in %.1fs",
                        e or type(e).__name__,
                        delay,
                        extra={"pod": pod.key, "node": node},
                    )
                    await asyncio.sleep(delay)
                    continue
                log.warning(
                    "bind failed %d times (%s); rescheduling",
                    attempt + 1,
                    e or type(e).__name__,
                    extra={"pod": pod.key, "node": node},
                )
                break
            except ApiError as e:
                metrics.bind_results.labels("failed").inc()
                log.warning("bind rejected: %s", e, extra={"pod": pod.key, "node": node})
                self.cache.forget(pod.key)
                self.outcomes.rejected(pod, f"binding rejected: {e.message}")
                if self.requeue_rejected:
                    self.requeue(pod, req.attempts)
                return
            now = self.clock()
            metrics.binding_duration.labels("bound").observe(now - start)
            metrics.bind_results.labels("bound").inc()
            metrics.pod_sli_duration.labels(str(min(req.attempts, 16))).observe(now - req.queued_at)
            metrics.observe_stage("bind_sent", start - req.submitted_at)
            metrics.observe_stage("bound", now - start)
            self.cache.finish_binding(pod.key, now)
            self.bound += 1
            self.outcomes.bound(pod, node, assumed_at=req.assumed_at, bound_at=time.time())
            return
        if req.unanswered:
            # An attempt may still land: keep the assumption (the node's capacity stays taken) and hand the
            # pod back only once it is known not to be bound (``_settle``).
            req.settling = True
            task = asyncio.get_running_loop().create_task(self._settle(req))
            self._settling.add(task)
            task.add_done_callback(self._settling.discard)
            return
        self.cache.forget(pod.key)
        self.requeue(pod, req.attempts)

    async def _settle(self, req: BindRequest) -> None:
        """The binding of ``req`` failed after an unanswered attempt, which the API server may still apply:
        wait ``unanswered_hold`` (by then it has landed or never will), then read the pod. Bound: keep the
        assumption with its TTL running, as after a 409 (the watch shows where it is). Not bound: forget and
        requeue. Gone: forget. Until then the capacity stays assumed and the node counted in flight, so
        neither this worker's next decisions nor a release of the node can overtake the late binding."""
        pod = req.pod
        try:
            await asyncio.sleep(self.unanswered_hold)
            backoff = Backoff(self.retry_backoff, max(self.retry_backoff, RETRY_BACKOFF_MAX))
            path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}"
            while True:
                try:
                    obj = await self.client.get(path)
                    break
                except NotFound:
                    obj = None
                    break
                except (ApiError, TimeoutError) as e:
                    log.warning(
                        "reading a pod after an unanswered binding failed (%s); retrying",
                        e or type(e).__name__,
                        extra={"pod": pod.key, "node": req.node},
                    )
                    await asyncio.sleep(backoff.next())
            meta = (obj or {}).get("metadata") or {}
            if obj is None or (pod.uid and meta.get("uid") != pod.uid):
                log.info("bind: pod is gone", extra={"pod": pod.key, "node": req.node})
                self.cache.forget(pod.key)
                self.outcomes.gone(pod.key, pod.uid)
                return
            bound_to = (obj.get("spec") or {}).get("nodeName")
            if bound_to:
                log.info(
                    "an unanswered binding landed (on %s); waiting for the watch",
                    bound_to,
                    extra={"pod": pod.key, "node": req.node},
                )
                self.cache.finish_binding(pod.key, self.clock())
                return
            self.cache.forget(pod.key)
            self.requeue(pod, req.attempts)
        finally:
            self._in_flight.end_soon(req.node)
