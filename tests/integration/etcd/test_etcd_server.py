"""The test etcd's own start: a port another process took between our probe and etcd's bind does not fail
the test that needed the server (the race that made a suite run error in its setup)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.integration.etcd_server import ETCD_BIN, EtcdServer

pytestmark = pytest.mark.integration


def _held_port() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_first_start_moves_off_a_taken_port(tmp_path: Path) -> None:
    if not ETCD_BIN.exists():
        pytest.fail(f"{ETCD_BIN} not built: run `make tools`")
    server = EtcdServer(tmp_path / "data")
    with _held_port() as held:
        taken = held.getsockname()[1]
        server.client_port = taken
        server.start()
        try:
            assert server.running
            assert server.client_port != taken
            assert b"address already in use" in server.log_path.read_bytes()
        finally:
            server.stop()


def test_restart_keeps_its_endpoint_and_gives_up_with_a_reason(tmp_path: Path) -> None:
    if not ETCD_BIN.exists():
        pytest.fail(f"{ETCD_BIN} not built: run `make tools`")
    server = EtcdServer(tmp_path / "data")
    server.start()
    endpoint = server.endpoint
    server.stop()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the old server's TIME_WAIT
        squatter.bind(("127.0.0.1", server.client_port))
        squatter.listen()
        with pytest.raises(RuntimeError, match="could not bind its ports"):
            server.start()
    assert server.endpoint == endpoint
    server.start()  # the port is free again: the same member comes back on the same endpoint
    try:
        assert server.running
        assert server.endpoint == endpoint
    finally:
        server.stop()
