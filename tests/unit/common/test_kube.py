"""The API client's pieces that need no server: HTTP status → error class, the client-side token bucket,
and credentials read from a kubeconfig."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from common import kube
from common.kube import (
    ApiError,
    Conflict,
    Gone,
    Invalid,
    NotFound,
    ServerError,
    TokenBucket,
    TooManyRequests,
    load_credentials,
)


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (404, NotFound),
        (409, Conflict),
        (410, Gone),
        (429, TooManyRequests),
        (500, ServerError),
        (503, ServerError),
        (400, Invalid),
        (422, Invalid),
        (403, ApiError),
    ],
)
def test_each_status_maps_to_one_error_class(status: int, cls: type[ApiError]) -> None:
    body = orjson.dumps({"kind": "Status", "reason": "Because", "message": 'pods "a" said no'})
    error = kube._error_for(status, body)
    assert type(error) is cls
    assert (error.status, error.reason, error.message) == (status, "Because", 'pods "a" said no')
    assert str(error) == f'{status} Because: pods "a" said no'


def test_a_body_that_is_not_a_status_is_kept_as_the_message() -> None:
    error = kube._error_for(502, b"<html>bad gateway</html>")
    assert type(error) is ServerError
    assert (error.reason, error.message, str(error)) == (
        "",
        "<html>bad gateway</html>",
        "502: <html>bad gateway</html>",
    )


async def test_token_bucket_spends_its_burst_then_waits_for_the_next_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(kube, "time", SimpleNamespace(monotonic=lambda: clock.now))
    real_sleep = asyncio.sleep
    slept: list[float] = []

    async def sleep(delay: float) -> None:  # the bucket's clock moves only when it sleeps
        slept.append(delay)
        clock.now += delay
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    bucket = TokenBucket(qps=10.0, burst=2)
    await bucket.take()
    await bucket.take()
    assert slept == []
    await bucket.take()
    assert slept == [pytest.approx(0.1)]
    clock.now += 1.0  # a quiet second refills at most ``burst`` tokens
    for _ in range(2):
        await bucket.take()
    assert len(slept) == 1
    await bucket.take()
    assert len(slept) == 2


async def test_token_bucket_without_qps_never_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    async def sleep(delay: float) -> None:
        raise AssertionError("an unlimited bucket slept")

    monkeypatch.setattr(asyncio, "sleep", sleep)
    bucket = TokenBucket(qps=0, burst=1)
    for _ in range(100):
        await bucket.take()


def test_credentials_from_a_kubeconfig_with_a_token(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(
        """\
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://127.0.0.1:6443/
    insecure-skip-tls-verify: true
users:
- name: admin
  user:
    token: s3cret
contexts:
- name: local
  context: {cluster: local, user: admin}
current-context: local
"""
    )
    creds = load_credentials(str(path))
    assert creds.server == "https://127.0.0.1:6443"
    assert creds.token == "s3cret"
    assert creds.verify is False


async def test_keeping_the_pool_warm_survives_an_unreachable_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """``keep_warm`` runs beside the scheduling loop in one task group: no failure of a round may end it."""
    client = kube.KubeClient(kube.Credentials(server="http://127.0.0.1:9"), keepalive=0.1)  # discard: refused
    touched: list[tuple[str, str, object]] = []
    real_request = client.request

    async def request(method: str, path: str, **kw: Any) -> object:
        touched.append((method, path, kw.get("pooled")))
        if len(touched) == 3:
            raise RuntimeError("not an API error")
        return await real_request(method, path, **kw)

    monkeypatch.setattr(client, "request", request)
    try:
        task = asyncio.create_task(client.keep_warm(2))
        while len(touched) < 6:  # three rounds: refused, a stray exception, refused
            assert not task.done(), task
            await asyncio.sleep(0.01)
        assert set(touched) == {("GET", "/version", True)}  # through the pool bindings take
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await client.close()
