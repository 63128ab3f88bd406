"""The leader's pod dispatcher: every pending pod of our scheduler goes to one worker whose shard can fit it.

Inputs: a watch of pending pods (``spec.schedulerName`` = ours, ``spec.nodeName`` empty) and the set of live
workers with their dispatch addresses (from etcd membership, through ``set_workers``). Output: DISPATCH
messages over each worker's stream (``common.protocol``), and the unschedulable report for pods no shard can
take.

Choosing a worker: among the connected workers whose last CAPACITY summary says the pod can fit (the pod's
CPU and memory requests within the largest free amounts on one node) and that have not already said no for
this pod, take the better of two picked at random: the one with fewer pods in flight to it (join the
shorter queue; ties go to more free CPU). Capacity decides *whether* a shard can take a pod, queue length
*which* one should: that keeps every worker's decision and binding capacity busy during a burst, and
best-of-two avoids the herd effect of always picking the minimum.

Invariants:
- A pod is dispatched to at most one worker at a time; it is tracked until its RESULT, until the watch shows
  it bound or deleted, or until the worker's stream dies (then it is dispatched again, elsewhere if possible).
- A pod is declared unschedulable (condition + event, with the reasons summed over every shard) only when
  every live worker with nodes has said no (or its summary rules the pod out) and no connected worker is
  still settling (no summary yet, or granted nodes it is still catching up on); it is retried when a worker's capacity grows, a worker joins,
  or ``UNSCHEDULABLE_RETRY`` passes.
- Malformed pods are reported unschedulable at once with their parse error; they are never dispatched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from common import protocol
from common.kube import KubeClient
from common.records import PodKey, PodRecord, pod_from_json
from common.reporting import Reporter, unschedulable_message
from common.watching import Reflector

log = logging.getLogger(__name__)

UNSCHEDULABLE_RETRY = 30.0
CONNECT_RETRY = 0.5


@dataclass(slots=True)
class _Pod:
    obj: dict[str, Any]
    record: PodRecord
    tried: set[str] = field(default_factory=set)
    worker: str | None = None
    dispatch_id: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    nodes: int = 0
    parked_at: float | None = None  # set while declared unschedulable


@dataclass(slots=True)
class _Link:
    worker_id: str
    address: str
    writer: asyncio.StreamWriter | None = None
    task: asyncio.Task[None] | None = None
    capacity: dict[str, Any] = field(default_factory=dict)
    last_heard: float = 0.0
    in_flight: dict[int, PodKey] = field(default_factory=dict)
    reserved_cpu: int = 0
    reserved_memory: int = 0
    dispatched: int = 0
    bound: int = 0

    @property
    def ready(self) -> bool:
        return self.writer is not None and not self.writer.is_closing() and bool(self.capacity)


class _PendingFeed:
    def __init__(self, d: Dispatcher) -> None:
        self.d = d

    def replace(self, objects: list[dict[str, Any]]) -> None:
        seen = set()
        for obj in objects:
            seen.add(self.d.observe(obj))
        for key in [k for k in self.d.pods if k not in seen]:
            self.d.forget(key)

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            meta = obj.get("metadata") or {}
            self.d.forget(PodKey(f"{meta.get('namespace')}/{meta.get('name')}"))
        else:
            self.d.observe(obj)


class Dispatcher:
    def __init__(
        self,
        client: KubeClient,
        reporter: Reporter,
        *,
        scheduler_name: str,
        leader_id: str,
        term: int,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.client = client
        self.reporter = reporter
        self.scheduler_name = scheduler_name
        self.leader_id = leader_id
        self.term = term
        self.clock = clock
        self.rng = rng or random.Random()
        self.pods: dict[PodKey, _Pod] = {}
        self.links: dict[str, _Link] = {}
        self._ready: deque[PodKey] = deque()
        self._wakeup = asyncio.Event()
        self._next_id = 0
        self.reflector = Reflector(
            client,
            "/api/v1/pods",
            _PendingFeed(self),
            params={"fieldSelector": f"spec.schedulerName={scheduler_name},spec.nodeName="},
            name="pending-pods",
        )
        self.declared_unschedulable = 0
        self.redispatched = 0

    # ----- pods ------------------------------------------------------------------------------------------

    def observe(self, obj: dict[str, Any]) -> PodKey:
        record = pod_from_json(obj)
        key = record.key
        if record.node_name or record.terminal or record.deleting:
            self.forget(key)
            return key
        p = self.pods.get(key)
        if p is None:
            p = self.pods[key] = _Pod(obj, record)
            if record.parse_error is not None:
                self.reporter.unschedulable(record, record.parse_error)
                p.parked_at = self.clock()
                return key
            if not record.gated:
                self._enqueue(key)
            return key
        was_gated = p.record.gated
        p.obj, p.record = obj, record
        if was_gated and not record.gated and p.worker is None:
            self._enqueue(key)
        return key

    def forget(self, key: PodKey) -> None:
        p = self.pods.pop(key, None)
        if p is not None and p.worker is not None:
            link = self.links.get(p.worker)
            if link is not None:
                self._release(link, p)
        self.reporter.forget(key)

    def _enqueue(self, key: PodKey) -> None:
        self._ready.append(key)
        self._wakeup.set()

    def _release(self, link: _Link, p: _Pod) -> None:
        if link.in_flight.pop(p.dispatch_id, None) is not None:
            link.reserved_cpu -= p.record.requests.milli_cpu
            link.reserved_memory -= p.record.requests.memory
        p.worker = None

    # ----- choosing --------------------------------------------------------------------------------------

    def _fits(self, link: _Link, pod: PodRecord) -> bool:
        cap = link.capacity
        if not link.ready or cap.get("nodes", 0) <= 0:
            return False
        return bool(
            pod.requests.milli_cpu <= cap.get("max_cpu", 0)
            and pod.requests.memory <= cap.get("max_memory", 0)
        )

    def _load(self, link: _Link) -> tuple[int, float]:
        """Lower is better: pods on their way to or waiting in the worker, then less free CPU."""
        return (len(link.in_flight), -float(link.capacity.get("free_cpu", 0) - link.reserved_cpu))

    def choose(self, p: _Pod) -> _Link | None:
        options = [
            link for wid, link in self.links.items() if wid not in p.tried and self._fits(link, p.record)
        ]
        if not options:
            return None
        if len(options) == 1:
            return options[0]
        a, b = self.rng.sample(options, 2)
        return a if self._load(a) <= self._load(b) else b

    def _live_workers_with_nodes(self) -> set[str]:
        return {wid for wid, link in self.links.items() if link.ready and link.capacity.get("nodes", 0) > 0}

    def _settling(self, p: _Pod) -> bool:
        """True while a connected worker could still answer for this pod: its stream has not sent a summary
        yet, or it holds granted nodes it is still catching up on. No verdict is final until it has."""
        for wid, link in self.links.items():
            if wid in p.tried or link.writer is None or link.writer.is_closing():
                continue
            if not link.capacity or link.capacity.get("syncing", 0) > 0:
                return True
        return False

    def _dispatch(self, key: PodKey) -> None:
        p = self.pods.get(key)
        if p is None or p.worker is not None or p.record.gated or p.parked_at is not None:
            return
        link = self.choose(p)
        if link is None:
            live = self._live_workers_with_nodes()
            ruled_out = p.tried | {w for w in live if not self._fits(self.links[w], p.record)}
            if live and live <= ruled_out and not self._settling(p):
                self._declare_unschedulable(p, live)
            return  # no worker can take it now: it waits for capacity or workers to change
        assert link.writer is not None
        self._next_id += 1
        p.worker, p.dispatch_id = link.worker_id, self._next_id
        link.in_flight[p.dispatch_id] = key
        link.reserved_cpu += p.record.requests.milli_cpu
        link.reserved_memory += p.record.requests.memory
        link.dispatched += 1
        link.writer.write(protocol.encode(protocol.DISPATCH, id=p.dispatch_id, pod=p.obj))

    def _declare_unschedulable(self, p: _Pod, live: set[str]) -> None:
        # Workers that never examined the pod (their summary already ruled it out) contribute their node
        # count with a resource reason, so the message still covers the whole agent pool.
        nodes, reasons = p.nodes, dict(p.reasons)
        for wid in live - p.tried:
            n = int(self.links[wid].capacity.get("nodes", 0))
            nodes += n
            reasons["Insufficient cpu"] = reasons.get("Insufficient cpu", 0) + n
        message = unschedulable_message(nodes, reasons) if nodes else "no worker owns any node"
        self.reporter.unschedulable(p.record, message)
        p.parked_at = self.clock()
        self.declared_unschedulable += 1
        log.info("pod %s unschedulable on every shard: %s", p.record.key, message)

    def retry_parked(self, *, force: bool = False) -> int:
        now = self.clock()
        n = 0
        for key, p in self.pods.items():
            if (
                p.parked_at is not None
                and p.record.parse_error is None
                and (force or now - p.parked_at >= UNSCHEDULABLE_RETRY)
            ):
                p.parked_at, p.tried, p.reasons, p.nodes = None, set(), {}, 0
                self._enqueue(key)
                n += 1
        return n

    # ----- worker links ----------------------------------------------------------------------------------

    def set_workers(self, workers: Mapping[str, str]) -> None:
        """The live workers and their dispatch addresses ("host:port"), from membership."""
        for wid in [w for w in self.links if w not in workers or self.links[w].address != workers[w]]:
            self._drop_link(wid)
        for wid, address in workers.items():
            if wid not in self.links:
                link = self.links[wid] = _Link(wid, address)
                link.task = asyncio.create_task(self._connect(link), name=f"link-{wid}")
        self.retry_parked(force=True)

    def close(self) -> None:
        """Drop every worker stream (the term ended)."""
        for wid in list(self.links):
            self._drop_link(wid)

    def _drop_link(self, wid: str) -> None:
        link = self.links.pop(wid, None)
        if link is None:
            return
        if link.task is not None:
            link.task.cancel()
        self._requeue_from(link)

    def _requeue_from(self, link: _Link) -> None:
        for key in list(link.in_flight.values()):
            p = self.pods.get(key)
            if p is not None:
                self._release(link, p)
                self.redispatched += 1
                self._enqueue(key)
        link.in_flight.clear()
        link.reserved_cpu = link.reserved_memory = 0

    async def _connect(self, link: _Link) -> None:
        host, _, port = link.address.rpartition(":")
        while True:
            try:
                reader, writer = await asyncio.open_connection(host, int(port))
            except OSError as e:
                log.debug("worker %s at %s not reachable: %s", link.worker_id, link.address, e)
                await asyncio.sleep(CONNECT_RETRY)
                continue
            link.writer, link.capacity, link.last_heard = writer, {}, self.clock()
            try:
                writer.write(protocol.encode(protocol.HELLO, leader=self.leader_id, term=self.term))
                await self._read(link, reader, writer)
            except (asyncio.IncompleteReadError, ConnectionError, protocol.ProtocolError, TimeoutError) as e:
                log.warning("stream to worker %s broke: %s", link.worker_id, e)
            finally:
                writer.close()
                link.writer, link.capacity = None, {}
                self._requeue_from(link)
            await asyncio.sleep(CONNECT_RETRY)

    async def _read(self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        last_ping = self.clock()
        while True:
            msg = await asyncio.wait_for(protocol.read_message(reader), protocol.DEAD_AFTER)
            link.last_heard = now = self.clock()
            kind = msg["t"]
            if kind == protocol.CAPACITY:
                grew = msg.get("max_cpu", 0) > link.capacity.get("max_cpu", 0)
                link.capacity = msg
                # the summary now includes what we had reserved for pods that have been placed meanwhile
                link.reserved_cpu = sum(
                    self.pods[k].record.requests.milli_cpu for k in link.in_flight.values() if k in self.pods
                )
                link.reserved_memory = sum(
                    self.pods[k].record.requests.memory for k in link.in_flight.values() if k in self.pods
                )
                self._wakeup.set()
                if grew:
                    self.retry_parked(force=True)
            elif kind == protocol.RESULT:
                self._result(link, msg)
            elif kind == protocol.ERROR:
                raise protocol.ProtocolError(f"worker says: {msg.get('message')}")
            if now - last_ping >= protocol.HEARTBEAT_INTERVAL:
                writer.write(protocol.encode(protocol.PING, ts=time.time()))
                last_ping = now

    def _result(self, link: _Link, msg: dict[str, Any]) -> None:
        key = link.in_flight.get(int(msg["id"]))
        if key is None:
            return
        p = self.pods.get(key)
        if p is None:
            link.in_flight.pop(int(msg["id"]), None)
            return
        self._release(link, p)
        outcome = msg.get("outcome")
        if outcome == protocol.BOUND:
            link.bound += 1
            self.pods.pop(key, None)
        elif outcome == protocol.GONE:
            self.pods.pop(key, None)
        else:
            p.tried.add(link.worker_id)
            if outcome == protocol.UNSCHEDULABLE:
                p.nodes += int(msg.get("nodes", 0))
                for reason, n in (msg.get("reasons") or {}).items():
                    p.reasons[reason] = p.reasons.get(reason, 0) + int(n)
            self._enqueue(key)

    # ----- loop ------------------------------------------------------------------------------------------

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.reflector.run())
            tg.create_task(self._loop())
            tg.create_task(self._housekeeping())

    async def _loop(self) -> None:
        while True:
            if not self._ready:
                self._wakeup.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), 0.5)
                if not self._ready:
                    # pods waiting for a worker to become able: try them all again
                    self._ready.extend(
                        k
                        for k, p in self.pods.items()
                        if p.worker is None and p.parked_at is None and not p.record.gated
                    )
            n = 0
            pending = len(self._ready)
            while self._ready and n < pending:
                self._dispatch(self._ready.popleft())
                n += 1
                if n % 256 == 0:
                    await asyncio.sleep(0)
            for link in self.links.values():
                if link.writer is not None and not link.writer.is_closing():
                    with contextlib.suppress(ConnectionError):
                        await link.writer.drain()
            if self._ready and n == pending:
                await asyncio.sleep(0.01)

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.retry_parked()

    def statistics(self) -> dict[str, Any]:
        return {
            "pending": len(self.pods),
            "parked": sum(1 for p in self.pods.values() if p.parked_at is not None),
            "declared_unschedulable": self.declared_unschedulable,
            "redispatched": self.redispatched,
            "workers": {
                wid: {
                    "connected": link.ready,
                    "nodes": link.capacity.get("nodes", 0),
                    "free_cpu": link.capacity.get("free_cpu", 0),
                    "free_memory": link.capacity.get("free_memory", 0),
                    "pending": link.capacity.get("pending", 0),
                    "binds_per_s": link.capacity.get("binds_per_s", 0.0),
                    "dispatched": link.dispatched,
                    "in_flight": len(link.in_flight),
                }
                for wid, link in self.links.items()
            },
        }
