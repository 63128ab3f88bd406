"""The one adapter between this project and the Kubernetes API server.

Everything that talks to the API server goes through ``KubeClient``: raw JSON in and out over kept-alive
connections, so the scheduling path never builds typed client models. Writes (POST, PUT, PATCH, DELETE: the
bindings and events a worker sends per pod) take ``common.apiconn``'s pool, where a write costs about half
the CPU it costs through aiohttp; reads and watches take aiohttp's. The ``kubernetes`` package is
used only here, and only to load kubeconfig / in-cluster credentials the way every Kubernetes tool does.

Invariants:
- Both pools' connections are kept alive ``KEEPALIVE`` seconds idle; a process that binds in bursts holds as
  many write connections open as it binds at once (``keep_warm``), so a burst after a quiet spell does not
  open them first.
- HTTP failures are mapped once, here, to the exception classes below; callers never inspect status codes.
- A client-side token bucket (``qps``/``burst``) bounds request rate, like client-go's rate limiter.
- Watches yield ``(event_type, object)`` pairs; a 410 Gone (initial or mid-stream) raises ``Gone`` so that the
  caller relists (see ``common.watching``).
- A watch reads events of up to ``MAX_WATCH_EVENT`` bytes (one JSON line each) with memory bounded by that
  size. A longer event raises ``EventTooLarge`` without being buffered whole: the caller cannot know what it
  said, so it relists (a list is read whole and has no such bound). A line that is not a JSON watch event is a
  broken stream (``ServerError``), like a dropped connection. Nothing else escapes: every failure of a request
  or a watch is one of the ``ApiError`` classes.
- A reply of ``PAUSE_GC_FROM`` bytes or more is decoded with the cyclic garbage collector paused (``_loads``).
- A watch or a list of pods or nodes gives objects without ``metadata.managedFields``
  (``without_managed_fields``: cut from the bytes, before decoding, only where the cut is exact); nothing in
  this project reads them.
- Bearer tokens are never cached for the life of the process (``Authenticator``): a token file (projected
  service-account token, or a kubeconfig ``tokenFile``) is re-read every ``TOKEN_REREAD`` seconds, an exec
  credential plugin is re-run ``EXPIRY_SKEW`` before its ``expirationTimestamp``, and both on a 401 to the
  current token. Every request, watches included, carries the current token. A 401 answered to a token that
  has been replaced since the request was sent says nothing about the current one: it neither re-fetches (with
  an exec plugin, a burst of requests in flight at a rotation would otherwise run the plugin once per request,
  each run holding every request back) nor counts as a refusal, and its request is sent again with the current
  token. A 401/403 answer to every request for ``LASTING_DENIAL`` seconds is logged once and makes
  ``Authenticator.healthy`` fail (the process's ``/healthz``), so a process whose credentials stopped working
  is restarted instead of retrying quietly.
"""

from __future__ import annotations

import asyncio
import datetime
import gc
import logging
import os
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlencode

import aiohttp
import orjson
import yaml
from aiohttp.http_exceptions import HttpProcessingError
from kubernetes import client, config  # used for credential loading only, never on the hot path
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.exec_provider import ExecProvider
from kubernetes.config.incluster_config import SERVICE_TOKEN_FILENAME
from kubernetes.config.kube_config import ConfigNode

from common import restmetrics
from common.apiconn import ApiConnections, BadRequest, ProtocolError

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

# The methods ``KubeClient`` sends through its write pool unless told otherwise
_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


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


KEEPALIVE = 60.0  # seconds an idle pooled connection is kept (kube-apiserver closes them after 90 s idle)
# How often ``keep_warm`` uses every connection it holds: well below ``KEEPALIVE`` and kube-apiserver's HTTP/1.1
# idle timeout (90 s), and below the idle timeouts of the load balancers usually put in front of it (minutes).
WARM_EVERY = 30.0

TOKEN_REREAD = (
    60.0  # seconds between reads of a token file (kubelet rotates projected tokens well before expiry)
)
EXPIRY_SKEW = 60.0  # re-run an exec plugin this long before its credential expires
LASTING_DENIAL = 30.0  # seconds of nothing but 401/403 after which the process is unhealthy


class CredentialsError(Exception):
    """Raised when a bearer token cannot be obtained (unreadable token file, failing exec plugin)."""


@dataclass(frozen=True, slots=True)
class Token:
    value: str
    expires_at: float | None = None  # wall-clock seconds; None: no stated expiry


class TokenSource(Protocol):
    """Where fresh bearer tokens come from. ``fetch`` blocks (file read, subprocess); call it off the loop."""

    def fetch(self) -> Token: ...


@dataclass(frozen=True, slots=True)
class FileToken:
    """A token file: the projected service-account token, or a kubeconfig user's ``tokenFile``."""

    path: str

    def fetch(self) -> Token:
        try:
            value = Path(self.path).read_text().strip()
        except OSError as e:
            raise CredentialsError(f"token file {self.path}: {e.strerror or e}") from e
        if not value:
            raise CredentialsError(f"token file {self.path} is empty")
        return Token(value)


@dataclass(frozen=True, slots=True)
class ExecToken:
    """A kubeconfig user's exec credential plugin (``client.authentication.k8s.io``), run for each fetch."""

    exec_config: dict[str, Any]
    base_path: str
    cluster: dict[str, Any] | None = None

    def fetch(self) -> Token:
        try:
            cluster = ConfigNode("cluster", self.cluster) if self.cluster is not None else None  # type: ignore[no-untyped-call]
            exec_config = ConfigNode("exec", self.exec_config)  # type: ignore[no-untyped-call]
            provider = ExecProvider(exec_config, self.base_path, cluster)  # type: ignore[no-untyped-call]
            status = provider.run()  # type: ignore[no-untyped-call]
        except (ConfigException, OSError) as e:
            raise CredentialsError(f"exec credential plugin: {e}") from e
        token = status.get("token") if isinstance(status, dict) else None
        if not token:
            raise CredentialsError("exec credential plugin returned no token")
        return Token(str(token), _parse_time(status.get("expirationTimestamp")))


def _parse_time(stamp: object) -> float | None:
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Credentials:
    """Where the API server is and how to authenticate to it."""

    server: str
    token: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    token_source: TokenSource | None = field(default=None, compare=False)  # None: ``token`` never changes
    token_expires_at: float | None = None  # of ``token``, when its source said


def tls_context(creds: Credentials) -> ssl.SSLContext:
    """The TLS settings ``creds`` give: the cluster's CA, the client certificate if any, verification."""
    ctx = ssl.create_default_context(cafile=creds.ca_file)
    if creds.cert_file and creds.key_file:
        ctx.load_cert_chain(creds.cert_file, creds.key_file)
    if not creds.verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def load_credentials(kubeconfig: str | None) -> Credentials:
    """Credentials from a kubeconfig file, or from the pod's service account when ``kubeconfig`` is None."""
    cfg = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
        source = _kubeconfig_token_source(kubeconfig)
    else:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        source = FileToken(SERVICE_TOKEN_FILENAME)
    auth = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
    token = None
    if auth:
        # Stripped as ``FileToken`` strips it: a token file written with a trailing newline (a hand-made Secret)
        # would otherwise make the first header invalid until the first re-read.
        token = (auth.split(" ", 1)[1] if auth.lower().startswith("bearer ") else auth).strip() or None
    expires_at = None
    if isinstance(source, ExecToken):
        # The loader ran the plugin once already but does not say when its credential expires: run it again
        # for a token whose expiry we know (plugins cache their credential, so this is cheap).
        try:
            fresh = source.fetch()
            token, expires_at = fresh.value, fresh.expires_at
        except CredentialsError as e:
            log.warning("%s; using the credential loaded from the kubeconfig", e)
    return Credentials(
        server=str(cfg.host).rstrip("/"),
        token=token,
        ca_file=cfg.ssl_ca_cert,
        cert_file=cfg.cert_file,
        key_file=cfg.key_file,
        verify=bool(cfg.verify_ssl),
        token_source=source if token else None,
        token_expires_at=expires_at,
    )


def _kubeconfig_token_source(path: str) -> TokenSource | None:
    """The current user's refreshable token source in a kubeconfig: its ``tokenFile`` or ``exec`` plugin."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(doc, dict):
        return None
    current = doc.get("current-context")
    context = _named(doc.get("contexts"), current, "context")
    user = _named(doc.get("users"), context.get("user"), "user")
    cluster = _named(doc.get("clusters"), context.get("cluster"), "cluster")
    base = os.path.dirname(os.path.abspath(path))
    if isinstance(user.get("tokenFile"), str):
        return FileToken(os.path.join(base, user["tokenFile"]))
    if isinstance(user.get("exec"), dict):
        return ExecToken(user["exec"], base, cluster or None)
    return None


def _named(items: object, name: object, key: str) -> dict[str, Any]:
    for item in items if isinstance(items, list) else ():
        if isinstance(item, dict) and item.get("name") == name and isinstance(item.get(key), dict):
            return dict(item[key])
    return {}


def _sent_token(headers: Mapping[str, str]) -> str:
    """The bearer token a request carried ("" for none)."""
    value = headers.get("Authorization", "")
    return value[len("Bearer ") :] if value.startswith("Bearer ") else ""


class Authenticator:
    """The current bearer token and whether the API server accepts it.

    ``token`` is what requests carry; ``refresh_if_due`` fetches a new one from the source when the old one
    is due (file: every ``TOKEN_REREAD``; exec: ``EXPIRY_SKEW`` before expiry; any: after a 401 to the current
    token). ``observe`` is told every response status; a streak of nothing but 401/403 lasting
    ``LASTING_DENIAL`` makes ``healthy`` fail, and any other answer ends the streak. A 401 to a token already
    replaced (sent before the rotation) does neither: it says nothing about the current token.
    """

    def __init__(
        self,
        creds: Credentials,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        lasting: float = LASTING_DENIAL,
    ) -> None:
        self.token = creds.token
        self._source = creds.token_source
        self._expires_at = creds.token_expires_at
        self._clock, self._wall, self._lasting = clock, wall, lasting
        self._fetched_at = clock()
        self._stale = False  # a 401 was seen: the next request re-fetches first
        self._lock = asyncio.Lock()
        self._denied_since: float | None = None
        self._denied_status = 0
        self._reported = False
        self._fetch_failed = False
        self.refreshes = 0

    def due(self) -> bool:
        if self._source is None:
            return False
        if self._stale:
            return True
        if self._expires_at is not None:
            return self._wall() >= self._expires_at - EXPIRY_SKEW
        return self._clock() - self._fetched_at >= TOKEN_REREAD

    async def refresh_if_due(self) -> bool:
        """Fetch a new token if one is due; True when the token changed. Never raises: a failed fetch is
        logged (once per failure streak) and the old token kept."""
        if not self.due() or self._source is None:
            return False
        source = self._source
        async with self._lock:
            if not self.due():
                return False  # another request refreshed while we waited
            try:
                fresh = await asyncio.to_thread(source.fetch)
            except CredentialsError as e:
                if not self._fetch_failed:
                    log.warning("API credentials not refreshed: %s; keeping the current token", e)
                self._fetch_failed = True
                self._fetched_at, self._stale = self._clock(), False
                return False
            self._fetch_failed = False
            self._fetched_at, self._stale, self._expires_at = self._clock(), False, fresh.expires_at
            changed, self.token = fresh.value != self.token, fresh.value
            if changed:
                self.refreshes += 1
                log.info("API bearer token refreshed")
            return changed

    def observe(self, status: int, sent: str | None = None) -> None:
        """Called with every response's status code and the token its request carried (None: not known). A
        401 to a token already replaced is about that token only: ignored. A request that carried none (its
        header dropped, as on a redirect to another origin) is judged as before, so a lasting refusal of it
        still makes the process unhealthy."""
        if status == 401 and sent and sent != self.token:
            return
        if status in (401, 403):
            if status == 401:
                self._stale = True
            if self._denied_since is None:
                self._denied_since = self._clock()
            self._denied_status = status
            self._report_lasting()
        elif self._denied_since is not None:
            if self._reported:
                log.warning("the API server accepts the credentials again")
            self._denied_since, self._reported = None, False

    def denied_for(self) -> float:
        """Seconds since the current streak of 401/403 answers began (0 when the last answer was another)."""
        return 0.0 if self._denied_since is None else self._clock() - self._denied_since

    def _report_lasting(self) -> None:
        if not self._reported and self.denied_for() > self._lasting:
            self._reported = True
            log.error(
                "the API server has refused every request for %.0f s (HTTP %d): the credentials are %s; "
                "reporting unhealthy",
                self.denied_for(),
                self._denied_status,
                "not accepted" if self._denied_status == 401 else "not allowed to act",
            )

    def healthy(self) -> bool | str:
        self._report_lasting()
        if self.denied_for() > self._lasting:
            return f"API credentials refused (HTTP {self._denied_status}) for {self.denied_for():.0f} s"
        return True


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
        keepalive: float = KEEPALIVE,
    ) -> None:
        self.creds = creds
        self._limiter = TokenBucket(qps, burst)
        self._timeout = request_timeout
        ssl_ctx: ssl.SSLContext | bool = tls_context(creds) if creds.server.startswith("https") else False
        headers = {"User-Agent": user_agent, "Accept": "application/json"}
        self.auth = Authenticator(creds)
        self._session = aiohttp.ClientSession(
            base_url=None,
            headers=headers,
            connector=aiohttp.TCPConnector(limit=max_connections, ssl=ssl_ctx, keepalive_timeout=keepalive),
            json_serialize=lambda o: orjson.dumps(o).decode(),
            trace_configs=[self._auth_trace(), restmetrics.trace()],
        )
        self._writes = ApiConnections(
            creds.server,
            ssl_ctx if isinstance(ssl_ctx, ssl.SSLContext) else None,
            limit=max_connections,
            keepalive=keepalive,
            headers=headers,
            on_open=restmetrics.opened,
        )
        self.warm_every = min(WARM_EVERY, keepalive / 2)

    def _auth_trace(self) -> aiohttp.TraceConfig:
        """Authentication for every request of the session (watches included): the trace's request-start hook
        refreshes a due token and sets the header of the request being sent; the end hook reports the status."""
        auth = self.auth

        async def start(_: object, __: object, params: aiohttp.TraceRequestStartParams) -> None:
            await auth.refresh_if_due()
            if auth.token:
                params.headers["Authorization"] = f"Bearer {auth.token}"

        async def end(_: object, __: object, params: aiohttp.TraceRequestEndParams) -> None:
            status = params.response.status
            auth.observe(status, _sent_token(params.headers) if status == 401 else None)

        trace = aiohttp.TraceConfig()
        trace.on_request_start.append(start)
        trace.on_request_end.append(end)
        return trace

    async def close(self) -> None:
        self._writes.close()
        await self._session.close()  # also the loop's turn that closes the write pool's sockets

    async def keep_warm(self, connections: int) -> None:
        """Hold ``connections`` kept-alive write connections to the API server open, for as long as this runs.

        Every ``warm_every`` seconds, ``connections`` concurrent ``GET /version`` requests (public, cheap, no
        object read) each take a connection of the write pool (the one bindings take), idle ones before new
        ones, so none of them reaches
        the keep-alive limit unused. Without this a quiet spell of a minute empties the pool, and the next
        burst of bindings pays a TCP and TLS handshake per connection, on both sides, exactly when a user is
        waiting; a process just started has no connection at all. Failures are ignored: the next round tries
        again, and real requests report their own. Runs until cancelled."""
        if connections <= 0:
            return
        while True:
            await asyncio.gather(*(self._touch() for _ in range(connections)))
            await asyncio.sleep(self.warm_every)

    async def _touch(self) -> None:
        try:
            await self.request("GET", "/version", pooled=True)
        except Exception as e:  # best effort: nothing here may stop the process that holds the pool
            log.debug("keeping a connection warm: %s: %s", type(e).__name__, e)

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
        cut: bool = False,
        pooled: bool | None = None,
    ) -> Any:
        """One request; returns the decoded JSON reply (or None for an empty one), decoded without the
        objects' ``metadata.managedFields`` if ``cut`` (``without_managed_fields``: pods and nodes only).
        ``pooled``: through the write pool (``common.apiconn``); by default the writes are. ``timeout``: the
        request's deadline, in seconds from this call, here and at the API server (``_send``)."""
        status, raw = await self._send(
            method,
            path,
            params=params,
            body=body,
            content_type=content_type,
            timeout=timeout,
            pooled=method in _WRITES if pooled is None else pooled,
        )
        try:
            return _loads(without_managed_fields(raw, every=True) if cut else raw) if raw else None
        except orjson.JSONDecodeError as e:
            raise ServerError(status, f"{method} {path}: the reply is not JSON: {e}") from e

    async def get_text(self, path: str, params: dict[str, str] | None = None) -> str:
        """A GET whose reply is text, not JSON (the API server's ``/metrics``), with everything else as
        ``request``: the rate limit, the current token, the errors."""
        _, raw = await self._send(
            "GET", path, params=params, body=None, content_type="application/json", timeout=None, pooled=False
        )
        return raw.decode("utf-8", errors="replace")

    async def _send(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None,
        body: Any,
        content_type: str,
        timeout: float | None,
        pooled: bool,
    ) -> tuple[int, bytes]:
        """The status and raw reply of a request that succeeded; an ``ApiError`` otherwise. A 401 is sent
        again once when the token it carried is no longer the current one (another request's 401 replaced
        it while this one was in flight, or this one's 401 fetched a different token now).

        ``timeout``: the request must end within this many seconds from this call, here and at the API
        server: the write pool (``ApiConnections.request``) sends what is left of it when it writes the
        request, after every wait before that (this rate limit, a token refresh, a free connection, a connect),
        as the server's ``timeout`` parameter. A server deadline computed earlier would end later than the
        sender's by those waits, and a fenced write (a binding, a preemption's) could then be applied after
        the fencing deadline it was cut to. With under a millisecond left it is not sent (``ServerError``,
        which its callers treat as possibly applied, as they must an unanswered request). Only through the
        write pool, and not beside a ``timeout`` of the caller's own in ``params`` (``Invalid``)."""
        if timeout is not None and (not pooled or "timeout" in (params or ())):
            # a caller's mistake, refused before anything is sent: only the write pool puts the deadline left at
            # the moment of writing into a request, and of two ``timeout`` parameters the server obeys the first
            raise Invalid(
                0, f"{method} {path}: a deadline is kept only by the write pool, as its own parameter"
            )
        data = orjson.dumps(body) if body is not None else None
        headers = {"Content-Type": content_type} if data is not None else None
        end = None if timeout is None else time.monotonic() + timeout
        retried = False
        while True:
            await self._limiter.take()
            if end is not None and end - time.monotonic() < 0.001:
                raise ServerError(
                    0, f"{method} {path}: not sent, its {timeout:.3f}s passed before it could be"
                )
            if pooled:
                status, raw, sent = await self._exchange(
                    method, path, params=params, data=data, headers=headers, end=end
                )
            else:
                status, raw, sent = await self._aiohttp_send(
                    method, path, params=params, data=data, headers=headers
                )
            if status < 300:
                return status, raw
            if status != 401 or retried:
                raise _error_for(status, raw)
            await self.auth.refresh_if_due()
            if not self.auth.token or sent == self.auth.token:
                raise _error_for(status, raw)
            retried = True

    async def _exchange(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None,
        data: bytes | None,
        headers: dict[str, str] | None,
        end: float | None,
    ) -> tuple[int, bytes, str]:
        """A request through the write pool: (status, raw reply, the token it carried). Authentication and
        metrics as the aiohttp session's traces do them for its requests. ``end``: its deadline on this
        module's clock, here and at the API server (``_send``)."""
        host = self._writes.authority
        token = ""
        started = 0.0
        try:
            async with asyncio.timeout(self._timeout if end is None else end - time.monotonic()):
                await self.auth.refresh_if_due()  # within the request's time, as aiohttp's trace runs it
                started = time.monotonic()  # the duration starts after it, as the trace's does
                token = self.auth.token or ""
                sending = dict(headers or ())
                if token:
                    sending["Authorization"] = f"Bearer {token}"
                query = urlencode(params) if params else ""
                status, raw = await self._writes.request(
                    method,
                    path,
                    query,
                    sending,
                    data,
                    server_timeout=None if end is None else end - time.monotonic(),
                )
        except (OSError, ProtocolError) as e:  # TimeoutError and ConnectionError are OSErrors
            restmetrics.failed(method, host)
            raise ServerError(0, f"{method} {path}: {type(e).__name__}: {e}") from e
        except BadRequest as e:  # never sent, and never could be: not worth a retry
            restmetrics.failed(method, host)
            raise Invalid(0, f"{method} {path}: {e}") from e
        except asyncio.CancelledError:  # the caller's own deadline, as a binding's: a request with no reply
            restmetrics.failed(method, host)
            raise
        restmetrics.observed(status, method, host, time.monotonic() - started)
        self.auth.observe(status, token if status == 401 else None)
        return status, raw, token

    async def _aiohttp_send(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None,
        data: bytes | None,
        headers: dict[str, str] | None,
    ) -> tuple[int, bytes, str]:
        """A request through the aiohttp session: (status, raw reply, the token it carried if it got a 401)."""
        try:
            async with self._session.request(
                method,
                self.creds.server + path,
                params=params,
                data=data,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self._timeout),
            ) as resp:
                status, raw = resp.status, await resp.read()
                return status, raw, _sent_token(resp.request_info.headers) if status == 401 else ""
        except _TRANSPORT_ERRORS as e:
            raise ServerError(0, f"{method} {path}: {type(e).__name__}: {e}") from e

    async def get(self, path: str, params: dict[str, str] | None = None) -> Any:
        """A GET's decoded reply; a list of pods or nodes without its objects' ``metadata.managedFields``
        (``without_managed_fields``), as a watch of them gives them."""
        return await self.request("GET", path, params=params, cut=spec_follows_metadata(path))

    async def post(
        self, path: str, body: Any, params: dict[str, str] | None = None, *, timeout: float | None = None
    ) -> Any:
        """``timeout``: as ``bind``'s, the request's deadline here and at the API server."""
        return await self.request("POST", path, body=body, params=params, timeout=timeout)

    async def put(self, path: str, body: Any) -> Any:
        return await self.request("PUT", path, body=body)

    async def delete(
        self, path: str, params: dict[str, str] | None = None, *, timeout: float | None = None
    ) -> Any:
        """``timeout``: as ``bind``'s, the request's deadline here and at the API server."""
        return await self.request("DELETE", path, params=params, timeout=timeout)

    async def patch(self, path: str, body: Any, *, kind: str = "merge", timeout: float | None = None) -> Any:
        """``timeout``: as ``bind``'s, the request's deadline here and at the API server."""
        content_type = {
            "merge": "application/merge-patch+json",
            "strategic": "application/strategic-merge-patch+json",
            "json": "application/json-patch+json",
        }[kind]
        return await self.request("PATCH", path, body=body, content_type=content_type, timeout=timeout)

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, *, timeout: float | None = None
    ) -> None:
        """POST the pod's binding subresource. 409 means already bound or gone; 404 means deleted.

        ``timeout`` (seconds from this call, the client's own waits included): what is left of it when the
        request is written also goes to the API server as the request's ``timeout`` parameter, its deadline
        for the request (its queueing in priority and fairness and its write included; without one it is the
        server's ``--request-timeout``, 60 s by default): a binding its sender gave up on is then abandoned by
        the server too, instead of landing up to a minute later (``common.etcd.leases.MAX_BIND_TIME``)."""
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid} if uid else {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self.post(f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body, timeout=timeout)

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
                cut = spec_follows_metadata(path)
                async for line in _lines(resp.content, MAX_WATCH_EVENT, path):
                    if line.strip():
                        yield _event(without_managed_fields(line) if cut else line, path)
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


# ``metadata.managedFields`` as the API server writes it, and what follows it in an object with a ``spec``
_MANAGED_FIELDS = b',"managedFields":['
_SPEC = b',"spec":{'
_END = b"]}"  # of managedFields, then of metadata, right before the object's spec
# the core resources whose objects have ``spec`` right after ``metadata`` (Go's declared order), where
# ``without_managed_fields`` cuts exactly; not, e.g., a PodTemplate, whose ``template`` comes first and may hold
# a ``metadata`` ending in a list, then a ``spec``
_SPEC_AFTER_METADATA = ("pods", "nodes")


def spec_follows_metadata(path: str) -> bool:
    """Is ``path`` a core collection of pods or nodes (all, or one namespace's)?"""
    parts = path.strip("/").split("/")
    return parts[:2] == ["api", "v1"] and parts[-1] in _SPEC_AFTER_METADATA and len(parts) in (3, 5)


def without_managed_fields(data: bytes, *, every: bool = False) -> bytes:
    """``data``, a watch event (one object) or, with ``every``, a list of pods or nodes as the API server wrote
    it, without each object's ``metadata.managedFields`` (no scheduler reads them), cut from the bytes before
    decoding: they are about 40 % of a kubelet-updated pod's bytes and most of its JSON values, and what a
    decode costs follows them (``docs/results/managed-fields-2026-12-05/``).

    The cut is exact for the objects ``spec_follows_metadata`` names. Go's encoder writes ``ObjectMeta``'s
    fields in their declared order, ``managedFields`` last, and a Pod's or Node's ``spec`` right after
    ``metadata``, with no blanks. Before an object's ``managedFields`` come its type and metadata, or (in a list)
    the objects before it, whose strings hold no unescaped quote and whose ``spec`` and ``status`` have no such
    field, so the next ``,"managedFields":[`` is the object's. Inside it every key is an entry's field or a
    ``fieldsV1`` path (``f:``, ``k:``, ``v:``, ``i:``, ``.``) and a quote within a string is escaped, so the
    first ``,"spec":{`` after it is the object's own, right after ``]}`` (the ends of ``managedFields`` and
    ``metadata``). Bytes without both (no ``managedFields``, another writer's spacing) are returned as they
    are, and decode whole; so are, from the first such object on, bytes in which that first ``spec`` does not
    follow ``]}`` (a writer that puts other fields after ``managedFields``: a cut to a later spec would take
    them, and in a list the objects up to it)."""
    start = data.find(_MANAGED_FIELDS)
    if start < 0:
        return data
    kept: list[bytes] = []
    pos = 0
    while start >= 0:
        spec = data.find(_SPEC, start)
        if spec < 0 or data[spec - 2 : spec] != _END:
            break  # not the API server's layout: this object and the rest decode whole
        kept.append(data[pos:start])
        pos = spec - 1
        # an event holds one object: no search of its spec and status for another
        start = data.find(_MANAGED_FIELDS, pos) if every else -1
    if not kept:
        return data
    kept.append(data[pos:])
    return b"".join(kept)


# A reply at least this large is decoded with the cyclic garbage collector paused (``_loads``).
PAUSE_GC_FROM = 1 << 20


def _loads(raw: bytes) -> Any:
    """``raw`` decoded; one of ``PAUSE_GC_FROM`` bytes or more (a list of thousands of pods or nodes) with the
    cyclic garbage collector paused meanwhile. Such a decode makes hundreds of thousands of dicts and lists that
    all stay alive, so each collection the allocations trigger on the way scans the growing tree again and
    frees nothing: with the collector on, a 10,000-pod list took four times as long
    (``docs/results/managed-fields-2026-12-05/``). A decoded reply is a tree, with no reference cycle, so the
    pause leaves no garbage behind; the collector runs at the next allocation after it."""
    if len(raw) < PAUSE_GC_FROM or not gc.isenabled():
        return orjson.loads(raw)
    gc.disable()
    try:
        return orjson.loads(raw)
    finally:
        gc.enable()


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
