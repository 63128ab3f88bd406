"""``/metrics`` behind delegated authentication and authorization; health endpoints open."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from common import metricsauth
from common.kube import ServerError
from common.metricsauth import DelegatedAuth

TOKENS = {"reader": ("system:serviceaccount:monitoring:prometheus", True), "nobody": ("someone", False)}


class FakeApi:
    """Answers TokenReviews for TOKENS and SubjectAccessReviews by the user's allowed flag."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.down = False

    async def post(self, path: str, body: Any) -> Any:
        self.calls.append(path)
        if self.down:
            raise ServerError(503, "unavailable")
        if path == metricsauth.TOKEN_REVIEWS:
            known = TOKENS.get(body["spec"]["token"])
            if not known:
                return {"status": {"authenticated": False}}
            return {
                "status": {"authenticated": True, "user": {"username": known[0], "groups": ["g"], "uid": "u"}}
            }
        spec = body["spec"]
        assert spec["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}
        assert spec["groups"] == ["g"] and spec["uid"] == "u"
        allowed = any(name == spec["user"] and ok for name, ok in TOKENS.values())
        return {"status": {"allowed": allowed}}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def served() -> AsyncIterator[tuple[str, FakeApi, Clock]]:
    api, clock = FakeApi(), Clock()
    auth = DelegatedAuth(api, ttl=30.0, size=2, clock=clock)  # type: ignore[arg-type]
    app = web.Application(middlewares=[metricsauth.middleware(auth)])

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    for path in ("/metrics", "/healthz", "/readyz"):
        app.router.add_get(path, ok)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", api, clock
    finally:
        await runner.cleanup()


async def get(url: str, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as r:
        return r.status


async def test_metrics_needs_a_token_that_may_read_it(served: tuple[str, FakeApi, Clock]) -> None:
    base, _, _ = served
    assert await get(f"{base}/metrics") == 401
    assert await get(f"{base}/metrics", "") == 401
    assert await get(f"{base}/metrics", "forged") == 401
    assert await get(f"{base}/metrics", "nobody") == 403
    assert await get(f"{base}/metrics", "reader") == 200


async def test_health_endpoints_stay_open(served: tuple[str, FakeApi, Clock]) -> None:
    base, api, _ = served
    assert await get(f"{base}/healthz") == 200
    assert await get(f"{base}/readyz") == 200
    assert api.calls == []


async def test_verdicts_are_cached_for_the_ttl(served: tuple[str, FakeApi, Clock]) -> None:
    base, api, clock = served
    for _ in range(5):
        assert await get(f"{base}/metrics", "reader") == 200
    assert len(api.calls) == 2  # one TokenReview, one SubjectAccessReview
    clock.now = 31.0
    assert await get(f"{base}/metrics", "reader") == 200
    assert len(api.calls) == 4


async def test_an_api_failure_is_503_and_not_remembered(served: tuple[str, FakeApi, Clock]) -> None:
    base, api, _ = served
    api.down = True
    assert await get(f"{base}/metrics", "reader") == 503
    api.down = False
    assert await get(f"{base}/metrics", "reader") == 200


async def test_the_cache_is_bounded(served: tuple[str, FakeApi, Clock]) -> None:
    base, api, _ = served
    for token in ("reader", "nobody", "forged", "reader"):
        await get(f"{base}/metrics", token)
    # size 2: "reader" was evicted by the two later tokens and reviewed again
    assert api.calls.count(metricsauth.TOKEN_REVIEWS) == 4


def test_apply_is_off_by_default_and_refuses_unknown_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    app = web.Application()
    monkeypatch.delenv(metricsauth.ENV, raising=False)
    metricsauth.apply(app)
    assert len(app.middlewares) == 0
    monkeypatch.setenv(metricsauth.ENV, "basic")
    with pytest.raises(ValueError, match="delegated"):
        metricsauth.apply(app)
