"""A relist drops the queued pods deleted while the watch was down (``PodFeed.replace``), and keeps those that
came after the list was read."""

from __future__ import annotations

from typing import Any

from common.records import PodKey, pod_from_json
from common.wellknown import DEFAULT_SCHEDULER_NAME
from tests.builders import make_node, make_pod
from worker.cache import Cache
from worker.feeds import PodFeed
from worker.queue import SchedulingQueue

KEY = PodKey("default/p")


class _Reports:
    def __init__(self) -> None:
        self.forgotten: list[PodKey] = []

    def forget(self, key: PodKey) -> None:
        self.forgotten.append(key)


def at(obj: dict[str, Any], rv: int) -> dict[str, Any]:
    obj["metadata"]["resourceVersion"] = str(rv)
    return obj


class Rig:
    def __init__(self, *, watch_pending: bool) -> None:
        self.cache = Cache()
        self.cache.upsert_node(make_node("n0", cpu="4").record())
        self.queue = SchedulingQueue(lambda: 0.0)
        self.reports = _Reports()
        self.gone: list[tuple[PodKey, str]] = []
        self.snapshot = 0
        self.feed = PodFeed(
            self.cache,
            self.queue,
            self.reports,  # type: ignore[arg-type]  # the one method the feed calls
            scheduler_name=DEFAULT_SCHEDULER_NAME,
            watch_pending=watch_pending,
            gone=lambda key, uid: self.gone.append((key, uid)),
        )
        self.feed.listed_revision = lambda: self.snapshot

    def relist(self, snapshot: int, *objects: dict[str, Any]) -> None:
        self.snapshot = snapshot
        self.feed.replace(list(objects))


def test_a_pod_deleted_during_the_watch_gap_leaves_the_queue_at_the_relist() -> None:
    rig = Rig(watch_pending=True)
    rig.feed.event("ADDED", at(make_pod("p").uid("u1").json(), 5))
    assert KEY in rig.queue
    rig.relist(9)  # deleted at some revision up to 9: its DELETED event was in the gap
    assert KEY not in rig.queue
    assert rig.gone == [(KEY, "u1")] and rig.reports.forgotten == [KEY]


def test_a_listed_pod_stays_queued() -> None:
    rig = Rig(watch_pending=True)
    rig.feed.event("ADDED", at(make_pod("p").uid("u1").json(), 5))
    rig.relist(9, at(make_pod("p").uid("u1").json(), 5))
    assert KEY in rig.queue and not rig.gone


def test_a_dispatched_pod_newer_than_the_snapshot_stays_queued() -> None:
    """Under a coordinator the queue also holds pods the leader dispatched, which the worker's watch may not
    have shown yet: one created after the relist's list was read is absent from it, and alive."""
    rig = Rig(watch_pending=False)
    rig.queue.add(pod_from_json(at(make_pod("p").uid("u1").json(), 12)))  # as the dispatch intake adds it
    rig.relist(9)
    assert KEY in rig.queue and not rig.gone
    rig.relist(14)  # a later snapshot without it: deleted since
    assert KEY not in rig.queue and rig.gone == [(KEY, "u1")]


def test_a_queued_pod_whose_name_was_taken_by_a_new_pod_leaves_the_queue() -> None:
    """The dispatched pod was deleted and another of the same name created during the gap. A worker under a
    coordinator does not take the new one from its watch (the leader dispatches it): the old one goes."""
    rig = Rig(watch_pending=False)
    rig.queue.add(pod_from_json(at(make_pod("p").uid("u1").json(), 5)))
    rig.relist(9, at(make_pod("p").uid("u2").json(), 8))
    assert KEY not in rig.queue and rig.gone == [(KEY, "u1")]


def test_a_recreated_pod_of_ours_is_queued_in_place_of_the_old_one_standalone() -> None:
    rig = Rig(watch_pending=True)
    rig.feed.event("ADDED", at(make_pod("p").uid("u1").json(), 5))
    rig.relist(9, at(make_pod("p").uid("u2").json(), 8))
    queued = rig.queue.queued(KEY)
    assert queued is not None and queued.uid == "u2"


def test_a_pod_deleted_while_in_flight_is_dropped_when_its_attempt_ends() -> None:
    rig = Rig(watch_pending=True)
    rig.feed.event("ADDED", at(make_pod("p").uid("u1").json(), 5))
    qp = rig.queue.pop_nowait()
    assert qp is not None and rig.queue.where(KEY) == "flight"
    rig.relist(9)
    assert rig.gone == [(KEY, "u1")]
    rig.queue.done(qp, scheduled=False, message="0/1 nodes are available")
    assert KEY not in rig.queue and rig.queue.queued(KEY) is None


def test_a_pod_with_no_comparable_revision_is_left_to_its_own_deleted_event() -> None:
    rig = Rig(watch_pending=False)
    obj = make_pod("p").uid("u1").json()
    obj["metadata"]["resourceVersion"] = "not-a-number"
    rig.queue.add(pod_from_json(obj))
    rig.relist(9)
    assert KEY in rig.queue and not rig.gone
