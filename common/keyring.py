"""The dispatch channel's shared secret (``common.protocol``, "Authentication"): read from a file, re-read
when the file changes, so a rotation needs no restart.

Rotation: write the new secret into the file on every coordinator and worker (a mounted Secret is updated
in place by the kubelet). Each process notices the change within ``CHECK_INTERVAL`` of using its keys; from
then on it signs with the new key and still accepts the previous one for ``ROTATION_GRACE``, long enough for
every other process to notice the change too. Streams keep the key they were opened with; a new stream opened
after the grace with a retired key is refused, and the leader connects again with its current key.

Invariants:
- ``keys()`` is never empty; its first element is ``current()``.
- A file that becomes unreadable, empty or too short keeps the last good secret (logged); only a readable
  secret of at least ``MIN_SECRET_BYTES`` replaces it. A missing or bad file at start is an error.
- ``NoSecret`` is the explicit absence of a secret: the empty key, which gives integrity against corruption
  but no authentication. Whether that is allowed is decided at the entry points (``--insecure-dispatch``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

CHECK_INTERVAL = 1.0  # seconds between looks at the file
ROTATION_GRACE = 300.0  # seconds the previous secret is still accepted after a change
MIN_SECRET_BYTES = 16


class SecretError(Exception):
    """The secret file cannot be read or holds no usable secret (at start)."""


class Keys(Protocol):
    def current(self) -> bytes:
        """The key new streams are opened with."""

    def keys(self) -> list[bytes]:
        """The keys a peer's HELLO may be under: the current one first, then the previous one during the
        rotation grace."""


class NoSecret:
    """No secret configured: the empty key."""

    def current(self) -> bytes:
        return b""

    def keys(self) -> list[bytes]:
        return [b""]


class StaticKeys:
    """Fixed keys (tests, tools): ``current`` and optionally a ``previous`` one still accepted."""

    def __init__(self, current: bytes, previous: bytes | None = None) -> None:
        self._keys = [current] if previous is None else [current, previous]

    def current(self) -> bytes:
        return self._keys[0]

    def keys(self) -> list[bytes]:
        return list(self._keys)


class SecretFile:
    """The secret in ``path`` (surrounding whitespace stripped), kept current as described above."""

    def __init__(
        self,
        path: str | Path,
        *,
        grace: float = ROTATION_GRACE,
        check_interval: float = CHECK_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self.grace = grace
        self.check_interval = check_interval
        self.clock = clock
        self._stamp = self._stat()
        secret = self._read()
        if secret is None:
            raise SecretError(f"{self.path}: no secret of at least {MIN_SECRET_BYTES} bytes")
        self._current = secret
        self._previous: bytes | None = None
        self._changed_at = 0.0
        self._checked_at = clock()
        self.rotations = 0

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _read(self) -> bytes | None:
        try:
            secret = self.path.read_bytes().strip()
        except OSError as e:
            log.warning("dispatch secret %s unreadable: %s", self.path, e)
            return None
        return secret if len(secret) >= MIN_SECRET_BYTES else None

    def _refresh(self) -> None:
        now = self.clock()
        if now - self._checked_at < self.check_interval:
            return
        self._checked_at = now
        stamp = self._stat()
        if stamp == self._stamp:
            return
        self._stamp = stamp
        secret = self._read()
        if secret is None:
            log.warning(
                "dispatch secret %s changed but holds no usable secret; keeping the last one", self.path
            )
            return
        if secret != self._current:
            self._previous, self._current, self._changed_at = self._current, secret, now
            self.rotations += 1
            log.info("dispatch secret rotated; the previous one is accepted for %.0f s", self.grace)

    def current(self) -> bytes:
        self._refresh()
        return self._current

    def keys(self) -> list[bytes]:
        self._refresh()
        if self._previous is not None and self.clock() - self._changed_at < self.grace:
            return [self._current, self._previous]
        return [self._current]


def load_keys(path: str) -> Keys:
    """The keys for a ``--dispatch-secret-file`` flag; no path: ``NoSecret`` (the entry points decide
    whether that is allowed)."""
    return SecretFile(path) if path else NoSecret()
