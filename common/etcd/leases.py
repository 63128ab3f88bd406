"""Lease keeping with a fencing rule: know when we may still act on what our lease protects.

A worker's nodes, and the leader's authority, are tied to an etcd lease. etcd expires a lease TTL seconds
after its last refresh; after that the leader may hand our nodes to someone else. The keeper refreshes the
lease every TTL/6 and answers ``healthy``, which is True only while a refresh *sent* less than TTL/2 ago
succeeded.

Why TTL/2 from the send time: etcd resets the TTL somewhere between our send and our receipt, so the lease
lives at least until ``send + TTL``. Stopping at ``send + TTL/2`` leaves TTL/2 of margin for clock-rate
differences, scheduling delays and in-flight work. This is the fencing rule: a holder that has not heard
from etcd for TTL/2 stops using what the lease protects before anybody else can be given it.

States: IDLE (no lease yet) -> ALIVE -> LOST (etcd says the lease no longer exists: expired or revoked)
or REVOKED (we gave it up) or CLOSED (we stopped refreshing; etcd will expire it). ``grant()`` may be called
again from any state to start over with a new lease (re-registration after LOST).

Time comes from an injected monotonic clock, so the health rule is unit-testable without sleeping.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from etcd3aio import Etcd3Client

from common.aiotools import cancel_and_wait
from common.etcd.kv import DEFAULT_TIMEOUT, ETCD_FAILURES, describe, keepalive_once, lease_service

log = logging.getLogger(__name__)

Clock = Callable[[], float]

MIN_TTL = 2  # etcd's own floor (1.5 x election timeout, rounded up); it silently raises smaller TTLs
REVOKE_TIMEOUT = 2.0  # short: revoking is a courtesy, expiry is the guarantee
REFRESHES_PER_TTL = 6  # 3 attempts fit in the TTL/2 fencing window, so one lost refresh does not fence


class LeaseState(enum.Enum):
    IDLE = "idle"
    ALIVE = "alive"
    LOST = "lost"
    REVOKED = "revoked"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class LeaseStats:
    lease_id: int
    state: LeaseState
    healthy: bool
    since_refresh: float  # seconds since the send time of the last successful refresh
    refreshes: int
    failures: int
    grants: int


class LeaseKeeper:
    """Grants one lease at a time and keeps it alive in a background task."""

    def __init__(
        self, client: Etcd3Client, *, ttl: int, name: str = "lease", clock: Clock = time.monotonic
    ) -> None:
        if ttl < MIN_TTL:
            raise ValueError(f"lease ttl must be at least {MIN_TTL} s (etcd's minimum), got {ttl}")
        self._client = client
        self.ttl = ttl
        self.name = name
        self._clock = clock
        self._lease_id = 0
        self._state = LeaseState.IDLE
        self._fence_after = ttl / 2
        self._last_ok = float("-inf")  # send time of the last successful grant/refresh
        self._task: asyncio.Task[None] | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._unhealthy_event = asyncio.Event()
        self._unhealthy_event.set()
        self._lost_event = asyncio.Event()
        self._listeners: list[Callable[[bool], None]] = []
        self._was_healthy = False
        self.refreshes = 0
        self.failures = 0
        self.grants = 0

    # ---- queries (synchronous, cheap: ``healthy`` is on the scheduling hot path) ----

    @property
    def lease_id(self) -> int:
        """The current lease, 0 before the first grant."""
        return self._lease_id

    @property
    def state(self) -> LeaseState:
        return self._state

    @property
    def healthy(self) -> bool:
        """True while the lease is ALIVE and a refresh sent less than TTL/2 ago succeeded."""
        return self._state is LeaseState.ALIVE and self._clock() - self._last_ok < self._fence_after

    def statistics(self) -> LeaseStats:
        return LeaseStats(
            self._lease_id,
            self._state,
            self.healthy,
            self._clock() - self._last_ok,
            self.refreshes,
            self.failures,
            self.grants,
        )

    def add_listener(self, callback: Callable[[bool], None]) -> Callable[[], None]:
        """Call ``callback(healthy)`` on every health change; returns a function that unsubscribes."""
        self._listeners.append(callback)
        return lambda: self._listeners.remove(callback)

    async def wait_unhealthy(self) -> None:
        """Return as soon as ``healthy`` turns False (immediately if it is False)."""
        await self._unhealthy_event.wait()

    async def wait_lost(self) -> None:
        """Return once etcd has told us the lease is gone."""
        await self._lost_event.wait()

    # ---- actions ----

    async def grant(self) -> int:
        """Grant a fresh lease and start refreshing it; the previous lease, if any, is abandoned."""
        await self._stop_refreshing()
        sent = self._clock()
        resp = await lease_service(self._client).grant(self.ttl, timeout=DEFAULT_TIMEOUT)
        granted_ttl = int(resp.TTL)
        if granted_ttl <= 0:
            raise RuntimeError(f"{self.name}: etcd granted a lease with TTL {granted_ttl}: {resp.error}")
        self._lease_id = int(resp.ID)
        # Fence on the smaller of asked and granted TTL: what we promised the rest of the system.
        self._fence_after = min(self.ttl, granted_ttl) / 2
        self._state = LeaseState.ALIVE
        self._lost_event.clear()
        self.grants += 1
        self._refreshed(sent)
        self._task = asyncio.create_task(self._refresh_loop(), name=f"lease-{self.name}-{self._lease_id:x}")
        log.info("%s: granted lease %x (ttl %d s)", self.name, self._lease_id, granted_ttl)
        return self._lease_id

    async def revoke(self) -> bool:
        """Stop refreshing and revoke the lease (its keys vanish now). False if etcd could not be told."""
        await self._stop_refreshing()
        lease_id = self._lease_id
        if self._state is not LeaseState.ALIVE:
            return self._state is LeaseState.REVOKED
        self._set_state(LeaseState.REVOKED)
        try:
            await lease_service(self._client).revoke(lease_id, timeout=REVOKE_TIMEOUT)
        except ETCD_FAILURES as e:
            # Not fatal: the lease expires by itself within TTL; until then our keys look alive.
            log.warning(
                "%s: could not revoke lease %x (%s); it expires within %d s",
                self.name,
                lease_id,
                describe(e),
                self.ttl,
            )
            return False
        return True

    async def close(self) -> None:
        """Stop refreshing without revoking; etcd expires the lease within TTL (how a crash looks outside)."""
        await self._stop_refreshing()
        if self._state is LeaseState.ALIVE:
            self._set_state(LeaseState.CLOSED)

    # ---- internals ----

    async def _stop_refreshing(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    async def _refresh_loop(self) -> None:
        lease_id = self._lease_id
        interval = max(self.ttl / REFRESHES_PER_TTL, 0.1)
        failing = False
        while True:
            await asyncio.sleep(interval)
            sent = self._clock()
            try:
                async with asyncio.timeout(interval):
                    remaining = await keepalive_once(self._client, lease_id)
            except ETCD_FAILURES as e:
                self.failures += 1
                # Warn once per outage; the fencing itself is reported by the health change.
                log.log(
                    logging.DEBUG if failing else logging.WARNING,
                    "%s: refresh of lease %x failed: %s",
                    self.name,
                    lease_id,
                    describe(e),
                )
                failing = True
                continue
            failing = False
            if remaining <= 0:
                log.warning("%s: lease %x is gone (expired or revoked)", self.name, lease_id)
                self._set_state(LeaseState.LOST)
                return
            self.refreshes += 1
            self._refreshed(sent)

    def _refreshed(self, sent: float) -> None:
        self._last_ok = max(self._last_ok, sent)
        self._arm_deadline()
        self._check_health()

    def _arm_deadline(self) -> None:
        """Schedule a health check for the moment the fencing window closes."""
        if self._deadline is not None:
            self._deadline.cancel()
        delay = max(self._last_ok + self._fence_after - self._clock(), 0.0)
        self._deadline = asyncio.get_running_loop().call_later(delay, self._on_deadline)

    def _on_deadline(self) -> None:
        self._deadline = None
        self._check_health()
        if self._was_healthy:
            self._arm_deadline()  # an injected clock had not reached the deadline yet

    def _check_health(self) -> None:
        healthy = self.healthy
        if healthy == self._was_healthy:
            return
        self._was_healthy = healthy
        if healthy:
            self._unhealthy_event.clear()
            log.info("%s: lease %x healthy", self.name, self._lease_id)
        else:
            self._unhealthy_event.set()
            log.warning("%s: lease %x unusable (%s): fenced", self.name, self._lease_id, self._state.value)
        for callback in list(self._listeners):
            callback(healthy)

    def _set_state(self, state: LeaseState) -> None:
        self._state = state
        if state is LeaseState.LOST:
            self._lost_event.set()
        self._check_health()
