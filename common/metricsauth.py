"""Access to ``/metrics`` checked the way kube-scheduler checks it: delegated to the API server.

With ``AGENT_SCHEDULER_METRICS_AUTH=delegated`` in the environment, every metrics server of the process
answers ``/metrics`` only to a caller whose bearer token the API server accepts (a ``TokenReview``) and who may
``get`` the non-resource URL ``/metrics`` (a ``SubjectAccessReview``), like a ClusterRole with
``nonResourceURLs: ["/metrics"]``. ``/healthz`` and ``/readyz`` stay open: the kubelet's probes carry no token.
Unset or ``none``: no check (the default; restrict the port with a NetworkPolicy instead).

Invariants:
- A missing or rejected token is 401, a token whose user may not read ``/metrics`` is 403; only an answer from
  the API server allows, and a failure to ask it (timeout, 5xx) is 503 and is not remembered.
- Verdicts are cached per token (its SHA-256, never the token) for ``CACHE_TTL`` seconds, at most ``CACHE_SIZE``
  tokens, so a scrape every few seconds costs the API server two reviews a minute per scraper.
- The API client used for the reviews is the process's own credentials (in a pod: its ServiceAccount, which
  needs ``create`` on ``tokenreviews`` and ``subjectaccessreviews``, as ``system:auth-delegator`` grants).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from common.kube import ApiError, KubeClient, load_credentials

log = logging.getLogger(__name__)

ENV = "AGENT_SCHEDULER_METRICS_AUTH"
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
PROTECTED_PATH = "/metrics"
CACHE_TTL = 30.0
CACHE_SIZE = 1024
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class DelegatedAuth:
    """Decides whether a bearer token may read ``/metrics``; ``await check(token)`` is an HTTP status."""

    def __init__(
        self,
        client: KubeClient,
        *,
        ttl: float = CACHE_TTL,
        size: int = CACHE_SIZE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._ttl = ttl
        self._size = size
        self._clock = clock
        self._cache: OrderedDict[str, tuple[float, int]] = OrderedDict()

    async def check(self, token: str) -> int:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        hit = self._cache.get(key)
        if hit and hit[0] > now:
            return hit[1]
        try:
            status = await self._review(token)
        except ApiError as e:
            log.warning("metrics access could not be checked with the API server: %s", e)
            return 503
        self._cache[key] = (now + self._ttl, status)
        self._cache.move_to_end(key)
        while len(self._cache) > self._size:
            self._cache.popitem(last=False)
        return status

    async def _review(self, token: str) -> int:
        review: Any = await self._client.post(
            TOKEN_REVIEWS,
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
        )
        status = (review or {}).get("status") or {}
        if not status.get("authenticated"):
            return 401
        user = status.get("user") or {}
        spec: dict[str, Any] = {
            "user": user.get("username", ""),
            "groups": user.get("groups") or [],
            "nonResourceAttributes": {"path": PROTECTED_PATH, "verb": "get"},
        }
        if user.get("uid"):
            spec["uid"] = user["uid"]
        if user.get("extra"):
            spec["extra"] = user["extra"]
        access: Any = await self._client.post(
            ACCESS_REVIEWS,
            {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec},
        )
        return 200 if ((access or {}).get("status") or {}).get("allowed") else 403


def middleware(auth: DelegatedAuth) -> Any:
    """An aiohttp middleware that lets through the open paths and asks ``auth`` about everything else."""

    @web.middleware
    async def check_access(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return web.Response(status=401, text="Unauthorized: a bearer token is required")
        status = await auth.check(token.strip())
        if status == 200:
            return await handler(request)
        text = {401: "Unauthorized", 403: "Forbidden: may not get /metrics"}.get(
            status, "cannot check access"
        )
        return web.Response(status=status, text=text)

    return check_access


def apply(app: web.Application) -> None:
    """Protect ``app`` as the environment says (see the module docstring); a no-op when auth is off."""
    mode = os.environ.get(ENV, "none").strip().lower() or "none"
    if mode == "none":
        return
    if mode != "delegated":
        raise ValueError(f"{ENV}={mode!r}: expected 'delegated' or 'none'")
    client = KubeClient(load_credentials(os.environ.get("KUBECONFIG") or None), qps=20.0, burst=40)
    app.middlewares.append(middleware(DelegatedAuth(client)))

    async def close(_: web.Application) -> None:
        await client.close()

    app.on_cleanup.append(close)
