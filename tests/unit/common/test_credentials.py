"""API credentials that change while the process runs: token files re-read, exec plugins re-run at expiry,
a 401 answered by a fresh token, and a lasting 401/403 reported as unhealthy. Our own fakes: a tiny aiohttp
API server on a free local port, a fake token source, and an injected clock."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import stat
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from common.kube import (
    EXPIRY_SKEW,
    TOKEN_REREAD,
    ApiError,
    Authenticator,
    Credentials,
    CredentialsError,
    ExecToken,
    FileToken,
    KubeClient,
    Token,
    load_credentials,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Source:
    """A token source returning scripted tokens (or errors), counting fetches."""

    def __init__(self, *tokens: Token | Exception) -> None:
        self.tokens = list(tokens)
        self.fetches = 0

    def fetch(self) -> Token:
        self.fetches += 1
        item = self.tokens.pop(0) if len(self.tokens) > 1 else self.tokens[0]
        if isinstance(item, Exception):
            raise item
        return item


def auth_with(source: Source, clock: Clock, *, expires_at: float | None = None) -> Authenticator:
    creds = Credentials(server="http://x", token="t0", token_source=source, token_expires_at=expires_at)
    return Authenticator(creds, clock=clock, wall=clock)


async def test_a_token_file_is_reread_after_the_reread_interval() -> None:
    clock, source = Clock(), Source(Token("t1"))
    auth = auth_with(source, clock)
    assert not await auth.refresh_if_due() and source.fetches == 0
    clock.now += TOKEN_REREAD
    assert await auth.refresh_if_due() and auth.token == "t1"
    assert not await auth.refresh_if_due()  # just fetched


async def test_an_exec_credential_is_renewed_before_it_expires_not_before() -> None:
    clock, source = Clock(), Source(Token("t1", expires_at=5000.0))
    auth = auth_with(source, clock, expires_at=2000.0)
    clock.now = 2000.0 - EXPIRY_SKEW - 1
    assert not await auth.refresh_if_due()
    clock.now = 2000.0 - EXPIRY_SKEW
    assert await auth.refresh_if_due() and auth.token == "t1"
    clock.now = 4000.0  # the new credential's expiry is what counts now
    assert not await auth.refresh_if_due()


async def test_a_401_makes_the_next_request_fetch_a_token_first() -> None:
    clock, source = Clock(), Source(Token("t1"))
    auth = auth_with(source, clock)
    auth.observe(401)
    assert auth.due()
    assert await auth.refresh_if_due() and auth.token == "t1"


def test_a_401_to_a_replaced_token_is_about_that_token_only() -> None:
    clock, source = Clock(), Source(Token("t1"))
    auth = auth_with(source, clock)
    auth.observe(401, "t-old")  # sent before t0 became current
    assert not auth.due() and auth.denied_for() == 0.0
    auth.observe(401, "t0")  # the current token refused: fetch first, and the streak starts
    assert auth.due() and auth._denied_since is not None
    carried_none = auth_with(Source(Token("t1")), clock)
    carried_none.observe(401, "")  # no token went (its header dropped on a redirect): judged as before
    assert carried_none.due() and carried_none._denied_since is not None


async def test_a_failing_source_keeps_the_old_token_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    clock, source = Clock(), Source(CredentialsError("token file /x: gone"))
    auth = auth_with(source, clock)
    for _ in range(3):
        clock.now += TOKEN_REREAD
        assert not await auth.refresh_if_due()
    assert auth.token == "t0" and source.fetches == 3
    assert len([r for r in caplog.records if "not refreshed" in r.message]) == 1


def test_only_a_lasting_streak_of_refusals_is_unhealthy(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    auth = Authenticator(Credentials(server="http://x", token="t"), clock=clock, lasting=30.0)
    auth.observe(403)
    clock.now += 20
    auth.observe(200)  # one accepted request ends the streak
    clock.now += 20
    auth.observe(401)
    assert auth.healthy() is True
    for _ in range(4):
        clock.now += 10
        auth.observe(401)
    verdict = auth.healthy()
    assert isinstance(verdict, str) and "401" in verdict
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "refused every request" in errors[0].message  # logged once
    auth.observe(200)
    assert auth.healthy() is True


def test_a_token_file_source_reads_and_strips(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("abc\n")
    assert FileToken(str(path)).fetch() == Token("abc")
    path.write_text("")
    with pytest.raises(CredentialsError, match="empty"):
        FileToken(str(path)).fetch()
    with pytest.raises(CredentialsError, match="missing"):
        FileToken(str(tmp_path / "missing")).fetch()


KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {{server: "{server}"}}
users:
- name: me
  user: {user}
contexts:
- name: local
  context: {{cluster: local, user: me}}
current-context: local
"""


def test_a_kubeconfig_token_file_becomes_a_refreshable_source(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("first")
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG.format(server="http://127.0.0.1:1", user="{tokenFile: token}"))
    creds = load_credentials(str(path))
    assert creds.token == "first"
    assert creds.token_source == FileToken(str(tmp_path / "token"))


def test_in_cluster_credentials_read_the_service_account_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No kubeconfig: the pod's service-account token (stripped, as every later re-read strips it) and CA, and
    the API server the ``KUBERNETES_SERVICE_*`` variables name; the token file stays the refreshable source."""
    from kubernetes.config import incluster_config

    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("abc\n")
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(ca))
    monkeypatch.setattr("common.kube.SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    creds = load_credentials(None)
    assert creds.server == "https://127.0.0.1:6443"
    assert creds.token == "abc" and creds.ca_file == str(ca) and creds.verify
    assert creds.token_source == FileToken(str(token))


def _exec_plugin(tmp_path: Path, token: str, expiry: str) -> Path:
    script = tmp_path / "plugin.py"
    status = {"token": token, "expirationTimestamp": expiry}
    body = {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", "status": status}
    script.write_text(f"#!{sys.executable}\nimport json\nprint(json.dumps({body!r}))\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_an_exec_plugin_becomes_a_source_with_its_expiry(tmp_path: Path) -> None:
    plugin = _exec_plugin(tmp_path, "from-plugin", "2030-01-01T00:00:00Z")
    path = tmp_path / "kubeconfig"
    user = f'{{exec: {{apiVersion: client.authentication.k8s.io/v1, command: "{plugin}", interactiveMode: Never}}}}'
    path.write_text(KUBECONFIG.format(server="http://127.0.0.1:1", user=user))
    creds = load_credentials(str(path))
    assert creds.token == "from-plugin"
    assert isinstance(creds.token_source, ExecToken)
    assert creds.token_expires_at == pytest.approx(1893456000.0)


class Api:
    """An API server that accepts one token at a time; ``valid`` changes it."""

    def __init__(self) -> None:
        self.valid = "t0"
        self.seen: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        self.seen.append(auth)
        if auth != f"Bearer {self.valid}":
            return web.json_response(
                {"kind": "Status", "reason": "Unauthorized", "message": "no"}, status=401
            )
        return web.json_response({"kind": "Namespace"})


@contextlib.asynccontextmanager
async def serving(handle: Callable[[web.Request], Awaitable[web.Response]]) -> AsyncIterator[str]:
    """``handle`` answering every request on a free local port; the server's URL."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def api() -> AsyncIterator[tuple[Api, str]]:
    fake = Api()
    async with serving(fake.handle) as server:
        yield fake, server


# A read goes through aiohttp's session, a write through the write pool (``common.apiconn``): both authenticate
TRANSPORTS = pytest.mark.parametrize("method", ["GET", "PATCH"], ids=["aiohttp", "write-pool"])


async def _call(client: KubeClient, method: str, path: str) -> Any:
    return await client.request(method, path, body={} if method != "GET" else None)


@TRANSPORTS
async def test_a_rotated_token_file_is_picked_up_on_the_first_401(
    api: tuple[Api, str], tmp_path: Path, method: str
) -> None:
    fake, server = api
    token = tmp_path / "token"
    token.write_text("t0")
    creds = Credentials(server=server, token="t0", token_source=FileToken(str(token)))
    async with KubeClient(creds) as client:
        assert await _call(client, method, "/api/v1/namespaces/a") == {"kind": "Namespace"}
        token.write_text("t1")  # the kubelet rotated the projected token; the server now wants the new one
        fake.valid = "t1"
        assert await _call(client, method, "/api/v1/namespaces/a") == {"kind": "Namespace"}
        assert fake.seen == ["Bearer t0", "Bearer t0", "Bearer t1"]
        assert client.auth.refreshes == 1 and client.auth.healthy() is True


@TRANSPORTS
async def test_a_revoked_token_stays_refused_and_is_reported(api: tuple[Api, str], method: str) -> None:
    fake, server = api
    fake.valid = "other"
    async with KubeClient(Credentials(server=server, token="t0")) as client:
        with pytest.raises(ApiError) as refused:
            await _call(client, method, "/api/v1/namespaces/a")
        assert refused.value.status == 401
        assert client.auth.denied_for() >= 0 and client.auth._denied_since is not None
        client.auth._denied_since = time.monotonic() - 31  # as if refused for 31 s
        assert isinstance(client.auth.healthy(), str)


class RotatingApi:
    """Holds the first ``held`` requests until all have arrived, then starts wanting ``t1`` instead of ``t0``
    and refuses them: the requests in flight at a token rotation. ``staggered``: the first is refused at once
    and the others only once a request with the new token came (their 401s arrive after the refresh)."""

    def __init__(self, held: int, *, staggered: bool) -> None:
        self.held = held
        self.staggered = staggered
        self.valid = "t0"
        self.seen: list[str] = []
        self.arrived = asyncio.Event()
        self.renewed = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        self.seen.append(auth)
        n = len(self.seen)
        if n == self.held:
            self.valid = "t1"
            self.arrived.set()
        if auth == "Bearer t1":
            self.renewed.set()
        if n <= self.held:
            await self.arrived.wait()
            if self.staggered and n > 1:
                await self.renewed.wait()
        if auth != f"Bearer {self.valid}":
            return web.json_response({"kind": "Status", "reason": "Unauthorized"}, status=401)
        return web.json_response({"kind": "Namespace"})


@TRANSPORTS
@pytest.mark.parametrize("staggered", [False, True], ids=["refused-together", "refused-after-the-refresh"])
async def test_requests_in_flight_at_a_rotation_fetch_once_and_all_succeed(
    staggered: bool, method: str
) -> None:
    held = 8
    fake, source = RotatingApi(held, staggered=staggered), Source(Token("t1"))
    async with (
        serving(fake.handle) as server,
        KubeClient(Credentials(server=server, token="t0", token_source=source)) as client,
    ):
        replies = await asyncio.gather(
            *(_call(client, method, f"/api/v1/namespaces/n{i}") for i in range(held))
        )
        assert replies == [{"kind": "Namespace"}] * held  # none failed with the 401 of the old token
        # one fetch for the rotation, not one per refused request (an exec plugin runs once)
        assert source.fetches == 1 and client.auth.refreshes == 1
        assert fake.seen == ["Bearer t0"] * held + ["Bearer t1"] * held
        assert client.auth.healthy() is True
