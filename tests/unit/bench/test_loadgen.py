"""The load generator's clocks: binds stamped once, creates retried, waiting ends (``scale.bench.loadgen``)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from common.kube import Invalid, KubeClient, TooManyRequests
from scale.bench import loadgen
from scale.bench.loadgen import drive
from scale.bench.workloads import WorkloadSpec, arrivals
from scale.tracking import BindWatch, wait_bound


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _pod(name: str, node: str = "") -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"nodeName": node} if node else {}}


def test_bind_is_stamped_the_first_time_only() -> None:
    clock = FakeClock()
    watch = BindWatch(clock)
    times = watch.expect("a", "agent")
    watch.event("ADDED", _pod("a"))
    assert not times.is_bound
    clock.now = 101.0
    watch.event("MODIFIED", _pod("a", "n1"))
    clock.now = 105.0
    watch.event("MODIFIED", _pod("a", "n1"))
    watch.replace([_pod("a", "n1")])
    watch.event("DELETED", _pod("a", "n1"))
    assert times.bound == 101.0 and times.node == "n1"
    assert watch.bound == 1 and watch.deleted == 1


def test_visible_is_the_first_delivery_of_the_pod_bound_or_not() -> None:
    clock = FakeClock()
    watch = BindWatch(clock)
    pending, relisted = watch.expect("a", "agent"), watch.expect("b", "agent")
    watch.event("ADDED", _pod("a"))
    clock.now = 101.0
    watch.event("MODIFIED", _pod("a", "n1"))
    watch.replace([_pod("a", "n1"), _pod("b", "n2")])  # b first seen in a relist, already bound
    assert (pending.visible, pending.bound) == (100.0, 101.0)
    assert relisted.visible == relisted.bound == 101.0


def test_the_clock_is_read_only_when_an_event_stamps_something() -> None:
    reads: list[float] = []

    def clock() -> float:
        reads.append(100.0 + len(reads))
        return reads[-1]

    watch = BindWatch(clock)
    times = watch.expect("a", "agent")
    watch.event("ADDED", _pod("stranger"))
    watch.event("ADDED", _pod("a"))  # visible
    watch.event("MODIFIED", _pod("a"))
    watch.event("MODIFIED", _pod("a", "n1"))  # bound
    watch.event("MODIFIED", _pod("a", "n1"))
    assert len(reads) == 2
    assert (times.visible, times.bound) == (100.0, 101.0)


def test_pods_the_generator_did_not_create_are_ignored() -> None:
    watch = BindWatch(FakeClock())
    watch.event("ADDED", _pod("stranger", "n1"))
    assert watch.bound == 0 and watch.pods == {}


class FakeClient:
    """Records creates; the first ``throttle`` calls answer 429, pods named in ``invalid`` get 422."""

    def __init__(self, watch: BindWatch, *, throttle: int = 0, invalid: frozenset[str] = frozenset()) -> None:
        self.watch = watch
        self.throttle = throttle
        self.invalid = invalid
        self.calls = 0
        self.created: list[str] = []

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        name = body["metadata"]["name"]
        if self.calls <= self.throttle:
            raise TooManyRequests(429, "slow down")
        if name in self.invalid:
            raise Invalid(422, "bad pod")
        self.created.append(name)
        self.watch.event(
            "MODIFIED", {**body, "spec": {**body["spec"], "nodeName": "n"}}
        )  # an instant scheduler
        return body


async def test_drive_creates_every_pod_retries_throttling_and_records_failures() -> None:
    watch = BindWatch()
    plan = arrivals(WorkloadSpec(name="steady", pods=20, rate=2000.0), namespace="ns", scheduler_name="s")
    client = FakeClient(watch, throttle=3, invalid=frozenset({"agent-000007"}))
    result = await drive(cast(KubeClient, client), "ns", plan, watch, concurrency=4)
    assert result.created == 19 and result.failed == 1
    assert len(client.created) == 19
    failed = watch.pods["agent-000007"]
    assert failed.error and not failed.is_bound and math.isnan(failed.acked)
    ok = [t for name, t in watch.pods.items() if name != "agent-000007"]
    assert all(t.is_bound and t.sent <= t.acked for t in ok)
    assert await wait_bound(watch, stall_s=1.0, timeout_s=5.0, since=result.last_sent)


async def test_wait_bound_gives_up_after_a_stall() -> None:
    watch = BindWatch()
    watch.expect("never", "agent")
    loop = asyncio.get_running_loop()
    began = loop.time()
    done = await wait_bound(watch, stall_s=0.2, timeout_s=10.0, since=watch.clock())
    assert not done
    assert loop.time() - began < 2.0


async def test_the_first_bind_may_take_longer_than_the_stall() -> None:
    """The preempt workload's first bind comes after every preemptor's first attempt: ``first_bind_s`` holds the
    stall rule off until then, and after a bind the stall is the usual one."""
    now = [0.0]
    watch = BindWatch(lambda: now[0])
    watch.expect("a", "agent")
    watch.expect("b", "agent")
    waiting = asyncio.create_task(
        wait_bound(watch, stall_s=2.0, timeout_s=100.0, since=0.0, first_bind_s=10.0, clock=lambda: now[0])
    )
    now[0] = 9.0  # well past the stall, not past the first bind's allowance
    await asyncio.sleep(0.12)
    assert not waiting.done()
    watch.last_bind = 9.5  # a first bind: from now on no bind for 2 s ends the wait
    now[0] = 11.0
    await asyncio.sleep(0.12)
    assert not waiting.done()
    now[0] = 11.6
    assert await asyncio.wait_for(waiting, 1.0) is False


class BacklogClient:
    """Creates pods; its watch shows them all bound once the scheduler was released."""

    def __init__(self) -> None:
        self.created: list[str] = []
        self.events: list[str] = []
        self.released = asyncio.Event()

    def release(self) -> None:
        self.events.append("release")
        self.released.set()

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.events.append("create")
        self.created.append(body["metadata"]["name"])
        return body

    async def get(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        return {"items": [], "metadata": {"resourceVersion": "1"}}

    async def watch(self, path: str, **kwargs: Any) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        await self.released.wait()
        for name in self.created:
            yield "MODIFIED", {"metadata": {"name": name}, "spec": {"nodeName": "n"}}
        await asyncio.Event().wait()


async def test_a_backlog_is_released_after_every_create_and_timed_from_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(loadgen, "RELEASE_SETTLE_S", 0.0)
    plan = arrivals(WorkloadSpec(name="backlog", pods=5, paused=True), namespace="ns", scheduler_name="s")
    client = BacklogClient()
    observed = await loadgen.run(
        cast(KubeClient, client),
        "ns",
        plan,
        concurrency=2,
        stall_s=2.0,
        timeout_s=5.0,
        release=client.release,
    )
    assert client.events == ["create"] * 5 + ["release"]
    assert observed.complete
    assert all(t.eligible == observed.origin for t in observed.agent)
    assert all(0 <= t.latency <= t.bound - t.sent for t in observed.agent)
