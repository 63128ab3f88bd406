"""Reading the sharding ConfigMap's text, which anyone allowed to edit the ConfigMap writes: bounded in size, depth,
time and memory, and every failure a short ``PolicyConfigError``.

The text is read twice. First the parser's events are walked in a flat loop that builds nothing; it refuses
aliases, anchors, deep nesting, long scalars and too many values. Only a text that passed is composed and
constructed (PyYAML does both recursively, and the constructor follows aliases). The limits:

- ``MAX_KEY_BYTES`` (64 KiB) per policy key (``sharding.yaml``, ``agent-scheduler.yaml``) and ``MAX_DATA_BYTES``
  (256 KiB) for the whole ``data`` (keys and values, counted as the API server counts them; it allows 1 MiB),
  checked before any YAML is read (``check_data``). A policy with fifty schedulers of five policies each is
  about 15 KiB of YAML.
- No anchors (``&a``) and no aliases (``*a``), hence no merge keys (``<<: *a``): the policy never needs them, and
  an alias is how a few hundred bytes expand into billions of objects (billion laughs) or into a mapping key
  whose ``repr`` exhausts memory.
- Nesting at most ``MAX_DEPTH`` (32) levels; the policy itself is 7 deep. 20,000 levels would otherwise raise
  ``RecursionError`` in the composer.
- At most ``MAX_NODES`` (10,000) values in a document, the policy of about 500 schedulers: this bounds the time
  to build it (about 30 ms with libyaml, 0.3 s without) and its memory (a few MiB).
- A scalar at most ``MAX_SCALAR_CHARS`` (1,024) characters (the longest string the policy has is a NodeShard
  name, 253); a number literal at most ``MAX_NUMBER_CHARS`` (64) characters, checked before conversion: Python
  refuses to convert integers of more than 4,300 digits (a ``ValueError`` outside every ``YAMLError``
  handler), and 64 characters keep every integer below 1e300, so ``float(n)`` and ``f"{n:g}"`` never overflow.
- Timestamps are read as the strings they are, as Kubernetes' YAML-to-JSON conversion reads them (an impossible
  date such as ``2001-02-30`` would otherwise raise ``ValueError`` from ``datetime``).

Everything else the safe loader refuses (unknown tags, tabs, control characters) stays a ``YAMLError`` and is
reported with its position; any other exception out of PyYAML becomes a ``PolicyConfigError`` too. Messages show
values only through ``shown``, which cuts them to ``MAX_SHOWN`` characters and never calls ``repr`` on a
container or converts a huge integer.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import yaml

from coordinator.nodeshards.policy.errors import PolicyConfigError

MAX_KEY_BYTES = 64 * 1024
"""Largest value of a policy key of the ConfigMap, in UTF-8 bytes."""
MAX_DATA_BYTES = 256 * 1024
"""Largest ConfigMap ``data`` as a whole (every key's name and value), in UTF-8 bytes."""
MAX_DEPTH = 32
"""Deepest nesting of collections and scalars in one document (the top-level value is depth 1)."""
MAX_SCALAR_CHARS = 1024
"""Longest scalar (string, number, anything unquoted or quoted), in characters."""
MAX_NUMBER_CHARS = 64
"""Longest integer or float literal, in characters."""
MAX_NODES = 10_000
"""Most values (scalars and collections) in one document."""
MAX_SHOWN = 80
"""Longest value shown in a message, in characters."""

_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"


def shown(value: object, limit: int = MAX_SHOWN) -> str:
    """``value`` for a message: a string's ``repr`` cut to ``limit`` characters, a number as written, and for
    anything else only its kind (a container's ``repr`` can be as large as the memory it takes)."""
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}... ({len(value)} characters)"
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        bits = value.bit_length()
        return str(value) if bits <= 256 else f"<integer of {bits} bits>"
    if isinstance(value, float):
        return repr(value)
    return f"<{type(value).__name__}>"


def _byte_size(text: str, limit: int) -> int:
    """UTF-8 size of ``text``, or ``limit + 1`` when it is obviously larger (without encoding it)."""
    if len(text) > limit:  # every character is at least one byte
        return limit + 1
    return len(text.encode("utf-8", "surrogatepass"))


def check_data(data: Mapping[Any, Any], policy_keys: tuple[str, ...]) -> None:
    """Raise ``PolicyConfigError`` unless ``data`` maps strings to strings within the size caps."""
    total = 0
    for key, value in data.items():
        if not isinstance(key, str):
            raise PolicyConfigError("", f"ConfigMap data key {shown(key)} is not a string")
        if not isinstance(value, str):
            raise PolicyConfigError("", f"value is not a string, got {shown(value)}", source=key[:MAX_SHOWN])
        total += _byte_size(key, MAX_DATA_BYTES) + _byte_size(value, MAX_DATA_BYTES)
        if key in policy_keys and _byte_size(value, MAX_KEY_BYTES) > MAX_KEY_BYTES:
            raise PolicyConfigError(
                "",
                f"too large: {_describe_size(value)}, at most {MAX_KEY_BYTES // 1024} KiB per policy key",
                source=key,
            )
        if total > MAX_DATA_BYTES:
            raise PolicyConfigError(
                "", f"ConfigMap data too large: over {MAX_DATA_BYTES // 1024} KiB (keys and values together)"
            )


def _describe_size(text: str) -> str:
    if len(text) > MAX_KEY_BYTES:
        return f"{len(text)} characters"
    return f"{_byte_size(text, MAX_KEY_BYTES)} bytes"


_Base: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser when PyYAML was built with it (about ten times faster), else PyYAML's own; same results."""


def _check_events(text: str) -> None:
    """Walk the parser's events - a flat loop, no recursion, nothing built - and refuse what the module
    docstring lists, before the composer (recursive) and the constructor (which follows aliases) see the text."""
    depth = nodes = 0
    for event in yaml.parse(text, Loader=_Base):
        if isinstance(event, yaml.AliasEvent):
            raise _refused(event, "aliases (*name) are not allowed in the policy")
        if not isinstance(event, yaml.NodeEvent | yaml.CollectionEndEvent):
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
            continue
        if event.anchor is not None:
            raise _refused(event, "anchors (&name) are not allowed in the policy")
        nodes += 1
        if nodes > MAX_NODES:
            raise _refused(event, f"more than {MAX_NODES} values")
        if depth >= MAX_DEPTH:
            raise _refused(event, f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(event, yaml.ScalarEvent):
            if len(event.value) > MAX_SCALAR_CHARS:
                raise _refused(
                    event, f"a value of {len(event.value)} characters is longer than {MAX_SCALAR_CHARS}"
                )
        else:
            depth += 1


def _refused(event: yaml.Event, problem: str) -> yaml.composer.ComposerError:
    # libyaml's marks have the same line and column as PyYAML's, which is all the message reads
    return yaml.composer.ComposerError(None, None, problem, event.start_mark)  # type: ignore[arg-type]


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Hashable, Any]:
    loader.flatten_mapping(node)
    seen: set[object] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        where = f"line {key_node.start_mark.line + 1}, column {key_node.start_mark.column + 1}"
        if not isinstance(key, str):
            raise PolicyConfigError("", f"{where}: mapping key {shown(key)} is not a string")
        if key in seen:
            raise PolicyConfigError("", f"{where}: duplicate key {shown(key)}")
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


def _number_literal(node: yaml.Node, what: str) -> None:
    text = str(node.value)
    if len(text) > MAX_NUMBER_CHARS:
        raise yaml.constructor.ConstructorError(
            None,
            None,
            f"{what} literal of {len(text)} characters is longer than {MAX_NUMBER_CHARS}",
            node.start_mark,
        )


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    _number_literal(node, "integer")
    return loader.construct_yaml_int(node)


def _construct_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float:
    _number_literal(node, "float")
    return loader.construct_yaml_float(node)


def _construct_timestamp(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> str:
    return loader.construct_scalar(node)


def policy_loader(base: type[yaml.SafeLoader]) -> type[yaml.SafeLoader]:
    """A loader on ``base`` that also rejects duplicate and non-string mapping keys and over-long number
    literals, and reads timestamps as strings."""
    loader: type[yaml.SafeLoader] = type("PolicyLoader", (base,), {})
    loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
    loader.add_constructor(_INT_TAG, _construct_int)
    loader.add_constructor(_FLOAT_TAG, _construct_float)
    loader.add_constructor(_TIMESTAMP_TAG, _construct_timestamp)
    return loader


_PolicyLoader = policy_loader(_Base)


def load_yaml(text: str) -> object:
    """Parse one YAML document within the limits; every failure is a ``PolicyConfigError`` (path ``""``) whose
    reason gives the position."""
    try:
        _check_events(text)
        return yaml.load(text, Loader=_PolicyLoader)  # a SafeLoader subclass: no arbitrary objects
    except PolicyConfigError:
        raise
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise PolicyConfigError("", f"invalid YAML: {where}{e.problem or e}") from e
    except yaml.YAMLError as e:
        raise PolicyConfigError("", f"invalid YAML: {e}") from e
    except (ValueError, TypeError, OverflowError, RecursionError) as e:
        # A safe constructor failing outside PyYAML's own errors (a bad !!binary, a value Python refuses):
        # the text is still what is wrong.
        raise PolicyConfigError("", f"invalid YAML value ({type(e).__name__}): {str(e)[:MAX_SHOWN]}") from e
