"""Progress signals of one leader term: how a leader tells "leading" from "holding the lease, doing nothing".

A term's work registers one probe per loop it depends on (``Progress.add``). A probe is a cheap callable
asked about once a second: True means "made progress, or is legitimately idle, since you last asked". A
signal *stalls* when its probe has not said True for longer than its bound; ``run_as_leader`` then steps the
leader down, so a standby (whose own watches may work) takes over.

The probes this project uses:
- ``advancing(counter)``: a loop that must complete rounds (the shard map runs one at least every second);
  progress is the counter moving.
- ``reflector_healthy(reflector)``: a list+watch that must stay connected; progress is having listed once
  and not failing (no failed reconnect lately, or events since the latest failure). A quiet but connected
  watch is idle, not stuck.

Invariant: a signal's clock starts when it is added, so every loop gets a full bound to come up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from common.watching import Reflector

DEFAULT_BOUND = 30.0  # seconds without progress before a term is judged stuck
WATCH_RETRY_WINDOW = 25.0  # a failing watch retries at least this often (see ``reflector_healthy``)

Probe = Callable[[], bool]


@dataclass(slots=True)
class _Signal:
    probe: Probe
    bound: float
    last_ok: float


class Progress:
    """The named signals of one term and when each last made progress."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._signals: dict[str, _Signal] = {}
        self.last_stall: str | None = None  # what the latest ``stalled`` call found

    def add(self, name: str, probe: Probe, bound: float = DEFAULT_BOUND) -> None:
        self._signals[name] = _Signal(probe, bound, self._clock())

    def stalled(self) -> str | None:
        """Ask every probe; a description of the first stalled signal, or None while all progress."""
        now = self._clock()
        for name, signal in self._signals.items():
            if signal.probe():
                signal.last_ok = now
            elif now - signal.last_ok > signal.bound:
                self.last_stall = f"{name} made no progress for {now - signal.last_ok:.0f} s"
                return self.last_stall
        self.last_stall = None
        return None

    def statistics(self) -> dict[str, float]:
        """Seconds since each signal last made progress (as of the latest ``stalled`` call)."""
        now = self._clock()
        return {name: round(now - s.last_ok, 1) for name, s in self._signals.items()}


def advancing(counter: Callable[[], int]) -> Probe:
    """Progress when ``counter()`` differs from its value at the previous ask."""
    last = [counter()]

    def probe() -> bool:
        value = counter()
        moved, last[0] = value != last[0], value
        return moved

    return probe


def reflector_healthy(reflector: Reflector, *, clock: Callable[[], float] = time.monotonic) -> Probe:
    """Progress when the reflector has listed once and is not failing: no failed (re)connect within the last
    ``WATCH_RETRY_WINDOW`` seconds, or events (or a newer resourceVersion) delivered since the latest failure.

    A failing reflector retries at least every ``WATCH_RETRY_WINDOW`` (its backoff tops out at 10 s, a connect
    attempt at 10 s more), so one that keeps failing never looks healthy between two attempts; a watch that
    recovered and is simply quiet looks healthy again once the window has passed.
    """
    seen = [(reflector.reconnects, reflector.events, reflector.resource_version)]
    failed_at = [-WATCH_RETRY_WINDOW - 1.0]
    delivered_at = [-WATCH_RETRY_WINDOW - 1.0]

    def probe() -> bool:
        now = clock()
        current = (reflector.reconnects, reflector.events, reflector.resource_version)
        (reconnects, events, version), seen[0] = seen[0], current
        if current[0] != reconnects:
            failed_at[0] = now
        if current[1] != events or current[2] != version:
            delivered_at[0] = now
        if not reflector.synced.is_set():
            return False
        return now - failed_at[0] > WATCH_RETRY_WINDOW or delivered_at[0] >= failed_at[0]

    return probe
