"""Fencing against a real etcd that goes away: workers stop owning within TTL/2, and resume after it
comes back (same lease if it survived, a new registration if not). Each test has its own etcd."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator

import pytest

from common.etcd.keys import KeyLayout
from tests.integration.etcd.etcd_harness import TTL, ShardCluster, eventually, node_names
from tests.integration.etcd_server import EtcdServer

pytestmark = pytest.mark.integration

MARGIN = 0.5  # scheduling slack on top of the TTL/2 fencing window
RECOVERY = 20.0  # generous: etcd restart, gRPC reconnect, re-election, a few shard-map rounds


@pytest.fixture
async def private_cluster(private_etcd: EtcdServer) -> AsyncIterator[ShardCluster]:
    c = ShardCluster(private_etcd.endpoint, KeyLayout())
    try:
        yield c
    finally:
        await c.close()
        assert not c.log.violations, c.log.violations[:5]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["stop", "kill"])
async def test_etcd_down_fences_workers_and_restart_resumes_ownership(
    private_etcd: EtcdServer, private_cluster: ShardCluster, sig: int
) -> None:
    cluster = private_cluster
    cluster.pool.set(node_names(6))
    await cluster.start_leader("coordinator-0")
    w1 = await cluster.start_worker("w1")
    w2 = await cluster.start_worker("w2")
    await eventually(lambda: cluster.fully_assigned() and len(w1.owned()) == 3, 10, "split")
    leases = (w1.lease_id, w2.lease_id)

    # Stop etcd in a thread: a graceful stop takes seconds (etcd drains open streams), and the event
    # loop, where the fencing happens, must keep running meanwhile.
    signalled = time.monotonic()
    await asyncio.to_thread(private_etcd.stop, sig)
    gone = time.monotonic()
    await eventually(lambda: not w1.owned() and not w2.owned(), TTL / 2 + MARGIN, "workers fenced")
    fenced = time.monotonic()
    assert fenced - gone <= TTL / 2 + MARGIN
    if sig == signal.SIGKILL:  # etcd stopped answering at the signal
        assert fenced - signalled <= TTL / 2 + MARGIN
    assert not any(w.owns(n) for w in (w1, w2) for n in node_names(6))
    await eventually(lambda: not cluster.leading(), TTL / 2 + MARGIN, "leader steps down")

    await asyncio.to_thread(private_etcd.start)
    await eventually(cluster.fully_assigned, RECOVERY, "ownership resumes after etcd is back")
    assert w1.healthy and w2.healthy
    await eventually(lambda: len(cluster.leading()) == 1, RECOVERY, "a leader again")
    # Both outcomes are legitimate: etcd restores leases on restart with a fresh TTL, but a lease can also
    # expire while etcd drains during a graceful stop; then the worker registered again under a new one.
    for worker, old in zip((w1, w2), leases, strict=True):
        assert (worker.lease_id == old) == (worker.statistics().registrations == 1)
