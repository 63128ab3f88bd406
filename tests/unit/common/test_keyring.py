"""The dispatch secret file: read at start, re-read when it changes, the previous key kept for the grace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from common.keyring import NoSecret, SecretError, SecretFile, load_keys


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def write(path: Path, text: str, bump: int) -> None:
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + bump * 1_000_000_000))  # a visible mtime change


def test_rotation_keeps_the_previous_key_for_the_grace(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    write(path, "first-secret-0123456789\n", 0)
    clock = Clock()
    keys = SecretFile(path, grace=60.0, check_interval=1.0, clock=clock)
    assert keys.keys() == [b"first-secret-0123456789"]
    write(path, "second-secret-0123456789", 1)
    assert keys.current() == b"first-secret-0123456789"  # not looked at again within the interval
    clock.now += 1.0
    assert keys.keys() == [b"second-secret-0123456789", b"first-secret-0123456789"]
    clock.now += 59.0
    assert keys.keys() == [b"second-secret-0123456789", b"first-secret-0123456789"]
    clock.now += 1.0
    assert keys.keys() == [b"second-secret-0123456789"]
    assert keys.rotations == 1


@pytest.mark.parametrize("content", ["", "short", None], ids=["empty", "too-short", "removed"])
def test_a_bad_change_keeps_the_last_good_secret(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "secret"
    write(path, "first-secret-0123456789", 0)
    clock = Clock()
    keys = SecretFile(path, clock=clock)
    if content is None:
        path.unlink()
    else:
        write(path, content, 1)
    clock.now += 5
    assert keys.keys() == [b"first-secret-0123456789"]


def test_a_missing_or_bad_file_at_start_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SecretError):
        SecretFile(tmp_path / "absent")
    (tmp_path / "short").write_text("tiny")
    with pytest.raises(SecretError):
        SecretFile(tmp_path / "short")


def test_no_path_is_no_secret() -> None:
    assert isinstance(load_keys(""), NoSecret) and NoSecret().keys() == [b""]
