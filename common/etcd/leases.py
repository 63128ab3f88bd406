"""Lease keeping with a fencing rule: know when we may still act on what our lease protects.

A worker's nodes, and the leader's authority, are tied to an etcd lease. etcd expires a lease TTL seconds
after its last refresh; after that the leader may hand our nodes to someone else. The keeper refreshes the
lease every TTL/6 and answers ``healthy``, which is True only while a refresh *sent* less than TTL/2 ago
succeeded. ``fence_deadline`` is the moment (on the keeper's clock) that stops being true unless another
refresh succeeds: whoever acts under the lease bounds each action to end before it.

Why TTL/2 from the send time: etcd resets the TTL somewhere between our send and our receipt, so the lease
lives at least until ``send + TTL``. Stopping at ``send + TTL/2`` leaves TTL/2 of margin for clock-rate
differences, scheduling delays and in-flight work. This is the fencing rule: a holder that has not heard
from etcd for TTL/2 stops using what the lease protects before anybody else can be given it.

The refreshes run on a thread of their own, over a channel of their own: a *blocking* gRPC channel to the
same endpoints, with the same TLS material and token as the caller's client. (Not a second asyncio loop
with a grpc.aio channel: grpc.aio shares one completion-queue poller between all loops of a process, and
loops in several threads can steal or stall each other's events.) A caller's loop that is blocked - a long
decision, a pod that costs much CPU - therefore cannot starve the refreshes: a blocking gRPC call releases
the GIL, and pure-Python work yields it every few milliseconds. Since ``healthy`` is computed from the
refresh thread's timestamps at every read, a caller whose loop stalled past the deadline finds itself
fenced when it resumes instead of acting on a lease it may have lost. The refresh thread only stamps times
and states under a lock; events, timers and listeners stay on the caller's loop (handed over with
``call_soon_threadsafe``).

``MAX_BIND_TIME`` bounds how long an action sent under the lease may still take effect after its sender's
fencing deadline (a request the API server is still processing when its client gave up). A worker's binding
attempts never run past their fencing deadline; the leader waits this long after etcd confirmed a lease
gone before granting what it protected (``coordinator.workershards.handoff``).

States: IDLE (no lease yet) -> ALIVE -> LOST (etcd says the lease no longer exists: expired or revoked)
or REVOKED (we gave it up) or CLOSED (we stopped refreshing; etcd will expire it). ``grant()`` may be called
again from any state to start over with a new lease (re-registration after LOST).

Time comes from an injected monotonic clock, so the health rule is unit-testable without sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc  # type: ignore[import-untyped, unused-ignore]
from etcd3aio import Etcd3Client
from etcd3aio._protobuf import LeaseKeepAliveRequest, LeaseStub

from common.etcd.kv import DEFAULT_TIMEOUT, ETCD_FAILURES, describe, lease_service

log = logging.getLogger(__name__)

Clock = Callable[[], float]

MIN_TTL = 2  # etcd's own floor (1.5 x election timeout, rounded up); it silently raises smaller TTLs
REVOKE_TIMEOUT = 2.0  # short: revoking is a courtesy, expiry is the guarantee
REFRESHES_PER_TTL = 6  # 3 attempts fit in the TTL/2 fencing window, so one lost refresh does not fence
MAX_BIND_TIME = 5.0  # seconds an action sent before its fencing deadline may still take effect after it
THREAD_STOP_TIMEOUT = 5.0  # a refresh thread that does not stop is left behind (daemon), not waited for


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
    """Grants one lease at a time and keeps it alive from a refresh thread (see the module docstring)."""

    def __init__(
        self, client: Etcd3Client, *, ttl: int, name: str = "lease", clock: Clock = time.monotonic
    ) -> None:
        if ttl < MIN_TTL:
            raise ValueError(f"lease ttl must be at least {MIN_TTL} s (etcd's minimum), got {ttl}")
        self._client = client
        self.ttl = ttl
        self.name = name
        self._clock = clock
        # Guards what the refresh thread writes: lease id, state and the last successful send time.
        self._lock = threading.Lock()
        self._lease_id = 0
        self._state = LeaseState.IDLE
        self._fence_after = ttl / 2
        self._last_ok = float("-inf")  # send time of the last successful grant/refresh
        self._refresher: _Refresher | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._unhealthy_event = asyncio.Event()
        self._unhealthy_event.set()
        self._lost_event = asyncio.Event()
        self._listeners: list[Callable[[bool], None]] = []
        self._was_healthy = False
        self.refreshes = 0
        self.failures = 0
        self.grants = 0

    # ---- queries (synchronous, cheap, any thread: ``healthy`` is on the scheduling hot path) ----

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

    @property
    def fence_deadline(self) -> float:
        """When ``healthy`` turns False unless a refresh succeeds first (the keeper's clock): the send time
        of the last successful refresh + TTL/2; minus infinity when the lease is not ALIVE."""
        if self._state is not LeaseState.ALIVE:
            return float("-inf")
        return self._last_ok + self._fence_after

    @property
    def clock(self) -> Clock:
        """The clock ``fence_deadline`` is measured on."""
        return self._clock

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
        self._loop = asyncio.get_running_loop()
        sent = self._clock()
        resp = await lease_service(self._client).grant(self.ttl, timeout=DEFAULT_TIMEOUT)
        granted_ttl = int(resp.TTL)
        if granted_ttl <= 0:
            raise RuntimeError(f"{self.name}: etcd granted a lease with TTL {granted_ttl}: {resp.error}")
        with self._lock:
            self._lease_id = int(resp.ID)
            # Fence on the smaller of asked and granted TTL: what we promised the rest of the system.
            self._fence_after = min(self.ttl, granted_ttl) / 2
            self._state = LeaseState.ALIVE
            self._last_ok = max(self._last_ok, sent)
        self._lost_event.clear()
        self.grants += 1
        self._after_refresh()
        interval = max(self.ttl / REFRESHES_PER_TTL, 0.1)
        self._refresher = _Refresher(self, self._lease_id, interval)
        self._refresher.start()
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

    # ---- internals: the caller's loop ----

    async def _stop_refreshing(self) -> None:
        refresher, self._refresher = self._refresher, None
        if refresher is not None:
            await refresher.stop()
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _after_refresh(self) -> None:
        if self._state is LeaseState.ALIVE:
            self._arm_deadline()
        self._check_health()

    def _arm_deadline(self) -> None:
        """Schedule a health check for the moment the fencing window closes."""
        if self._deadline is not None:
            self._deadline.cancel()
        delay = max(self.fence_deadline - self._clock(), 0.0)
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
        with self._lock:
            self._state = state
        self._on_state()

    def _on_state(self) -> None:
        if self._state is LeaseState.LOST:
            self._lost_event.set()
        self._check_health()

    def _to_loop(self, callback: Callable[[], None]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the caller's loop is closing: nobody is left to tell
            loop.call_soon_threadsafe(callback)

    # ---- internals: called from the refresh thread ----

    def _refreshed(self, lease_id: int, sent: float) -> None:
        with self._lock:
            if lease_id != self._lease_id or self._state is not LeaseState.ALIVE:
                return  # a late answer for an abandoned lease
            self._last_ok = max(self._last_ok, sent)
            self.refreshes += 1
        self._to_loop(self._after_refresh)

    def _refresh_failed(self, lease_id: int) -> None:
        with self._lock:
            self.failures += 1

    def _gone(self, lease_id: int) -> None:
        with self._lock:
            if lease_id != self._lease_id or self._state is not LeaseState.ALIVE:
                return
            self._state = LeaseState.LOST
        self._to_loop(self._on_state)


def _blocking_channel(client: Etcd3Client) -> Any:
    """A blocking gRPC channel to ``client``'s endpoints, with its options and TLS material."""
    manager = client._manager
    options = list(manager.grpc_options)
    conn: dict[str, Any] = dict(client._conn_args)
    if conn.get("ca_cert") is not None:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=conn["ca_cert"],
            private_key=conn.get("cert_key"),
            certificate_chain=conn.get("cert_chain"),
        )
        if client._tls_server_name is not None:
            options.append(("grpc.ssl_target_name_override", client._tls_server_name))
        return grpc.secure_channel(manager.target, credentials, options=options)
    return grpc.insecure_channel(manager.target, options=options)


def _describe(error: BaseException) -> str:
    if isinstance(error, grpc.RpcError) and hasattr(error, "code"):
        return f"{error.code().name}: {error.details()}"
    return describe(error)


class _Refresher:
    """One lease's refresh loop, on a daemon thread with a blocking gRPC channel of its own."""

    def __init__(self, keeper: LeaseKeeper, lease_id: int, interval: float) -> None:
        self._keeper = keeper
        self._lease_id = lease_id
        self._interval = interval
        self._stopping = threading.Event()
        self._call: Any = None  # the keepalive call under way, cancelled by ``stop``
        self._thread = threading.Thread(
            target=self._main, name=f"lease-{keeper.name}-{lease_id:x}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    async def stop(self) -> None:
        """Stop refreshing; returns once the thread ended (or after ``THREAD_STOP_TIMEOUT``)."""
        self._stopping.set()
        call = self._call
        if call is not None:
            call.cancel()  # thread-safe; the thread sees CANCELLED and, stopping, ends
        await asyncio.to_thread(self._thread.join, THREAD_STOP_TIMEOUT)
        if self._thread.is_alive():
            log.warning("%s: refresh thread did not stop in %.0f s", self._keeper.name, THREAD_STOP_TIMEOUT)

    def _main(self) -> None:
        try:
            channel = _blocking_channel(self._keeper._client)
            try:
                self._refresh_loop(LeaseStub(channel))
            finally:
                channel.close()
        except Exception:
            # Refreshes stop; the keeper fences itself at the deadline, and etcd expires the lease.
            log.exception("%s: refresh thread failed", self._keeper.name)

    def _keepalive_once(self, stub: Any) -> int:
        """Refresh once; the TTL etcd reset the lease to, <= 0 when it is gone (``grpc.RpcError`` on failure)."""
        keeper = self._keeper
        metadata = getattr(keeper._client.lease, "_metadata", ()) or None  # the caller's auth token, if any
        responses = stub.LeaseKeepAlive(
            iter([LeaseKeepAliveRequest(ID=self._lease_id)]), timeout=self._interval, metadata=metadata
        )
        self._call = responses
        try:
            resp = next(responses, None)
        finally:
            self._call = None
            responses.cancel()
        if resp is None:
            raise _StreamClosed(f"keepalive stream for lease {self._lease_id:x} closed without a reply")
        return int(resp.TTL)

    def _refresh_loop(self, stub: Any) -> None:
        keeper, lease_id, interval = self._keeper, self._lease_id, self._interval
        failing = False
        while not self._stopping.wait(interval):
            sent = keeper.clock()
            try:
                remaining = self._keepalive_once(stub)
            except (grpc.RpcError, _StreamClosed) as e:
                if self._stopping.is_set():
                    return
                keeper._refresh_failed(lease_id)
                # Warn once per outage; the fencing itself is reported by the health change.
                log.log(
                    logging.DEBUG if failing else logging.WARNING,
                    "%s: refresh of lease %x failed: %s",
                    keeper.name,
                    lease_id,
                    _describe(e),
                )
                failing = True
                continue
            failing = False
            if remaining <= 0:
                log.warning("%s: lease %x is gone (expired or revoked)", keeper.name, lease_id)
                keeper._gone(lease_id)
                return
            keeper._refreshed(lease_id, sent)


class _StreamClosed(Exception):
    """The keepalive stream ended without an answer."""
