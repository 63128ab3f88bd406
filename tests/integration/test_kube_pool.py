"""The API client's connection pool against the real kube-apiserver: held warm through a quiet spell.

A burst of bindings after a minute without any used to open its connections first (a TCP and a TLS handshake
each, on both sides); ``KubeClient.keep_warm`` holds them open, and a worker holds as many as it binds at once
from its start.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from urllib.parse import urlparse

import psutil
import pytest
from prometheus_client import REGISTRY

from common.kube import KubeClient, NotFound, ServerError
from scale.cluster import Cluster
from tests.integration.support import start_worker

pytestmark = pytest.mark.integration

KEEPALIVE = 1.0  # seconds: a quiet spell of a few of these closes every idle connection nobody holds warm
CONNECTIONS = 8


def _opened() -> float:
    return REGISTRY.get_sample_value("agent_scheduler_api_connections_opened_total") or 0.0


async def _burst(client: KubeClient) -> float:
    """Connections ``client`` opened for ``CONNECTIONS`` concurrent requests through its write pool, the one
    bindings take (a GET of ``/version`` there, as ``keep_warm`` sends, writes nothing)."""
    before = _opened()
    await asyncio.gather(*(client.request("GET", "/version", pooled=True) for _ in range(CONNECTIONS)))
    return _opened() - before


async def test_keep_warm_holds_the_pool_open_through_a_quiet_spell(cluster: Cluster) -> None:
    cold = KubeClient(cluster.credentials(), keepalive=KEEPALIVE)
    warm = KubeClient(cluster.credentials(), keepalive=KEEPALIVE)
    try:
        assert await _burst(cold) == CONNECTIONS  # a new pool opens one connection per concurrent request
        held = asyncio.create_task(warm.keep_warm(CONNECTIONS))
        # quiet: the cold pool's connections expire, the warm one's are used
        await asyncio.sleep(4 * KEEPALIVE)
        # stopped before the burst, so its own requests do not hold the connections the burst would take
        held.cancel()
        assert await _burst(warm) == 0
        assert await _burst(cold) == CONNECTIONS
    finally:
        await cold.close()
        await warm.close()


async def test_a_worker_holds_its_binding_connections_open_before_any_pod(
    cluster: Cluster, tmp_path: Path
) -> None:
    worker = start_worker(cluster, tmp_path, f"agent-test-{uuid.uuid4().hex[:6]}")
    port = urlparse(cluster.credentials().server).port
    held = 0
    try:
        process = psutil.Process(worker.pid)
        for _ in range(300):  # a guard against hanging, not a speed requirement
            held = sum(
                1
                for c in process.net_connections(kind="tcp")
                if c.status == psutil.CONN_ESTABLISHED and c.raddr and c.raddr.port == port
            )
            if held >= 128:
                break
            await asyncio.sleep(0.1)
    finally:
        assert worker.stop() == 0, worker.tail()
    # the default is --bind-concurrency (128); its watches alone hold about ten
    assert held >= 128, (held, worker.tail())


async def test_a_text_reply_is_read_through_the_same_client(cluster: Cluster) -> None:
    """``/metrics`` answers in Prometheus text, not JSON: ``get_text`` reads it with the client's token and
    TLS, and an error still maps to the client's error classes."""
    async with KubeClient(cluster.credentials()) as client:
        text = await client.get_text("/metrics")
        assert "# TYPE apiserver_request_total counter" in text
        with pytest.raises(NotFound):
            await client.get_text("/metrics-that-do-not-exist")
        with pytest.raises(ServerError, match="not JSON"):
            await client.get("/metrics")  # a JSON request of the same path says what it got
