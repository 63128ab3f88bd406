"""Pods read directly by the catch-up of a granted node (``PodFeed.apply_direct``) against a lagging watch."""

from __future__ import annotations

from typing import Any, cast

from common.records import NodeName, PodKey, pod_from_json
from common.reporting import Reporter
from common.wellknown import DEFAULT_SCHEDULER_NAME
from tests.builders import make_node, make_pod
from worker.cache import Cache
from worker.feeds import PodFeed
from worker.queue import SchedulingQueue

KEY = PodKey("default/p")


class _NoReports:
    def forget(self, key: PodKey) -> None:
        pass


def at(obj: dict[str, Any], rv: int) -> dict[str, Any]:
    obj["metadata"]["resourceVersion"] = str(rv)
    return obj


def feed_over() -> tuple[Cache, PodFeed]:
    cache = Cache()
    cache.upsert_node(make_node("n0", cpu="4").record())
    feed = PodFeed(
        cache,
        SchedulingQueue(lambda: 0.0),
        # PodFeed takes the concrete Reporter (no protocol); the feed only calls its forget()
        cast(Reporter, _NoReports()),
        scheduler_name=DEFAULT_SCHEDULER_NAME,
        watch_pending=False,
    )
    return cache, feed


def cpu(cache: Cache) -> int:
    return cache.nodes[NodeName("n0")].requested.milli_cpu


def test_older_watch_events_of_a_directly_read_pod_do_not_free_its_capacity() -> None:
    """The watch lags: the catch-up read the pod bound to n0 at revision 10; the watch still delivers its
    creation (pending, revision 5). Applying that would take the pod off n0 and let this worker fill the
    room again while the API server has the pod there."""
    cache, feed = feed_over()
    pending, bound = make_pod("p").req(cpu="3"), make_pod("p").req(cpu="3").on("n0")
    feed.apply_direct([pod_from_json(at(bound.json(), 10))])
    assert cpu(cache) == 3000
    feed.event("ADDED", at(pending.json(), 5))
    assert cpu(cache) == 3000 and cache.pod_node[KEY] == "n0"
    feed.event("MODIFIED", at(bound.json(), 10))  # the watch reached the read: it takes over
    assert cpu(cache) == 3000 and not feed.direct
    feed.event("DELETED", at(bound.json(), 12))
    assert cpu(cache) == 0


def test_a_relist_older_than_a_direct_read_does_not_undo_it() -> None:
    cache, feed = feed_over()
    pending, bound = make_pod("p").req(cpu="3"), make_pod("p").req(cpu="3").on("n0")
    feed.apply_direct([pod_from_json(at(bound.json(), 10))])
    feed.listed_revision = lambda: 8  # a relist that started before the read
    feed.replace([at(pending.json(), 5)])
    assert cpu(cache) == 3000 and KEY in feed.direct
    feed.replace([])  # the same old snapshot without the pod at all (created after it)
    assert cpu(cache) == 3000
    feed.listed_revision = lambda: 12  # a snapshot as new as the read: authoritative again
    feed.replace([at(bound.json(), 10)])
    assert cpu(cache) == 3000 and not feed.direct
    feed.listed_revision = lambda: 13
    feed.replace([])
    assert cpu(cache) == 0


def test_a_direct_read_does_not_hold_a_pod_the_watch_already_has() -> None:
    cache, feed = feed_over()
    bound = make_pod("p").req(cpu="3").on("n0")
    feed.event("ADDED", at(bound.json(), 10))
    feed.apply_direct([pod_from_json(at(bound.json(), 10))])
    assert not feed.direct and cpu(cache) == 3000
