"""The worker's end of the dispatch protocol (``common.protocol``): a TCP server the coordinator leader
connects to. Pods it receives go into the scheduler's queue; results and capacity summaries go back.

Invariants:
- One leader stream at a time: a HELLO with a higher ``term`` replaces the current stream; a lower one is
  refused. Results for pods dispatched over an older stream go to the current one (the leader that now
  owns dispatch).
- Every DISPATCH is answered by ACK and later exactly one RESULT per dispatch id, unless the stream
  breaks first (the leader then re-dispatches; duplicates are harmless, see the protocol).
- While the worker cannot place pods (fenced, draining, no owned nodes), DISPATCH is answered with RESULT
  ``rejected`` at once, so the leader tries another worker without waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common import protocol
from common.records import NodeName, PodKey, PodRecord, pod_from_json
from worker.engine import Decision
from worker.scheduler import Scheduler

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Pending:
    dispatch_id: int
    key: PodKey


class Intake:
    def __init__(
        self, sched: Scheduler, *, worker_id: str, can_place: Callable[[], bool] = lambda: True
    ) -> None:
        self.sched = sched
        self.worker_id = worker_id
        self.can_place = can_place
        self._writer: asyncio.StreamWriter | None = None
        self._term = -1
        self._pending: dict[PodKey, _Pending] = {}
        self._server: asyncio.Server | None = None
        self._bound_times: list[float] = []
        self.received = 0
        sched.on_unschedulable = self._unschedulable
        previous_on_bound = sched.binder.on_bound

        def on_bound(pod: PodRecord, node: NodeName) -> None:
            previous_on_bound(pod, node)
            self._bound(pod, node)

        sched.binder.on_bound = on_bound  # transient bind failures stay with this worker (binder requeues)

    # ----- server ----------------------------------------------------------------------------------------

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._serve, host, port)
        sock_host, sock_port = self._server.sockets[0].getsockname()[:2]
        return str(sock_host), int(sock_port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._writer is not None:
            self._writer.close()
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            hello = await protocol.read_message(reader)
            if not isinstance(hello, protocol.Hello):
                raise protocol.ProtocolError(f"expected hello, got {type(hello).__name__}")
            term = hello.term
            if term < self._term:
                writer.write(protocol.encode(protocol.Error(f"term {term} is older than {self._term}")))
                await writer.drain()
                return
            if self._writer is not None and self._writer is not writer:
                self._writer.close()
            self._term, self._writer = term, writer
            log.info("leader %s (term %d) connected from %s", hello.leader, term, peer)
            writer.write(protocol.encode(protocol.Welcome(worker=self.worker_id, term=term)))
            reporter = asyncio.create_task(self._report_capacity(writer))
            try:
                while True:
                    msg = await protocol.read_message(reader)
                    self._handle(msg, writer)
            finally:
                reporter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reporter
        except (asyncio.IncompleteReadError, ConnectionError):
            log.info("leader stream from %s closed", peer)
        except protocol.ProtocolError as e:
            log.warning("protocol error from %s: %s", peer, e)
            with contextlib.suppress(ConnectionError):
                writer.write(protocol.encode(protocol.Error(str(e))))
        finally:
            if self._writer is writer:
                self._writer = None
            writer.close()

    def _handle(self, msg: protocol.Message, writer: asyncio.StreamWriter) -> None:
        if isinstance(msg, protocol.Dispatch):
            dispatch_id = msg.id
            pod = pod_from_json(msg.pod)
            self.received += 1
            if not self.can_place():
                writer.write(
                    protocol.encode(
                        protocol.Result.rejected(dispatch_id, pod.key, "worker cannot place pods now")
                    )
                )
                return
            self._pending[pod.key] = _Pending(dispatch_id, pod.key)
            self.sched.submit(pod)
            writer.write(protocol.encode(protocol.Ack(dispatch_id)))
        elif isinstance(msg, protocol.Ping):
            writer.write(protocol.encode(protocol.Pong(msg.ts)))
        else:
            log.debug("ignoring %s message", type(msg).__name__)

    # ----- results ---------------------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(data)

    def _bound(self, pod: PodRecord, node: NodeName) -> None:
        self._bound_times.append(time.monotonic())
        p = self._pending.pop(pod.key, None)
        if p is not None:
            self._send(protocol.encode(protocol.Result.bound(p.dispatch_id, pod.key, node)))

    def _unschedulable(self, pod: PodRecord, decision: Decision) -> None:
        p = self._pending.pop(pod.key, None)
        # The worker's queue keeps the pod too (it retries when its own shard changes); the leader may place
        # it elsewhere meanwhile, and whichever binding lands first wins.
        self.sched.queue.delete(pod.key)
        if p is None:
            return
        self._send(
            protocol.encode(
                protocol.Result.unschedulable(
                    p.dispatch_id,
                    pod.key,
                    nodes=decision.nodes,
                    reasons=dict(decision.reasons),
                    message=decision.message,
                )
            )
        )

    def capacity(self) -> dict[str, Any]:
        free_cpu = free_mem = max_cpu = max_mem = 0
        nodes = 0
        cache = self.sched.cache
        for name in cache.index.names():
            info = cache.nodes[NodeName(name)]
            nodes += 1
            alloc, used = info.node.allocatable, info.requested
            c, m = alloc.milli_cpu - used.milli_cpu, alloc.memory - used.memory
            free_cpu += c
            free_mem += m
            max_cpu, max_mem = max(max_cpu, c), max(max_mem, m)
        now = time.monotonic()
        self._bound_times = [t for t in self._bound_times if now - t < 5.0]
        stats = self.sched.queue.statistics()
        return {
            "nodes": nodes if self.can_place() else 0,
            "free_cpu": free_cpu,
            "free_memory": free_mem,
            "max_cpu": max_cpu if self.can_place() else 0,
            "max_memory": max_mem if self.can_place() else 0,
            "pending": stats["active"] + stats["backoff"] + stats["flight"],
            "syncing": len(self.sched.syncing),
            "binds_per_s": len(self._bound_times) / 5.0,
            "ts": time.time(),
        }

    async def _report_capacity(self, writer: asyncio.StreamWriter) -> None:
        while not writer.is_closing():
            writer.write(protocol.encode(protocol.Capacity(**self.capacity())))
            await writer.drain()
            await asyncio.sleep(protocol.CAPACITY_INTERVAL)
