"""Kubernetes resource quantities ("100m", "1.5Gi", "2e3") parsed to integers.

Invariants:
- CPU-like resources are kept in milli-units (``parse_milli``), everything else in whole units rounded up
  (``parse_units``), as kube-scheduler does when it compares requests with allocatable.
- A malformed quantity raises ``QuantityError`` naming the offending text; nothing here guesses.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
# sign, digits with at most one dot, then a suffix: binary, decimal SI or a decimal exponent.
_QUANTITY = re.compile(r"^([+-]?)(\d+\.?\d*|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")


class QuantityError(ValueError):
    """Raised when a string is not a valid Kubernetes quantity."""


def _parse(text: str | int | float) -> Decimal:
    if isinstance(text, bool):
        raise QuantityError(f"quantity {text!r} is a boolean")
    if isinstance(text, int | float):
        return Decimal(str(text))
    if not isinstance(text, str):
        raise QuantityError(f"quantity {text!r} is not a string")
    m = _QUANTITY.match(text.strip())
    if m is None:
        raise QuantityError(
            f"quantities must match the regular expression of Kubernetes quantities: {text!r}"
        )
    sign, number, suffix = m.group(1), m.group(2), m.group(3) or ""
    try:
        value = Decimal(number)
    except InvalidOperation as e:  # pragma: no cover - the regular expression admits only decimals
        raise QuantityError(f"invalid quantity {text!r}") from e
    if suffix in _BINARY:
        value *= _BINARY[suffix]
    elif suffix in _DECIMAL:
        value *= _DECIMAL[suffix]
    else:
        value *= Decimal(10) ** int(suffix[1:])
    return -value if sign == "-" else value


def parse_milli(text: str | int | float) -> int:
    """Return the quantity in milli-units, rounded up (``"100m"`` -> 100, ``"1"`` -> 1000)."""
    return int((_parse(text) * 1000).to_integral_value(rounding=ROUND_CEILING))


def parse_units(text: str | int | float) -> int:
    """Return the quantity in whole units, rounded up (``"1Ki"`` -> 1024, ``"500m"`` -> 1)."""
    return int(_parse(text).to_integral_value(rounding=ROUND_CEILING))


def format_milli(milli: int) -> str:
    """Render milli-units the way kubectl prints CPU (``1500`` -> ``"1500m"``, ``2000`` -> ``"2"``)."""
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"
