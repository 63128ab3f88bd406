"""client-go's REST client metrics, for every request of a ``common.kube.KubeClient`` (watches included):
``rest_client_requests_total{code,method,host}`` and ``rest_client_request_duration_seconds{verb,host}``,
with client-go's names, labels and meaning, so dashboards built for Kubernetes components read them as they
are. A request that got no response counts under ``code="<error>"``; the duration runs from sending the
request to the response headers (for a watch, until the stream opened). Not client-go's, hence our prefix:
``agent_scheduler_api_connections_opened_total``, the connections (TCP and TLS handshakes) opened to the API
server; it rises during a burst when the pool was not held warm (``KubeClient.keep_warm``).

Observed by an aiohttp trace (``trace()``), so nothing on the request path calls into this module.
Cardinality: one host per process, a handful of methods and codes.
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


def trace() -> aiohttp.TraceConfig:
    """The trace that observes each request of a session."""
    # Label children resolved once per label set (``labels()`` costs a locked lookup on every request; a
    # worker sends two requests per pod it places). Few keys: one host, a handful of methods and codes.
    counters: dict[tuple[int, str, str], Any] = {}
    durations: dict[tuple[str, str], Any] = {}

    async def start(_: object, ctx: object, params: aiohttp.TraceRequestStartParams) -> None:
        ctx.started = time.monotonic()  # type: ignore[attr-defined]

    async def end(_: object, ctx: object, params: aiohttp.TraceRequestEndParams) -> None:
        host = _host(params.url)
        status, method = params.response.status, params.method
        counter = counters.get((status, method, host))
        if counter is None:
            counter = counters[(status, method, host)] = requests.labels(str(status), method, host)
        counter.inc()
        started = getattr(ctx, "started", None)
        if started is not None:
            duration = durations.get((method, host))
            if duration is None:
                duration = durations[(method, host)] = request_duration.labels(method, host)
            duration.observe(time.monotonic() - started)

    async def failed(_: object, ctx: object, params: aiohttp.TraceRequestExceptionParams) -> None:
        requests.labels("<error>", params.method, _host(params.url)).inc()

    async def opened(_: object, __: object, ___: aiohttp.TraceConnectionCreateEndParams) -> None:
        connections_opened.inc()

    config = aiohttp.TraceConfig()
    config.on_connection_create_end.append(opened)
    config.on_request_start.append(start)
    config.on_request_end.append(end)
    config.on_request_exception.append(failed)
    return config
