"""The write pool's HTTP/1.1: replies parsed however their bytes are split, connections reused only when that
is safe, and nothing a caller names can add a header.

The replies here are written by hand (``Reply``) or served by a local socket server that answers each request
with canned bytes (the pool's peer, not an imitation of the API server); the pool against the real
kube-apiserver is tested in ``tests/integration/test_kube_pool.py``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from common.apiconn import MAX_HEAD, ApiConnections, ProtocolError, Reply

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
    "head",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 2\r\n\r\n",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n",
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


Answer = bytes | None | tuple[float, bytes]


class Peer:
    """A local HTTP/1.1 peer: answers each request it reads whole with the next of ``answers`` (bytes, or a
    ``(seconds, bytes)``: those bytes after a pause; ``None``: say nothing; ``b""``: close the connection)."""

    def __init__(self, answers: list[Answer]) -> None:
        self.answers = answers
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
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/prefix"


PeerFactory = Callable[[list[Answer]], Peer]


@pytest.fixture
async def peer_factory() -> AsyncIterator[PeerFactory]:
    peers: list[Peer] = []

    def make(answers: list[Answer]) -> Peer:
        peer = Peer(answers)
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
        assert await pool.request("POST", "/api/v1/x?a=b", {"Authorization": "Bearer t"}, b"{}") == (
            201,
            b'{"a": true}',
        )
        assert await pool.request("DELETE", "/api/v1/y", {}, None) == (201, b'{"a": true}')
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
        await pool.request("GET", "/a", {}, None)
        now[0] = 10.5  # past the keepalive: a new connection, the stale one closed
        await pool.request("GET", "/b", {}, None)
        assert pool.opened == 2
        await pool.request("GET", "/c", {}, None)  # its reply closes the connection
        await pool.request("GET", "/d", {}, None)
        assert pool.opened == 3
    finally:
        pool.close()


async def test_a_connection_the_server_closed_while_idle_is_replaced(peer_factory: PeerFactory) -> None:
    peer = peer_factory([OK, b"", OK])
    pool = _pool(await peer.start())
    try:
        await pool.request("GET", "/a", {}, None)
        with pytest.raises(ConnectionError):
            await pool.request("POST", "/b", {}, b"x")  # the server closed instead of answering
        assert await pool.request("GET", "/c", {}, None) == (201, b'{"a": true}')
        assert pool.opened == 2
    finally:
        pool.close()


async def test_a_request_given_up_on_closes_its_connection_so_its_late_reply_is_never_read(
    peer_factory: PeerFactory,
) -> None:
    late = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlate"
    peer = peer_factory([(0.4, late), OK])
    pool = _pool(await peer.start())
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await pool.request("POST", "/slow", {}, b"x")
        assert pool.idle == 0
        # on a connection of its own: written on the first, it would read the reply that comes late there
        assert await pool.request("GET", "/next", {}, None) == (201, b'{"a": true}')
        assert pool.opened == 2
    finally:
        pool.close()


async def test_no_more_connections_than_the_limit(peer_factory: PeerFactory) -> None:
    peer = peer_factory([OK] * 10)
    pool = _pool(await peer.start(), limit=2)
    try:
        replies = await asyncio.gather(*(pool.request("GET", f"/{i}", {}, None) for i in range(10)))
    finally:
        pool.close()
    assert {status for status, _ in replies} == {201}
    assert peer.connections == pool.opened <= 2


async def test_nothing_a_caller_names_can_add_a_header_or_a_request(peer_factory: PeerFactory) -> None:
    peer = peer_factory([OK])
    pool = _pool(await peer.start())
    try:
        with pytest.raises(ProtocolError, match="control character"):
            await pool.request("GET", "/a", {"X": "v\r\nInjected: 1"}, None)
        with pytest.raises(ProtocolError, match="not Latin-1"):
            await pool.request("GET", "/a", {"X": "\u2603"}, None)
        assert peer.requests == []  # nothing was sent
        # a target's CR, LF and spaces are escaped, not written
        await pool.request("GET", "/a b\r\nInjected: 1", {}, None)
    finally:
        pool.close()
    assert peer.requests[0].startswith(b"GET /prefix/a%20b%0D%0AInjected:%201 HTTP/1.1\r\n")
    with pytest.raises(ProtocolError):
        ApiConnections("http://h", None, limit=1, keepalive=1.0, headers={"Bad": "a\nb"})
    with pytest.raises(ValueError, match="not an http"):
        ApiConnections("ftp://h", None, limit=1, keepalive=1.0, headers={})
