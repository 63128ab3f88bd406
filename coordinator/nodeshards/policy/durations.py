"""Go duration strings ("60s", "1m30s", "1.5h", "250ms") parsed to integer nanoseconds.

Volcano's ``shardSyncPeriod`` is decoded with Go's ``time.ParseDuration``; this module accepts exactly that
grammar: an optional sign, then one or more ``<decimal><unit>`` groups with units ``ns``, ``us``/``µs``/``μs``,
``ms``, ``s``, ``m``, ``h``; the bare string ``"0"`` is the only unit-less value. Results are exact (fractions
are computed with ``Fraction`` and truncated toward zero, as Go does) and bounded to Go's int64 range. Text
longer than ``MAX_CHARS`` is refused before it is read (Go has no such limit, but no sensible duration needs it,
and it keeps ``Fraction`` away from Python's 4,300-digit limit on converting integers).
"""

from __future__ import annotations

import re
from fractions import Fraction

_UNIT_NS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign
    "\u03bcs": 1_000,  # Greek small letter mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
_GROUP = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
_INT64_MAX = 2**63 - 1
MAX_CHARS = 64


class DurationError(ValueError):
    """Raised when a string is not a Go duration."""


def parse_go_duration(text: str) -> int:
    """Return ``text`` as nanoseconds; raise ``DurationError`` when Go's ``time.ParseDuration`` would fail."""
    if len(text) > MAX_CHARS:
        raise DurationError(f"duration of {len(text)} characters is too long (at most {MAX_CHARS})")
    body = text
    negative = body[:1] == "-"
    if body[:1] in "+-" and body:
        body = body[1:]
    if body == "0":
        return 0
    if not body:
        raise DurationError(f"invalid duration {text!r}")
    total = Fraction(0)
    pos = 0
    while pos < len(body):
        m = _GROUP.match(body, pos)
        if m is None:
            raise DurationError(f'invalid duration {text!r} (expected e.g. "60s", "1m30s", "500ms")')
        total += Fraction(m.group(1)) * _UNIT_NS[m.group(2)]
        pos = m.end()
    nanos = int(total)  # truncates toward zero, like Go
    if nanos > _INT64_MAX:
        raise DurationError(f"duration {text!r} overflows")
    return -nanos if negative else nanos


def format_seconds(nanos: int) -> str:
    """Render nanoseconds compactly for summaries (``60_000_000_000`` -> ``"60s"``, ``1.5e9`` -> ``"1.5s"``)."""
    seconds = Fraction(nanos, 1_000_000_000)
    if seconds.denominator == 1:
        return f"{seconds.numerator}s"
    return f"{float(seconds):g}s"
