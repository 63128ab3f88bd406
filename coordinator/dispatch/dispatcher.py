"""The leader's pod dispatcher: every pending pod of our scheduler goes to one worker whose shard can fit it.

Inputs: a watch of pending pods (``spec.schedulerName`` = ours, ``spec.nodeName`` empty) and the set of live
workers with their dispatch addresses (from etcd membership, through ``set_workers``). Output: DISPATCH
messages over each worker's link (``common.protocol``), and the unschedulable report for pods no shard can
take. The parts: ``pending`` (the table and the verdict), ``choice`` (what is known of each worker and which
one a pod goes to), ``links`` (one worker's stream); this module wires them and runs the loop.

Invariants:
- A pod is dispatched to at most one worker at a time; it is tracked until its RESULT, until the watch shows
  it bound or deleted, until the worker's stream dies, or until ``DISPATCH_TIMEOUT`` passes without a RESULT
  (then it is dispatched again, elsewhere if possible). A RESULT for a dispatch no longer tracked (late,
  duplicate, or over a replaced stream) or for another pod of the same name (its uid differs) is ignored; a
  pod recreated under the same name replaces its predecessor's entry and dispatch.
- A pod is declared unschedulable (condition + event, with the reasons summed over every shard) only when
  every live worker with nodes has said no (or its summary rules the pod out) and no connected worker is
  still settling (including a worker that is not placing pods: fenced or draining); it is retried when a
  worker's capacity grows, the set of workers changes, or ``UNSCHEDULABLE_RETRY`` passes. A RESULT rejected
  is never a no, nor is an unschedulable answer over zero nodes (a worker that saw no usable node): the pod
  is dispatched again after a backoff (``pending``), so workers fenced through an etcd outage cause no
  Unschedulable verdict.
- A worker with ``protocol.MAX_UNACKED`` dispatches awaiting ACK is not chosen; pods that only it could take
  wait (they are not "no" answers) and are queued again as soon as an ACK frees its window.
- Malformed pods are reported unschedulable at once with their parse error; they are never dispatched. So are
  pods using inter-pod rules (``PodRecord.standalone_only``): only a standalone worker honours those so far,
  because they span shards (see ``common.support``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from common import metrics, protocol
from common.keyring import Keys, NoSecret
from common.kube import KubeClient
from common.records import PodKey, PodRecord, pod_from_json
from common.watching import Reflector
from coordinator.dispatch.choice import Worker, choose
from coordinator.dispatch.links import Inbound, Link, LinkEvents, LinkFactory, Transport
from coordinator.dispatch.pending import DISPATCH_TIMEOUT, PendingPod, PendingTable, verdict

log = logging.getLogger(__name__)

IDLE_RESCAN = 0.5  # with nothing queued, waiting pods are considered again this often
YIELD_EVERY = 256  # dispatches between yields to the event loop during a burst


class UnschedulableReports(Protocol):
    """The part of ``common.reporting.Reporter`` the dispatcher uses."""

    def unschedulable(self, pod: PodRecord, message: str) -> None: ...

    def forget(self, key: PodKey) -> None: ...


class _PendingFeed:
    def __init__(self, d: Dispatcher) -> None:
        self.d = d

    def replace(self, objects: list[dict[str, Any]]) -> None:
        seen = set()
        for obj in objects:
            seen.add(self.d.observe(obj))
        for key in [k for k in self.d.table if k not in seen]:
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
        reporter: UnschedulableReports,
        *,
        scheduler_name: str,
        leader_id: str,
        term: int,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        connect: LinkFactory | None = None,
        keys: Keys | None = None,
    ) -> None:
        self.client = client
        self.reporter = reporter
        self.scheduler_name = scheduler_name
        self.leader_id = leader_id
        self.term = term
        self.clock = clock
        self.keys: Keys = keys or NoSecret()
        self.rng = rng or random.Random()
        self.connect: LinkFactory = connect or self._open_link
        self.table = PendingTable()
        self.workers: dict[str, Worker] = {}
        self._blocked: dict[PodKey, None] = {}  # waiting only for a full ACK window to free (ordered set)
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
        self.timed_out = 0
        self.rejected = 0

    def _open_link(self, worker_id: str, address: str, events: LinkEvents) -> Transport:
        link = Link(
            worker_id,
            address,
            events,
            leader_id=self.leader_id,
            term=self.term,
            keys=self.keys,
            clock=self.clock,
        )
        return link.start()

    # ----- pods ------------------------------------------------------------------------------------------

    def observe(self, obj: dict[str, Any]) -> PodKey:
        record = pod_from_json(obj)
        key = record.key
        if record.node_name or record.terminal or record.deleting:
            self.forget(key)
            return key
        p = self.table.get(key)
        if p is not None and p.record.uid != record.uid:
            self.forget(key)  # deleted and recreated under the same name: a new pod
            p = None
        if p is None:
            p = self.table.pods[key] = PendingPod(obj, record, seen_at=self.clock())
            refusal = record.parse_error or record.standalone_only
            if refusal is not None:
                self.reporter.unschedulable(record, refusal)
                p.parked_at = self.clock()
                return key
            if not record.gated:
                self.table.enqueue(key)
            return key
        was_gated = p.record.gated
        p.obj, p.record = obj, record
        if was_gated and not record.gated and p.worker is None:
            p.seen_at = self.clock()  # the time spent gated is the user's, not the scheduler's
            self.table.enqueue(key)
        return key

    def forget(self, key: PodKey) -> None:
        p = self.table.pods.pop(key, None)
        if p is not None:
            self._release(p)
        self.reporter.forget(key)

    def _release(self, p: PendingPod) -> None:
        if p.worker is not None:
            w = self.workers.get(p.worker)
            if w is not None:
                w.release(p.dispatch_id, p.record)
        p.worker = None

    def dispatch(self, key: PodKey) -> None:
        """Consider one queued pod: send it to a worker, declare it unschedulable, or leave it waiting."""
        p = self.table.get(key)
        if p is None or not p.waiting or p.not_before > self.clock():
            return  # a pod rejected lately is considered again by the idle rescan once its backoff ends
        w = choose(self.workers.values(), p.record, p.tried, self.rng)
        if w is None:
            message = verdict(p, self.workers)
            if message is not None:
                self._declare_unschedulable(p, message)
            elif any(
                o.window_full and o.fits(p.record) for wid, o in self.workers.items() if wid not in p.tried
            ):
                self._blocked[key] = None
            return  # no worker can take it now: it waits for capacity, an ACK, or workers to change
        self._next_id += 1
        p.worker, p.dispatch_id, p.dispatched_at = w.worker_id, self._next_id, self.clock()
        w.assign(p.dispatch_id, p.record)
        w.link.send(protocol.Dispatch(p.dispatch_id, p.obj))

    def dispatch_ready(self) -> int:
        """Consider every pod queued so far (not those queued meanwhile); returns how many."""
        n, pending = 0, len(self.table.ready)
        while self.table.ready and n < pending:
            self.dispatch(self.table.ready.popleft())
            n += 1
        return n

    def _declare_unschedulable(self, p: PendingPod, message: str) -> None:
        self.reporter.unschedulable(p.record, message)
        p.parked_at = self.clock()
        self.declared_unschedulable += 1
        log.info("pod %s unschedulable on every shard: %s", p.record.key, message)

    def retry_parked(self, *, force: bool = False) -> int:
        return self.table.retry_parked(self.clock(), force=force)

    # ----- workers ---------------------------------------------------------------------------------------

    def set_workers(self, workers: Mapping[str, str]) -> None:
        """The live workers and their dispatch addresses ("host:port"), from membership."""
        for wid in [w for w in self.workers if w not in workers or self.workers[w].address != workers[w]]:
            self._drop_worker(wid)
        for wid, address in workers.items():
            if wid not in self.workers:
                self.workers[wid] = Worker(wid, address, self.connect(wid, address, self))
        self.retry_parked(force=True)

    def close(self) -> None:
        """Drop every worker link (the term ended)."""
        for wid in list(self.workers):
            self._drop_worker(wid)

    def _drop_worker(self, wid: str) -> None:
        w = self.workers.pop(wid, None)
        if w is not None:
            w.link.stop()
            self._requeue_from(w)

    def _requeue_from(self, w: Worker) -> None:
        for key in w.disconnected():
            p = self.table.get(key)
            if p is not None:
                p.worker = None
                self.redispatched += 1
                self.table.enqueue(key)
        self._unblock()  # the pods that waited for this worker's window may go elsewhere now

    def _current(self, link: Transport) -> Worker | None:
        """The worker ``link`` belongs to, unless the link has been replaced or dropped since."""
        w = self.workers.get(link.worker_id)
        return w if w is not None and w.link is link else None

    def link_up(self, link: Transport) -> None:
        w = self._current(link)
        if w is not None:
            w.capacity = None

    def link_down(self, link: Transport) -> None:
        w = self._current(link)
        if w is not None:
            self._requeue_from(w)

    def received(self, link: Transport, message: Inbound) -> None:
        w = self._current(link)
        if w is None:
            return
        match message:
            case protocol.Capacity():
                grew = w.summarised(message, self.table.record_of)
                self.table.wakeup.set()
                if grew:
                    self.retry_parked(force=True)
            case protocol.Ack(dispatch_id):
                self._acknowledged(w, dispatch_id)
            case protocol.Result():
                self._acknowledged(w, message.id)
                self._result(w, message)

    def _acknowledged(self, w: Worker, dispatch_id: int) -> None:
        if w.acknowledged(dispatch_id):
            self._unblock()

    def _unblock(self) -> None:
        for key in self._blocked:
            self.table.enqueue(key)
        self._blocked.clear()

    def _result(self, w: Worker, result: protocol.Result) -> None:
        key = w.in_flight.get(result.id)
        if key is None:
            return
        p = self.table.get(key)
        if p is None or p.worker != w.worker_id or p.dispatch_id != result.id:
            w.in_flight.pop(result.id, None)
            return
        if result.uid and p.record.uid and result.uid != p.record.uid:
            log.warning(
                "ignoring %s's result for %s: uid %s, expected %s", w.worker_id, key, result.uid, p.record.uid
            )
            return  # not this pod: the dispatch stays in flight until its own RESULT or the timeout
        self._release(p)
        if result.outcome == protocol.BOUND:
            w.bound += 1
            self.table.pods.pop(key, None)
            metrics.observe_stage("dispatched", p.dispatched_at - p.seen_at)
            metrics.observe_stage("result", self.clock() - p.dispatched_at)
        elif result.outcome == protocol.GONE:
            self.table.pods.pop(key, None)
        elif result.outcome == protocol.REJECTED or result.nodes == 0:
            # "Try later", never "no": the worker cannot place pods now, its binding was refused, or it
            # considered no node at all (fenced or still catching up when it decided)
            self.rejected += 1
            p.rejected(self.clock())
            self.table.enqueue(key)
        else:
            p.answered_no(w.worker_id, result)
            self.table.enqueue(key)

    def expire_dispatches(self) -> int:
        """Withdraw every dispatch that has had no RESULT for ``DISPATCH_TIMEOUT`` and queue its pod again;
        returns how many. A late RESULT for it is then ignored (its id is no longer tracked)."""
        deadline = self.clock() - DISPATCH_TIMEOUT
        expired = [
            (key, p)
            for key, p in self.table.pods.items()
            if p.worker is not None and p.dispatched_at < deadline
        ]
        for key, p in expired:
            w = self.workers.get(p.worker) if p.worker is not None else None
            log.warning(
                "no result from %s for %s within %.0f s; dispatching it again",
                p.worker,
                key,
                DISPATCH_TIMEOUT,
            )
            dispatch_id = p.dispatch_id
            self._release(p)
            if w is not None:
                self._acknowledged(w, dispatch_id)
            self.timed_out += 1
            self.redispatched += 1
            self.table.enqueue(key)
        return len(expired)

    # ----- loop ------------------------------------------------------------------------------------------

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.reflector.run())
            tg.create_task(self._loop())
            tg.create_task(self._housekeeping())

    async def _loop(self) -> None:
        ready = self.table.ready
        while True:
            if not ready:
                self.table.wakeup.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.table.wakeup.wait(), IDLE_RESCAN)
                if not ready:
                    self.table.requeue_waiting()
            n = 0
            pending = len(ready)
            while ready and n < pending:
                self.dispatch(ready.popleft())
                n += 1
                if n % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
            await asyncio.gather(*(w.link.drain() for w in list(self.workers.values())))
            if ready and n == pending:
                await asyncio.sleep(0.01)

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.retry_parked()
            self.expire_dispatches()

    def statistics(self) -> dict[str, Any]:
        return {
            "pending": len(self.table),
            "parked": self.table.parked(),
            "declared_unschedulable": self.declared_unschedulable,
            "redispatched": self.redispatched,
            "timed_out": self.timed_out,
            "rejected": self.rejected,
            "waiting_for_window": len(self._blocked),
            "workers": {
                wid: {
                    "connected": w.ready,
                    "nodes": w.nodes,
                    "free_cpu": w.capacity.free_cpu if w.capacity else 0,
                    "free_memory": w.capacity.free_memory if w.capacity else 0,
                    "pending": w.capacity.pending if w.capacity else 0,
                    "binds_per_s": w.capacity.binds_per_s if w.capacity else 0.0,
                    "dispatched": w.dispatched,
                    "in_flight": len(w.in_flight),
                    "unacked": len(w.unacked),
                }
                for wid, w in self.workers.items()
            },
        }
