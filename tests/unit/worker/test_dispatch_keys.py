"""Where a worker may listen without a dispatch secret: loopback only, unless told ``insecure_dispatch``."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.keyring import NoSecret, SecretFile
from worker.coordinated import CoordinatedOptions, _dispatch_keys


def options(host: str, *, secret: str = "", insecure: bool = False) -> CoordinatedOptions:
    return CoordinatedOptions(
        etcd_endpoints=["127.0.0.1:2379"],
        listen_host=host,
        dispatch_secret_file=secret,
        insecure_dispatch=insecure,
    )


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_loopback_needs_no_secret(host: str) -> None:
    assert isinstance(_dispatch_keys(options(host)), NoSecret)


@pytest.mark.parametrize("host", ["0.0.0.0", "", "::"])
def test_beyond_loopback_a_secret_is_required(host: str) -> None:
    with pytest.raises(SystemExit, match="insecure-dispatch"):
        _dispatch_keys(options(host))
    assert isinstance(_dispatch_keys(options(host, insecure=True)), NoSecret)


def test_a_secret_file_is_used_anywhere(tmp_path: Path) -> None:
    secret = tmp_path / "s"
    secret.write_text("0123456789abcdef0123")
    keys = _dispatch_keys(options("0.0.0.0", secret=str(secret)))
    assert isinstance(keys, SecretFile) and keys.current() == b"0123456789abcdef0123"
