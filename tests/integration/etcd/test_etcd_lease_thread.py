"""The lease keeper refreshes from a thread of its own: a blocked caller loop neither loses the lease nor
acts on a stale one. Real etcd (the session server)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from etcd3aio import Etcd3Client

from common.etcd.kv import lease_remaining
from common.etcd.leases import LeaseKeeper, LeaseState

pytestmark = pytest.mark.integration

TTL = 2


def busy(seconds: float) -> None:
    """Hold the loop (and compete for the GIL) without yielding."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(1000))


async def test_a_blocked_loop_does_not_starve_the_refreshes(etcd: Etcd3Client) -> None:
    keeper = LeaseKeeper(etcd, ttl=TTL, name="blocked")
    lease = await keeper.grant()
    try:
        before = keeper.fence_deadline
        busy(2 * TTL)  # the caller's loop is stuck in pure-Python work (a costly pod, say) for 2 x TTL
        # Refreshes went on meanwhile: the deadline moved, the lease is alive in etcd and still healthy.
        assert keeper.fence_deadline > before + TTL
        assert keeper.healthy and keeper.state is LeaseState.ALIVE
        assert await lease_remaining(etcd, lease) > 0
        assert keeper.refreshes >= 4
        assert any(t.name.startswith("lease-blocked") for t in threading.enumerate())
    finally:
        await keeper.revoke()
    assert not any(t.name.startswith("lease-blocked") for t in threading.enumerate())


async def test_health_is_read_from_the_refresh_times_not_from_the_loop(etcd: Etcd3Client) -> None:
    """With refreshes frozen (as in a paused process or an etcd that stopped answering), a caller whose
    loop was blocked past the deadline finds itself fenced the moment it looks, before any timer ran."""
    now = [1000.0]
    keeper = LeaseKeeper(etcd, ttl=TTL, name="frozen", clock=lambda: now[0])
    await keeper.grant()
    try:
        assert keeper.healthy
        assert keeper.fence_deadline == 1000.0 + TTL / 2
        now[0] += TTL / 2  # no timer has run: the property itself says fenced
        assert not keeper.healthy
    finally:
        await keeper.revoke()
    assert keeper.fence_deadline == float("-inf")


async def test_lost_lease_is_reported_on_the_callers_loop(etcd: Etcd3Client) -> None:
    keeper = LeaseKeeper(etcd, ttl=TTL, name="lost")
    lease = await keeper.grant()
    changes: list[bool] = []
    keeper.add_listener(changes.append)
    loop = asyncio.get_running_loop()
    seen_on: list[asyncio.AbstractEventLoop] = []
    keeper.add_listener(lambda _h: seen_on.append(asyncio.get_running_loop()))
    try:
        await etcd.lease.revoke(lease)  # type: ignore[union-attr]  # behind the keeper's back
        await asyncio.wait_for(keeper.wait_lost(), TTL * 2)
        assert keeper.state is LeaseState.LOST and not keeper.healthy
        assert changes == [False] and seen_on == [loop]
    finally:
        await keeper.close()
