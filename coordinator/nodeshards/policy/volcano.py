"""The ``sharding.yaml`` key of the sharding ConfigMap, in Volcano's format, parsed and validated.

Format (Volcano v1.14+)::

    schedulerConfigs:              # processed in this order; earlier schedulers pick nodes first
      - name: agent-scheduler      # = NodeShard name; must be a DNS subdomain
        type: agent                # free-form workload class; at least one entry must be "agent"
        policies:                  # filter -> sort by sum(weight * score) -> select
          - {name: allocation-rate, weight: 1, arguments: {minCPUUtil: 0.7, maxCPUUtil: 1.0}}
          - {name: warmup, weight: 5}
          - {name: node-limit, arguments: {minNodes: 2, maxNodes: 50}}
    shardSyncPeriod: "60s"         # Go duration, > 0 (default 60s)
    enableNodeEventTrigger: true   # default true

The older flat form (``cpuUtilizationMin``, ``cpuUtilizationMax``, ``preferWarmupNodes``, ``minNodes``,
``maxNodes`` and a legacy ``arguments`` map on the scheduler entry), which Volcano's user guide still shows, is
accepted and converted to a policy chain exactly as Volcano converts it, with a deprecation warning.

Unknown fields: at the top level they are *ignored with a warning* - the ConfigMap is shared with Volcano's own
sharding controller, whose decoder ignores unknown fields, and a newer Volcano may add options. Anywhere below
(scheduler entries, policy entries, arguments) an unknown field is *rejected*: there a typo (``polices``,
``maxCPUutil``) would silently change which nodes a scheduler gets.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from coordinator.nodeshards.policy import fields, safeyaml
from coordinator.nodeshards.policy.durations import DurationError, format_seconds, parse_go_duration
from coordinator.nodeshards.policy.errors import PolicyConfigError
from coordinator.nodeshards.policy.plugins import (
    REGISTRY,
    Filterer,
    Scorer,
    Selector,
    ShardPlugin,
    allocation_rate,
    node_limit,
    warmup,
)

AGENT_TYPE = "agent"
VOLCANO_TYPE = "volcano"
DEFAULT_SYNC_PERIOD = "60s"

_TOP_KEYS = ("schedulerConfigs", "shardSyncPeriod", "enableNodeEventTrigger")
_LEGACY_BAND_KEYS = ("arguments", "cpuUtilizationMin", "cpuUtilizationMax")
_LEGACY_KEYS = (*_LEGACY_BAND_KEYS, "preferWarmupNodes")
_LEGACY_LIMIT_KEYS = ("minNodes", "maxNodes")
_ENTRY_KEYS = ("name", "type", "policies", *_LEGACY_KEYS, *_LEGACY_LIMIT_KEYS)
_POLICY_KEYS = ("name", "weight", "arguments")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True, slots=True)
class PolicyEntry:
    """One element of a scheduler's policy chain."""

    plugin: ShardPlugin
    weight: int = 1
    """Multiplier of the plugin's score in the weighted sort; ignored for plugins that do not score."""

    def to_dict(self) -> dict[str, object]:
        return {"name": self.plugin.name, "weight": self.weight, "arguments": self.plugin.arguments()}

    def describe(self) -> str:
        text = self.plugin.describe()
        return f"{text} x{self.weight}" if isinstance(self.plugin, Scorer) else text


@dataclass(frozen=True, slots=True)
class SchedulerPolicy:
    """One ``schedulerConfigs`` entry, with its chain split by phase (derived, in config order)."""

    name: str
    type: str
    policies: tuple[PolicyEntry, ...]
    filters: tuple[Filterer, ...] = field(init=False, repr=False, compare=False)
    scorers: tuple[tuple[int, Scorer], ...] = field(init=False, repr=False, compare=False)
    selectors: tuple[Selector, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        plugins = [e.plugin for e in self.policies]
        object.__setattr__(self, "filters", tuple(p for p in plugins if isinstance(p, Filterer)))
        object.__setattr__(
            self,
            "scorers",
            tuple((e.weight, e.plugin) for e in self.policies if isinstance(e.plugin, Scorer)),
        )
        object.__setattr__(self, "selectors", tuple(p for p in plugins if isinstance(p, Selector)))

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "type": self.type, "policies": [e.to_dict() for e in self.policies]}

    def describe(self) -> str:
        return f"{self.name} [{self.type}]: " + ", ".join(e.describe() for e in self.policies)


@dataclass(frozen=True, slots=True)
class ShardingConfig:
    """The whole ``sharding.yaml``, normalised (legacy fields converted, defaults filled in)."""

    schedulers: tuple[SchedulerPolicy, ...]
    shard_sync_period_ns: int = 60 * 1_000_000_000
    """Period of the full reconciliation (``shardSyncPeriod``), in nanoseconds."""
    enable_node_event_trigger: bool = True
    """Whether node events (a managed node added or deleted, its labels or allocatable CPU changed) trigger an
    evaluation between periodic syncs. Pod events trigger nothing: the CPU they request is read at the next
    evaluation."""

    @property
    def shard_sync_period_seconds(self) -> float:
        return self.shard_sync_period_ns / 1e9

    def scheduler(self, name: str) -> SchedulerPolicy | None:
        """The entry named ``name``, if any."""
        return next((s for s in self.schedulers if s.name == name), None)

    @property
    def agent_schedulers(self) -> tuple[SchedulerPolicy, ...]:
        return tuple(s for s in self.schedulers if s.type == AGENT_TYPE)

    def to_dict(self) -> dict[str, object]:
        return {
            "schedulerConfigs": [s.to_dict() for s in self.schedulers],
            "shardSyncPeriod": format_seconds(self.shard_sync_period_ns),
            "enableNodeEventTrigger": self.enable_node_event_trigger,
        }


def _parse_policy(raw: object, path: str, warnings: list[str]) -> PolicyEntry:
    m = fields.as_mapping(raw, path)
    fields.reject_unknown(m, path, _POLICY_KEYS)
    name = fields.get_str(m, "name", path)
    parser = REGISTRY.get(name)
    if parser is None:
        raise PolicyConfigError(
            fields.sub(path, "name"), f"unknown policy {safeyaml.shown(name)} (known: {', '.join(REGISTRY)})"
        )
    weight = fields.get_int(m, "weight", path, 1)
    if weight < 0:
        raise PolicyConfigError(fields.sub(path, "weight"), f"must be >= 0, got {weight}")
    args_path = fields.sub(path, "arguments")
    raw_args = m.get("arguments")
    args = {} if raw_args is None else fields.as_mapping(raw_args, args_path)
    return PolicyEntry(parser(args, args_path, warnings), weight)


def _legacy_band(m: Mapping[str, object], path: str, warnings: list[str]) -> list[PolicyEntry]:
    """Volcano's conversion of the flat fields: allocation-rate (+ warmup when preferWarmupNodes)."""
    plugin: allocation_rate.AllocationRate
    if "arguments" in m:
        args_path = fields.sub(path, "arguments")
        raw_args = m.get("arguments")
        args = {} if raw_args is None else fields.as_mapping(raw_args, args_path)
        plugin = allocation_rate.parse(args, args_path, warnings)
    else:
        plugin = allocation_rate.band(
            fields.get_float(m, "cpuUtilizationMin", path, 0.0),
            fields.get_float(m, "cpuUtilizationMax", path, 1.0),
            min_path=fields.sub(path, "cpuUtilizationMin"),
            max_path=fields.sub(path, "cpuUtilizationMax"),
            max_name="cpuUtilizationMax",
        )
    chain = [PolicyEntry(plugin, 1)]
    if fields.get_bool(m, "preferWarmupNodes", path, False):
        chain.append(PolicyEntry(warmup.Warmup(), 1))
    used = ", ".join(k for k in _LEGACY_KEYS if k in m)
    warnings.append(
        f"{path}: {used} deprecated; converted to policies [{', '.join(e.describe() for e in chain)}]"
    )
    return chain


def _legacy_limit(m: Mapping[str, object], path: str, chain: list[PolicyEntry], warnings: list[str]) -> None:
    """Volcano's conversion of scheduler-level minNodes/maxNodes into a node-limit policy."""
    limit = node_limit.limits(
        fields.get_int(m, "minNodes", path, 0),
        fields.get_int(m, "maxNodes", path, None),
        min_path=fields.sub(path, "minNodes"),
        max_path=fields.sub(path, "maxNodes"),
    )
    if any(e.plugin.name == node_limit.NAME for e in chain):
        warnings.append(f"{path}: minNodes/maxNodes ignored because the chain has a node-limit policy")
    elif limit.min_nodes > 0 or limit.max_nodes is not None:
        chain.append(PolicyEntry(limit, 1))
        warnings.append(f"{path}: minNodes/maxNodes deprecated; converted to policy [{limit.describe()}]")


def _parse_scheduler(raw: object, path: str, warnings: list[str]) -> SchedulerPolicy:
    m = fields.as_mapping(raw, path)
    fields.reject_unknown(m, path, _ENTRY_KEYS)
    name = fields.get_str(m, "name", path)
    if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        raise PolicyConfigError(
            fields.sub(path, "name"),
            f"{safeyaml.shown(name)} is not a valid NodeShard name (lowercase DNS subdomain)",
        )
    kind = fields.get_str(m, "type", path)
    if not kind:
        raise PolicyConfigError(fields.sub(path, "type"), "must not be empty")
    policies_path = fields.sub(path, "policies")
    raw_chain = m.get("policies")
    items = [] if raw_chain is None else fields.as_list(raw_chain, policies_path)
    chain = [_parse_policy(p, fields.item(policies_path, j), warnings) for j, p in enumerate(items)]
    legacy = [k for k in _LEGACY_KEYS if k in m]
    if chain and legacy:
        warnings.append(f"{path}: {', '.join(legacy)} ignored because policies is set")
    elif not chain and any(k in m for k in _LEGACY_BAND_KEYS):
        chain = _legacy_band(m, path, warnings)
    elif not chain:
        raise PolicyConfigError(
            policies_path, f"must list at least one policy (known: {', '.join(REGISTRY)})"
        )
    if any(k in m for k in _LEGACY_LIMIT_KEYS):
        _legacy_limit(m, path, chain, warnings)
    return SchedulerPolicy(name, kind, tuple(chain))


def parse_sharding(text: str, warnings: list[str]) -> ShardingConfig:
    """Parse and validate ``sharding.yaml``; append non-fatal findings to ``warnings``.

    Raises ``PolicyConfigError`` (without ``source``) for anything that must not be applied.
    """
    doc = fields.as_mapping(safeyaml.load_yaml(text), "")
    for key in fields.unknown_keys(doc, _TOP_KEYS):
        warnings.append(f"{key[: safeyaml.MAX_SHOWN]}: unknown top-level field ignored")
    if "schedulerConfigs" not in doc:
        raise PolicyConfigError("schedulerConfigs", "required field is missing")
    entries = fields.as_list(doc["schedulerConfigs"], "schedulerConfigs")
    if not entries:
        raise PolicyConfigError("schedulerConfigs", "must contain at least one scheduler")
    schedulers: list[SchedulerPolicy] = []
    first_index: dict[str, int] = {}
    for i, raw in enumerate(entries):
        path = fields.item("schedulerConfigs", i)
        scheduler = _parse_scheduler(raw, path, warnings)
        if scheduler.name in first_index:
            raise PolicyConfigError(
                fields.sub(path, "name"),
                f"duplicate scheduler name {scheduler.name!r} (also schedulerConfigs[{first_index[scheduler.name]}])",
            )
        first_index[scheduler.name] = i
        schedulers.append(scheduler)
    if not any(s.type == AGENT_TYPE for s in schedulers):
        raise PolicyConfigError("schedulerConfigs", f'no scheduler of type "{AGENT_TYPE}"')
    period_text = fields.get_str(doc, "shardSyncPeriod", "", DEFAULT_SYNC_PERIOD)
    try:
        period = parse_go_duration(period_text)
    except DurationError as e:
        raise PolicyConfigError("shardSyncPeriod", str(e)) from e
    if period <= 0:
        raise PolicyConfigError("shardSyncPeriod", f"must be > 0, got {safeyaml.shown(period_text)}")
    trigger = fields.get_bool(doc, "enableNodeEventTrigger", "", True)
    return ShardingConfig(tuple(schedulers), period, trigger)
