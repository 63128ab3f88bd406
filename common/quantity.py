"""Kubernetes resource quantities ("100m", "1.5Gi", "2e3") parsed to integers.

Invariants:
- CPU-like resources are kept in milli-units (``parse_milli``), everything else in whole units rounded up
  (``parse_units``), as kube-scheduler does when it compares requests with allocatable.
- A malformed quantity raises ``QuantityError`` naming the offending text; nothing here guesses.
- Whatever the input, the only exception is ``QuantityError`` and the cost is bounded: text longer than
  ``MAX_TEXT`` characters, an exponent outside Go's int32 (Kubernetes' own parser), NaN or infinite numbers,
  and results outside int64 (``MIN_VALUE``..``MAX_VALUE``, in the unit returned) are refused before any large
  number is built. Kubernetes documents the same int64 bound ("no quantity may represent a number greater than
  2^63-1"), and the wire protocol and kube-scheduler's own arithmetic assume it.
- Only ASCII digits are digits (Kubernetes' grammar); "١٢" is not 12.
"""

from __future__ import annotations

import math
import re
from decimal import ROUND_CEILING, Context, Decimal, InvalidOperation

MAX_VALUE = 2**63 - 1
MIN_VALUE = -(2**63)
# Canonical quantities are under 30 characters; this leaves room for leading zeros and long fractions.
MAX_TEXT = 256

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL_EXPONENT = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
# sign, digits with at most one dot, then a suffix: binary, decimal SI or a decimal exponent.
_QUANTITY = re.compile(
    r"([+-]?)([0-9]+\.?[0-9]*|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?", re.ASCII
)
_INT32 = 2**31 - 1
# Exact arithmetic for any text within MAX_TEXT: enough digits for the mantissa, the largest binary multiplier
# and the milli shift; exponents are bounded before they reach it (see _scaled).
_EXACT = Context(prec=MAX_TEXT + 64, Emax=10**6, Emin=-(10**6), traps=[InvalidOperation])
# Anything at or above 10**30 is out of range in every unit (int64 milli-units end below 10**22); anything
# below 10**-30 rounds up to the smallest unit.
_TOO_LARGE_EXPONENT = 30


class QuantityError(ValueError):
    """Raised when a string is not a valid Kubernetes quantity, or one out of range."""


def _scaled(value: Decimal, exponent: int, text: object) -> Decimal:
    """``value * 10**exponent``, exactly, with the magnitude checked first so no huge number is built."""
    if value.is_zero():
        return value
    magnitude = value.adjusted() + exponent
    if magnitude >= _TOO_LARGE_EXPONENT:
        raise QuantityError(f"quantity {text!r} is out of range (above {MAX_VALUE})")
    if magnitude < -_TOO_LARGE_EXPONENT:
        return Decimal(f"{'-' if value.is_signed() else ''}1e-{_TOO_LARGE_EXPONENT}")
    return value.scaleb(exponent, _EXACT)


def _parse(text: str | int | float) -> Decimal:
    if isinstance(text, bool):
        raise QuantityError(f"quantity {text!r} is a boolean")
    if isinstance(text, int):
        if text.bit_length() > 64 + 10:  # beyond int64 even before the milli shift; never made a string
            raise QuantityError(f"quantity of {text.bit_length()} bits is out of range (above {MAX_VALUE})")
        return Decimal(text)
    if isinstance(text, float):
        if not math.isfinite(text):
            raise QuantityError(f"quantity {text!r} is not a finite number")
        return _scaled(Decimal(repr(text)), 0, text)
    if not isinstance(text, str):
        raise QuantityError(f"quantity {text!r} is not a string")
    if len(text) > MAX_TEXT:
        raise QuantityError(f"quantity {text[:40]!r}... is longer than {MAX_TEXT} characters")
    m = _QUANTITY.fullmatch(text.strip())
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
        value = _scaled(value, 0, text) * _BINARY[suffix]
    elif suffix in _DECIMAL_EXPONENT:
        value = _scaled(value, _DECIMAL_EXPONENT[suffix], text)
    else:
        exponent = int(suffix[1:])  # at most MAX_TEXT digits: far below int()'s limit
        if abs(exponent) > _INT32:
            raise QuantityError(f"quantity {text!r} has an exponent outside int32")
        value = _scaled(value, exponent, text)
    return -value if sign == "-" else value


def _integral(value: Decimal, text: object, unit: str) -> int:
    result = int(value.to_integral_value(rounding=ROUND_CEILING, context=_EXACT))
    if not MIN_VALUE <= result <= MAX_VALUE:
        raise QuantityError(f"quantity {text!r} is out of range (more than {MAX_VALUE} {unit} in magnitude)")
    return result


def parse_milli(text: str | int | float) -> int:
    """Return the quantity in milli-units, rounded up (``"100m"`` -> 100, ``"1"`` -> 1000)."""
    return _integral(_parse(text).scaleb(3, _EXACT), text, "milli-units")


def parse_units(text: str | int | float) -> int:
    """Return the quantity in whole units, rounded up (``"1Ki"`` -> 1024, ``"500m"`` -> 1)."""
    return _integral(_parse(text), text, "units")


def format_milli(milli: int) -> str:
    """Render milli-units the way kubectl prints CPU (``1500`` -> ``"1500m"``, ``2000`` -> ``"2"``)."""
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"
