"""A real etcd for the coordination tests: one shared server per session, private ones for restart tests.

The server (``tests.integration.etcd_server``) is the project's own build (.local/bin/etcd) on free
127.0.0.1 ports with a temp data dir, stopped by the PID we started, never by name. Tests isolate themselves with a unique key
prefix, so they can share the session server; tests that stop or restart etcd use ``private_etcd``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from etcd3aio import Etcd3Client

from common.etcd.keys import KeyLayout
from common.etcd.kv import connect
from tests.integration.etcd.etcd_harness import ShardCluster
from tests.integration.etcd_server import ETCD_BIN, EtcdServer


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    if not ETCD_BIN.exists():
        pytest.fail(f"{ETCD_BIN} not built: run `make tools`")
    server = EtcdServer(tmp_path_factory.mktemp("etcd") / "data")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def private_etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """An etcd of the test's own, which the test may stop, kill and restart."""
    if not ETCD_BIN.exists():
        pytest.fail(f"{ETCD_BIN} not built: run `make tools`")
    server = EtcdServer(tmp_path / "etcd-data")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def etcd_endpoint(etcd_server: EtcdServer) -> str:
    return etcd_server.endpoint


@pytest.fixture
def keys() -> KeyLayout:
    """A key prefix of the test's own."""
    return KeyLayout(f"/test-{uuid.uuid4().hex[:12]}")


@pytest.fixture
async def etcd(etcd_endpoint: str) -> AsyncIterator[Etcd3Client]:
    client = await connect([etcd_endpoint])
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def shard_cluster(etcd_endpoint: str, keys: KeyLayout) -> AsyncIterator[ShardCluster]:
    """Leaders and workers under the test's prefix; fails the test if a node was ever owned twice."""
    c = ShardCluster(etcd_endpoint, keys)
    try:
        yield c
    finally:
        await c.close()
        assert not c.log.violations, c.log.violations[:5]
