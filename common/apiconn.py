"""Kept-alive HTTP/1.1 connections for the API server requests a scheduler sends per pod: its writes.

``KubeClient`` sends its writes (POST, PUT, PATCH, DELETE: bindings, Scheduled events, status patches, the
coordinator's NodeShard writes) through an ``ApiConnections`` pool, and its reads and watches through aiohttp.
The split is by cost: a worker sends two small writes for every pod it places, and through ``KubeClient``
with its rate limit, authentication and metrics a write costs about half the CPU here that it cost through
aiohttp's request machinery (its URL, header, cookie, timeout, tracing and response objects) on the same
event loop and TLS: 0.15-0.18 against 0.28-0.40 ms per Event POST (``docs/results/writes-2026-12-06/``).
Reads stay on aiohttp: lists are large, few, and worth the compression it negotiates; watches are streams.

What it implements of HTTP/1.1 is what a reply from the API server (or a proxy in front of it) may use: a
status line, headers, a body framed by ``Content-Length``, by ``Transfer-Encoding: chunked`` (with trailers)
or by the connection's end; interim 1xx replies are skipped. It never asks for compression, so a reply with a
``Content-Encoding`` other than ``identity`` is refused.

Invariants:
- One request at a time per connection (no pipelining), at most ``limit`` connections open at once; a request
  beyond them waits for one.
- A connection is used again only after a whole reply was read from it, with nothing after that reply, and
  only if the reply did not close it (``Connection: close``, HTTP/1.0, framed by the connection's end).
  Anything else (a timeout, a cancelled caller, a malformed reply, the connection lost) closes it, so a late
  or partial reply is never read as the answer to a later request.
- An idle connection is reused, newest first, only within ``keepalive`` seconds of its last reply; older ones
  are closed when the next request looks for a connection (or by the server). kube-apiserver closes HTTP/1.1 connections idle for 90 s, and a request written as it
  does so gets no reply; a write (a binding) cannot safely be sent again, so the pool does not risk it.
- A request is sent a second time, on a new connection, only when that cannot change what it did: its
  connection was found closed before it was written, or, for a read (GET, HEAD, OPTIONS), died before any
  byte of a reply (``ApiConnections.request``). Never for a closed pool.
- Failures are ``OSError`` (``ConnectionError`` for a connection the server closed), ``TimeoutError`` or
  ``ProtocolError`` (a reply that is not HTTP/1.1 as above); ``KubeClient`` maps them to its ``ServerError``.
- A header with a control character is refused before anything is sent (``BadRequest``), and a request
  target's are percent-encoded: nothing a tenant names can add a header or a request.
"""

from __future__ import annotations

import asyncio
import math
import re
import ssl
import time
from collections.abc import Callable
from typing import cast
from urllib.parse import quote, urlsplit

MAX_HEAD = 64 * 1024  # bytes of a reply's status line and headers; kube-apiserver's are a few hundred
MAX_CHUNK_LINE = 1024  # bytes of a chunk-size line (hex size and extensions)

# What a request target keeps as it is: a path's and a query's delimiters, and escapes already made
_PATH_SAFE = "/:@!$&'()*+,;=~-._%"
_QUERY_SAFE = _PATH_SAFE + "?"
_STRAY_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Methods a request of which may be sent again when a kept-alive connection died under it after it was written
# but before any reply: Go's client replays these (``isReplayable``), and they change nothing on the server.
# Not PUT or DELETE, though idempotent: the first may have been carried out, and the second's answer would then
# be a 409 or a 404 (a preemption's victim deleted, reported as not deleted)
_REPLAYABLE = frozenset({"GET", "HEAD", "OPTIONS"})

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

# Parser states
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _TRAILER, _TO_EOF, _DONE = range(7)


class ProtocolError(Exception):
    """A reply that is not the HTTP/1.1 this module reads."""


class BadRequest(ValueError):
    """A request this module will not write (a control character in a header): it never could be sent."""


class NotSent(ConnectionError):
    """The connection was found closed before the request was written: nothing was sent."""


class Reply:
    """One HTTP reply, fed the connection's bytes as they arrive (``feed``) until ``done``."""

    __slots__ = ("_bodiless", "_buf", "_need", "_parts", "_state", "body", "reusable", "status")

    def __init__(self, *, bodiless: bool = False) -> None:
        self._bodiless = bodiless  # the reply to a HEAD: headers only, whatever they say of a body
        self.status = 0
        self.body = b""
        self.reusable = True  # the connection may carry another request after this reply
        self._buf = bytearray()
        self._parts: list[bytes] = []
        self._state = _HEAD
        self._need = 0

    def feed(self, data: bytes) -> bool:
        """Take ``data``; True once the reply is complete. Raises ``ProtocolError`` for a malformed reply."""
        buf = self._buf
        buf += data
        while True:
            state = self._state
            if state == _HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > MAX_HEAD:
                        raise ProtocolError(f"a reply's headers longer than {MAX_HEAD} bytes")
                    return False
                if end > MAX_HEAD:
                    raise ProtocolError(f"a reply's headers longer than {MAX_HEAD} bytes")
                head = bytes(buf[:end])
                del buf[: end + 4]
                self._head(head)
            elif state == _LENGTH:
                if len(buf) < self._need:
                    return False
                self._parts.append(bytes(buf[: self._need]))
                del buf[: self._need]
                self._state = _DONE
            elif state == _CHUNK_SIZE:
                end = buf.find(b"\r\n")
                if end < 0 or end > MAX_CHUNK_LINE:
                    if end > MAX_CHUNK_LINE or len(buf) > MAX_CHUNK_LINE:
                        raise ProtocolError("a chunk-size line too long")
                    return False
                size = bytes(buf[:end]).split(b";", 1)[0].strip()
                del buf[: end + 2]
                if not size or size.strip(b"0123456789abcdefABCDEF"):
                    raise ProtocolError(f"a chunk size that is not hexadecimal: {size[:32]!r}")
                self._need = int(size, 16)
                self._state = _CHUNK_DATA if self._need else _TRAILER
            elif state == _CHUNK_DATA:
                if len(buf) < self._need + 2:
                    return False
                if buf[self._need : self._need + 2] != b"\r\n":
                    raise ProtocolError("a chunk not followed by CRLF")
                self._parts.append(bytes(buf[: self._need]))
                del buf[: self._need + 2]
                self._state = _CHUNK_SIZE
            elif state == _TRAILER:
                if buf.startswith(b"\r\n"):
                    del buf[:2]
                    self._state = _DONE
                    continue
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > MAX_HEAD:
                        raise ProtocolError(f"a reply's trailers longer than {MAX_HEAD} bytes")
                    return False
                del buf[: end + 4]
                self._state = _DONE
            elif state == _TO_EOF:
                self._parts.append(bytes(buf))
                buf.clear()
                return False
            else:  # _DONE
                if buf:
                    self.reusable = False  # bytes nobody asked for: the connection's state is unknown
                    buf.clear()
                self.body = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
                self._parts.clear()
                return True

    def end_of_stream(self) -> bool:
        """The connection ended orderly: True if that completes the reply (a body framed by the end)."""
        if self._state != _TO_EOF:
            return False
        self._state = _DONE
        self.reusable = False
        return self.feed(b"")

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        code, _, _ = rest.partition(b" ")
        if version not in (b"HTTP/1.1", b"HTTP/1.0") or len(code) != 3 or not code.isdigit():
            raise ProtocolError(f"not an HTTP/1.1 status line: {lines[0][:80]!r}")
        status = int(code)
        length: int | None = None
        chunked = False
        close = keep_alive = False
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not name or name != name.strip():
                raise ProtocolError(f"a malformed header line: {line[:80]!r}")
            name = name.lower()
            value = value.strip()
            if name == b"content-length":
                if not value.isdigit() or (length is not None and length != int(value)):
                    raise ProtocolError(f"an invalid Content-Length: {value[:40]!r}")
                length = int(value)
            elif name == b"transfer-encoding":
                codings = [c.strip().lower() for c in value.split(b",")]
                if codings != [b"chunked"]:
                    raise ProtocolError(f"a transfer coding this client does not read: {value[:40]!r}")
                chunked = True
            elif name == b"content-encoding":
                if value.lower() not in (b"", b"identity"):
                    raise ProtocolError(f"a compressed reply that was not asked for: {value[:40]!r}")
            elif name == b"connection":
                tokens = {t.strip().lower() for t in value.split(b",")}
                close = close or b"close" in tokens
                keep_alive = keep_alive or b"keep-alive" in tokens
        if 100 <= status < 200:
            if status == 101:
                raise ProtocolError("the server switched protocols")
            return  # an interim reply: the real one follows
        self.status = status
        if close or (version == b"HTTP/1.0" and not keep_alive):
            self.reusable = False
        if chunked and length is not None:
            raise ProtocolError("a reply with both Content-Length and chunked coding")
        if self._bodiless or status in (204, 304):
            self._state = _DONE  # no body, whatever the headers say (RFC 9112, 6.3)
        elif chunked:
            self._state = _CHUNK_SIZE
        elif length is not None:
            self._need = length
            self._state = _LENGTH
        else:
            self.reusable = False
            self._state = _TO_EOF


class _Connection(asyncio.Protocol):
    """One connection to the server; carries one request at a time (``exchange``)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.received = False  # has any byte of the reply to the request out arrived?
        self._reply: Reply | None = None
        self._waiter: asyncio.Future[Reply] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's TLS transport is not a subclass

    def data_received(self, data: bytes) -> None:
        reply = self._reply
        if reply is None:
            # bytes while no request is out: a reply to nothing (or the server's goodbye); never read later
            self.close()
            return
        self.received = True
        try:
            done = reply.feed(data)
        except ProtocolError as e:
            self._fail(e)
            return
        if done:
            self._finish(reply)

    def eof_received(self) -> bool:
        self.closed = True  # from now on no request may be written here (the transport closes next turn)
        reply = self._reply
        if reply is not None and reply.end_of_stream():
            self._finish(reply)
        return False  # close the transport: this side has nothing more to send either

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        reply = self._reply
        if reply is not None and exc is None and reply.end_of_stream():
            self._finish(reply)
            return
        self._fail(exc or ConnectionResetError("the API server closed the connection before its reply"))

    def _finish(self, reply: Reply) -> None:
        self._reply = None
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(reply)

    def _fail(self, exc: BaseException) -> None:
        self._reply = None
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.close()

    def close(self) -> None:
        """Close at once, without TLS's goodbye: a connection closed here is broken, stale or no longer
        wanted, and a graceful TLS close would hold its socket open until the peer answers. A request still
        out fails (its reply, however much of it came, is not one)."""
        self.closed = True
        self._reply = None
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionAbortedError("the connection was closed by this client"))
        if self.transport is not None:
            self.transport.abort()

    @property
    def usable(self) -> bool:
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    async def exchange(self, request: bytes, *, bodiless: bool = False) -> Reply:
        """Write ``request`` and wait for its whole reply."""
        if not self.usable or self.transport is None:
            raise NotSent("the connection closed before the request was written")
        loop = asyncio.get_running_loop()
        self.received = False
        self._reply = Reply(bodiless=bodiless)
        waiter: asyncio.Future[Reply] = loop.create_future()
        self._waiter = waiter
        self.transport.write(request)
        return await waiter


def _checked(value: str, what: str) -> bytes:
    """``value`` as header bytes; a control character (a CR or LF that would start a header or a request of
    its own) or a non-Latin-1 one is refused. The value is not quoted in the error: it may be a credential."""
    if _CONTROL.search(value):  # a regular expression: a service-account token is about a kilobyte
        raise BadRequest(f"{what} with a control character")
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError as e:
        raise BadRequest(f"{what} that is not Latin-1") from e


def _header_lines(headers: dict[str, str]) -> bytes:
    return b"".join(
        _checked(name, "a header name") + b": " + _checked(value, f"the {name} header") + b"\r\n"
        for name, value in headers.items()
    )


def _target(path: str, query: str) -> bytes:
    """The request target: ``path`` and ``query`` with every character outside a URL's percent-encoded (a
    ``%`` too, unless it starts an escape already made), as yarl writes them for aiohttp."""
    target = _STRAY_PERCENT.sub("%25", quote(path, safe=_PATH_SAFE))
    if query:
        target += "?" + _STRAY_PERCENT.sub("%25", quote(query, safe=_QUERY_SAFE))
    return target.encode("ascii")


class ApiConnections:
    """A pool of kept-alive HTTP/1.1 connections to one server (``https://host:port[/prefix]``)."""

    def __init__(
        self,
        server: str,
        ssl_context: ssl.SSLContext | None,
        *,
        limit: int,
        keepalive: float,
        headers: dict[str, str],
        on_open: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        url = urlsplit(server)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) server address: {server!r}")
        if limit <= 0:
            raise ValueError(f"a pool of {limit} connections")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self._ssl = ssl_context if url.scheme == "https" else None
        self._prefix = url.path.rstrip("/")
        authority = f"[{self.host}]" if ":" in self.host else self.host
        if url.port:
            authority += f":{url.port}"
        self.authority = authority
        self._fixed = _header_lines({"Host": authority, **headers})
        self._keepalive = keepalive
        self._on_open = on_open
        self._clock = clock
        self._idle: list[_Connection] = []  # newest last
        self._open: set[_Connection] = set()
        self._slots = asyncio.Semaphore(limit)
        self._closed = False
        self.opened = 0

    async def request(
        self,
        method: str,
        path: str,
        query: str,
        headers: dict[str, str],
        body: bytes | None,
        *,
        server_timeout: float | None = None,
    ) -> tuple[int, bytes]:
        """Send one request and read its reply: (status, body). ``path`` is below the server's prefix;
        characters outside a URL's are percent-encoded in it and in ``query``. No timeout of its own: the
        caller bounds it (a cancelled request closes its connection).

        ``server_timeout``: the request must end within this many seconds from this call at the API server
        too. What is left of it when the request is written, once it holds a slot and a connection (the waits
        for them, and a connect, come out of it), goes as its ``timeout`` parameter, rounded down to the
        millisecond; with less than a millisecond left it is not written (``TimeoutError``).

        A request is sent again, once and on a new connection, when its kept-alive connection turned out to
        be closed before it was written, and, for a GET, HEAD or OPTIONS, when the connection died after it
        was written but before any byte of a reply (the server closed an idle connection as it went out), as
        Go's client does. A write in that case fails: it may have been carried out."""
        if method not in _METHODS:
            raise BadRequest(f"a method this client does not send: {method[:16]!r}")
        if "?" in path:
            raise BadRequest("a path with a query in it: the query is its own argument")
        end = None if server_timeout is None else self._clock() + server_timeout
        head = method.encode() + b" "
        rest = b" HTTP/1.1\r\n" + self._fixed + _header_lines(headers)  # refused here, before any wait
        if body is not None:  # no copy of the caller's headers for it
            rest += b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
        else:
            rest += b"\r\n"
        request = b"" if end is not None else head + _target(self._prefix + path, query) + rest
        async with self._slots:
            if self._closed:
                raise ConnectionAbortedError("the pool was closed")
            for attempt in (1, 2):
                conn = self._take() if attempt == 1 else None
                fresh = conn is None
                if conn is None:
                    conn = await self._connect()
                reusable = written = False
                try:
                    if end is not None:  # nothing awaits between this and the write
                        left_ms = math.floor((end - self._clock()) * 1000)
                        if left_ms < 1:
                            reusable = True  # nothing was written on it
                            raise TimeoutError(f"{method} {path}: its deadline passed before it was written")
                        timed = f"timeout={left_ms / 1000:.3f}s"
                        request = (
                            head + _target(self._prefix + path, f"{query}&{timed}" if query else timed) + rest
                        )
                    written = True
                    reply = await conn.exchange(request, bodiless=method == "HEAD")
                    reusable = reply.reusable
                except NotSent:
                    if attempt == 2 or self._closed:
                        raise
                    continue
                except ConnectionError:
                    if attempt == 2 or self._closed or fresh or conn.received or method not in _REPLAYABLE:
                        raise
                    continue
                finally:
                    if reusable and not conn.closed and not self._closed:
                        if written or fresh:  # one taken and not written on keeps its last reply's time
                            conn.idle_since = self._clock()
                        self._idle.append(conn)
                    else:
                        conn.close()
                        self._open.discard(conn)
                return reply.status, reply.body
            raise AssertionError("unreachable: the second attempt returns or raises")

    def _take(self) -> _Connection | None:
        """The newest idle connection still fit to use. Stale ones are closed on the way, and from the oldest
        end too: newest first, the oldest would otherwise stay open until the server closes them."""
        now = self._clock()
        idle = self._idle
        while idle and (not idle[0].usable or now - idle[0].idle_since >= self._keepalive):
            stale = idle.pop(0)
            stale.close()
            self._open.discard(stale)
        while self._idle:
            conn = self._idle.pop()
            if conn.usable and now - conn.idle_since < self._keepalive:
                return conn
            conn.close()
            self._open.discard(conn)
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(
            _Connection, self.host, self.port, ssl=self._ssl, server_hostname=self.host if self._ssl else None
        )
        if self._closed:
            conn.close()
            raise ConnectionAbortedError("the pool was closed")
        self._open.add(conn)
        self.opened += 1
        if self._on_open is not None:
            self._on_open()
        return conn

    @property
    def idle(self) -> int:
        """Idle connections held (stale ones included until the next request sees them)."""
        return len(self._idle)

    def close(self) -> None:
        """Close every connection, idle or in use (a request in flight fails with ``ConnectionError``), and
        any a request is opening; the pool sends nothing more."""
        self._closed = True
        for conn in list(self._open):
            conn.close()
        self._open.clear()
        self._idle.clear()
