"""Telling users what happened to their pods: the PodScheduled condition and scheduling Events.

Unschedulable pods get condition PodScheduled=False, reason Unschedulable, with kube-scheduler's message
shape, and one ``FailedScheduling`` Warning event; bound pods get a ``Scheduled`` Normal event (a flag, on by
default as in kube-scheduler). Both are shown by ``kubectl describe pod``.

Protecting the API server from ten thousand unschedulable pods:
- coalescing: reports wait in a dict keyed by pod, so a pod that fails again before its report is sent has
  one (the newest) report, not two;
- deduplication: a pod whose message did not change is not reported again within ``REPEAT_AFTER``;
- rate limit: failure reports are sent by one task at ``qps`` at most; Scheduled events by a few concurrent
  senders, so they keep pace with binding.
Nothing is dropped silently: failure reports are coalesced, never dropped; informational Scheduled events
are dropped only when their queue is full, and counted (``agent_scheduler_events_dropped_total``).

A failure report never outlives the pod's binding: the binding sets PodScheduled=True server-side, and a
report that lands after it (sent by a worker while another one bound the pod, or overtaken by a retry of its
own) would leave a bound pod marked unschedulable. The status patch answers with the pod: if it is already
bound, the condition is set back to True and no FailedScheduling event is sent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

from common import aiotools, metrics
from common.events import NORMAL, WARNING, ObjectRef, event_body, events_path, rfc3339
from common.kube import ApiError, KubeClient, NotFound
from common.records import PodKey, PodRecord

log = logging.getLogger(__name__)

REPEAT_AFTER = 60.0
MAX_SCHEDULED_EVENTS_QUEUED = 10000
SCHEDULED_EVENT_SENDERS = 8


def unschedulable_message(nodes: int, reasons: dict[str, int]) -> str:
    """kube-scheduler's FailedScheduling message: "0/40 nodes are available: 12 Insufficient cpu, ..."."""
    detail = ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items()))
    return f"0/{nodes} nodes are available" + (f": {detail}." if detail else ".")


def _bound(pod: object) -> bool:
    """Does this pod object (the answer to a status patch) name a node?"""
    if not isinstance(pod, dict):
        return False
    spec = pod.get("spec")
    return isinstance(spec, dict) and bool(spec.get("nodeName"))


@dataclass(slots=True)
class _Failure:
    pod: PodRecord
    message: str


class Reporter:
    def __init__(
        self,
        client: KubeClient,
        *,
        component: str,
        instance: str = "",
        qps: float = 50.0,
        scheduled_events: bool = True,
    ) -> None:
        self.client = client
        self.component = component
        self.instance = instance or component
        self.interval = 1.0 / qps if qps > 0 else 0.0
        self.scheduled_events = scheduled_events
        self._failures: OrderedDict[PodKey, _Failure] = OrderedDict()
        self._scheduled: OrderedDict[PodKey, tuple[PodRecord, str]] = OrderedDict()
        self._last: dict[PodKey, tuple[str, float]] = {}
        self._wakeup = asyncio.Event()
        self._scheduled_wakeup = asyncio.Event()
        self.sent = 0

    def unschedulable(self, pod: PodRecord, message: str) -> None:
        last = self._last.get(pod.key)
        if last is not None and last[0] == message and time.monotonic() - last[1] < REPEAT_AFTER:
            return
        self._failures[pod.key] = _Failure(pod, message)
        self._failures.move_to_end(pod.key)
        self._wakeup.set()

    def scheduled(self, pod: PodRecord, node: str) -> None:
        self._last.pop(pod.key, None)
        self._failures.pop(pod.key, None)
        if not self.scheduled_events:
            return
        if len(self._scheduled) >= MAX_SCHEDULED_EVENTS_QUEUED:
            metrics.reports_dropped.inc()
            return
        self._scheduled[pod.key] = (pod, node)
        self._scheduled_wakeup.set()
        aiotools.PACER.poke()

    def forget(self, key: PodKey) -> None:
        """The pod is gone: nothing more to report."""
        self._failures.pop(key, None)
        self._scheduled.pop(key, None)
        self._last.pop(key, None)

    def pending(self) -> int:
        return len(self._failures) + len(self._scheduled)

    async def run(self) -> None:
        # Scheduled events waiting for a sender: they wait for the API server, so this process may pace
        with aiotools.PACER.backlog_of(self._scheduled.__len__):
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._failure_loop())
                for _ in range(SCHEDULED_EVENT_SENDERS):
                    tg.create_task(self._scheduled_loop())

    async def _failure_loop(self) -> None:
        while True:
            if not self._failures:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            _, failure = self._failures.popitem(last=False)
            await self._send_failure(failure)
            if self.interval:
                await asyncio.sleep(self.interval)

    async def _scheduled_loop(self) -> None:
        # Scheduled events follow binds one for one; they are sent concurrently (bounded by the client's
        # own rate limit) so that they keep pace with binding instead of piling up.
        while True:
            if not self._scheduled:
                self._scheduled_wakeup.clear()
                await self._scheduled_wakeup.wait()
                continue
            _, (pod, node) = self._scheduled.popitem(last=False)
            await self._event(pod, NORMAL, "Scheduled", f"Successfully assigned {pod.key} to {node}")

    async def _send_failure(self, f: _Failure) -> None:
        pod = f.pod
        self._last[pod.key] = (f.message, time.monotonic())
        patch = {
            "status": {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": f.message,
                        "lastProbeTime": None,
                        "lastTransitionTime": rfc3339(),
                    }
                ]
            }
        }
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status"
        try:
            answer = await self.client.patch(path, patch, kind="strategic")
        except NotFound:
            self.forget(pod.key)
            return
        except ApiError as e:
            log.warning("pod %s: could not set PodScheduled condition: %s", pod.key, e)
        else:
            if _bound(answer):
                await self._undo_stale(pod, path)
                return
        await self._event(pod, WARNING, "FailedScheduling", f.message)

    async def _undo_stale(self, pod: PodRecord, path: str) -> None:
        """The pod was bound before our failure report landed: put back what the binding had set."""
        self._last.pop(pod.key, None)
        self._failures.pop(pod.key, None)
        log.info("pod %s was bound before its failure report landed; PodScheduled set back to True", pod.key)
        scheduled = {
            "type": "PodScheduled",
            "status": "True",
            "reason": None,  # null deletes the field in a strategic merge patch
            "message": None,
            "lastProbeTime": None,
            "lastTransitionTime": rfc3339(),
        }
        try:
            await self.client.patch(path, {"status": {"conditions": [scheduled]}}, kind="strategic")
        except NotFound:
            self.forget(pod.key)
        except ApiError as e:
            log.warning("pod %s: could not set PodScheduled back to True: %s", pod.key, e)

    async def _event(self, pod: PodRecord, type_: str, reason: str, message: str) -> None:
        body = event_body(
            ObjectRef.pod(pod.namespace, pod.name, pod.uid),
            type_=type_,
            reason=reason,
            message=message,
            component=self.component,
            instance=self.instance,
        )
        try:
            await self.client.post(events_path(pod.namespace), body)
            self.sent += 1
        except ApiError as e:
            log.warning("pod %s: could not record %s event: %s", pod.key, reason, e)
