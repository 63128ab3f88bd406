"""List+watch of one resource kind, feeding a handler: the reflector of this project.

The reflector lists (in pages), hands the complete set to ``handler.replace``, then watches from the list's
resourceVersion and hands each event to ``handler.event``. Bookmarks only advance the resourceVersion.

Invariants:
- After ``replace`` the handler holds exactly the listed objects, so objects deleted while the watch was down
  are not kept forever (relist on 410 Gone, and at start).
- Transient failures (5xx, 429, broken connections) reconnect from the last seen resourceVersion with
  exponential backoff (``common.backoff.api_retry``: 0.2 s doubling to 10 s), resetting after a healthy stream, so no event is lost and none
  is applied twice from the same stream. Handlers must still treat events idempotently: a relist may replay.
- ``synced`` is set after the first complete list; ``list_started_at`` says when the latest complete list
  began, so a caller can tell whether the cache reflects a consistent read made after some moment.
- ``resource_version`` only grows while one stream lasts (the API server delivers events in etcd revision
  order), which lets a caller wait until the cache has seen a given object revision. ``object_version`` is
  the highest resourceVersion of an object the handler was given (an event's, or a listed object's; not a
  bookmark's or a list's, which are revisions of the whole store that no event of this kind may ever reach):
  a revision every reflector of the same kind and selector also reaches through its own events or lists.
- A stream the API server ends before its ``timeoutSeconds`` (it ends watchers it judges too slow, and every
  watch when it shuts down) is resumed from the last resourceVersion like a timed-out one, and counted in
  ``closed_early``; after the backoff delay if it delivered no event (no spinning on a server that ends every
  stream at once). Every restart but a stream's timeout is counted in ``agent_scheduler_watch_restarts_total``
  by this reflector's name and the reason.
- Nothing a watch or a handler raises ends ``run`` (only cancellation does). An event too large to read
  (``EventTooLarge``, counted in ``oversized``) and a handler that raises (counted in ``handler_errors``) are
  logged and followed by a relist after the backoff delay: the list carries the object the event was about,
  and ``replace`` rebuilds the handler's set, so nothing is lost and a repeating cause does not spin.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

from common import metrics
from common.backoff import api_retry
from common.kube import ApiError, EventTooLarge, Gone, KubeClient

log = logging.getLogger(__name__)

LIST_PAGE_SIZE = 500
# A stream that lasted less than this share of its timeoutSeconds was ended by the API server, not the timeout.
EARLY_CLOSE = 0.9


def revision_of(rv: object) -> int:
    """A resourceVersion as an integer (an etcd revision in every API server we know), 0 if there is none or it
    has another form."""
    try:
        return int(str(rv)) if rv else 0
    except ValueError:
        return 0


def _version(obj: dict[str, Any]) -> int:
    return revision_of((obj.get("metadata") or {}).get("resourceVersion"))


class WatchHandler(Protocol):
    def replace(self, objects: list[dict[str, Any]]) -> None:
        """The complete current set, after a (re)list."""

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        """ADDED, MODIFIED or DELETED."""


class Reflector:
    def __init__(
        self,
        client: KubeClient,
        path: str,
        handler: WatchHandler,
        *,
        params: dict[str, str] | None = None,
        name: str = "",
        watch_timeout: int = 300,
    ) -> None:
        self.client = client
        self.path = path
        self.handler = handler
        self.params = params or {}
        self.name = name or path
        self.watch_timeout = watch_timeout
        self.synced = asyncio.Event()
        self.resource_version = ""
        # ``object_version``'s parts: the highest as of the latest list, and the latest event's since (events come
        # in revision order, each above the list's: kept as given, parsed only when asked, not per event)
        self._listed_version = 0
        self._event_version = ""
        self.relists = 0
        self.reconnects = 0
        self.events = 0
        self.oversized = 0
        self.handler_errors = 0
        self.closed_early = 0
        self.list_started_at = -1.0  # monotonic start of the latest (re)list that completed

    @property
    def object_version(self) -> int:
        """The highest resourceVersion of an object handed to the handler (the module docstring). Integer
        resourceVersions (etcd revisions) assumed: an event's of another form reads as 0 here."""
        return max(self._listed_version, revision_of(self._event_version))

    async def list_all(self) -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        cont = ""
        while True:
            params = {**self.params, "limit": str(LIST_PAGE_SIZE)}
            if cont:
                params["continue"] = cont
            page = await self.client.get(self.path, params)
            items.extend(page.get("items") or ())
            meta = page.get("metadata") or {}
            cont = meta.get("continue") or ""
            if not cont:
                return items, str(meta.get("resourceVersion") or "")

    async def run(self) -> None:
        """Run until cancelled."""
        backoff = api_retry()
        need_list = True
        while True:
            try:
                if need_list:
                    started = time.monotonic()
                    items, self.resource_version = await self.list_all()
                    self.list_started_at = started
                    self._listed_version = max(
                        self.object_version,
                        max((_version(item) for item in items), default=0),
                    )
                    self._event_version = ""
                    self.handler.replace(items)
                    self.relists += 1
                    self.synced.set()
                    need_list = False
                    log.debug("%s: listed %d objects at rv %s", self.name, len(items), self.resource_version)
                opened, delivered = time.monotonic(), self.events
                async for kind, obj in self.client.watch(
                    self.path,
                    resource_version=self.resource_version,
                    timeout_seconds=self.watch_timeout,
                    params=self.params,
                ):
                    rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if kind == "BOOKMARK":
                        if rv:
                            self.resource_version = str(rv)
                        continue
                    if rv:
                        self.resource_version = self._event_version = str(rv)
                    self.events += 1
                    self.handler.event(kind, obj)
                    backoff.reset()
                lasted = time.monotonic() - opened
                if lasted < self.watch_timeout * EARLY_CLOSE:
                    self.closed_early += 1
                    self._restarted("closed")
                    log.info(
                        "%s: the API server ended the watch after %.1fs (timeout %ds); resuming from %s",
                        self.name,
                        lasted,
                        self.watch_timeout,
                        self.resource_version,
                    )
                    if self.events == delivered:
                        # nothing came through it: a server or proxy that keeps ending streams at once is not
                        # asked again at once, over and over
                        await asyncio.sleep(backoff.next())
            except Gone:
                self._restarted("gone")
                log.info("%s: resourceVersion %s too old, relisting", self.name, self.resource_version)
                need_list = True
            except EventTooLarge as e:
                self._restarted("oversized")
                self.oversized += 1
                need_list = True
                delay = backoff.next()
                log.warning(
                    "%s: %s after resourceVersion %s; relisting in %.1fs",
                    self.name,
                    e,
                    self.resource_version,
                    delay,
                )
                await asyncio.sleep(delay)
            except ApiError as e:
                self._restarted("error")
                self.reconnects += 1
                delay = backoff.next()
                log.warning("%s: watch failed (%s), retrying in %.1fs", self.name, e, delay)
                await asyncio.sleep(delay)
            except Exception:
                # A handler that cannot take an object must not stop this kind's cache for good: relist, so it
                # is rebuilt from a consistent read, after a delay, so a failure that repeats does not spin.
                self._restarted("handler_error")
                self.handler_errors += 1
                need_list = True
                delay = backoff.next()
                log.exception(
                    "%s: handling the list or an event failed; relisting in %.1fs", self.name, delay
                )
                await asyncio.sleep(delay)

    def _restarted(self, reason: str) -> None:
        metrics.watch_restarts.labels(self.name, reason).inc()
