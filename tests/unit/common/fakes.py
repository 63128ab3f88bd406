"""In-memory stand-ins for this project's ``common.kube.KubeClient`` (its get/post/patch/watch methods), and
a recorded ``asyncio.sleep``, for unit tests of the modules that talk to the API through that client.

``FakeKube`` answers from scripts, not from an imitation of the API server: ``pages`` are what successive
``get`` calls return, ``streams`` what successive ``watch`` calls yield (an ``Exception`` in a stream is raised
at that point; when the streams run out, ``watch`` blocks until the test cancels it). Every call is recorded
in ``calls``, in order, so a test can assert what was asked and in which order relative to sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from common.kube import KubeClient

StreamItem = tuple[str, dict[str, Any]] | Exception


class FakeKube:
    def __init__(
        self,
        *,
        pages: list[dict[str, Any]] | None = None,
        streams: list[list[StreamItem]] | None = None,
    ) -> None:
        self.pages = list(pages or [])
        self.streams = list(streams or [])
        self.calls: list[tuple[Any, ...]] = []
        self.gets: list[tuple[str, dict[str, str]]] = []
        self.watch_versions: list[str] = []
        self.posts: list[tuple[str, Any]] = []
        self.patches: list[tuple[str, Any, str]] = []
        #: exceptions the next ``patch`` calls raise, one per call, before answering normally
        self.patch_errors: list[Exception] = []
        #: set when the streams have run out and a ``watch`` call is waiting for the test to stop it
        self.idle = asyncio.Event()
        self._changed = asyncio.Event()

    def client(self) -> KubeClient:
        """This fake, typed as the client the code under test expects."""
        return self  # type: ignore[return-value]

    async def get(self, path: str, params: dict[str, str] | None = None) -> Any:
        self.gets.append((path, dict(params or {})))
        self.calls.append(("get", path, dict(params or {})))
        return self.pages.pop(0)

    async def post(self, path: str, body: Any, params: dict[str, str] | None = None) -> Any:
        self.posts.append((path, body))
        self.calls.append(("post", path, body))
        self._changed.set()
        return body

    async def patch(self, path: str, body: Any, *, kind: str = "merge") -> Any:
        self.calls.append(("patch", path, body))
        if self.patch_errors:
            raise self.patch_errors.pop(0)
        self.patches.append((path, body, kind))
        self._changed.set()
        return body

    async def watch(
        self,
        path: str,
        *,
        resource_version: str,
        timeout_seconds: int = 300,
        params: dict[str, str] | None = None,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self.watch_versions.append(resource_version)
        self.calls.append(("watch", resource_version))
        if not self.streams:
            self.idle.set()
            await asyncio.Event().wait()  # until cancelled
        for item in self.streams.pop(0):
            if isinstance(item, Exception):
                raise item
            yield item

    async def wait_posts(self, count: int) -> None:
        """Until at least ``count`` posts were made (a guard against hanging, not a timing assertion)."""

        async def reached() -> None:
            while len(self.posts) < count:
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(reached(), 10)


async def cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def record_sleeps(monkeypatch: pytest.MonkeyPatch, log: list[tuple[Any, ...]] | None = None) -> list[float]:
    """Replace ``asyncio.sleep`` by one that records the delay (also into ``log``) and only yields."""
    real_sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    slept: list[float] = []

    async def sleep(delay: float, result: Any = None) -> Any:
        slept.append(delay)
        if log is not None:
            log.append(("sleep", delay))
        await real_sleep(0)
        return result

    monkeypatch.setattr(asyncio, "sleep", sleep)
    return slept
