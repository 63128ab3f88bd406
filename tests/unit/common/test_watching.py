"""The Reflector's promises: paged lists, relist on 410 Gone, reconnect from the last resourceVersion with
backoff on transient errors, bookmarks that only advance the resourceVersion."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import REGISTRY

from common.kube import EventTooLarge, Gone, ServerError, TooManyRequests
from common.watching import LIST_PAGE_SIZE, Reflector
from tests.unit.common.fakes import FakeKube, cancel, record_sleeps

PATH = "/api/v1/pods"


def _obj(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}}


def _page(names: list[str], rv: str, cont: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"resourceVersion": rv}
    if cont:
        meta["continue"] = cont
    return {"items": [_obj(n, "1") for n in names], "metadata": meta}


class Handler:
    """Keeps the set the reflector says exists, as a cache would."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.replaced = 0
        self.events: list[tuple[str, str]] = []

    def replace(self, objects: list[dict[str, Any]]) -> None:
        self.replaced += 1
        self.objects = {o["metadata"]["name"]: o for o in objects}

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        self.events.append((kind, name))
        if kind == "DELETED":
            self.objects.pop(name, None)
        else:
            self.objects[name] = obj


async def _run_until_idle(reflector: Reflector, kube: FakeKube) -> None:
    """Run the reflector until it has used every scripted answer and waits in a watch, then stop it."""
    task = asyncio.create_task(reflector.run())
    try:
        await asyncio.wait_for(kube.idle.wait(), 10)
    finally:
        await cancel(task)


async def test_lists_in_pages_with_continue_then_watches_from_the_lists_version() -> None:
    kube = FakeKube(pages=[_page(["a", "b"], "", cont="token-1"), _page(["c"], "42")])
    handler = Handler()
    reflector = Reflector(kube.client(), PATH, handler, params={"fieldSelector": "spec.nodeName="})

    await _run_until_idle(reflector, kube)

    assert kube.gets == [
        (PATH, {"fieldSelector": "spec.nodeName=", "limit": str(LIST_PAGE_SIZE)}),
        (PATH, {"fieldSelector": "spec.nodeName=", "limit": str(LIST_PAGE_SIZE), "continue": "token-1"}),
    ]
    assert handler.replaced == 1 and sorted(handler.objects) == ["a", "b", "c"]
    assert reflector.synced.is_set() and reflector.relists == 1
    assert kube.watch_versions == ["42"]


async def test_410_gone_relists_and_the_new_list_replaces_the_handlers_set() -> None:
    kube = FakeKube(
        pages=[_page(["a", "b"], "5"), _page(["a", "d"], "20")],
        streams=[[("ADDED", _obj("c", "6")), Gone(410, "too old")]],
    )
    handler = Handler()
    reflector = Reflector(kube.client(), PATH, handler)

    await _run_until_idle(reflector, kube)

    assert handler.events == [("ADDED", "c")]
    assert sorted(handler.objects) == ["a", "d"], "b and c went away while the watch was down: not kept"
    assert handler.replaced == 2 and reflector.relists == 2 and reflector.reconnects == 0
    assert kube.watch_versions == ["5", "20"]


async def test_transient_errors_reconnect_from_the_last_version_with_growing_backoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube = FakeKube(
        pages=[_page(["a"], "5")],
        streams=[
            [("ADDED", _obj("b", "7")), ServerError(500, "etcd leader changed")],
            [TooManyRequests(429, "slow down")],
            [ServerError(0, "connection reset")],
            [("MODIFIED", _obj("b", "9")), ServerError(503, "unavailable")],
        ],
    )
    slept = record_sleeps(monkeypatch)
    handler = Handler()
    reflector = Reflector(kube.client(), PATH, handler)

    await _run_until_idle(reflector, kube)

    assert kube.watch_versions == ["5", "7", "7", "7", "9"], "each reconnect resumes where the stream stopped"
    assert len(kube.gets) == 1 and handler.replaced == 1, "a transient error does not relist"
    assert reflector.reconnects == 4
    # 0.2 s doubling while nothing arrives; an event resets it (common.backoff.api_retry)
    assert slept == [0.2, 0.4, 0.8, 0.2]
    assert handler.events == [("ADDED", "b"), ("MODIFIED", "b")]


async def test_bookmarks_advance_the_version_without_events() -> None:
    kube = FakeKube(
        pages=[_page(["a"], "5")],
        streams=[[("BOOKMARK", {"metadata": {"resourceVersion": "90"}})]],
    )
    handler = Handler()
    reflector = Reflector(kube.client(), PATH, handler)

    await _run_until_idle(reflector, kube)

    assert handler.events == [] and reflector.events == 0
    assert reflector.resource_version == "90"
    assert kube.watch_versions == ["5", "90"], "a stream that ends is watched again from the bookmark"


def _object_versions_at_lists(reflector: Reflector) -> list[int]:
    """The reflector's ``object_version`` as each list is handed over, in a list that grows as it runs."""
    versions: list[int] = []
    real_replace = reflector.handler.replace

    def replace(objects: list[dict[str, Any]]) -> None:
        real_replace(objects)
        versions.append(reflector.object_version)

    reflector.handler.replace = replace  # type: ignore[method-assign]
    return versions


async def test_the_object_version_follows_objects_not_lists_or_bookmarks() -> None:
    """``object_version``: the newest object the handler was given, a version every other reflector of the
    kind reaches by its own events; a list's or a bookmark's version is the whole store's."""
    page = {"items": [_obj("a", "3"), _obj("b", "7")], "metadata": {"resourceVersion": "50"}}
    kube = FakeKube(
        pages=[page],
        streams=[
            [("MODIFIED", _obj("a", "60")), ("BOOKMARK", {"metadata": {"resourceVersion": "90"}})],
        ],
    )
    reflector = Reflector(kube.client(), PATH, Handler())
    versions = _object_versions_at_lists(reflector)

    await _run_until_idle(reflector, kube)

    assert versions == [7]  # the newest listed object's, not the list's own version (50)
    assert reflector.object_version == 60 and reflector.resource_version == "90"


def _restarts(resource: str, reason: str) -> float:
    return (
        REGISTRY.get_sample_value(
            "agent_scheduler_watch_restarts_total", {"resource": resource, "reason": reason}
        )
        or 0.0
    )


async def test_the_object_version_never_goes_back_across_a_relist() -> None:
    """A relist that no longer shows the newest object delivered (deleted meanwhile) keeps its version; the
    events after a list count from there."""
    kube = FakeKube(
        pages=[
            {"items": [_obj("a", "3")], "metadata": {"resourceVersion": "10"}},
            {"items": [_obj("a", "3")], "metadata": {"resourceVersion": "80"}},
        ],
        streams=[
            [("ADDED", _obj("b", "40")), Gone(410, "too old")],
            [("MODIFIED", _obj("a", "85"))],
        ],
    )
    reflector = Reflector(kube.client(), PATH, Handler())
    versions = _object_versions_at_lists(reflector)

    await _run_until_idle(reflector, kube)

    assert versions == [3, 40], "b (40) is gone from the second list: its version stays, not the list's (80)"
    assert reflector.object_version == 85


async def test_a_stream_the_server_ends_early_is_resumed_counted_and_not_reopened_at_once_if_empty(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube = FakeKube(
        pages=[_page(["a"], "5"), _page(["a"], "12")],
        streams=[
            [("ADDED", _obj("b", "7"))],  # ended by the server (long before the 300 s timeout)
            [],  # ended at once, nothing delivered
            [("MODIFIED", _obj("b", "9")), Gone(410, "too old")],
        ],
    )
    slept = record_sleeps(monkeypatch)
    handler = Handler()
    reflector = Reflector(kube.client(), PATH, handler, name="early-close-test")

    await _run_until_idle(reflector, kube)

    assert kube.watch_versions == ["5", "7", "7", "12"], "an ended stream resumes where it stopped"
    assert reflector.closed_early == 2 and reflector.relists == 2 and reflector.reconnects == 0
    assert slept == [0.2], "only the empty stream waits before the next watch"
    assert (_restarts("early-close-test", "closed"), _restarts("early-close-test", "gone")) == (2.0, 1.0)
    assert _restarts("early-close-test", "error") == 0.0


async def test_an_event_too_large_to_read_relists_after_a_backoff_so_the_object_is_not_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube = FakeKube(
        pages=[_page(["a"], "5"), _page(["a", "big"], "9")],
        streams=[
            [("ADDED", _obj("b", "6")), EventTooLarge(0, "an event of more than 16777216 bytes")],
            [("ADDED", _obj("c", "10"))],
        ],
    )
    slept = record_sleeps(monkeypatch)
    handler = Handler()
    reflector = Reflector(kube.client(), PATH, handler)

    await _run_until_idle(reflector, kube)

    assert reflector.oversized == 1 and reflector.relists == 2 and reflector.reconnects == 0
    assert sorted(handler.objects) == ["a", "big", "c"], "the list brought the object the big event was about"
    assert kube.watch_versions == ["5", "9", "10"], "the watch resumes after the list, past the big event"
    assert slept == [0.2]


class FailingHandler(Handler):
    """Raises on the objects named in ``bad``, once each, as a handler with a bug for some input would."""

    def __init__(self, bad: set[str]) -> None:
        super().__init__()
        self.bad = bad

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if name in self.bad:
            self.bad.discard(name)
            raise KeyError(name)
        super().event(kind, obj)


async def test_a_handler_that_raises_does_not_stop_the_reflector_it_relists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube = FakeKube(
        pages=[_page(["a"], "5"), _page(["a", "poison"], "8")],
        streams=[
            [("ADDED", _obj("poison", "6")), ("ADDED", _obj("not-read", "7"))],
            [("ADDED", _obj("d", "9"))],
        ],
    )
    slept = record_sleeps(monkeypatch)
    handler = FailingHandler({"poison"})
    reflector = Reflector(kube.client(), PATH, handler)

    await _run_until_idle(reflector, kube)

    assert reflector.handler_errors == 1 and reflector.relists == 2
    assert sorted(handler.objects) == ["a", "d", "poison"], "rebuilt from the list"
    assert kube.watch_versions == ["5", "8", "9"]
    assert slept == [0.2]
