"""The watch stream as the API server writes it, over real HTTP from an in-process server: events far larger
than aiohttp's own line limit are read, an event over ``MAX_WATCH_EVENT`` raises ``EventTooLarge`` without
being buffered whole, a line that is not a watch event is a broken stream (``ServerError``), a pod or node
watch or list gives its objects without ``metadata.managedFields``, cut exactly from the bytes (recorded
events), and a large reply is decoded with the garbage collector paused."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from common import kube
from common.kube import Credentials, EventTooLarge, Gone, KubeClient, ServerError

PATH = "/api/v1/pods"
Writer = Callable[[web.StreamResponse], Awaitable[None]]


def _event(kind: str, name: str, **extra: Any) -> bytes:
    obj = {"metadata": {"name": name, "resourceVersion": "7", **extra}}
    return orjson.dumps({"type": kind, "object": obj}) + b"\n"


@contextlib.asynccontextmanager
async def _serve(write: Writer) -> AsyncIterator[KubeClient]:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.content_type = "application/json"
        await resp.prepare(request)
        await write(resp)
        return resp

    app = web.Application()
    app.router.add_get(PATH, handler)
    server = TestServer(app)
    await server.start_server()
    client = KubeClient(Credentials(server=str(server.make_url("")).rstrip("/")))
    try:
        yield client
    finally:
        await client.close()
        await server.close()


async def _events(write: Writer) -> list[tuple[str, dict[str, Any]]]:
    async with _serve(write) as client:
        return [e async for e in client.watch(PATH, resource_version="1")]


async def test_events_far_above_aiohttps_line_limit_are_read() -> None:
    big = "x" * (600 * 1024)  # a 600 KiB annotation: over aiohttp's 128 KiB default, under the API's limit

    async def write(resp: web.StreamResponse) -> None:
        await resp.write(_event("ADDED", "small"))
        line = _event("ADDED", "big", annotations={"a": big})
        for i in range(0, len(line), 7000):  # in pieces, as TCP delivers it
            await resp.write(line[i : i + 7000])
        await resp.write(_event("MODIFIED", "small") + _event("DELETED", "small"))

    events = await _events(write)
    assert [(k, o["metadata"]["name"]) for k, o in events] == [
        ("ADDED", "small"),
        ("ADDED", "big"),
        ("MODIFIED", "small"),
        ("DELETED", "small"),
    ]
    assert events[1][1]["metadata"]["annotations"]["a"] == big


async def test_an_event_above_the_limit_raises_event_too_large(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube, "MAX_WATCH_EVENT", 64 * 1024)
    seen: list[str] = []

    async def write(resp: web.StreamResponse) -> None:
        await resp.write(_event("ADDED", "before"))
        await resp.write(_event("ADDED", "huge", annotations={"a": "y" * (200 * 1024)}))
        await resp.write(_event("ADDED", "after"))

    async with _serve(write) as client:
        with pytest.raises(EventTooLarge) as e:
            async for _, obj in client.watch(PATH, resource_version="1"):
                seen.append(obj["metadata"]["name"])
        assert str(64 * 1024) in str(e.value)
    assert seen == ["before"], "the events before the oversized one were delivered; none after"


LINE = _event("ADDED", "n" * 40)


@pytest.mark.parametrize("limit", [len(LINE) - 2, len(LINE) - 1, len(LINE)])
async def test_the_limit_counts_the_line_without_its_newline(
    monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    monkeypatch.setattr(kube, "MAX_WATCH_EVENT", limit)

    async def write(resp: web.StreamResponse) -> None:
        for byte in range(len(LINE)):  # one byte at a time: the line ends in its own chunk
            await resp.write(LINE[byte : byte + 1])

    if limit >= len(LINE) - 1:
        assert len(await _events(write)) == 1
    else:
        with pytest.raises(EventTooLarge):
            await _events(write)


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(b"not json\n", id="not-json"),
        pytest.param(b"[1, 2]\n", id="a-list"),
        pytest.param(b'{"type": "ADDED"}\n', id="no-object"),
        pytest.param(b'{"type": "ADDED", "object": [1]}\n', id="object-not-a-map"),
        pytest.param(b'{"type": 5, "object": {}}\n', id="type-not-a-string"),
        pytest.param(b'{"type": "ADDED", "object": {"n": 1e999}}\n', id="infinite-number"),
        pytest.param(b'{"type": "ADDED", "object": {"n": 1}\n', id="truncated"),
    ],
)
async def test_a_line_that_is_not_a_watch_event_is_a_broken_stream(line: bytes) -> None:
    async def write(resp: web.StreamResponse) -> None:
        await resp.write(line)

    with pytest.raises(ServerError):
        await _events(write)


@pytest.mark.parametrize(
    ("code", "cls"), [(410, Gone), ("410", ServerError), (None, ServerError), (99999, ServerError)]
)
async def test_error_events_map_their_code_and_a_bad_code_is_a_server_error(
    code: Any, cls: type[Exception]
) -> None:
    async def write(resp: web.StreamResponse) -> None:
        status = {"kind": "Status", "code": code, "reason": "Expired", "message": "too old"}
        await resp.write(orjson.dumps({"type": "ERROR", "object": status}) + b"\n")

    with pytest.raises(cls):
        await _events(write)


async def test_blank_lines_are_skipped_and_a_last_line_without_newline_is_read() -> None:
    async def write(resp: web.StreamResponse) -> None:
        await resp.write(b"\n\r\n" + _event("ADDED", "a") + b"\n" + _event("ADDED", "b")[:-1])

    assert [o["metadata"]["name"] for _, o in await _events(write)] == ["a", "b"]


async def test_a_reply_that_is_not_json_is_a_server_error() -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=b"<html>proxy error</html>", content_type="text/html")

    app = web.Application()
    app.router.add_get(PATH, handler)
    server = TestServer(app)
    await server.start_server()
    client = KubeClient(Credentials(server=str(server.make_url("")).rstrip("/")))
    try:
        with pytest.raises(ServerError, match="not JSON"):
            await client.get(PATH)
    finally:
        await client.close()
        await server.close()


def _recorded_pod_events() -> list[dict[str, Any]]:
    """Every event of two pods' lives as a real API server wrote them (ADDED, binding, start, deletion,
    DELETED), each with its managedFields."""
    data = orjson.loads((Path(__file__).parents[1] / "worker" / "data" / "pod_events.json").read_bytes())
    return [event for events in data.values() for event in events]


def _without(event: dict[str, Any]) -> dict[str, Any]:
    obj = event["object"]
    meta = {k: v for k, v in obj["metadata"].items() if k != "managedFields"}
    return {**event, "object": {**obj, "metadata": meta}}


def test_managed_fields_are_cut_exactly_from_recorded_pod_events() -> None:
    events = _recorded_pod_events()
    assert events and all(e["object"]["metadata"].get("managedFields") for e in events)
    for event in events:
        line = orjson.dumps(event)  # compact, as Go's encoder writes it
        cut = kube.without_managed_fields(line)
        assert len(cut) < len(line)
        assert orjson.loads(cut) == _without(event)


def test_a_node_loses_its_managed_fields_and_nothing_else() -> None:
    node = {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": "kwok-node-1",
            "labels": {"type": "kwok"},
            "finalizers": ["x"],
            "managedFields": [
                {
                    "manager": "kwok",
                    "operation": "Update",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:spec": {"f:taints": {}},
                        "f:status": {"f:conditions": {'k:{"type":"Ready"}': {}}},
                    },
                    "subresource": "status",
                }
            ],
        },
        "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    event = {"type": "MODIFIED", "object": node}
    assert orjson.loads(kube.without_managed_fields(orjson.dumps(event))) == _without(event)


@pytest.mark.parametrize(
    "line",
    [
        # no managedFields
        b'{"type":"ADDED","object":{"metadata":{"name":"p"},"spec":{}}}',
        # another writer's spacing: the cut's markers are not there, so nothing is cut
        b'{"type": "ADDED", "object": {"metadata": {"name": "p", "managedFields": []}, "spec": {}}}',
        # managedFields, but no spec after metadata
        b'{"type":"ADDED","object":{"metadata":{"name":"p","managedFields":[{"manager":"m"}]},"status":{}}}',
        # the markers only inside strings (escaped quotes)
        b'{"type":"ADDED","object":{"metadata":{"name":"p","annotations":{"a":",\\"managedFields\\":[ ]},\\"spec\\":{"}},"spec":{}}}',
    ],
)
def test_a_line_without_both_markers_is_left_whole(line: bytes) -> None:
    assert kube.without_managed_fields(line) is line


@pytest.mark.parametrize(
    ("path", "cut"),
    [
        ("/api/v1/pods", True),
        ("/api/v1/nodes", True),
        ("/api/v1/namespaces/team-a/pods", True),
        ("/api/v1/podtemplates", False),  # its template's metadata may end in a list, then a spec
        ("/api/v1/namespaces/team-a/pods/p", False),
        ("/apis/apps/v1/deployments", False),
        ("/api/v1/namespaces", False),
    ],
)
def test_only_pods_and_nodes_are_cut(path: str, cut: bool) -> None:
    assert kube.spec_follows_metadata(path) is cut


async def test_a_pod_watch_yields_its_objects_without_managed_fields() -> None:
    events = _recorded_pod_events()

    async def write(resp: web.StreamResponse) -> None:
        for event in events:
            await resp.write(orjson.dumps(event) + b"\n")

    got = await _events(write)
    assert got == [(e["type"], _without(e)["object"]) for e in events]


def _listed(events: list[dict[str, Any]]) -> dict[str, Any]:
    """A PodList as the API server writes it: the list's own metadata, then the items."""
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "9"}, "items": events}


def test_managed_fields_are_cut_from_every_object_of_a_list() -> None:
    objects = [e["object"] for e in _recorded_pod_events()]
    body = orjson.dumps(_listed(objects))
    assert orjson.loads(kube.without_managed_fields(body, every=True)) == _listed(
        [_without({"object": o})["object"] for o in objects]
    )


async def test_a_list_of_pods_is_decoded_without_managed_fields_and_other_replies_whole() -> None:
    objects = [e["object"] for e in _recorded_pod_events()]
    body = orjson.dumps(_listed(objects))

    async def reply(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/api/v1/pods", reply)
    app.router.add_get("/api/v1/podtemplates", reply)
    server = TestServer(app)
    await server.start_server()
    client = KubeClient(Credentials(server=str(server.make_url("")).rstrip("/")))
    try:
        pods = await client.get("/api/v1/pods")
        whole = await client.get("/api/v1/podtemplates")
    finally:
        await client.close()
        await server.close()
    assert pods == _listed([_without({"object": o})["object"] for o in objects])
    assert whole == orjson.loads(body)


def _collections_during(decode: Callable[[], object]) -> int:
    started = 0

    def count(phase: str, info: dict[str, int]) -> None:
        nonlocal started
        started += phase == "start"

    gc.callbacks.append(count)
    try:
        decode()
    finally:
        gc.callbacks.remove(count)
    return started


def test_a_large_reply_is_decoded_with_the_collector_paused_and_restored() -> None:
    objects = [e["object"] for e in _recorded_pod_events()]
    body = orjson.dumps(_listed(objects * (kube.PAUSE_GC_FROM // 20_000 + 1)))
    assert len(body) >= kube.PAUSE_GC_FROM
    assert gc.isenabled()
    assert _collections_during(lambda: orjson.loads(body)) > 0  # what the pause spares
    assert _collections_during(lambda: kube._loads(body)) == 0
    assert gc.isenabled()
    assert kube._loads(body) == orjson.loads(body)
    gc.disable()
    try:
        kube._loads(body)
        assert not gc.isenabled()  # a caller's pause is its own
    finally:
        gc.enable()


def _no_managed_fields(value: Any) -> Any:
    """``value`` with every ``managedFields`` key dropped, at any depth."""
    if isinstance(value, dict):
        return {k: _no_managed_fields(v) for k, v in value.items() if k != "managedFields"}
    if isinstance(value, list):
        return [_no_managed_fields(v) for v in value]
    return value


def test_go_encoded_hostile_objects_lose_managed_fields_and_nothing_else() -> None:
    """Pods, Nodes, events (ADDED, DELETED, BOOKMARK, ERROR) and lists as Go's encoder writes them, with the
    cut's markers in labels, annotations, owner references, managers and ``fieldsV1`` keys, ``\\u003c``-style
    escapes, a pod named by ``generateName``, lists mixing objects with and without managedFields
    (``data/go_encoded_objects.go.txt`` made them). Each is cut as its reader cuts it: an event as the watch
    does (its one object), an object or a list as a reply to a request does (every object)."""
    lines = (Path(__file__).parent / "data" / "go_encoded_objects.jsonl").read_bytes().splitlines()
    cut_any = 0
    events = 0
    for line in lines:
        parsed = orjson.loads(line)
        event = "type" in parsed and "object" in parsed
        events += event
        cut = kube.without_managed_fields(line, every=not event)
        cut_any += len(cut) < len(line)
        assert _no_managed_fields(orjson.loads(cut)) == _no_managed_fields(parsed)
    assert cut_any >= 4 and 0 < events < len(lines)


def test_bytes_not_laid_out_as_the_api_server_writes_them_are_not_cut() -> None:
    # labels after managedFields: a cut to the next spec would take them, and the next pod's metadata with them
    line = (
        b'{"items":[{"metadata":{"name":"a","managedFields":[{"manager":"m"}],"labels":{"x":"y"}},'
        b'"spec":{"nodeName":"n1"}},{"metadata":{"name":"b","finalizers":["f"]},"spec":{"nodeName":"n2"}}]}'
    )
    assert kube.without_managed_fields(line, every=True) is line
