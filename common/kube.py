"""The one adapter between this project and the Kubernetes API server.

Everything that talks to the API server goes through ``KubeClient``: raw JSON in and out over one kept-alive
aiohttp connection pool, so the scheduling path never builds typed client models. The ``kubernetes`` package is
used only here, and only to load kubeconfig / in-cluster credentials the way every Kubernetes tool does.

Invariants:
- HTTP failures are mapped once, here, to the exception classes below; callers never inspect status codes.
- A client-side token bucket (``qps``/``burst``) bounds request rate, like client-go's rate limiter.
- Watches yield ``(event_type, object)`` pairs; a 410 Gone (initial or mid-stream) raises ``Gone`` so that the
  caller relists (see ``common.watching``).
- A watch reads events of up to ``MAX_WATCH_EVENT`` bytes (one JSON line each) with memory bounded by that
  size. A longer event raises ``EventTooLarge`` without being buffered whole: the caller cannot know what it
  said, so it relists (a list is read whole and has no such bound). A line that is not a JSON watch event is a
  broken stream (``ServerError``), like a dropped connection. Nothing else escapes: every failure of a request
  or a watch is one of the ``ApiError`` classes.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp.http_exceptions import HttpProcessingError
from kubernetes import client, config  # used for credential loading only, never on the hot path

log = logging.getLogger(__name__)

# The largest watch event read. The API server refuses request bodies over 3 MiB (its MaxRequestBodyBytes) and
# etcd values over its --max-request-bytes (1.5 MiB by default, raised by some clusters to a few MiB), so
# no stored object reaches this; the JSON of an event adds its envelope and escaping to the object's size,
# hence the margin. aiohttp's own line limit (twice its 64 KiB read buffer) is far below real objects.
MAX_WATCH_EVENT = 16 * 1024 * 1024


class ApiError(Exception):
    """Raised for an API request that failed; ``status`` is the HTTP status (0 when none came back)."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}" if reason else f"{status}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NotFound(ApiError):
    """404: the object (or the pod being bound) does not exist."""


class Conflict(ApiError):
    """409: already exists, already bound, or a resourceVersion precondition failed."""


class Gone(ApiError):
    """410: the resourceVersion a watch asked for is too old; relist."""


class TooManyRequests(ApiError):
    """429: the API server's flow control refused the request; retry after a backoff."""


class ServerError(ApiError):
    """5xx, a timeout or a broken connection: transient, retry with backoff."""


class Invalid(ApiError):
    """400/422: the request body is wrong; retrying will not help."""


class EventTooLarge(ApiError):
    """A watch event longer than ``MAX_WATCH_EVENT``: skipped unread, so the watcher must relist."""


# Failures of the transport below HTTP status codes: aiohttp raises ``HttpProcessingError`` (e.g. a header
# line too long) outside its ``ClientError`` hierarchy.
_TRANSPORT_ERRORS = (aiohttp.ClientError, HttpProcessingError, TimeoutError)


def _error_for(status: int, body: bytes) -> ApiError:
    reason, message = "", body[:500].decode("utf-8", "replace")
    try:
        parsed = orjson.loads(body)
        if isinstance(parsed, dict):
            reason = str(parsed.get("reason") or "")
            message = str(parsed.get("message") or message)
    except orjson.JSONDecodeError:
        pass
    cls: type[ApiError]
    if status == 404:
        cls = NotFound
    elif status == 409:
        cls = Conflict
    elif status == 410:
        cls = Gone
    elif status == 429:
        cls = TooManyRequests
    elif status >= 500:
        cls = ServerError
    elif status in (400, 422):
        cls = Invalid
    else:
        cls = ApiError
    return cls(status, message, reason)


@dataclass(frozen=True, slots=True)
class Credentials:
    """Where the API server is and how to authenticate to it."""

    server: str
    token: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True


def load_credentials(kubeconfig: str | None) -> Credentials:
    """Credentials from a kubeconfig file, or from the pod's service account when ``kubeconfig`` is None."""
    cfg = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    auth = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
    token = None
    if auth:
        token = auth.split(" ", 1)[1] if auth.lower().startswith("bearer ") else auth
    return Credentials(
        server=str(cfg.host).rstrip("/"),
        token=token,
        ca_file=cfg.ssl_ca_cert,
        cert_file=cfg.cert_file,
        key_file=cfg.key_file,
        verify=bool(cfg.verify_ssl),
    )


class TokenBucket:
    """Client-side rate limit: ``qps`` tokens a second, at most ``burst`` saved up."""

    def __init__(self, qps: float, burst: int) -> None:
        self.qps = qps
        self.burst = max(1, burst)
        self._tokens = float(self.burst)
        self._stamp = time.monotonic()

    async def take(self) -> None:
        if self.qps <= 0:
            return
        while True:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.qps)
            self._stamp = now
            if self._tokens >= 1:
                self._tokens -= 1
                return
            await asyncio.sleep((1 - self._tokens) / self.qps)


class KubeClient:
    """Async raw-JSON client. Create inside a running event loop; ``close()`` when done."""

    def __init__(
        self,
        creds: Credentials,
        *,
        qps: float = 2000.0,
        burst: int = 2000,
        max_connections: int = 128,
        request_timeout: float = 30.0,
        user_agent: str = "agent-scheduler",
    ) -> None:
        self.creds = creds
        self._limiter = TokenBucket(qps, burst)
        self._timeout = request_timeout
        ssl_ctx: ssl.SSLContext | bool
        if creds.server.startswith("https"):
            ssl_ctx = ssl.create_default_context(cafile=creds.ca_file)
            if creds.cert_file and creds.key_file:
                ssl_ctx.load_cert_chain(creds.cert_file, creds.key_file)
            if not creds.verify:
                ssl_ctx.check_hostname = False
                ssl_ctx.verify_mode = ssl.CERT_NONE
        else:
            ssl_ctx = False
        headers = {"User-Agent": user_agent, "Accept": "application/json"}
        if creds.token:
            headers["Authorization"] = f"Bearer {creds.token}"
        self._session = aiohttp.ClientSession(
            base_url=None,
            headers=headers,
            connector=aiohttp.TCPConnector(limit=max_connections, ssl=ssl_ctx, keepalive_timeout=60),
            json_serialize=lambda o: orjson.dumps(o).decode(),
        )

    async def close(self) -> None:
        await self._session.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> Any:
        """One request; returns the decoded JSON reply (or None for an empty one)."""
        await self._limiter.take()
        data = orjson.dumps(body) if body is not None else None
        headers = {"Content-Type": content_type} if data is not None else None
        try:
            async with self._session.request(
                method,
                self.creds.server + path,
                params=params,
                data=data,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout or self._timeout),
            ) as resp:
                raw = await resp.read()
                if resp.status >= 300:
                    raise _error_for(resp.status, raw)
        except _TRANSPORT_ERRORS as e:
            raise ServerError(0, f"{method} {path}: {type(e).__name__}: {e}") from e
        try:
            return orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError as e:
            raise ServerError(resp.status, f"{method} {path}: the reply is not JSON: {e}") from e

    async def get(self, path: str, params: dict[str, str] | None = None) -> Any:
        return await self.request("GET", path, params=params)

    async def post(self, path: str, body: Any, params: dict[str, str] | None = None) -> Any:
        return await self.request("POST", path, body=body, params=params)

    async def put(self, path: str, body: Any) -> Any:
        return await self.request("PUT", path, body=body)

    async def delete(self, path: str, params: dict[str, str] | None = None) -> Any:
        return await self.request("DELETE", path, params=params)

    async def patch(self, path: str, body: Any, *, kind: str = "merge") -> Any:
        content_type = {
            "merge": "application/merge-patch+json",
            "strategic": "application/strategic-merge-patch+json",
            "json": "application/json-patch+json",
        }[kind]
        return await self.request("PATCH", path, body=body, content_type=content_type)

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        """POST the pod's binding subresource. 409 means already bound or gone; 404 means deleted."""
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid} if uid else {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self.post(f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body)

    async def watch(
        self,
        path: str,
        *,
        resource_version: str,
        timeout_seconds: int = 300,
        params: dict[str, str] | None = None,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Stream watch events from ``resource_version``. Raises ``Gone`` when it is too old."""
        query = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
            **(params or {}),
        }
        await self._limiter.take()
        try:
            async with self._session.get(
                self.creds.server + path,
                params=query,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_seconds + 30),
            ) as resp:
                if resp.status >= 300:
                    raise _error_for(resp.status, await resp.read())
                async for line in _lines(resp.content, MAX_WATCH_EVENT, path):
                    if line.strip():
                        yield _event(line, path)
        except _TRANSPORT_ERRORS as e:
            raise ServerError(0, f"watch {path}: {type(e).__name__}: {e}") from e


async def _lines(content: aiohttp.StreamReader, limit: int, path: str) -> AsyncIterator[bytes]:
    """The newline-separated lines of a stream, each of at most ``limit`` bytes. Linear in the bytes read (a
    long line is joined once, not re-copied per chunk); a longer line raises ``EventTooLarge`` once ``limit``
    bytes of it are buffered."""
    buf = bytearray()
    async for chunk in content.iter_any():
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if len(buf) + end - start > limit:
                raise EventTooLarge(0, f"watch {path}: an event of more than {limit} bytes")
            if buf:
                buf += memoryview(chunk)[start:end]
                line = bytes(buf)
                buf.clear()
            else:
                line = chunk[start:end]
            yield line
            start = end + 1
        buf += memoryview(chunk)[start:]
        if len(buf) > limit:
            raise EventTooLarge(0, f"watch {path}: an event of more than {limit} bytes")
    if buf:
        yield bytes(buf)


def _event(line: bytes, path: str) -> tuple[str, dict[str, Any]]:
    """One watch event, or the error the API server put in the stream. A line that is not a watch event
    means the stream is broken: ``ServerError``, so the watcher reconnects from its last version."""
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        raise ServerError(0, f"watch {path}: an event that is not JSON: {e}") from e
    obj = event.get("object") if isinstance(event, dict) else None
    kind = event.get("type") if isinstance(event, dict) else None
    if not isinstance(kind, str) or not isinstance(obj, dict):
        raise ServerError(0, f"watch {path}: a line that is not a watch event: {line[:200]!r}")
    if kind == "ERROR":
        code = obj.get("code")
        raise _error_for(code if isinstance(code, int) and 100 <= code <= 599 else 500, orjson.dumps(obj))
    return kind, obj
