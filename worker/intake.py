"""The worker's end of the dispatch protocol (``common.protocol``): a TCP server the coordinator leader
connects to. Pods it receives go into the scheduler's queue; results and capacity summaries go back.

Two objects:
- ``LeaderResults``: the current leader stream and the dispatch ids of the pods it sent. It is the
  scheduler's outcome receiver (``worker.outcomes.Outcomes``) under a coordinator: bound, unschedulable and
  rejected pods are answered with one RESULT each; bound pods still get their Scheduled event and audit line.
- ``Intake``: the server. It accepts one leader stream at a time, puts dispatched pods into the scheduler's
  queue, answers heartbeats, and sends the capacity summary (kept current by the cache's index, read in O(1)).

Invariants:
- One leader stream at a time: a HELLO with a higher or equal ``term`` replaces the current stream; a lower
  one is refused. Results for pods dispatched over an older stream go to the current one (the leader that
  now owns dispatch).
- Every DISPATCH is answered by ACK and later exactly one RESULT per dispatch id, unless the stream
  breaks first (the leader then re-dispatches; duplicates are harmless, see the protocol). A pod whose
  binding failed transiently stays in this worker's queue (``worker.binder``) and is answered when bound.
- An unschedulable pod is answered and leaves this worker's queue: the leader decides where it goes next.
- While the worker cannot place pods (fenced, draining), DISPATCH is answered with RESULT ``rejected`` at
  once, so the leader tries another worker without waiting.

The message encode/decode calls are kept in the few small functions marked "wire" below.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable

from common import protocol
from common.records import NodeName, PodKey, PodRecord, pod_from_json
from common.reporting import Reporter
from worker.audit import AuditLog
from worker.engine import Decision
from worker.scheduler import Scheduler
from worker.shard import ShardView

log = logging.getLogger(__name__)

BIND_RATE_WINDOW = 5.0  # seconds over which ``binds_per_s`` is averaged

# ----- wire: every message this side encodes or decodes -------------------------------------------------


def _result(
    dispatch_id: int,
    key: PodKey,
    outcome: protocol.Outcome,
    *,
    node: str = "",
    nodes: int = 0,
    reasons: dict[str, int] | None = None,
    message: str = "",
) -> bytes:
    return protocol.encode(
        protocol.Result(
            dispatch_id, key, outcome, node=node, nodes=nodes, reasons=reasons or {}, message=message
        )
    )


def _hello_term(hello: protocol.Message) -> tuple[int, str]:
    """The term and leader name of a HELLO; ProtocolError for any other first frame."""
    if not isinstance(hello, protocol.Hello):
        raise protocol.ProtocolError(f"expected hello, got {type(hello).__name__}")
    return hello.term, hello.leader


def _dispatch(msg: protocol.Dispatch) -> tuple[int, PodRecord]:
    return msg.id, pod_from_json(msg.pod)


def _welcome(worker_id: str, term: int) -> bytes:
    return protocol.encode(protocol.Welcome(worker=worker_id, term=term))


def _ack(dispatch_id: int) -> bytes:
    return protocol.encode(protocol.Ack(dispatch_id))


def _pong(ping: protocol.Ping) -> bytes:
    return protocol.encode(protocol.Pong(ping.ts))


def _error(message: str) -> bytes:
    return protocol.encode(protocol.Error(message))


def _capacity(summary: protocol.Capacity) -> bytes:
    return protocol.encode(summary)


# ----- outcomes under a coordinator ---------------------------------------------------------------------


class LeaderResults:
    """The current leader stream, the pods it dispatched, and the RESULTs owed to it (``Outcomes``)."""

    def __init__(self, reporter: Reporter, *, audit: AuditLog | None = None) -> None:
        self.reporter = reporter
        self.audit = audit
        self.writer: asyncio.StreamWriter | None = None
        self.term = -1
        self.pending: dict[PodKey, int] = {}  # pod -> dispatch id of its latest DISPATCH
        self._bound_times: list[float] = []

    def connect(self, term: int, writer: asyncio.StreamWriter) -> bool:
        """A leader said HELLO: take its stream unless its term is older than the current one."""
        if term < self.term:
            return False
        if self.writer is not None and self.writer is not writer:
            self.writer.close()
        self.term, self.writer = term, writer
        return True

    def disconnect(self, writer: asyncio.StreamWriter) -> None:
        if self.writer is writer:
            self.writer = None

    def expect(self, dispatch_id: int, key: PodKey) -> None:
        self.pending[key] = dispatch_id

    def send(self, data: bytes) -> None:
        if self.writer is not None and not self.writer.is_closing():
            self.writer.write(data)

    def binds_per_second(self) -> float:
        now = time.monotonic()
        self._bound_times = [t for t in self._bound_times if now - t < BIND_RATE_WINDOW]
        return len(self._bound_times) / BIND_RATE_WINDOW

    # ----- worker.outcomes.Outcomes ----------------------------------------------------------------------

    def bound(self, pod: PodRecord, node: NodeName, *, assumed_at: float, bound_at: float) -> None:
        self.reporter.scheduled(pod, node)
        if self.audit is not None:
            self.audit.bound(pod.key, node, assumed_at, bound_at)
        self._bound_times.append(time.monotonic())
        dispatch_id = self.pending.pop(pod.key, None)
        if dispatch_id is not None:
            self.send(_result(dispatch_id, pod.key, protocol.BOUND, node=node))

    def unschedulable(self, pod: PodRecord, decision: Decision) -> None:
        # Not reported on the pod: the leader may place it on another shard, and reports it when none can.
        dispatch_id = self.pending.pop(pod.key, None)
        if dispatch_id is not None:
            self.send(
                _result(
                    dispatch_id,
                    pod.key,
                    protocol.UNSCHEDULABLE,
                    nodes=decision.nodes,
                    reasons=dict(decision.reasons),
                    message=decision.message,
                )
            )

    def rejected(self, pod: PodRecord, message: str) -> None:
        self.reporter.unschedulable(pod, message)
        dispatch_id = self.pending.pop(pod.key, None)
        if dispatch_id is not None:
            self.send(_result(dispatch_id, pod.key, protocol.REJECTED, message=message))


# ----- the server ---------------------------------------------------------------------------------------


class Intake:
    def __init__(
        self,
        sched: Scheduler,
        results: LeaderResults,
        *,
        worker_id: str,
        shard: ShardView,
        can_place: Callable[[], bool] = lambda: True,
    ) -> None:
        self.sched = sched
        self.results = results
        self.worker_id = worker_id
        self.shard = shard
        self.can_place = can_place
        self._server: asyncio.Server | None = None
        self.received = 0

    async def start(self, listener: socket.socket) -> None:
        """Serve on an already bound socket (its address is in the worker's membership record)."""
        self._server = await asyncio.start_server(self.serve, sock=listener)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self.results.writer is not None:
            self.results.writer.close()
        if self._server is not None:
            await self._server.wait_closed()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One leader connection, from HELLO until it closes or a newer leader replaces it."""
        peer = writer.get_extra_info("peername")
        try:
            term, leader = _hello_term(await protocol.read_message(reader))
            if not self.results.connect(term, writer):
                writer.write(_error(f"term {term} is older than {self.results.term}"))
                await writer.drain()
                return
            log.info("leader %s (term %d) connected from %s", leader, term, peer)
            writer.write(_welcome(self.worker_id, term))
            reporter = asyncio.create_task(self._report_capacity(writer))
            try:
                while True:
                    msg = await protocol.read_message(reader)
                    self.handle(msg, writer)
            finally:
                reporter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reporter
        except (asyncio.IncompleteReadError, ConnectionError):
            log.info("leader stream from %s closed", peer)
        except protocol.ProtocolError as e:
            log.warning("protocol error from %s: %s", peer, e)
            with contextlib.suppress(ConnectionError):
                writer.write(_error(str(e)))
        finally:
            self.results.disconnect(writer)
            writer.close()

    def handle(self, msg: protocol.Message, writer: asyncio.StreamWriter) -> None:
        if isinstance(msg, protocol.Dispatch):
            dispatch_id, pod = _dispatch(msg)
            self.received += 1
            if not self.can_place():
                writer.write(
                    _result(dispatch_id, pod.key, protocol.REJECTED, message="worker cannot place pods now")
                )
                return
            self.results.expect(dispatch_id, pod.key)
            self.sched.submit(pod)
            writer.write(_ack(dispatch_id))
        elif isinstance(msg, protocol.Ping):
            writer.write(_pong(msg))
        else:
            log.debug("ignoring %s message", type(msg).__name__)

    def capacity(self) -> protocol.Capacity:
        """The CAPACITY summary: the index's incremental totals, the queue's counts, the bind rate."""
        summary = self.sched.cache.index.summary()
        placing = self.can_place()
        stats = self.sched.queue.statistics()
        return protocol.Capacity(
            nodes=summary.nodes if placing else 0,
            free_cpu=summary.free_cpu,
            free_memory=summary.free_memory,
            max_cpu=summary.max_cpu if placing else 0,
            max_memory=summary.max_memory if placing else 0,
            pending=stats["active"] + stats["backoff"] + stats["flight"],
            syncing=self.shard.syncing(),
            binds_per_s=self.results.binds_per_second(),
            ts=time.time(),
        )

    async def _report_capacity(self, writer: asyncio.StreamWriter) -> None:
        while not writer.is_closing():
            writer.write(_capacity(self.capacity()))
            await writer.drain()
            await asyncio.sleep(protocol.CAPACITY_INTERVAL)
