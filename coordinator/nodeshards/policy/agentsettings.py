"""The ``agent-scheduler.yaml`` key of the sharding ConfigMap: this project's own settings.

Volcano's controller ignores keys it does not know, so our settings live beside ``sharding.yaml`` in the same
ConfigMap and hot-reload with it. Every field is optional; an absent key (or an empty document) means all
defaults. Unlike ``sharding.yaml``, this format is ours alone, so any unknown field is *rejected*: a typo here
would otherwise silently fall back to a default.

::

    shards:                        # how nodes move between schedulers (NodeShards)
      bandHysteresis: 0.05
      rankHysteresis: 0.05
      maxMovesPerSync: 50          # null: unbounded
    rebalance:                     # how nodes move between this scheduler's worker processes
      skewThreshold: 1.25
      hysteresis: 0.1
      maxNodeMovesPerRound: 10
    lease:
      ttlSeconds: 15
    dispatch:
      capacityReportIntervalSeconds: 1.0
      candidatesPerPod: 3
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from coordinator.policy import fields
from coordinator.policy.errors import PolicyConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_S = TypeVar("_S", bound="DataclassInstance")


def _key(
    name: str,
    kind: type,
    *,
    lo: float | None = None,
    hi: float | None = None,
    positive: bool = False,
    nullable: bool = False,
) -> dict[str, Any]:
    """Field metadata: YAML key, type, inclusive bounds, ``positive`` (strictly above ``lo``), ``nullable``."""
    return {"key": name, "kind": kind, "lo": lo, "hi": hi, "positive": positive, "nullable": nullable}


@dataclass(frozen=True, slots=True)
class ShardSettings:
    """Damping of node moves between schedulers (applied by ``evaluate``)."""

    band_hysteresis: float = field(default=0.05, metadata=_key("bandHysteresis", float, lo=0.0, hi=0.5))
    """A node stays with the scheduler holding it while its utilisation is within this margin outside that
    scheduler's allocation-rate band (a fraction, 0.05 = 5 points; rounded to whole points). 0 disables."""
    rank_hysteresis: float = field(default=0.05, metadata=_key("rankHysteresis", float, lo=0.0))
    """Bonus added to a held node's weighted score for its holder, so under node-limit a challenger must beat
    an incumbent by more than this to displace it. 0 disables."""
    max_moves_per_sync: int | None = field(
        default=50, metadata=_key("maxMovesPerSync", int, lo=0, nullable=True)
    )
    """At most this many held nodes change scheduler per evaluation (the rest are deferred to later syncs);
    ``null`` means unbounded, 0 freezes held nodes. Assigning a node nobody holds is not a move."""


@dataclass(frozen=True, slots=True)
class RebalanceSettings:
    """When and how fast the coordinator moves nodes between this scheduler's worker processes."""

    skew_threshold: float = field(default=1.25, metadata=_key("skewThreshold", float, lo=1.0, positive=True))
    """Rebalance when the most loaded worker's load exceeds the least loaded one's by this ratio (> 1)."""
    hysteresis: float = field(default=0.1, metadata=_key("hysteresis", float, lo=0.0))
    """Once rebalancing starts, continue until the ratio is at most ``skewThreshold - hysteresis`` (>= 1)."""
    max_node_moves_per_round: int = field(default=10, metadata=_key("maxNodeMovesPerRound", int, lo=1))
    """Upper bound on nodes moved between workers in one rebalancing round."""


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    """Liveness of worker processes."""

    ttl_seconds: int = field(default=15, metadata=_key("ttlSeconds", int, lo=1, hi=3600))
    """A worker whose lease is not renewed for this many seconds is dead and its nodes are reassigned."""


@dataclass(frozen=True, slots=True)
class DispatchSettings:
    """How the coordinator hands pods to workers."""

    capacity_report_interval_seconds: float = field(
        default=1.0, metadata=_key("capacityReportIntervalSeconds", float, lo=0.0, hi=3600.0, positive=True)
    )
    """How often each worker reports its free capacity to the coordinator, in seconds (> 0)."""
    candidates_per_pod: int = field(default=3, metadata=_key("candidatesPerPod", int, lo=1, hi=100))
    """Candidate nodes carried with each scheduling result (Volcano's ``candidateNodeCount``, default 3)."""


@dataclass(frozen=True, slots=True)
class AgentSchedulerSettings:
    """The whole ``agent-scheduler.yaml``."""

    shards: ShardSettings = field(default_factory=ShardSettings)
    rebalance: RebalanceSettings = field(default_factory=RebalanceSettings)
    lease: LeaseSettings = field(default_factory=LeaseSettings)
    dispatch: DispatchSettings = field(default_factory=DispatchSettings)

    def to_dict(self) -> dict[str, object]:
        return {name: _section_dict(getattr(self, name)) for name in _SECTIONS}


_SECTIONS = ("shards", "rebalance", "lease", "dispatch")


def _section_dict(section: DataclassInstance) -> dict[str, object]:
    return {f.metadata["key"]: getattr(section, f.name) for f in dataclasses.fields(section)}


def _read_value(m: dict[str, object], f: dataclasses.Field[Any], path: str) -> object:
    meta = f.metadata
    key: str = meta["key"]
    value: float | int | None
    if meta["kind"] is float:
        value = fields.get_float(m, key, path, 0.0)
    else:
        value = fields.get_int(m, key, path, None) if meta["nullable"] else fields.get_int(m, key, path, 0)
    if value is None:
        return None
    fields.check_range(value, fields.sub(path, key), meta["lo"], meta["hi"])
    if meta["positive"] and value <= meta["lo"]:
        raise PolicyConfigError(fields.sub(path, key), f"must be > {meta['lo']:g}, got {value:g}")
    return value


def _read_section(default: _S, raw: object, path: str) -> _S:
    m = {} if raw is None else dict(fields.as_mapping(raw, path))
    by_key = {f.metadata["key"]: f for f in dataclasses.fields(default)}
    fields.reject_unknown(m, path, by_key)
    changes = {by_key[k].name: _read_value(m, by_key[k], path) for k in m}
    return dataclasses.replace(default, **changes)


def parse_settings(text: str) -> AgentSchedulerSettings:
    """Parse and validate ``agent-scheduler.yaml``; raises ``PolicyConfigError`` (without ``source``)."""
    doc = fields.load_yaml(text)
    top = {} if doc is None else fields.as_mapping(doc, "")
    fields.reject_unknown(top, "", _SECTIONS)
    base = AgentSchedulerSettings()
    settings = AgentSchedulerSettings(
        shards=_read_section(base.shards, top.get("shards"), "shards"),
        rebalance=_read_section(base.rebalance, top.get("rebalance"), "rebalance"),
        lease=_read_section(base.lease, top.get("lease"), "lease"),
        dispatch=_read_section(base.dispatch, top.get("dispatch"), "dispatch"),
    )
    rebalance = settings.rebalance
    if rebalance.skew_threshold - rebalance.hysteresis < 1.0:
        raise PolicyConfigError(
            "rebalance.hysteresis",
            f"must be <= skewThreshold - 1 (got {rebalance.hysteresis:g} with skewThreshold "
            f"{rebalance.skew_threshold:g})",
        )
    return settings
