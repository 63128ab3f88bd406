"""The dispatch gate (``worker.gate``): a dispatched pod is released to the queue only once the pod watch has
reached its DISPATCH's ``min_rv``, in order of ``min_rv``, once, with the wait measured."""

from __future__ import annotations

import asyncio
import time
from typing import cast

from common import metrics
from common.records import PodRecord
from common.reporting import Reporter
from common.wellknown import DEFAULT_SCHEDULER_NAME
from tests.builders import make_pod
from worker.cache import Cache
from worker.feeds import PodFeed
from worker.gate import RevisionGate
from worker.queue import SchedulingQueue


class Watch:
    """The pod watch's progress as the gate sees it: a revision and the event set on every pod event."""

    def __init__(self) -> None:
        self.rv = 0
        self.progress = asyncio.Event()

    def revision(self) -> int:
        return self.rv

    def advance(self, rv: int) -> None:
        self.rv = rv
        self.progress.set()


def gate(watch: Watch, released: list[str], done: asyncio.Event | None = None) -> RevisionGate:
    def release(pod: PodRecord, since: float) -> None:
        released.append(pod.name)
        if done is not None:
            done.set()

    return RevisionGate(watch.revision, watch.progress, release)


def test_a_pod_the_watch_has_reached_is_released_at_once() -> None:
    watch = Watch()
    released: list[str] = []
    watch.rv = 100
    g = gate(watch, released)
    g.hold(make_pod("a").record(), 100)
    g.hold(make_pod("b").record(), 0)
    assert released == ["a", "b"] and len(g) == 0 and g.waited == 0


def test_parked_pods_are_released_in_order_of_their_min_rv() -> None:
    watch = Watch()
    released: list[str] = []
    g = gate(watch, released)
    g.hold(make_pod("late").record(), 300)
    g.hold(make_pod("early").record(), 200)
    assert released == [] and len(g) == 2
    watch.rv = 250
    assert g.check() == 1 and released == ["early"]
    watch.rv = 300
    assert g.check() == 1 and released == ["early", "late"]
    assert g.check() == 0 and g.waited == 2


def test_a_pod_dispatched_again_while_parked_keeps_one_entry_with_the_later_min_rv() -> None:
    watch = Watch()
    released: list[str] = []
    g = gate(watch, released)
    g.hold(make_pod("a").record(), 200)
    g.hold(make_pod("a").record(), 400)
    g.hold(make_pod("a").record(), 100)  # an older dispatch's smaller min_rv does not shorten the wait
    watch.rv = 399
    g.check()
    assert released == [] and len(g) == 1
    watch.rv = 400
    g.check()
    assert released == ["a"] and len(g) == 0


async def test_run_releases_parked_pods_as_the_watch_advances() -> None:
    watch, done = Watch(), asyncio.Event()
    released: list[str] = []
    g = gate(watch, released, done)
    task = asyncio.create_task(g.run())
    try:
        before = metrics.watch_wait._sum.get()
        g.hold(make_pod("a").record(), 10)
        await asyncio.sleep(0)
        assert released == []
        watch.advance(10)
        async with asyncio.timeout(2):
            await done.wait()
        assert released == ["a"]
        assert metrics.watch_wait._sum.get() >= before
    finally:
        task.cancel()


async def test_run_notices_an_advance_without_an_event() -> None:
    """A bookmark moves the watch's revision without a pod event: the gate polls while pods are parked."""
    watch, done = Watch(), asyncio.Event()
    released: list[str] = []
    g = gate(watch, released, done)
    task = asyncio.create_task(g.run())
    try:
        g.hold(make_pod("a").record(), 10)
        await asyncio.sleep(0)
        watch.rv = 10  # no progress event
        async with asyncio.timeout(2):
            await done.wait()
    finally:
        task.cancel()


class _Reporter:
    def forget(self, key: object) -> None:
        pass


def test_the_pod_feed_signals_progress_on_every_event_and_relist() -> None:
    """The gate wakes on ``progress``: set after the cache applied a pod event (any kind) or a relist."""
    progress = asyncio.Event()
    feed = PodFeed(
        Cache(),
        SchedulingQueue(time.monotonic),
        # PodFeed takes the concrete Reporter (no protocol); the feed only calls its forget()
        cast(Reporter, _Reporter()),
        scheduler_name=DEFAULT_SCHEDULER_NAME,
        watch_pending=False,
        progress=progress,
    )
    for kind, obj in (
        ("ADDED", make_pod("a").on("n1").json()),
        ("MODIFIED", make_pod("a").on("n1").json()),
        ("DELETED", make_pod("a").on("n1").json()),
    ):
        progress.clear()
        feed.event(kind, obj)
        assert progress.is_set(), kind
    progress.clear()
    feed.replace([])
    assert progress.is_set()
