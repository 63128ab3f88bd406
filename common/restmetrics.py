"""client-go's REST client metrics, for every request of a ``common.kube.KubeClient`` (watches included):
``rest_client_requests_total{code,method,host}`` and ``rest_client_request_duration_seconds{verb,host}``,
with client-go's names, labels and meaning, so dashboards built for Kubernetes components read them as they
are. A request that got no response counts under ``code="<error>"``; the duration runs from sending the
request to the response headers (for a watch, until the stream opened). Not client-go's, hence our prefix:
``agent_scheduler_api_connections_opened_total``, the connections (TCP and TLS handshakes) opened to the API
server; it rises during a burst when the pool was not held warm (``KubeClient.keep_warm``).

Requests through aiohttp (reads and watches) are observed by its trace (``trace()``); those through
``common.apiconn`` (the writes, and ``keep_warm``'s ``GET /version``) by ``KubeClient`` calling ``observed``,
``failed`` and ``opened``, with the duration running to the whole reply (each such reply is one small
object, so the two measures differ by its transfer) and a request its caller gave up on (cancelled) counted
as ``<error>``, as aiohttp's trace counts it. Cardinality: one host per process, a handful of methods and
codes.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
from prometheus_client import Counter, Histogram

_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60)

requests = Counter(
    "rest_client_requests",
    "Number of HTTP requests to the API server, partitioned by status code, method, and host.",
    ["code", "method", "host"],
)
request_duration = Histogram(
    "rest_client_request_duration_seconds",
    "Request latency in seconds, broken down by verb and host.",
    ["verb", "host"],
    buckets=_BUCKETS,
)

connections_opened = Counter(
    "agent_scheduler_api_connections_opened",
    "Connections opened to the API server (each a TCP and TLS handshake).",
)


def _host(url: object) -> str:
    authority = getattr(url, "raw_authority", None) or getattr(url, "host", None)
    return str(authority or "")


# Label children resolved once per label set (``labels()`` costs a locked lookup on every request; a worker
# sends two requests per pod it places). Few keys: one host, a handful of methods and codes.
_counters: dict[tuple[str, str, str], Any] = {}
_durations: dict[tuple[str, str], Any] = {}


def _counter(code: str, method: str, host: str) -> Any:
    key = (code, method, host)
    counter = _counters.get(key)
    if counter is None:
        counter = _counters[key] = requests.labels(*key)
    return counter


def observed(status: int, method: str, host: str, seconds: float | None) -> None:
    """A request answered with ``status`` after ``seconds`` (None: not known)."""
    _counter(str(status), method, host).inc()
    if seconds is not None:
        duration = _durations.get((method, host))
        if duration is None:
            duration = _durations[(method, host)] = request_duration.labels(method, host)
        duration.observe(seconds)


def failed(method: str, host: str) -> None:
    """A request that got no response."""
    _counter("<error>", method, host).inc()


def opened() -> None:
    """A connection (a TCP and a TLS handshake) opened to the API server."""
    connections_opened.inc()


def trace() -> aiohttp.TraceConfig:
    """The trace that observes each request of an aiohttp session."""

    async def start(_: object, ctx: object, params: aiohttp.TraceRequestStartParams) -> None:
        ctx.started = time.monotonic()  # type: ignore[attr-defined]

    async def end(_: object, ctx: object, params: aiohttp.TraceRequestEndParams) -> None:
        started = getattr(ctx, "started", None)
        elapsed = None if started is None else time.monotonic() - started
        observed(params.response.status, params.method, _host(params.url), elapsed)

    async def exception(_: object, ctx: object, params: aiohttp.TraceRequestExceptionParams) -> None:
        failed(params.method, _host(params.url))

    async def connection(_: object, __: object, ___: aiohttp.TraceConnectionCreateEndParams) -> None:
        opened()

    config = aiohttp.TraceConfig()
    config.on_connection_create_end.append(connection)
    config.on_request_start.append(start)
    config.on_request_end.append(end)
    config.on_request_exception.append(exception)
    return config
