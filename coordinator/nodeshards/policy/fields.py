"""Typed reads from parsed YAML, each failure a ``PolicyConfigError`` naming the field's path.

The parsers in ``sharding`` and ``settings`` never index raw YAML themselves: they call these helpers, which
check the type, build the dotted path (``schedulerConfigs[0].policies[1].weight``) and say what was expected.

YAML is loaded by ``safeyaml.load_yaml``, a strict safe loader with limits on size, depth and
literals and no aliases: duplicate keys in one mapping are rejected (PyYAML would silently keep the last one, so a
repeated ``maxCPUUtil`` would change a band without a trace), and keys must be strings.
Booleans are never accepted where numbers are expected, although YAML and Python treat them as integers.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Final, overload

from coordinator.nodeshards.policy.errors import PolicyConfigError


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing()


def sub(path: str, key: str) -> str:
    """The path of ``key`` inside the mapping at ``path``."""
    return f"{path}.{key}" if path else key


def item(path: str, index: int) -> str:
    """The path of element ``index`` of the list at ``path``."""
    return f"{path}[{index}]"


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "mapping"
    return type(value).__name__


def as_mapping(value: object, path: str) -> Mapping[str, object]:
    """``value`` as a mapping, or an error at ``path``."""
    if not isinstance(value, dict):
        what = "empty document" if value is None and not path else _kind(value)
        raise PolicyConfigError(path, f"must be a mapping, got {what}")
    return value


def as_list(value: object, path: str) -> list[object]:
    """``value`` as a list, or an error at ``path``."""
    if not isinstance(value, list):
        raise PolicyConfigError(path, f"must be a list, got {_kind(value)}")
    return value


def unknown_keys(m: Mapping[str, object], allowed: Collection[str]) -> list[str]:
    """Keys of ``m`` not in ``allowed``, sorted."""
    return sorted(k for k in m if k not in allowed)


def reject_unknown(m: Mapping[str, object], path: str, allowed: Collection[str]) -> None:
    """Raise for the first key of ``m`` not in ``allowed``, listing what is allowed."""
    extra = unknown_keys(m, allowed)
    if extra:
        raise PolicyConfigError(sub(path, extra[0]), f"unknown field (allowed: {', '.join(sorted(allowed))})")


def get_str(m: Mapping[str, object], key: str, path: str, default: str | _Missing = MISSING) -> str:
    """A string field; ``default`` when absent, an error when absent and no default."""
    value = m.get(key, MISSING)
    if isinstance(value, _Missing):
        if isinstance(default, _Missing):
            raise PolicyConfigError(sub(path, key), "required field is missing")
        return default
    if not isinstance(value, str):
        hint = ' (quote it, e.g. "true")' if isinstance(value, bool | int | float) else ""
        raise PolicyConfigError(sub(path, key), f"must be a string, got {_kind(value)}{hint}")
    return value


def get_bool(m: Mapping[str, object], key: str, path: str, default: bool) -> bool:
    """A boolean field, ``default`` when absent."""
    value = m.get(key, default)
    if not isinstance(value, bool):
        raise PolicyConfigError(sub(path, key), f"must be a boolean, got {_kind(value)}")
    return value


def get_float(m: Mapping[str, object], key: str, path: str, default: float) -> float:
    """A finite number (integers accepted), ``default`` when absent."""
    value = m.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PolicyConfigError(sub(path, key), f"must be a number, got {_kind(value)}")
    if not math.isfinite(value):
        raise PolicyConfigError(sub(path, key), f"must be finite, got {value}")
    return float(value)


@overload
def get_int(m: Mapping[str, object], key: str, path: str, default: int) -> int: ...
@overload
def get_int(m: Mapping[str, object], key: str, path: str, default: None) -> int | None: ...
def get_int(m: Mapping[str, object], key: str, path: str, default: int | None) -> int | None:
    """An integer field (``null`` allowed only when ``default`` is ``None``), ``default`` when absent."""
    value = m.get(key, default)
    if value is None and default is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise PolicyConfigError(sub(path, key), f"must be an integer, got {_kind(value)}")
    return value


def check_range(value: float, path: str, lo: float | None = None, hi: float | None = None) -> None:
    """Raise unless ``lo <= value <= hi`` (either bound optional)."""
    if lo is not None and value < lo:
        raise PolicyConfigError(path, f"must be >= {lo:g}, got {value:g}")
    if hi is not None and value > hi:
        raise PolicyConfigError(path, f"must be <= {hi:g}, got {value:g}")
