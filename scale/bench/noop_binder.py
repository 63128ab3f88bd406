"""The no-decision binder: binds each pod to a node chosen before the run. The ceiling of this machine.

It measures what the API server allows when the scheduler costs nothing (the bench runs it with 256 bindings in
flight, ``--concurrency``): the pod's node is already written in
its ``NODE_ANNOTATION`` (computed before the run by ``placer``, with the real engine over the same node fleet,
so every choice fits), and this process posts the bindings — through ``common.kube.KubeClient``, the same
client path, rate limiter and connection pool as the agent scheduler's binder, with the same number of bindings
in flight, on the same event loop (``--event-loop``).

It watches every non-terminal pod, as a scheduler's cache must (the worker and kube-scheduler do too), and picks
out the pending pods of its scheduler name itself: the API server then pays for the same watch traffic as with a
real scheduler, and the ceiling is the ceiling of scheduling, not of a cheaper, filtered watch.

Run as its own process (``python -m scale.bench.noop_binder``) so its CPU and memory are measured like any
scheduler's. It emits no events and reports nothing; a pod without the annotation is left pending.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Callable
from typing import Any

from common import aiotools
from common.backoff import Backoff
from common.kube import (
    ApiError,
    Conflict,
    KubeClient,
    NotFound,
    ServerError,
    TooManyRequests,
    load_credentials,
)
from common.watching import Reflector
from scale.bench.workloads import NODE_ANNOTATION

log = logging.getLogger(__name__)

SCHEDULER_NAME = "bench-noop"
BIND_RETRIES = 10
RETRY_INITIAL_S = 0.05
RETRY_MAX_S = 1.0


class _Pending:
    """Watch handler: every unbound pod of our scheduler name with a node annotation goes on the queue once."""

    def __init__(self, queue: asyncio.Queue[tuple[str, str, str, str]], scheduler_name: str) -> None:
        self.queue = queue
        self.scheduler_name = scheduler_name
        self.seen: set[str] = set()

    def _offer(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        spec = obj.get("spec") or {}
        if (
            not uid
            or uid in self.seen
            or spec.get("nodeName")
            or spec.get("schedulerName") != self.scheduler_name
        ):
            return
        node = (meta.get("annotations") or {}).get(NODE_ANNOTATION)
        if not node:
            return
        self.seen.add(uid)
        self.queue.put_nowait((str(meta.get("namespace")), str(meta.get("name")), uid, str(node)))

    def replace(self, objects: list[dict[str, Any]]) -> None:
        for obj in objects:
            self._offer(obj)

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.seen.discard(str((obj.get("metadata") or {}).get("uid") or ""))
        else:
            self._offer(obj)


async def _bind_loop(
    client: KubeClient, queue: asyncio.Queue[tuple[str, str, str, str]], stats: dict[str, int]
) -> None:
    while True:
        namespace, name, uid, node = await queue.get()
        backoff = Backoff(RETRY_INITIAL_S, RETRY_MAX_S)
        for attempt in range(BIND_RETRIES):
            try:
                await client.bind(namespace, name, uid, node)
                stats["bound"] += 1
            except (Conflict, NotFound):
                stats["gone"] += 1
            except (TooManyRequests, ServerError) as e:
                if attempt < BIND_RETRIES - 1:
                    await backoff.sleep()
                    continue
                stats["failed"] += 1
                log.warning("binding %s/%s failed: %s", namespace, name, e)
            except ApiError as e:
                stats["failed"] += 1
                log.warning("binding %s/%s failed: %s", namespace, name, e)
            break


async def serve(args: argparse.Namespace) -> int:
    creds = load_credentials(args.kubeconfig)
    stats = {"bound": 0, "gone": 0, "failed": 0}
    async with KubeClient(
        creds, qps=args.qps, burst=args.burst, max_connections=args.concurrency * 2
    ) as client:
        queue: asyncio.Queue[tuple[str, str, str, str]] = asyncio.Queue()
        reflector = Reflector(
            client,
            "/api/v1/pods",
            _Pending(queue, args.scheduler_name),
            params={"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"},
            name="noop-pods",
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        tasks = [asyncio.create_task(reflector.run())]
        tasks += [asyncio.create_task(_bind_loop(client, queue, stats)) for _ in range(args.concurrency)]
        await reflector.synced.wait()
        log.info(
            "no-decision binder ready (scheduler name %s, %d binds in flight)",
            args.scheduler_name,
            args.concurrency,
        )
        await stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    log.info("no-decision binder stopped: %s", stats)
    return 0


def placer(
    nodes: list[dict[str, Any]], *, exclude_pools: frozenset[str] = frozenset({"batch"})
) -> Callable[[dict[str, Any]], str | None]:
    """A function that gives each pod (in call order) a node that fits it, using the real engine over ``nodes``.

    Each call decides and assumes, so successive pods see the capacity the earlier ones took. Nodes of
    ``exclude_pools`` (the ``node-pool`` label) are left out, so that the default scheduler's batch pods never
    compete with these precomputed choices.
    """
    from common.records import node_from_json, pod_from_json
    from scale.cluster.nodes import LABEL_POOL
    from worker.cache import Cache
    from worker.scheduler import build_engine
    from worker.settings import WorkerSettings

    settings = WorkerSettings()
    cache = Cache(session_label=settings.scheduling.session_label)
    for obj in nodes:
        if (obj["metadata"].get("labels") or {}).get(LABEL_POOL) in exclude_pools:
            continue
        cache.upsert_node(node_from_json(obj))
    engine = build_engine(settings, cache)

    def place(pod: dict[str, Any]) -> str | None:
        record = pod_from_json(pod)
        decision = engine.schedule(record)
        if decision.node is None:
            return None
        cache.assume(record, decision.node)
        return str(decision.node)

    return place


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scale.bench.noop_binder", description=__doc__.split("\n")[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--scheduler-name", default=SCHEDULER_NAME)
    p.add_argument("--qps", type=float, default=5000.0)
    p.add_argument("--burst", type=int, default=5000)
    p.add_argument("--concurrency", type=int, default=128, help="bindings in flight (the worker's default)")
    p.add_argument("--log-level", default="INFO")
    aiotools.add_event_loop_argument(p)  # the scheduler's loop, so the ceiling is of the same machinery
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return aiotools.run(serve(args), args.event_loop)


if __name__ == "__main__":
    raise SystemExit(main())
