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


class _SlowBucket:
    """A rate limit whose every token takes ``wait`` seconds of the client's clock."""

    def __init__(self, clock: SimpleNamespace, wait: float) -> None:
        self.clock, self.wait = clock, wait

    async def take(self) -> None:
        self.clock.now += self.wait


Sent = tuple[dict[str, str] | None, float | None]


async def _deadline_client(
    monkeypatch: pytest.MonkeyPatch, wait: float
) -> tuple[kube.KubeClient, SimpleNamespace, list[Sent]]:
    clock = SimpleNamespace(now=100.0)
    monkeypatch.setattr(kube, "time", SimpleNamespace(monotonic=lambda: clock.now))
    client = kube.KubeClient(kube.Credentials(server="http://127.0.0.1:9"))
    client._limiter = _SlowBucket(clock, wait)  # type: ignore[assignment]
    sent: list[Sent] = []

    async def exchange(method: str, path: str, **kw: Any) -> tuple[int, bytes, str]:
        sent.append((kw["params"], None if kw["end"] is None else kw["end"] - clock.now))
        return 200, b"{}", ""

    monkeypatch.setattr(client, "_exchange", exchange)
    return client, clock, sent


@pytest.mark.parametrize("write", ["patch", "delete", "post", "bind"])
async def test_a_write_deadline_counts_from_the_call_the_rate_limit_wait_included(
    monkeypatch: pytest.MonkeyPatch, write: str
) -> None:
    """A fenced write's deadline is cut to its fencing deadline: the client's rate limit spends part of it,
    and the transport is given what is left (the write pool sends that, less its own waits, to the API
    server: ``tests/unit/common/test_apiconn.py``)."""
    client, _, sent = await _deadline_client(monkeypatch, wait=0.5)
    try:
        if write == "patch":
            await client.patch("/api/v1/namespaces/a/pods/p", {}, timeout=2.0)
        elif write == "delete":
            await client.delete("/api/v1/namespaces/a/pods/p", {"gracePeriodSeconds": "0"}, timeout=2.0)
        elif write == "post":
            await client.post("/api/v1/namespaces/a/events", {}, timeout=2.0)
        else:
            await client.bind("a", "p", "u", "n1", timeout=2.0)
    finally:
        await client.close()
    [(params, left)] = sent
    assert left == pytest.approx(1.5)
    assert params == ({"gracePeriodSeconds": "0"} if write == "delete" else None)  # the caller's, as given


async def test_a_write_whose_deadline_passed_in_the_rate_limit_is_not_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client, _, sent = await _deadline_client(monkeypatch, wait=2.0)
    try:
        with pytest.raises(
            kube.ServerError, match="not sent"
        ):  # as its callers treat no answer: may have landed
            await client.patch("/api/v1/namespaces/a/pods/p", {}, timeout=2.0)
    finally:
        await client.close()
    assert sent == []


async def test_a_request_without_a_deadline_has_none(monkeypatch: pytest.MonkeyPatch) -> None:
    client, _, sent = await _deadline_client(monkeypatch, wait=0.5)
    try:
        await client.put("/api/v1/namespaces/a/configmaps/c", {})
    finally:
        await client.close()
    assert sent == [(None, None)]


async def test_a_deadline_the_write_pool_cannot_keep_is_refused_before_sending() -> None:
    """Only the write pool puts the deadline left at the moment of writing into the request, and it must be
    the request's only ``timeout`` parameter (the API server obeys the first)."""
    client = kube.KubeClient(kube.Credentials(server="http://127.0.0.1:9"))  # nothing listens: nothing sent
    try:
        with pytest.raises(kube.Invalid, match="write pool"):
            await client.request("GET", "/api/v1/pods", timeout=1.0, pooled=False)
        with pytest.raises(kube.Invalid, match="write pool"):
            await client.delete("/api/v1/namespaces/a/pods/p", {"timeout": "60s"}, timeout=1.0)
    finally:
        await client.close()
