"""Exponential backoff: the one retry delay every loop of this project uses.

A ``Backoff`` starts at ``initial`` seconds, multiplies by ``factor`` after each use and never exceeds
``maximum``; ``reset`` after a success brings it back to ``initial``. It holds no clock and starts no task, so
a caller decides what "a success" is and when to sleep (``sleep`` is a convenience for the common case).

Named presets keep the constants in one place:
- ``api_retry()``  0.2 s doubling to 10 s: watches and API requests (kube-scheduler's reflector uses the same
  order of magnitude);
- ``etcd_retry()`` 0.2 s doubling to 2 s: etcd is expected back within a second or two, and fenced workers
  place nothing until it is, so the ceiling is low.
"""

from __future__ import annotations

import asyncio


class Backoff:
    """Delays ``initial``, ``initial*factor``, ... capped at ``maximum``. Not shared between tasks."""

    __slots__ = ("_delay", "factor", "initial", "maximum")

    def __init__(self, initial: float, maximum: float, *, factor: float = 2.0) -> None:
        if not 0 < initial <= maximum:
            raise ValueError(f"backoff wants 0 < initial <= maximum, got {initial} and {maximum}")
        if factor < 1:
            raise ValueError(f"backoff factor must be at least 1, got {factor}")
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self._delay = initial

    @property
    def delay(self) -> float:
        """The delay the next ``next()`` will return."""
        return self._delay

    @property
    def fresh(self) -> bool:
        """True until the first ``next()`` after a reset: the first failure of a run of failures."""
        return self._delay == self.initial

    def next(self) -> float:
        """The delay to wait now; the following one grows."""
        delay = self._delay
        self._delay = min(self.maximum, delay * self.factor)
        return delay

    def reset(self) -> None:
        """A success: the next failure waits ``initial`` again."""
        self._delay = self.initial

    async def sleep(self) -> float:
        """Sleep for ``next()`` seconds; returns how long it slept."""
        delay = self.next()
        await asyncio.sleep(delay)
        return delay


def api_retry() -> Backoff:
    """Retrying the Kubernetes API (watches, requests): 0.2 s doubling to 10 s."""
    return Backoff(0.2, 10.0)


def etcd_retry() -> Backoff:
    """Retrying etcd (mirrors, registration, acknowledgements): 0.2 s doubling to 2 s."""
    return Backoff(0.2, 2.0)
