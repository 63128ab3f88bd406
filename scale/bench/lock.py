"""One benchmark at a time on a machine: an exclusive lock held for the whole run.

Every benchmark that starts a local cluster (``bench cluster``, ``bench footprint``, ``bench share``) measures
CPU and latency on a machine whose cores it shares with the API server. Two at once (from one checkout or
two) take CPU from each other's API servers and schedulers, and both reports come out wrong with nothing in
them saying so. So each takes ``LOCK_PATH`` (``flock``, exclusive, non-blocking) before it starts anything and
refuses to run while another holds it (exit status ``BUSY``, distinct from a bad argument's 2).
``AGENT_SCHEDULER_BENCH_LOCK`` names another lock file (the integration tests use their own: they measure
nothing a concurrent run could spoil).

Invariant: the lock is the open file's, so it goes when the process ends, however it ends (a crash or a kill
leaves no stale lock). The file holds the holder's pid and command, for the refusal's message only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

LOCK_PATH = Path(tempfile.gettempdir()) / "agent-scheduler-bench.lock"
LOCK_ENV = "AGENT_SCHEDULER_BENCH_LOCK"
BUSY = 75  # EX_TEMPFAIL: try again later


class BenchRunning(Exception):
    """Another benchmark holds the lock."""


@contextlib.contextmanager
def exclusive(what: str, path: Path | None = None) -> Iterator[None]:
    """Hold the machine's benchmark lock (``path``, default ``LOCK_PATH``) while the block runs;
    ``BenchRunning`` if another run holds it."""
    path = path or Path(os.environ.get(LOCK_ENV) or LOCK_PATH)
    try:
        fd, writable = os.open(path, os.O_RDWR | os.O_CREAT, 0o644), True
    except PermissionError:
        # another user's lock file: flock works on a read-only descriptor too; the holder line is not written
        fd, writable = os.open(path, os.O_RDONLY), False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"
            raise BenchRunning(
                f"another benchmark is running on this machine ({holder}); two at once take CPU from each "
                f"other and spoil both reports: wait for it to finish or stop it (lock: {path})"
            ) from None
        if writable:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}: {what}: {' '.join(sys.argv)}\n".encode(), 0)
        try:
            yield
        finally:
            if writable:
                os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the lock
