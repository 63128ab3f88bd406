"""Kubernetes Events about objects the shard controller reads (the sharding ConfigMap), sent off the caller's path.

Watch handlers are synchronous, so they ``emit`` into a bounded queue and one task posts the events. The queue
is small on purpose: an operator needs the latest verdict on their ConfigMap, not a backlog; when it is full the
oldest event is dropped and counted (``dropped``). A failed post is logged and not retried: the log line that
accompanies every event says the same thing.

Event names are ``<object>.<random hex>``, like kubectl's, so two verdicts on one object never collide.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from common.kube import ApiError, KubeClient

log = logging.getLogger(__name__)

QUEUE_LIMIT = 64
NORMAL = "Normal"
WARNING = "Warning"


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an event is about (``involvedObject``)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""
    resource_version: str = ""

    @classmethod
    def of(cls, obj: dict[str, Any], *, api_version: str, kind: str) -> ObjectRef:
        meta = obj.get("metadata") or {}
        return cls(
            api_version,
            kind,
            str(meta.get("namespace") or ""),
            str(meta.get("name") or ""),
            str(meta.get("uid") or ""),
            str(meta.get("resourceVersion") or ""),
        )


@dataclass(frozen=True, slots=True)
class _Event:
    ref: ObjectRef
    type: str
    reason: str
    message: str
    time: datetime


def event_body(ev: _Event, *, component: str, instance: str) -> dict[str, Any]:
    """A core/v1 Event (the form ``kubectl describe`` shows)."""
    stamp = ev.time.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    involved: dict[str, Any] = {
        "apiVersion": ev.ref.api_version,
        "kind": ev.ref.kind,
        "namespace": ev.ref.namespace,
        "name": ev.ref.name,
    }
    if ev.ref.uid:
        involved["uid"] = ev.ref.uid
    if ev.ref.resource_version:
        involved["resourceVersion"] = ev.ref.resource_version
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{ev.ref.name}.{uuid.uuid4().hex[:16]}", "namespace": ev.ref.namespace},
        "involvedObject": involved,
        "reason": ev.reason,
        "message": ev.message[:1024],
        "type": ev.type,
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class EventSender:
    """Queue of events to post; ``run()`` posts them until cancelled."""

    def __init__(self, client: KubeClient, *, component: str, instance: str) -> None:
        self._client = client
        self._component = component
        self._instance = instance
        self._queue: asyncio.Queue[_Event] = asyncio.Queue(QUEUE_LIMIT)
        self.sent = 0
        self.dropped = 0
        self.failed = 0

    def emit(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        """Queue one event (never blocks)."""
        if self._queue.full():
            self._queue.get_nowait()
            self.dropped += 1
        self._queue.put_nowait(_Event(ref, type_, reason, message, datetime.now(UTC)))

    def pending(self) -> int:
        return self._queue.qsize()

    async def run(self) -> None:
        while True:
            ev = await self._queue.get()
            body = event_body(ev, component=self._component, instance=self._instance)
            try:
                await self._client.post(f"/api/v1/namespaces/{ev.ref.namespace}/events", body)
                self.sent += 1
            except ApiError as e:
                self.failed += 1
                log.warning("could not record %s event on %s/%s: %s", ev.reason, ev.ref.kind, ev.ref.name, e)
