"""The load generator: creates a workload's pods on schedule and times each one until it is bound.

Two halves share one clock (``time.monotonic`` unless a test injects another):
- ``scale.tracking.BindWatch``, the handler of a ``common.watching.Reflector`` on the workload's namespace,
  stamps each pod's ``bound`` time (see that module);
- ``drive`` creates the pods of an arrival plan at their arrival times, at most ``concurrency`` in flight,
  stamping ``sent`` just before each request and ``acked`` when the API server answered. Throttling and server
  errors are retried with backoff (the pod keeps its first ``sent`` time); a pod that cannot be created is
  recorded with its error and counts as unbound.

``scale.tracking.wait_bound`` then waits until every created pod is bound, or binds stop coming for ``stall_s``
seconds, or ``timeout_s`` passes: the caller decides what "unbound" means by choosing those. With
``pull_delay_s`` (simulated image pulls, ``scale.bench.pulls``), the same watch also feeds the image puller,
and the run then waits (``wait_running``, same limits) until the bound pods are Running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from common.backoff import Backoff
from common.kube import ApiError, Conflict, KubeClient, ServerError, TooManyRequests
from common.watching import Reflector
from scale.bench.pulls import ImagePuller
from scale.bench.workloads import Arrival
from scale.tracking import BindWatch, Clock, PodTimes, wait_bound, wait_running

log = logging.getLogger(__name__)

CREATE_RETRIES = 10
RETRY_INITIAL = 0.05
RETRY_MAX = 2.0
RELEASE_SETTLE_S = 1.0


@dataclass(slots=True)
class DriveResult:
    origin: float  # when the first arrival was due
    created: int
    failed: int
    last_sent: float


async def create_one(
    client: KubeClient, namespace: str, pod: dict[str, Any], times: PodTimes, clock: Clock
) -> None:
    """POST one pod, retrying 429/5xx with backoff; records ``sent``/``acked`` or ``error`` in ``times``."""
    backoff = Backoff(RETRY_INITIAL, RETRY_MAX)
    times.sent = clock()
    for attempt in range(CREATE_RETRIES):
        try:
            await client.post(f"/api/v1/namespaces/{namespace}/pods", pod)
        except Conflict:
            pass  # created by an earlier attempt whose reply was lost
        except (TooManyRequests, ServerError) as e:
            if attempt == CREATE_RETRIES - 1:
                times.error = str(e)
                return
            await backoff.sleep()
            continue
        except ApiError as e:
            times.error = str(e)
            return
        times.acked = clock()
        return


async def drive(
    client: KubeClient,
    namespace: str,
    plan: Sequence[Arrival],
    watch: BindWatch,
    *,
    concurrency: int,
    clock: Clock = time.monotonic,
) -> DriveResult:
    """Create every pod of ``plan`` at its arrival time (relative to now); returns when all creates returned."""
    for arrival in plan:
        watch.expect(arrival.name, arrival.kind)
    slots = asyncio.Semaphore(concurrency)
    tasks: set[asyncio.Task[None]] = set()
    origin = clock()
    last_sent = origin

    async def one(arrival: Arrival) -> None:
        try:
            await create_one(client, namespace, arrival.pod, watch.pods[arrival.name], clock)
        finally:
            slots.release()

    try:
        for arrival in plan:
            wait = origin + arrival.at - clock()
            if wait > 0:
                await asyncio.sleep(wait)
            await slots.acquire()
            last_sent = clock()
            task = asyncio.create_task(one(arrival))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
    failed = sum(1 for a in plan if watch.pods[a.name].error)
    if failed:
        log.warning(
            "%d of %d creates failed; first: %s",
            failed,
            len(plan),
            next(watch.pods[a.name].error for a in plan if watch.pods[a.name].error),
        )
    return DriveResult(origin=origin, created=len(plan) - failed, failed=failed, last_sent=last_sent)


@dataclass(slots=True)
class Observation:
    origin: float
    end: float
    complete: bool
    agent: list[PodTimes]
    batch: list[PodTimes]
    offered_span_s: float
    #: simulated pulls: pods that waited for at least one, pulls started, failed writes; running all seen
    pods_waiting_for_pulls: int = 0
    pulls: int = 0
    pull_errors: int = 0
    running_complete: bool = True


async def run(
    client: KubeClient,
    namespace: str,
    plan: Sequence[Arrival],
    *,
    concurrency: int,
    stall_s: float,
    timeout_s: float,
    release: Callable[[], None] | None = None,
    pull_delay_s: float = 0.0,
    first_bind_s: float = 0.0,
    clock: Clock = time.monotonic,
) -> Observation:
    """Watch the namespace, create ``plan``, wait for the binds; the whole measured window of one run.

    With ``release`` (the backlog workload: the scheduler is paused), every create is done first, then
    ``release()`` is called; that moment is the run's origin and each pod's ``eligible`` time."""
    watch = BindWatch(clock)
    puller: ImagePuller | None = None
    handler: BindWatch | _Both = watch
    if pull_delay_s > 0:
        puller = ImagePuller(client, pull_delay_s=pull_delay_s, clock=clock)
        await puller.load_nodes()
        handler = _Both(watch, puller)
    reflector = Reflector(client, f"/api/v1/namespaces/{namespace}/pods", handler, name=f"bench:{namespace}")
    watcher = asyncio.create_task(reflector.run(), name="bench-watch")
    running_complete = True
    try:
        await asyncio.wait_for(reflector.synced.wait(), 60.0)
        driven = await drive(client, namespace, plan, watch, concurrency=concurrency, clock=clock)
        since = driven.last_sent
        if release is not None:
            await asyncio.sleep(RELEASE_SETTLE_S)  # let the last creates reach the paused scheduler's socket
            since = driven.origin = clock()
            for times in watch.pods.values():
                times.eligible = since
            release()
        complete = await wait_bound(
            watch, stall_s=stall_s, timeout_s=timeout_s, since=since, first_bind_s=first_bind_s, clock=clock
        )
        if puller is not None:
            running_complete = await wait_running(
                watch, stall_s=stall_s, timeout_s=timeout_s, since=since, clock=clock
            )
        end = clock()
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        if puller is not None:
            await puller.close()
    return Observation(
        origin=driven.origin,
        end=end,
        complete=complete,
        agent=watch.of_kind("agent"),
        batch=watch.of_kind("batch"),
        offered_span_s=driven.last_sent - driven.origin,
        pods_waiting_for_pulls=puller.pods_waiting if puller is not None else 0,
        pulls=puller.pulls if puller is not None else 0,
        pull_errors=puller.errors if puller is not None else 0,
        running_complete=running_complete,
    )


class _Both:
    """One namespace watch feeding the bind timer and the image puller."""

    def __init__(self, watch: BindWatch, puller: ImagePuller) -> None:
        self.watch = watch
        self.puller = puller

    def replace(self, objects: list[dict[str, Any]]) -> None:
        self.watch.replace(objects)
        self.puller.replace(objects)

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        self.watch.event(kind, obj)
        self.puller.event(kind, obj)
