"""Leader election against a real etcd: one leader, standby takeover, step-down on fencing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from etcd3aio import Etcd3Client

from common.aiotools import cancel_and_wait
from common.etcd.keys import KeyLayout
from common.etcd.kv import connect, lease_service
from common.etcd.schema import LeaderRecord
from coordinator.leadership.election import LeaderElection, LeaderTerm, current_leader, run_as_leader
from tests.integration.etcd.etcd_harness import TTL, eventually

pytestmark = pytest.mark.integration


async def _candidates(
    endpoint: str, keys: KeyLayout, *names: str
) -> list[tuple[Etcd3Client, LeaderElection]]:
    out: list[tuple[Etcd3Client, LeaderElection]] = []
    for name in names:
        client = await connect([endpoint])
        out.append((client, LeaderElection(client, LeaderRecord(name), keys=keys, ttl=TTL)))
    return out


async def test_one_leader_and_takeover_when_its_lease_is_revoked(
    etcd_endpoint: str, keys: KeyLayout, etcd: Etcd3Client
) -> None:
    (ca, a), (cb, b) = await _candidates(etcd_endpoint, keys, "a", "b")
    ta = asyncio.create_task(a.run())
    term_a = await asyncio.wait_for(a.wait_term(), 5)
    tb = asyncio.create_task(b.run())
    lost: list[LeaderTerm] = []
    a.on_lost(lost.append)
    try:
        await asyncio.sleep(0.5)
        assert a.leading and not b.leading
        assert (await current_leader(etcd, keys)) == LeaderRecord("a")

        # Kill the leader's lease from outside, as an expiry would.
        await lease_service(etcd).revoke(term_a.lease_id, timeout=5)
        took = await eventually(lambda: b.leading, TTL + 2, "standby takes over")
        assert took < TTL + 2
        assert term_a.lost.is_set()
        assert lost == [term_a]
        assert not (a.leading and b.leading)
        assert (await current_leader(etcd, keys)) == LeaderRecord("b")
    finally:
        await cancel_and_wait(ta, tb)
        await ca.close()
        await cb.close()


async def test_takeover_after_a_leader_crash_waits_for_lease_expiry(
    etcd_endpoint: str, keys: KeyLayout
) -> None:
    (ca, a), (cb, b) = await _candidates(etcd_endpoint, keys, "a", "b")
    ta = asyncio.create_task(a.run())
    await asyncio.wait_for(a.wait_term(), 5)
    tb = asyncio.create_task(b.run())
    try:
        await asyncio.sleep(0.3)
        # Crash: nothing refreshes the lease any more, and nobody revokes it (closing the keeper first
        # keeps the campaign's clean-up from revoking).
        await a.keeper.close()
        await cancel_and_wait(ta)
        loop = asyncio.get_running_loop()
        crashed = loop.time()
        await eventually(lambda: b.leading, TTL + 3, "standby takes over after expiry")
        # Before the lease could expire, nobody else led (b waited), and a stopped counting itself leader
        # at once, since its lease is no longer refreshed (fencing at TTL/2 at the latest).
        assert loop.time() - crashed > TTL / 2
        assert not a.leading
    finally:
        await cancel_and_wait(ta, tb)
        await ca.close()
        await cb.close()


async def test_run_as_leader_cancels_the_body_when_leadership_ends(
    etcd_endpoint: str, keys: KeyLayout
) -> None:
    (ca, a), (cb, b) = await _candidates(etcd_endpoint, keys, "a", "b")
    started: list[str] = []
    cancelled: list[str] = []

    def body_for(name: str) -> Callable[[LeaderTerm], Coroutine[Any, Any, None]]:
        async def body(term: LeaderTerm) -> None:
            started.append(name)
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(name)
                raise

        return body

    ra = asyncio.create_task(run_as_leader(a, body_for("a")))
    await eventually(lambda: started == ["a"], 5, "a leads")
    rb = asyncio.create_task(run_as_leader(b, body_for("b")))
    try:
        await asyncio.sleep(0.3)
        assert started == ["a"]
        a.resign()
        await eventually(lambda: started == ["a", "b"], TTL + 2, "b leads after a resigns")
        assert cancelled == ["a"]
    finally:
        await cancel_and_wait(ra, rb)
        await ca.close()
        await cb.close()


async def test_lease_health_follows_the_injected_clock(etcd: Etcd3Client) -> None:
    from common.etcd.leases import LeaseKeeper, LeaseState

    now = [1000.0]
    keeper = LeaseKeeper(etcd, ttl=TTL, clock=lambda: now[0])
    await keeper.grant()
    try:
        assert keeper.healthy
        now[0] += TTL / 2  # no refresh "sent" within TTL/2 by the fake clock: fenced
        assert not keeper.healthy
        # The next real refresh is stamped with the fake clock's send time and restores health.
        await eventually(lambda: keeper.healthy, TTL, "refresh restores health")
        assert keeper.state is LeaseState.ALIVE
    finally:
        await keeper.revoke()
    assert keeper.state is LeaseState.REVOKED and not keeper.healthy


async def test_a_leader_whose_work_fails_steps_down_and_a_standby_takes_over(
    etcd_endpoint: str, keys: KeyLayout, etcd: Etcd3Client
) -> None:
    (ca, a), (cb, b) = await _candidates(etcd_endpoint, keys, "a", "b")
    terms: list[str] = []

    async def failing(term: LeaderTerm) -> None:
        terms.append("a")
        raise RuntimeError("the NodeShard CRD vanished")

    async def working(term: LeaderTerm) -> None:
        terms.append("b")
        await asyncio.Event().wait()

    ra = asyncio.create_task(run_as_leader(a, failing))
    await eventually(lambda: a.step_downs == 1, 5, "a steps down after its work failed")
    rb = asyncio.create_task(run_as_leader(b, working))
    try:
        # a keeps failing and stepping down; once b has campaigned it wins the next election and keeps it.
        took = await eventually(lambda: b.leading, 5 + TTL, "b leads")
        assert terms[-1] == "b" and not a.leading
        await asyncio.sleep(1.5)
        assert b.leading and (await current_leader(etcd, keys)) == LeaderRecord("b")
        # a campaigns again and stands by behind b, a healthy standby.
        await eventually(lambda: a.standing_by, 40, "a stands by")
        assert took < 5 + TTL
    finally:
        await cancel_and_wait(ra, rb)
        await ca.close()
        await cb.close()


async def test_a_leader_whose_progress_stalls_steps_down(etcd_endpoint: str, keys: KeyLayout) -> None:
    (ca, a), (cb, b) = await _candidates(etcd_endpoint, keys, "a", "b")
    rounds = [0]

    async def stuck(term: LeaderTerm) -> None:
        from coordinator.leadership.progress import advancing

        term.progress.add("shard map rounds", advancing(lambda: rounds[0]), bound=1.0)
        await asyncio.Event().wait()  # holds the lease, never completes a round

    async def working(term: LeaderTerm) -> None:
        await asyncio.Event().wait()

    ra = asyncio.create_task(run_as_leader(a, stuck, check_interval=0.1))
    await eventually(lambda: a.leading, 5, "a leads")
    rb = asyncio.create_task(run_as_leader(b, working, check_interval=0.1))
    try:
        took = await eventually(lambda: b.leading, 5, "b leads after a stalled")
        assert a.step_downs == 1 and not a.leading
        assert took < 5
    finally:
        await cancel_and_wait(ra, rb)
        await ca.close()
        await cb.close()
