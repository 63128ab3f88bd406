"""Binder outcomes for each answer of the binding POST, with a fake of the API client's ``post``."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from common.kube import ApiError, Credentials, KubeClient, ServerError, _error_for
from common.records import NodeName, PodRecord
from tests.builders import make_node, make_pod
from worker.binder import Binder
from worker.cache import Cache
from worker.engine import Decision

NODE = NodeName("n1")
Reply = int | ApiError


class FakeApi(KubeClient):
    """Answers each POST with the next scripted status (or raises the scripted error)."""

    def __init__(self, replies: list[Reply]) -> None:
        super().__init__(Credentials("http://127.0.0.1:9"))
        self.replies = list(replies)
        self.posts: list[tuple[str, Any]] = []

    async def post(self, path: str, body: Any, params: dict[str, str] | None = None) -> Any:
        self.posts.append((path, body))
        reply = self.replies.pop(0)
        if isinstance(reply, ApiError):
            raise reply
        if reply >= 300:
            raise _error_for(reply, orjson.dumps({"reason": "Scripted", "message": f"status {reply}"}))
        return {"kind": "Status", "status": "Success"}


class Recorded:
    def __init__(self) -> None:
        self.bound: list[tuple[str, str]] = []
        self.unschedulable: list[str] = []
        self.rejected: list[tuple[str, str]] = []
        self.requeued: list[str] = []
        self.requeued_attempts: list[int] = []

    def on_bound(self, pod: PodRecord, node: NodeName, *, assumed_at: float, bound_at: float) -> None:
        assert assumed_at <= bound_at
        self.bound.append((pod.key, node))

    def on_unschedulable(self, pod: PodRecord, decision: Decision) -> None:
        self.unschedulable.append(pod.key)

    def on_rejected(self, pod: PodRecord, message: str) -> None:
        self.rejected.append((pod.key, message))

    def requeue(self, pod: PodRecord, attempts: int) -> None:
        self.requeued.append(pod.key)
        self.requeued_attempts.append(attempts)


class Outcomes:
    """The ``worker.outcomes.Outcomes`` seam, recording into ``Recorded``."""

    def __init__(self, rec: Recorded) -> None:
        self.bound = rec.on_bound
        self.unschedulable = rec.on_unschedulable
        self.rejected = rec.on_rejected


async def bind_once(
    replies: list[Reply], *, retries: int = 2, attempts: int = 1, requeue_rejected: bool = False
) -> tuple[Cache, FakeApi, Recorded, Binder]:
    cache = Cache()
    cache.upsert_node(make_node(NODE).record())
    pod = make_pod("p").req(cpu="1").record()
    cache.assume(pod, NODE)
    api = FakeApi(replies)
    rec = Recorded()
    binder = Binder(
        api,
        cache,
        Outcomes(rec),
        requeue=rec.requeue,
        requeue_rejected=requeue_rejected,
        retries=retries,
        concurrency=2,
        retry_backoff=0.001,
    )
    task = asyncio.create_task(binder.run())
    try:
        binder.submit(pod, NODE, queued_at=0.0, attempts=attempts)
        await asyncio.wait_for(binder.drain(), 5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()
    assert binder.in_flight() == 0
    return cache, api, rec, binder


async def test_201_is_bound_and_starts_the_assumption_ttl() -> None:
    cache, api, rec, binder = await bind_once([201])
    assert rec.bound == [("default/p", NODE)] and binder.bound == 1
    path, body = api.posts[0]
    assert path == "/api/v1/namespaces/default/pods/p/binding" and body["target"]["name"] == NODE
    assumed = cache.assumed["default/p"]  # type: ignore[index]
    assert assumed.deadline is not None  # confirmed by the watch later, or expires
    assert not rec.rejected and not rec.requeued


async def test_404_forgets_the_pod() -> None:
    cache, api, rec, _ = await bind_once([404])
    assert not cache.assumed and not cache.pod_node
    assert cache.nodes[NODE].requested.milli_cpu == 0
    assert not rec.bound and not rec.rejected and not rec.requeued
    assert len(api.posts) == 1


async def test_409_keeps_the_assumption_for_the_watch() -> None:
    cache, api, rec, _ = await bind_once([409])
    assert cache.is_assumed("default/p")  # type: ignore[arg-type]
    assert cache.assumed["default/p"].deadline is not None  # type: ignore[index]
    assert cache.nodes[NODE].requested.milli_cpu == 1000
    assert not rec.bound and not rec.rejected and not rec.requeued
    assert len(api.posts) == 1


@pytest.mark.parametrize("transient", [429, 500, 503])
async def test_transient_failure_is_retried_then_bound(transient: int) -> None:
    _, api, rec, _ = await bind_once([transient, transient, 201])
    assert rec.bound == [("default/p", NODE)] and len(api.posts) == 3


async def test_timeouts_retry_then_requeue() -> None:
    timeout = ServerError(0, "POST binding: TimeoutError: ")
    cache, api, rec, binder = await bind_once([timeout, timeout, timeout], retries=2)
    assert len(api.posts) == 3
    assert rec.requeued == ["default/p"] and not rec.bound and not rec.rejected
    assert not cache.assumed and cache.nodes[NODE].requested.milli_cpu == 0
    assert binder.bound == 0


async def test_server_errors_past_the_retries_requeue() -> None:
    cache, api, rec, _ = await bind_once([500, 502, 429], retries=2)
    assert rec.requeued == ["default/p"] and len(api.posts) == 3
    assert not cache.assumed


@pytest.mark.parametrize("status", [400, 403, 422])
async def test_other_errors_are_rejected_outcomes(status: int) -> None:
    cache, api, rec, _ = await bind_once([status])
    assert rec.rejected == [("default/p", f"binding rejected: status {status}")]
    assert not rec.bound and not rec.requeued and len(api.posts) == 1
    assert not cache.assumed and cache.nodes[NODE].requested.milli_cpu == 0


async def test_a_requeued_pod_keeps_its_attempts_for_the_queues_backoff() -> None:
    _, _, rec, _ = await bind_once([500, 500, 500], retries=2, attempts=3)
    assert rec.requeued == ["default/p"] and rec.requeued_attempts == [3]


@pytest.mark.parametrize("status", [403, 422])
async def test_a_refused_binding_is_requeued_too_when_no_leader_retries_it(status: int) -> None:
    """Standalone: reported on the pod and back to the queue with its attempts, as kube-scheduler does."""
    cache, api, rec, _ = await bind_once([status], attempts=4, requeue_rejected=True)
    assert rec.rejected == [("default/p", f"binding rejected: status {status}")]
    assert rec.requeued == ["default/p"] and rec.requeued_attempts == [4]
    assert len(api.posts) == 1 and not cache.assumed and cache.nodes[NODE].requested.milli_cpu == 0
