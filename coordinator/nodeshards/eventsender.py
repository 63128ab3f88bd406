"""``EventSender``: Kubernetes Events about the sharding ConfigMap, posted off the caller's path.

Watch handlers are synchronous, so they ``emit`` into a bounded queue and one task posts the events. The queue
is small on purpose: an operator needs the latest verdict on their ConfigMap, not a backlog; when it is full the
oldest event is dropped. A failed post is logged and not retried: the log line that accompanies every event says
the same thing. Bodies come from ``common.events.event_body``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from common.events import ObjectRef, event_body, events_path
from common.kube import ApiError, KubeClient

log = logging.getLogger(__name__)

QUEUE_LIMIT = 64


@dataclass(frozen=True, slots=True)
class _Queued:
    ref: ObjectRef
    type: str
    reason: str
    message: str
    at: datetime


class EventSender:
    """Queue of events to post; ``run()`` posts them until cancelled."""

    def __init__(self, client: KubeClient, *, component: str, instance: str) -> None:
        self._client = client
        self._component = component
        self._instance = instance
        self._queue: asyncio.Queue[_Queued] = asyncio.Queue(QUEUE_LIMIT)

    def emit(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        """Queue one event (never blocks)."""
        if self._queue.full():
            self._queue.get_nowait()
        self._queue.put_nowait(_Queued(ref, type_, reason, message, datetime.now(UTC)))

    async def run(self) -> None:
        while True:
            ev = await self._queue.get()
            body = event_body(
                ev.ref,
                type_=ev.type,
                reason=ev.reason,
                message=ev.message,
                component=self._component,
                instance=self._instance,
                at=ev.at,
            )
            try:
                await self._client.post(events_path(ev.ref.namespace), body)
            except ApiError as e:
                log.warning("could not record %s event on %s/%s: %s", ev.reason, ev.ref.kind, ev.ref.name, e)
