"""``--config FILE``: a role's settings as one versioned YAML document, in the style of KubeSchedulerConfiguration.

    apiVersion: agent-scheduler.io/v1alpha1
    kind: WorkerConfiguration            # or CoordinatorConfiguration
    leaseTtl: 10
    kubeApiQps: 2000
    scoreWeight: [MostAllocated=2]

The fields are the role's own flags in camelCase (``--kube-api-qps`` is ``kubeApiQps``), so the file can say
exactly what the command line can, plus the structured sections no flag can express (``SECTIONS``): the
worker's ``podTopologySpread``, kube-scheduler's PodTopologySpreadArgs for pods stating no constraint:

    podTopologySpread:
      defaultingType: List             # System (the default: kube-scheduler's) or List
      defaultConstraints:              # with List; [] turns default constraints off
      - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}

A flag given on the command line overrides the file (a repeatable flag such as ``--score-weight`` adds to the
file's list).

Invariants: the document is validated before anything starts, against the flags' own types and choices; an
error names the file and the field path (``worker.yaml: leaseTtl: expected an integer, got 'ten'``) and is one
line. Unknown fields, a wrong ``apiVersion`` or ``kind``, and more than one document are errors.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

API_VERSION = "agent-scheduler.io/v1alpha1"
KINDS = {"worker": "WorkerConfiguration", "coordinator": "CoordinatorConfiguration"}
MAX_BYTES = 256 * 1024
# Flags that are not settings of the role (where the settings come from, per-process identity is allowed).
NOT_CONFIGURABLE = frozenset({"help", "config"})


def _pod_topology_spread(value: Any) -> dict[str, Any]:
    from worker.plugins import spread_defaults  # the plugin's own validation, as kube-scheduler's

    if not isinstance(value, dict):
        raise ConfigError(f"podTopologySpread: expected a mapping, got {_describe(value)}")
    unknown = sorted(str(k) for k in value if k not in ("defaultingType", "defaultConstraints"))
    if unknown:
        raise ConfigError(
            f"podTopologySpread.{unknown[0]}: unknown field (known: defaultConstraints, defaultingType)"
        )
    try:
        spread_defaults(value)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"podTopologySpread.{e}") from None
    return {
        "spread_defaulting": value.get("defaultingType") or "System",
        "spread_default_constraints": list(value.get("defaultConstraints") or []),
    }


# role -> field -> its validator, which returns argparse defaults (dest -> value)
SECTIONS: dict[str, dict[str, Any]] = {"worker": {"podTopologySpread": _pod_topology_spread}}


class ConfigError(Exception):
    """The configuration file cannot be used; the message is one line naming the file and the field."""


def field_name(option: str) -> str:
    """``--kube-api-qps`` -> ``kubeApiQps``."""
    head, *rest = option.lstrip("-").split("-")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def configurable(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Field name -> the flag's action, for every long flag of ``parser`` a file may set."""
    out: dict[str, argparse.Action] = {}
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs and action.dest not in NOT_CONFIGURABLE:
            out[field_name(longs[0])] = action
    return out


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _convert(name: str, action: argparse.Action, value: Any) -> Any:
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        if not isinstance(value, bool):
            raise ConfigError(f"{name}: expected true or false, got {_describe(value)}")
        return value if isinstance(action, argparse._StoreTrueAction) else not value
    if isinstance(action, argparse._AppendAction):
        if not isinstance(value, list):
            raise ConfigError(f"{name}: expected a list, got {_describe(value)}")
        return [_scalar(f"{name}[{i}]", action, v) for i, v in enumerate(value)]
    if value is None and action.default is None:
        return None
    return _scalar(name, action, value)


def _scalar(name: str, action: argparse.Action, value: Any) -> Any:
    kind = action.type or str
    if isinstance(value, bool | dict | list) or value is None:
        raise ConfigError(f"{name}: expected {_type_name(kind)}, got {_describe(value)}")
    if kind is str and not isinstance(value, str):
        raise ConfigError(f"{name}: expected a string, got {_describe(value)}")
    try:
        converted = kind(value) if callable(kind) else value
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: expected {_type_name(kind)}, got {_describe(value)}") from None
    except argparse.ArgumentTypeError as e:  # a flag type's own message, as argparse shows it for the flag
        raise ConfigError(f"{name}: {e}") from None
    if kind is int and isinstance(value, float):
        raise ConfigError(f"{name}: expected an integer, got {_describe(value)}")
    if action.choices is not None and converted not in action.choices:
        allowed = ", ".join(map(str, action.choices))
        raise ConfigError(f"{name}: {_describe(value)} is not one of {allowed}")
    return converted


def _type_name(kind: Any) -> str:
    return {int: "an integer", float: "a number", str: "a string"}.get(kind, "a value")


def load(path: str, role: str, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The file's settings as ``argparse`` defaults (``dest -> value``); raises ``ConfigError``."""
    where = Path(path)
    try:
        raw = where.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror or e}") from None
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_BYTES} bytes")
    try:
        documents = list(yaml.safe_load_all(raw))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"{path}: not YAML{at}: {getattr(e, 'problem', None) or e}") from None
    documents = [d for d in documents if d is not None]
    if len(documents) != 1 or not isinstance(documents[0], dict):
        raise ConfigError(f"{path}: expected one YAML mapping (a {KINDS[role]})")
    doc: dict[str, Any] = dict(documents[0])
    try:
        if doc.pop("apiVersion", None) != API_VERSION:
            raise ConfigError(f"apiVersion: expected {API_VERSION}")
        if doc.pop("kind", None) != KINDS[role]:
            raise ConfigError(f"kind: expected {KINDS[role]} for agent-scheduler {role}")
        fields = configurable(parser)
        out: dict[str, Any] = {}
        for name, value in doc.items():
            section = SECTIONS.get(role, {}).get(str(name))
            if section is not None:
                out.update(section(value))
                continue
            action = fields.get(str(name))
            if action is None:
                known = sorted([*fields, *SECTIONS.get(role, {})])
                raise ConfigError(f"{name}: unknown field (known: {', '.join(known)})")
            out[action.dest] = _convert(str(name), action, value)
        return out
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
