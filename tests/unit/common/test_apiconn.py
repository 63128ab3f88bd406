"""The write pool's HTTP/1.1: replies parsed however their bytes are split, connections reused only when that
is safe, and nothing a caller names can add a header.

The replies here are written by hand (``Reply``) or served by a local socket server that answers each request
with canned bytes (the pool's peer, not an imitation of the API server); the pool against the real
kube-apiserver is tested in ``tests/integration/test_kube_pool.py``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest
from prometheus_client import REGISTRY

from common.apiconn import MAX_HEAD, ApiConnections, BadRequest, ProtocolError, Reply
from common.kube import Credentials, Invalid, KubeClient, ServerError

OK = b'HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"a": true}'
CHUNKED = (
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"
)


def _fed(data: bytes, step: int) -> Reply:
    """``data`` fed ``step`` bytes at a time; the reply must complete exactly at its last byte."""
    reply = Reply()
    for i in range(0, len(data), step):
        done = reply.feed(data[i : i + step])
        assert done == (i + step >= len(data)), (i, step)
    return reply


@pytest.mark.parametrize("step", [1, 2, 7, 1000])
def test_a_reply_with_a_length_is_read_however_it_is_split(step: int) -> None:
    reply = _fed(OK, step)
    assert (reply.status, reply.body, reply.reusable) == (201, b'{"a": true}', True)


@pytest.mark.parametrize("step", [1, 3, 5, 1000])
def test_a_chunked_reply_with_extensions_and_trailers(step: int) -> None:
    reply = _fed(CHUNKED, step)
    assert (reply.status, reply.body, reply.reusable) == (200, b"hello world", True)


def test_interim_replies_are_skipped_and_a_204_has_no_body() -> None:
    reply = _fed(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nDate: x\r\n\r\n", 1)
    assert (reply.status, reply.body, reply.reusable) == (204, b"", True)


@pytest.mark.parametrize(
    ("data", "bodiless"),
    [
        (b"HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n", False),
        (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n", False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", True),  # the reply to a HEAD
    ],
)
def test_a_reply_that_has_no_body_whatever_its_headers_say_ends_with_them(
    data: bytes, bodiless: bool
) -> None:
    reply = Reply(bodiless=bodiless)
    assert reply.feed(data)
    assert (reply.body, reply.reusable) == (b"", True)


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 2\r\n\r\n",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n",
        b"HTTP/1.0 200 OK\r\nConnection: close\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n",
    ],
)
def test_a_reply_that_closes_its_connection_is_not_reused(head: bytes) -> None:
    reply = _fed(head + b"ok", 1)
    assert (reply.body, reply.reusable) == (b"ok", False)


def test_a_reply_framed_by_the_connection_end_completes_only_at_the_end() -> None:
    reply = Reply()
    assert not reply.feed(b"HTTP/1.1 200 OK\r\n\r\nsome")
    assert not reply.feed(b" bytes")
    assert reply.end_of_stream()
    assert (reply.status, reply.body, reply.reusable) == (200, b"some bytes", False)
    assert not Reply().end_of_stream()  # an end before the headers completes nothing


def test_bytes_after_a_whole_reply_make_its_connection_unusable() -> None:
    reply = Reply()
    assert reply.feed(OK + b"HTTP/1.1 200 OK\r\n")
    assert (reply.status, reply.reusable) == (201, False)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"SPDY/3 200 OK\r\n\r\n", "status line"),
        (b"HTTP/1.1 2x0 OK\r\n\r\n", "status line"),
        (b"HTTP/1.1 2000 OK\r\n\r\n", "status line"),
        (b"HTTP/1.1 200x\r\n\r\n", "status line"),
        (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "header line"),
        (b"HTTP/1.1 200 OK\r\n Folded: x\r\n\r\n", "header line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "transfer coding"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", "both"),
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 1\r\n\r\n", "compressed"),
        (b"HTTP/1.1 101 Switching\r\n\r\n", "switched"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "hexadecimal"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY", "CRLF"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"y" * MAX_HEAD, "longer than"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1" * 2000, "too long"),
    ],
)
def test_a_malformed_reply_is_refused(data: bytes, says: str) -> None:
    with pytest.raises(ProtocolError, match=says):
        Reply().feed(data)


class Cut(bytes):
    """An answer the peer writes, then ends its connection."""


Answer = bytes | None | tuple[float, bytes]


class Peer:
    """A local HTTP/1.1 peer: answers each request it reads whole with the next of ``answers`` (bytes, or a
    ``(seconds, bytes)``: those bytes after a pause; ``None``: say nothing; ``b""``: close the connection)."""

    def __init__(self, answers: list[Answer], *, close_after_reply: bool = False) -> None:
        self.answers = answers
        self.close_after_reply = close_after_reply
        self.arrived = asyncio.Event()  # set at every request read
        self.requests: list[bytes] = []
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                self.arrived.set()
                answer = self.answers.pop(0)
                if isinstance(answer, tuple):
                    await asyncio.sleep(answer[0])
                    answer = answer[1]
                if answer is None:
                    continue
                if answer == b"":
                    break
                writer.write(answer)
                await writer.drain()
                if isinstance(answer, Cut):
                    break
                if self.close_after_reply:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/prefix"


PeerFactory = Callable[..., Peer]


@pytest.fixture
async def peer_factory() -> AsyncIterator[PeerFactory]:
    peers: list[Peer] = []

    def make(answers: list[Answer], **kw: bool) -> Peer:
        peer = Peer(answers, **kw)
        peers.append(peer)
        return peer

    yield make
    for peer in peers:
        if peer.server is not None:
            peer.server.close()


def _pool(server: str, **kw: object) -> ApiConnections:
    settings: dict[str, object] = {"limit": 4, "keepalive": 60.0, "headers": {"User-Agent": "t"}}
    settings.update(kw)
    return ApiConnections(server, None, **settings)  # type: ignore[arg-type]


async def test_a_connection_is_kept_alive_and_requests_are_written_as_http_1_1(
    peer_factory: PeerFactory,
) -> None:
    peer = peer_factory([OK, OK])
    pool = _pool(await peer.start())
    try:
        assert await pool.request("POST", "/api/v1/x", "a=b", {"Authorization": "Bearer t"}, b"{}") == (
            201,
            b'{"a": true}',
        )
        assert await pool.request("DELETE", "/api/v1/y", "", {}, None) == (201, b'{"a": true}')
    finally:
        pool.close()
    assert peer.connections == 1
    assert pool.opened == 1
    first, second = peer.requests
    assert first.startswith(b"POST /prefix/api/v1/x?a=b HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"\r\nUser-Agent: t\r\nAuthorization: Bearer t\r\nContent-Length: 2\r\n\r\n{}" in first
    assert second.startswith(b"DELETE /prefix/api/v1/y HTTP/1.1\r\n") and b"Content-Length" not in second


async def test_a_connection_idle_past_the_keepalive_or_closed_is_not_used_again(
    peer_factory: PeerFactory,
) -> None:
    now = [0.0]
    peer = peer_factory([OK, OK, b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", OK])
    pool = _pool(await peer.start(), keepalive=10.0, clock=lambda: now[0])
    try:
        await pool.request("GET", "/a", "", {}, None)
        now[0] = 10.5  # past the keepalive: a new connection, the stale one closed
        await pool.request("GET", "/b", "", {}, None)
        assert pool.opened == 2
        await pool.request("GET", "/c", "", {}, None)  # its reply closes the connection
        await pool.request("GET", "/d", "", {}, None)
        assert pool.opened == 3
    finally:
        pool.close()


async def test_stale_connections_are_closed_from_the_oldest_end_too(peer_factory: PeerFactory) -> None:
    now = [0.0]
    peer = peer_factory([OK])
    pool = _pool(await peer.start(), keepalive=10.0, clock=lambda: now[0])
    try:
        # two connections, idle since 0 and 5; at 12 the older is stale, the newer not
        for at in (0.0, 5.0):
            now[0] = at
            conn = await pool._connect()
            conn.idle_since = at
            pool._idle.append(conn)
        oldest = pool._idle[0]
        now[0] = 12.0
        await pool.request("GET", "/a", "", {}, None)
        assert oldest.closed and pool.idle == 1 and pool.opened == 2
    finally:
        pool.close()


async def test_a_connection_the_server_closed_while_idle_is_replaced_without_an_error(
    peer_factory: PeerFactory,
) -> None:
    peer = peer_factory([OK, OK, OK], close_after_reply=True)
    pool = _pool(await peer.start())
    try:
        await pool.request("POST", "/a", "", {}, b"x")
        await asyncio.sleep(0.05)  # the server's close arrives while the connection is idle
        assert await pool.request("POST", "/b", "", {}, b"x") == (201, b'{"a": true}')
        # its end seen but not yet its closing: found unusable before anything is written, sent on a new one
        pool._idle[-1].eof_received()
        assert await pool.request("POST", "/c", "", {}, b"x") == (201, b'{"a": true}')
    finally:
        pool.close()
    assert pool.opened == peer.connections == 3


@pytest.mark.parametrize(
    ("method", "again"),
    [("GET", True), ("HEAD", True), ("DELETE", False), ("PUT", False), ("POST", False), ("PATCH", False)],
)
async def test_a_request_the_server_dropped_unanswered_is_sent_again_only_if_it_reads(
    peer_factory: PeerFactory, method: str, again: bool
) -> None:
    peer = peer_factory([OK, b"", OK])  # the second request read, then the connection closed: no reply
    pool = _pool(await peer.start())
    body = None if method in ("GET", "HEAD") else b"x"
    try:
        await pool.request("GET", "/a", "", {}, None)
        if again:
            status, _ = await pool.request(method, "/b", "", {}, body)
            assert status == 201
        else:
            with pytest.raises(ConnectionError):  # it may have been carried out: not sent twice
                await pool.request(method, "/b", "", {}, body)
    finally:
        pool.close()
    assert len(peer.requests) == (3 if again else 2)


async def test_a_read_whose_reply_was_cut_short_is_not_sent_again(peer_factory: PeerFactory) -> None:
    peer = peer_factory([OK, Cut(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial"), OK])
    pool = _pool(await peer.start())
    try:
        await pool.request("GET", "/a", "", {}, None)
        with pytest.raises(ConnectionError):  # some of a reply came: the server acted on the request
            await pool.request("GET", "/b", "", {}, None)
    finally:
        pool.close()
    assert len(peer.requests) == 2


async def test_a_request_given_up_on_closes_its_connection_so_its_late_reply_is_never_read(
    peer_factory: PeerFactory,
) -> None:
    late = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlate"
    peer = peer_factory([(0.4, late), OK])
    pool = _pool(await peer.start())
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await pool.request("POST", "/slow", "", {}, b"x")
        assert pool.idle == 0
        # on a connection of its own: written on the first, it would read the reply that comes late there
        assert await pool.request("GET", "/next", "", {}, None) == (201, b'{"a": true}')
        assert pool.opened == 2
    finally:
        pool.close()


async def test_a_closed_pool_fails_its_requests_in_flight_and_sends_no_more(
    peer_factory: PeerFactory,
) -> None:
    peer = peer_factory([None])
    pool = _pool(await peer.start())
    out = asyncio.create_task(pool.request("POST", "/a", "", {}, b"x"))
    await peer.arrived.wait()
    pool.close()
    with pytest.raises(ConnectionAbortedError):
        await out
    with pytest.raises(ConnectionAbortedError):
        await pool.request("GET", "/b", "", {}, None)
    with pytest.raises(ValueError, match="0 connections"):
        ApiConnections("http://h", None, limit=0, keepalive=1.0, headers={})


async def test_a_read_in_flight_when_the_pool_closes_is_not_sent_again(peer_factory: PeerFactory) -> None:
    peer = peer_factory([OK, None, OK])
    pool = _pool(await peer.start())
    await pool.request("GET", "/a", "", {}, None)
    peer.arrived.clear()
    out = asyncio.create_task(pool.request("GET", "/b", "", {}, None))  # a read, on a kept-alive connection
    await peer.arrived.wait()
    pool.close()
    with pytest.raises(ConnectionAbortedError):
        await out
    await asyncio.sleep(0.05)
    assert peer.connections == 1 and len(peer.requests) == 2


async def test_no_more_connections_than_the_limit(peer_factory: PeerFactory) -> None:
    peer = peer_factory([OK] * 10)
    pool = _pool(await peer.start(), limit=2)
    try:
        replies = await asyncio.gather(*(pool.request("GET", f"/{i}", "", {}, None) for i in range(10)))
    finally:
        pool.close()
    assert {status for status, _ in replies} == {201}
    assert peer.connections == pool.opened <= 2


async def test_nothing_a_caller_names_can_add_a_header_or_a_request(peer_factory: PeerFactory) -> None:
    peer = peer_factory([OK])
    pool = _pool(await peer.start())
    try:
        with pytest.raises(BadRequest, match="control character") as refused:
            await pool.request("GET", "/a", "", {"Authorization": "Bearer s3cret\r\nInjected: 1"}, None)
        assert "s3cret" not in str(refused.value)  # a credential is never echoed into a log
        with pytest.raises(BadRequest, match="not Latin-1"):
            await pool.request("GET", "/a", "", {"X": "\u2603"}, None)
        with pytest.raises(BadRequest, match="method"):
            await pool.request("GET /x HTTP/1.1\r\n", "/a", "", {}, None)
        with pytest.raises(BadRequest, match="query"):
            await pool.request("GET", "/a?b=c", "", {}, None)
        assert peer.requests == []  # nothing was sent
        # a target's CR, LF, spaces and stray percent signs are escaped, not written; escapes made stay
        await pool.request("GET", "/a b\r\nInjected: 1%zz%2F", "q=1 2\r\n", {}, None)
    finally:
        pool.close()
    assert peer.requests[0].startswith(
        b"GET /prefix/a%20b%0D%0AInjected:%201%25zz%2F?q=1%202%0D%0A HTTP/1.1\r\n"
    )
    with pytest.raises(BadRequest):
        ApiConnections("http://h", None, limit=1, keepalive=1.0, headers={"Bad": "a\nb"})
    with pytest.raises(ValueError, match="not an http"):
        ApiConnections("ftp://h", None, limit=1, keepalive=1.0, headers={})


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_the_client_counts_maps_and_times_its_writes_as_it_does_its_reads(
    peer_factory: PeerFactory,
) -> None:
    """``KubeClient``'s writes through the pool: rest-client metrics as aiohttp's trace keeps them, a reply
    that is not HTTP a ``ServerError``, a header that cannot be written an ``Invalid`` (nothing to retry)."""
    peer = peer_factory([OK, None, b"SPDY/3 200 OK\r\n\r\n"])
    server = await peer.start()
    host = server.split("//")[1].split("/")[0]
    before = {
        code: _sample("rest_client_requests_total", code=code, method="POST", host=host)
        for code in ("201", "<error>")
    }
    opened = _sample("agent_scheduler_api_connections_opened_total")
    timed = _sample("rest_client_request_duration_seconds_count", verb="POST", host=host)
    async with KubeClient(Credentials(server=server, token="t0")) as client:
        assert await client.post("/api/v1/x", {}) == {"a": True}
        with pytest.raises(TimeoutError):  # the caller's own deadline, as the binder sets one
            async with asyncio.timeout(0.2):
                await client.post("/api/v1/slow", {})
        with pytest.raises(ServerError, match="ProtocolError"):
            await client.post("/api/v1/y", {})
        client.auth.token = "t0\nX-Injected: 1"
        with pytest.raises(Invalid):
            await client.post("/api/v1/z", {})
    assert _sample("rest_client_requests_total", code="201", method="POST", host=host) == before["201"] + 1
    # the given-up request, the malformed reply and the refused header: no response for any
    assert (
        _sample("rest_client_requests_total", code="<error>", method="POST", host=host)
        == before["<error>"] + 3
    )
    assert _sample("agent_scheduler_api_connections_opened_total") == opened + 2  # the timeout closed one
    assert (
        _sample("rest_client_request_duration_seconds_count", verb="POST", host=host) == timed + 1
    )  # answered
    assert peer.requests[0].startswith(b"POST /prefix/api/v1/x HTTP/1.1\r\n")
    assert b"\r\nContent-Type: application/json\r\nAuthorization: Bearer t0\r\n" in peer.requests[0]


def _timeout_sent(request: bytes) -> float:
    """The ``timeout`` parameter of a written request's target, in seconds."""
    target = request.split(b" ", 2)[1].decode()
    params = dict(p.split("=", 1) for p in target.split("?", 1)[1].split("&"))
    assert params["timeout"].endswith("s")
    return float(params["timeout"][:-1])


async def test_a_deadline_goes_out_as_what_is_left_when_the_request_is_written(
    peer_factory: PeerFactory,
) -> None:
    """The wait for a free connection comes out of it: the API server must not be given more time than the
    sender has left, or a fenced write could land after its fencing deadline."""
    peer = peer_factory([(0.3, OK), OK])
    pool = _pool(await peer.start(), limit=1)
    try:
        first = asyncio.create_task(pool.request("POST", "/a", "", {}, b"{}"))
        await peer.arrived.wait()  # the only connection is busy for 0.3 s
        began = time.monotonic()
        assert await pool.request("DELETE", "/b", "gracePeriodSeconds=0", {}, None, server_timeout=2.0) == (
            201,
            b'{"a": true}',
        )
        waited = time.monotonic() - began
        await first
    finally:
        pool.close()
    second = peer.requests[1]
    assert second.startswith(b"DELETE /prefix/b?gracePeriodSeconds=0&timeout=")
    # the 0.3 s the connection was busy came out of it (2.0 or 1.999 if it had not; margin for scheduling)
    assert _timeout_sent(second) <= 2.0 - 0.25
    assert _timeout_sent(second) >= 2.0 - waited - 0.001  # and no more than the wait
    assert b"timeout=" not in peer.requests[0]  # none asked: none sent


async def test_a_request_whose_deadline_passed_waiting_for_a_connection_is_not_written(
    peer_factory: PeerFactory,
) -> None:
    peer = peer_factory([(0.3, OK), OK])
    pool = _pool(await peer.start(), limit=1)
    try:
        first = asyncio.create_task(pool.request("POST", "/a", "", {}, b"{}"))
        await peer.arrived.wait()
        with pytest.raises(TimeoutError, match="before it was written"):
            await pool.request("POST", "/late", "", {}, b"{}", server_timeout=0.1)
        await first
        assert await pool.request("POST", "/c", "", {}, b"{}") == (201, b'{"a": true}')
    finally:
        pool.close()
    assert [r.split(b" ", 2)[1] for r in peer.requests] == [b"/prefix/a", b"/prefix/c"]
    assert pool.opened == 1  # the connection it held unwritten was kept


async def test_a_token_refresh_before_a_write_comes_out_of_its_deadline(
    peer_factory: PeerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    peer = peer_factory([OK])
    async with KubeClient(Credentials(server=await peer.start(), token="t0")) as client:

        async def slow_refresh() -> None:  # an exec plugin or a token file read taking its time
            await asyncio.sleep(0.3)

        monkeypatch.setattr(client.auth, "refresh_if_due", slow_refresh)
        await client.patch("/api/v1/namespaces/a/pods/p", {}, timeout=2.0)
    assert _timeout_sent(peer.requests[0]) <= 2.0 - 0.3


async def test_a_kept_connection_not_written_on_keeps_its_idle_time(peer_factory: PeerFactory) -> None:
    """A request not written for want of time leaves the connection it took as it was: its keepalive still
    counts from its last reply, so it is not used past the server's idle close."""
    now = [0.0]
    peer = peer_factory([OK, OK])
    pool = _pool(await peer.start(), clock=lambda: now[0])
    try:
        await pool.request("POST", "/a", "", {}, b"{}")  # its reply at 0
        now[0] = 59.0
        with pytest.raises(TimeoutError, match="before it was written"):
            await pool.request("POST", "/late", "", {}, b"{}", server_timeout=0.0005)
        now[0] = 61.0  # past the keepalive of 60 s since the last reply
        await pool.request("POST", "/b", "", {}, b"{}")
    finally:
        pool.close()
    assert pool.opened == 2 and peer.connections == 2
    assert [r.split(b" ", 2)[1] for r in peer.requests] == [b"/prefix/a", b"/prefix/b"]


async def test_a_fresh_connection_not_written_on_is_kept(peer_factory: PeerFactory) -> None:
    now = [0.0]
    peer = peer_factory([OK])
    pool = _pool(await peer.start(), clock=lambda: now[0])
    try:
        with pytest.raises(TimeoutError, match="before it was written"):
            await pool.request("POST", "/late", "", {}, b"{}", server_timeout=0.0005)
        await pool.request("POST", "/a", "", {}, b"{}")
    finally:
        pool.close()
    assert pool.opened == 1 and [r.split(b" ", 2)[1] for r in peer.requests] == [b"/prefix/a"]
