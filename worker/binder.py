"""Asynchronous binding: the POST of each assumed pod's ``binding`` subresource, off the decision path.

A fixed pool of ``concurrency`` tasks takes (pod, node) pairs from a queue and binds them over the client's
kept-alive connections. Outcomes:
- success: the cache starts the assumption's TTL (``finish_binding``); the watch confirms it later.
- 409 Conflict (already bound, possibly by our own earlier attempt whose reply was lost): keep the assumption
  with its TTL running; the watch shows where the pod really is, or the assumption expires.
- 404 Not Found (the pod was deleted): forget the assumption, capacity returns.
- 429 / 5xx / timeout: retry with backoff (``RETRY_BACKOFF`` doubling), at most ``retries`` times; then
  forget and ``requeue`` the pod in this worker's queue for another scheduling attempt.
- anything else (400/422/403): forget, and tell the outcome receiver it was ``rejected`` (API's message).
A success is told to the outcome receiver (``worker.outcomes``) as ``bound``, with the audit times.

Invariant: every path that does not end in a confirmed binding gives the capacity back (forget or expiry).
``in_flight(node)`` counts bindings under way per node, so a node release can wait for them (``drain``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from common import metrics
from common.kube import ApiError, Conflict, KubeClient, NotFound, ServerError, TooManyRequests
from common.records import NodeName, PodRecord
from worker.cache import Cache
from worker.outcomes import Outcomes

log = logging.getLogger(__name__)

RETRY_BACKOFF = 0.2
DEFAULT_RETRIES = 4


@dataclass(slots=True)
class BindRequest:
    pod: PodRecord
    node: NodeName
    queued_at: float  # when the pod entered the scheduling queue (SLI start)
    attempts: int
    assumed_at: float  # wall clock, for the audit trail
    submitted_at: float = 0.0  # on the binder's clock: start of the "bind_sent" stage


class Binder:
    def __init__(
        self,
        client: KubeClient,
        cache: Cache,
        outcomes: Outcomes,
        *,
        requeue: Callable[[PodRecord], None],
        concurrency: int = 64,
        retries: int = DEFAULT_RETRIES,
        clock: Callable[[], float] = time.monotonic,
        retry_backoff: float = RETRY_BACKOFF,
    ) -> None:
        self.client = client
        self.cache = cache
        self.outcomes = outcomes
        self.requeue = requeue
        self.concurrency = concurrency
        self.retries = retries
        self.clock = clock
        self.retry_backoff = retry_backoff
        self._queue: asyncio.Queue[BindRequest] = asyncio.Queue()
        self._in_flight: dict[NodeName, int] = {}
        self._idle = asyncio.Condition()
        self.bound = 0

    def submit(self, pod: PodRecord, node: NodeName, queued_at: float, attempts: int) -> None:
        self._in_flight[node] = self._in_flight.get(node, 0) + 1
        self._queue.put_nowait(BindRequest(pod, node, queued_at, attempts, time.time(), self.clock()))

    def in_flight(self, node: NodeName | None = None) -> int:
        if node is None:
            return sum(self._in_flight.values())
        return self._in_flight.get(node, 0)

    async def drain(self, nodes: Iterable[NodeName] | None = None) -> None:
        """Wait until no binding to these nodes (all when None) is under way."""
        wanted = set(nodes) if nodes is not None else None
        async with self._idle:
            await self._idle.wait_for(
                lambda: not any(n for node, n in self._in_flight.items() if wanted is None or node in wanted)
            )

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for _ in range(self.concurrency):
                tg.create_task(self._work())

    async def _work(self) -> None:
        while True:
            req = await self._queue.get()
            try:
                await self._bind(req)
            finally:
                left = self._in_flight.get(req.node, 0) - 1
                if left > 0:
                    self._in_flight[req.node] = left
                else:
                    self._in_flight.pop(req.node, None)
                async with self._idle:
                    self._idle.notify_all()

    async def _bind(self, req: BindRequest) -> None:
        pod, node = req.pod, req.node
        backoff = self.retry_backoff
        for attempt in range(self.retries + 1):
            start = self.clock()
            try:
                await self.client.bind(pod.namespace, pod.name, pod.uid, node)
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
                return
            except (TooManyRequests, ServerError) as e:
                metrics.bind_results.labels("retried").inc()
                if attempt < self.retries:
                    log.warning(
                        "bind failed (%s), retry in %.1fs", e, backoff, extra={"pod": pod.key, "node": node}
                    )
                    await asyncio.sleep(backoff)
                    backoff *= 2
                    continue
                log.warning(
                    "bind failed %d times (%s); rescheduling",
                    attempt + 1,
                    e,
                    extra={"pod": pod.key, "node": node},
                )
                break
            except ApiError as e:
                metrics.bind_results.labels("failed").inc()
                log.warning("bind rejected: %s", e, extra={"pod": pod.key, "node": node})
                self.cache.forget(pod.key)
                self.outcomes.rejected(pod, f"binding rejected: {e.message}")
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
        self.cache.forget(pod.key)
        self.requeue(pod)
