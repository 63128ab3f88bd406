"""A thin typed adapter over ``etcd3aio``: the only module that touches its untyped protobuf replies.

etcd3aio returns generated protobuf messages that mypy sees as ``Any``. This module converts them at
the boundary into small frozen dataclasses, and names the exceptions an etcd call can raise, so the
rest of the layer is type-checked and catches failures in one way.

Invariants:
- Every call takes a timeout; nothing here waits forever on an unreachable etcd.
- ``ETCD_FAILURES`` is what a caller must expect from any function here when etcd is down, slow or
  refuses the request. Programming errors (wrong types, not connected) are not in it.

Security (``EtcdSecurity``): ``https://`` endpoints (or a CA file) make the channel TLS, verified against
the CA file; a client certificate and key give mutual TLS (etcd's ``--client-cert-auth``, where the
certificate's CN is the etcd user). A user and password file use etcd's auth API: the client authenticates
at start and keeps its token valid (``AUTH_REFRESH``; at once when etcd says the token is no longer valid,
as after an etcd restart with simple tokens). Misconfiguration that retrying cannot fix (unreadable files,
wrong password) raises ``EtcdConfigError`` with one line saying what; an unreachable etcd or a failing TLS
handshake is retried by ``wait_ready`` with one warning per outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc.aio  # type: ignore[import-untyped, unused-ignore]
from etcd3aio import Etcd3Client, EtcdError, SortOrder, SortTarget, prefix_range_end
from etcd3aio._protobuf import Compare, WatchCreateRequest, WatchRequest
from etcd3aio.errors import EtcdPermissionDeniedError, EtcdUnauthenticatedError
from etcd3aio.kv import KVService
from etcd3aio.lease import LeaseService
from etcd3aio.watch import WatchService

from common.backoff import etcd_retry
from common.wellknown import DEFAULT_ETCD_PREFIX

log = logging.getLogger(__name__)

# etcd's client-side error mapping covers unary calls; raw streams (keepalive) raise the gRPC error, and
# our own deadlines raise TimeoutError.
ETCD_FAILURES: tuple[type[BaseException], ...] = (EtcdError, grpc.aio.AioRpcError, TimeoutError)

DEFAULT_TIMEOUT = 5.0  # per request; generous, since etcd answers in about a millisecond when well

# mvccpb.Event.EventType
EVENT_PUT = 0
EVENT_DELETE = 1

# gRPC's default reconnect backoff grows to 120 s; after an etcd restart we want to be back within about a
# second, because fenced workers place no pods until then.
_MAX_RECONNECT_BACKOFF_MS = 1000


def describe(error: BaseException) -> str:
    """One log-friendly line for an etcd failure (gRPC errors print five lines by default)."""
    if isinstance(error, grpc.aio.AioRpcError):
        return f"{error.code().name}: {error.details()}"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int  # 0 when the key has no lease


@dataclass(frozen=True, slots=True)
class WatchBatch:
    """One watch response: its events in order, or ``lost_history`` when etcd dropped the watch."""

    revision: int
    events: tuple[tuple[int, KeyValue], ...]  # (EVENT_PUT | EVENT_DELETE, kv)
    lost_history: bool = False  # compacted or cancelled: the caller must re-read the state


AUTH_REFRESH = 60.0  # re-authenticate this often (etcd's simple tokens last 5 minutes by default)
AUTH_CHECK = 2.0  # how often a cheap read checks that the token is still accepted


class EtcdConfigError(Exception):
    """Raised for an etcd client configuration that cannot work: bad flags, unreadable certificate or
    password files, a password etcd rejects. The message is one line meant for the operator."""


@dataclass(frozen=True, slots=True)
class EtcdSecurity:
    """How to reach a secured etcd. All optional; the empty value is a plain, unauthenticated client."""

    ca_file: str = ""  # PEM CA bundle that signed etcd's serving certificate; enables TLS
    cert_file: str = ""  # client certificate (mutual TLS)
    key_file: str = ""
    user: str = ""  # etcd auth API user
    password_file: str = ""  # file holding that user's password (first line)
    server_name: str = ""  # TLS name to verify, when it differs from the endpoint host


class Client(Etcd3Client):
    """An ``Etcd3Client`` that also keeps its etcd auth token valid (when a user is configured)."""

    _auth_task: asyncio.Task[None] | None = None

    async def close(self) -> None:
        task, self._auth_task = self._auth_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await super().close()


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise EtcdConfigError(f"etcd {what} {path}: {e.strerror or e}") from e


def split_endpoints(endpoints: Sequence[str], security: EtcdSecurity) -> tuple[list[str], bool]:
    """``host:port`` endpoints and whether to use TLS. ``http://`` and ``https://`` schemes are accepted (as
    etcd prints its client URLs); mixing them is an error, and TLS without a CA file too."""
    schemes = {e.split("://", 1)[0] if "://" in e else "" for e in endpoints}
    if "https" in schemes and "http" in schemes:
        raise EtcdConfigError("etcd endpoints mix http:// and https://")
    tls = "https" in schemes or bool(security.ca_file)
    if tls and not security.ca_file:
        raise EtcdConfigError(
            "https:// etcd endpoints need --etcd-cafile (the CA that signed etcd's certificate)"
        )
    if bool(security.cert_file) != bool(security.key_file):
        raise EtcdConfigError("--etcd-certfile and --etcd-keyfile go together")
    if security.cert_file and not tls:
        raise EtcdConfigError("a client certificate needs TLS: give --etcd-cafile or https:// endpoints")
    if bool(security.user) != bool(security.password_file):
        raise EtcdConfigError("--etcd-user and --etcd-password-file go together")
    hosts = [e.split("://", 1)[-1].rstrip("/") for e in endpoints]
    return hosts, tls


async def connect(
    endpoints: Sequence[str],
    security: EtcdSecurity | None = None,
    *,
    probe_key: str = DEFAULT_ETCD_PREFIX + "/",
) -> Client:
    """Open a client whose channel reconnects quickly after an etcd restart (see the module docstring for
    ``security``; ``probe_key``, a key the user may read, checks the auth token). Does not wait for etcd: see
    ``wait_ready``. Raises ``EtcdConfigError``."""
    security = security or EtcdSecurity()
    hosts, tls = split_endpoints(endpoints, security)
    ca = _read(security.ca_file, "CA file") if tls else None
    chain = _read(security.cert_file, "certificate file") if tls and security.cert_file else None
    key = _read(security.key_file, "key file") if tls and security.key_file else None
    client = Client(
        hosts,
        watch_max_reconnect_backoff_seconds=1.0,
        tls_server_name=security.server_name or None,
        ca_cert=ca,
        cert_chain=chain,
        cert_key=key,
    )
    # etcd3aio builds the channel from these options in connect(); it has no public knob for backoff.
    options = client._manager.grpc_options
    options.append(("grpc.max_reconnect_backoff_ms", _MAX_RECONNECT_BACKOFF_MS))
    options.append(("grpc.initial_reconnect_backoff_ms", 100))
    options.append(("grpc.min_reconnect_backoff_ms", 100))
    await client.connect()
    if security.user:
        password = _read(security.password_file, "password file").decode().splitlines()
        client._auth_task = asyncio.create_task(
            _keep_authenticated(client, security.user, password[0] if password else "", probe_key),
            name="etcd-auth",
        )
    return client


async def authenticate(client: Etcd3Client, user: str, password: str) -> None:
    """Get a token for ``user`` and use it on every later call. ``EtcdConfigError`` when etcd rejects the
    user or password (retrying will not help); ``ETCD_FAILURES`` when etcd cannot be reached."""
    if client.auth is None:
        raise RuntimeError("etcd client is not connected")
    try:
        resp = await client.auth.authenticate(user, password, timeout=DEFAULT_TIMEOUT)
    except EtcdUnauthenticatedError as e:
        raise EtcdConfigError(f"etcd refused user {user!r}: {e}") from e
    except (EtcdError, grpc.aio.AioRpcError) as e:
        detail = describe(e)
        if any(
            s in detail for s in ("invalid user", "authentication failed", "authentication is not enabled")
        ):
            raise EtcdConfigError(f"etcd refused user {user!r}: {detail}") from e
        raise
    client.set_token(resp.token)


async def _keep_authenticated(client: Client, user: str, password: str, probe_key: str) -> None:
    """Re-authenticate every ``AUTH_REFRESH``, and as soon as a cheap read is refused as unauthenticated.
    Failures are retried (etcd may be down); a rejected password is logged once per streak."""
    backoff = etcd_retry()
    since = -AUTH_REFRESH
    loop = asyncio.get_running_loop()
    complained = False
    while True:
        try:
            if loop.time() - since >= AUTH_REFRESH:
                await authenticate(client, user, password)
                since, complained = loop.time(), False
                backoff.reset()
            await asyncio.sleep(AUTH_CHECK)
            await kv_service(client).get(probe_key, count_only=True, timeout=DEFAULT_TIMEOUT)
        except EtcdUnauthenticatedError:
            since = -AUTH_REFRESH  # the token is no longer valid (etcd restarted, or it expired)
        except EtcdConfigError as e:
            if not complained:
                log.error("%s", e)
                complained = True
            await asyncio.sleep(backoff.next())
        except ETCD_FAILURES as e:
            log.debug("etcd authentication: %s; retrying", describe(e))
            await asyncio.sleep(backoff.next())


async def wait_ready(
    client: Etcd3Client,
    security: EtcdSecurity | None = None,
    *,
    probe_key: str = DEFAULT_ETCD_PREFIX + "/",
    what: str = "etcd",
    attempts: int | None = None,
) -> None:
    """Wait until etcd answers a read (authenticating first when a user is configured), retrying an
    unreachable etcd or a failing TLS handshake with one warning per outage (``attempts``: give up after
    that many, raising the last failure). Raises ``EtcdConfigError`` when the configuration cannot work."""
    security = security or EtcdSecurity()
    password = ""
    if security.user:
        lines = _read(security.password_file, "password file").decode().splitlines()
        password = lines[0] if lines else ""
    backoff = etcd_retry()
    warned = False
    while True:
        try:
            if security.user:
                await authenticate(client, security.user, password)
            await kv_service(client).get(probe_key, count_only=True, timeout=DEFAULT_TIMEOUT)
            if warned:
                log.info("%s reachable", what)
            return
        except EtcdUnauthenticatedError as e:
            raise EtcdConfigError(f"{what} refused the request as unauthenticated: {e}") from e
        except EtcdPermissionDeniedError as e:
            raise EtcdConfigError(f"{what} user may not read {probe_key}: {e}") from e
        except ETCD_FAILURES as e:
            if attempts is not None:
                attempts -= 1
                if attempts <= 0:
                    raise
            if not warned:
                log.warning("%s not reachable yet (%s); retrying", what, describe(e))
                warned = True
            await asyncio.sleep(backoff.next())


def kv_service(client: Etcd3Client) -> KVService:
    if client.kv is None:
        raise RuntimeError("etcd client is not connected")
    return client.kv


def lease_service(client: Etcd3Client) -> LeaseService:
    if client.lease is None:
        raise RuntimeError("etcd client is not connected")
    return client.lease


def watch_service(client: Etcd3Client) -> WatchService:
    if client.watch is None:
        raise RuntimeError("etcd client is not connected")
    return client.watch


def to_key_value(pb: Any) -> KeyValue:
    return KeyValue(
        key=bytes(pb.key).decode(),
        value=bytes(pb.value),
        create_revision=int(pb.create_revision),
        mod_revision=int(pb.mod_revision),
        lease=int(pb.lease),
    )


def compare_mod_revision(key: str, mod_revision: int) -> object:
    """Txn comparison "the key's mod revision is ``mod_revision``" (etcd3aio has no builder for it)."""
    return Compare(result=Compare.EQUAL, target=Compare.MOD, key=key.encode(), mod_revision=mod_revision)


async def get_key(client: Etcd3Client, key: str) -> tuple[KeyValue | None, int]:
    """The key's current value (None if absent) and the store revision it was read at."""
    resp = await kv_service(client).get(key, timeout=DEFAULT_TIMEOUT)
    kvs = [to_key_value(pb) for pb in resp.kvs]
    return (kvs[0] if kvs else None), int(resp.header.revision)


async def get_prefix(client: Etcd3Client, prefix: str) -> tuple[list[KeyValue], int]:
    """All keys under the prefix, oldest first (by create revision), and the revision they were read at."""
    resp = await kv_service(client).get(
        prefix,
        range_end=prefix_range_end(prefix),
        sort_order=SortOrder.ASCEND,
        sort_target=SortTarget.CREATE,
        timeout=DEFAULT_TIMEOUT,
    )
    return [to_key_value(pb) for pb in resp.kvs], int(resp.header.revision)


async def lease_remaining(client: Etcd3Client, lease_id: int) -> int:
    """Seconds the lease has left; -1 once etcd no longer knows it (expired or revoked)."""
    resp = await lease_service(client).time_to_live(lease_id, timeout=DEFAULT_TIMEOUT)
    return int(resp.TTL)


async def keepalive_once(client: Etcd3Client, lease_id: int) -> int:
    """Refresh the lease once; returns the TTL etcd reset it to, or <= 0 when the lease is gone.

    One short stream per refresh: etcd3aio's own keepalive helper swallows errors, and we need to know
    exactly when a refresh succeeded. Callers bound it with a timeout.
    """
    call = lease_service(client).keep_alive(lease_id)
    try:
        resp = await call.read()
    finally:
        call.cancel()
    if resp is grpc.aio.EOF:
        raise EtcdError(f"keepalive stream for lease {lease_id:x} closed without a reply")
    return int(resp.TTL)


async def watch(
    client: Etcd3Client, key: str, *, prefix: bool, start_revision: int
) -> AsyncGenerator[WatchBatch, None]:
    """Watch a key or a prefix from a revision, until etcd drops the watch or the stream fails.

    No reconnecting here: on a broken stream ``ETCD_FAILURES`` propagate and the caller re-reads state and
    watches again (a relist after an outage is cheap, and cannot skip events). We drive the gRPC stream
    ourselves because etcd3aio's watch leaves its request generator suspended forever after a
    disconnect, which surfaces as "Task was destroyed but it is pending" when it is collected.
    """
    service = watch_service(client)
    closed = asyncio.Event()

    async def requests() -> AsyncIterator[Any]:
        create = WatchCreateRequest(
            key=key.encode(),
            range_end=prefix_range_end(key) if prefix else b"",
            start_revision=start_revision,
        )
        yield WatchRequest(create_request=create)
        await closed.wait()  # keep the stream open for responses; end cleanly when we are done

    call = service._stub.Watch(requests(), metadata=service._metadata or None)
    try:
        async for resp in call:
            if resp.canceled or resp.compact_revision > 0:
                log.info("etcd watch on %s lost its history (compacted at %d)", key, resp.compact_revision)
                yield WatchBatch(int(resp.header.revision), (), lost_history=True)
                return
            events = tuple((int(ev.type), to_key_value(ev.kv)) for ev in resp.events)
            yield WatchBatch(int(resp.header.revision), events)
    finally:
        closed.set()
        call.cancel()


async def wait_deleted(client: Etcd3Client, key: str, *, start_revision: int) -> None:
    """Return once ``key`` is deleted at or after ``start_revision`` (or is already absent).

    Rides out etcd outages: a wait is not a reason to give up.
    """
    backoff = etcd_retry()
    while True:
        try:
            async with contextlib.aclosing(
                watch(client, key, prefix=False, start_revision=start_revision)
            ) as stream:
                async for batch in stream:
                    if batch.lost_history:
                        break
                    if any(kind == EVENT_DELETE for kind, _ in batch.events):
                        return
                    backoff.reset()
            current, revision = await get_key(client, key)
        except ETCD_FAILURES as e:
            log.debug("waiting for deletion of %s: %s; retrying", key, describe(e))
            await backoff.sleep()
            continue
        if current is None:
            return
        start_revision = revision + 1
