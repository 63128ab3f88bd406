"""The ``agent-scheduler.yaml`` key of the sharding ConfigMap: this project's own settings.

Volcano's controller ignores keys it does not know, so our settings live beside ``sharding.yaml`` in the same
ConfigMap and hot-reload with it. Every field is optional; an absent key (or an empty document) means all
defaults. Unlike ``sharding.yaml``, this format is ours alone, so any unknown field is *rejected*: a typo here
would otherwise silently fall back to a default.

::

    shards:                        # how nodes move between schedulers (NodeShards); applied by ``evaluate``
      bandHysteresis: 0.05
      rankHysteresis: 0.05
      maxMovesPerSync: 50          # null: unbounded
      minResidenceSeconds: 0       # a node that changed scheduler stays this long (0: off)
      minResidenceSecondsByScheduler: {volcano: 200}   # the same for nodes given to one scheduler entry
    rebalance:                     # how nodes move between this scheduler's worker processes; applied by
      startSkew: 0.25              # ``coordinator.workershards.assignment`` from the shard map's next round
      stopSkew: 0.10
      maxNodeMovesPerRound: 32
      maxNodesInTransitFraction: 0.10

Skew has one definition, the assignment's: a worker's fill is the node capacity it holds divided by its fair
share (1.0 = exactly its share); skew is the highest fill minus the lowest. The defaults here are the
assignment's own (``AssignmentConfig``), so a ConfigMap without ``rebalance`` changes nothing.

The two move settings bound the nodes in transit between workers together: at most
max(``maxNodeMovesPerRound``, ``maxNodesInTransitFraction`` x pool nodes) at once, and one round takes at most
max(``maxNodeMovesPerRound``, ``maxNodesInTransitFraction`` x its nodes) from any worker. So
``maxNodeMovesPerRound`` is the floor that keeps small pools moving, and the fraction lets a join converge in
a few rounds at 100,000 nodes; ``maxNodesInTransitFraction: 0`` restores a fixed budget of
``maxNodeMovesPerRound``.

Settings that are not hot-reloaded any more are *accepted and ignored with a warning* (logged, counted in the
policy summary that ``agent-scheduler status`` prints, and left out of the policy version): the ``lease`` and
``dispatch`` sections, and ``rebalance.skewThreshold`` / ``rebalance.hysteresis``. They never took effect (the
lease TTL is the ``--lease-ttl`` flag of each process, the wire intervals are protocol constants, and the old
skew keys described a ratio the assignment never used), so ignoring them keeps an installation doing exactly
what it did, while rejecting them would discard every other edit of the same ConfigMap, ``sharding.yaml``
included, until an operator noticed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from coordinator.nodeshards.policy import fields, safeyaml
from coordinator.nodeshards.policy.errors import PolicyConfigError
from coordinator.workershards.assignment import AssignmentConfig

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
    omit_default: bool = False,
) -> dict[str, Any]:
    """Field metadata: YAML key, type, inclusive bounds, ``positive`` (strictly above ``lo``), ``nullable``;
    ``omit_default``: left out of ``to_dict`` (so of the policy version) at its default, for a setting added
    after versions were published, so that every policy without it keeps its version."""
    return {
        "key": name,
        "kind": kind,
        "lo": lo,
        "hi": hi,
        "positive": positive,
        "nullable": nullable,
        "omit_default": omit_default,
    }


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
    min_residence_seconds: float = field(
        default=0.0, metadata=_key("minResidenceSeconds", float, lo=0.0, hi=86400.0 * 7, omit_default=True)
    )
    """A node that moved to a scheduler stays with it at least this many seconds (per-node hysteresis in time:
    it cannot move back, or on, before then); 0 disables. The leader keeps the move times in memory, so a new
    leader starts with none resting (``coordinator.nodeshards.controller``)."""
    min_residence_by_scheduler: tuple[tuple[str, float], ...] = field(
        default=(),
        metadata=_key("minResidenceSecondsByScheduler", dict, lo=0.0, hi=86400.0 * 7, omit_default=True),
    )
    """``minResidenceSeconds`` for the nodes given to the named scheduler entries (name -> seconds, sorted by
    name); entries not named use ``minResidenceSeconds``. A batch scheduler can thus keep a lent node long
    enough for its jobs (and not see it taken back before the next wave) while the agent shard gives nodes
    back soon after a wave. Names that match no scheduler entry are ignored."""

    def residence(self, scheduler: str | None) -> float:
        """Seconds a node given to ``scheduler`` (``None``: to nobody) stays there."""
        return dict(self.min_residence_by_scheduler).get(scheduler or "", self.min_residence_seconds)


_ASSIGNMENT_DEFAULTS = AssignmentConfig()


@dataclass(frozen=True, slots=True)
class RebalanceSettings:
    """When and how fast the coordinator moves nodes between this scheduler's worker processes."""

    start_skew: float = field(
        default=_ASSIGNMENT_DEFAULTS.skew_threshold, metadata=_key("startSkew", float, lo=0.0, positive=True)
    )
    """Start rebalancing when skew (highest fill minus lowest, see the module docstring) exceeds this (> 0)."""
    stop_skew: float = field(
        default=_ASSIGNMENT_DEFAULTS.settle_skew, metadata=_key("stopSkew", float, lo=0.0)
    )
    """Once rebalancing, continue until skew is at most this (0 <= stopSkew <= startSkew)."""
    max_node_moves_per_round: int = field(
        default=_ASSIGNMENT_DEFAULTS.max_moves_per_round, metadata=_key("maxNodeMovesPerRound", int, lo=1)
    )
    """Nodes on their way between workers at once, at least (the bound is the larger of this and
    ``maxNodesInTransitFraction`` of the pool); a round starts new moves only up to the bound minus those still
    in flight."""
    max_nodes_in_transit_fraction: float = field(
        default=_ASSIGNMENT_DEFAULTS.max_transit_fraction,
        metadata=_key("maxNodesInTransitFraction", float, lo=0.0, hi=1.0),
    )
    """Fraction of the pool that may be in transit at once, and of any one worker's nodes that one round may
    take (0 <= x <= 1; 0: only ``maxNodeMovesPerRound`` counts)."""

    def assignment_config(self) -> AssignmentConfig:
        """The assignment's configuration with these settings (its other knobs at their defaults)."""
        return dataclasses.replace(
            _ASSIGNMENT_DEFAULTS,
            skew_threshold=self.start_skew,
            settle_skew=self.stop_skew,
            max_moves_per_round=self.max_node_moves_per_round,
            max_transit_fraction=self.max_nodes_in_transit_fraction,
        )


@dataclass(frozen=True, slots=True)
class AgentSchedulerSettings:
    """The whole ``agent-scheduler.yaml``."""

    shards: ShardSettings = field(default_factory=ShardSettings)
    rebalance: RebalanceSettings = field(default_factory=RebalanceSettings)

    def to_dict(self) -> dict[str, object]:
        return {name: _section_dict(getattr(self, name)) for name in _SECTIONS}


_SECTIONS = ("shards", "rebalance")

_IGNORED_SECTIONS = {
    "lease": "lease TTLs are process flags (--lease-ttl of each worker and coordinator)",
    "dispatch": "the wire intervals are protocol constants",
}
"""Sections accepted and ignored with a warning (see the module docstring), with the reason."""
_IGNORED_KEYS = {
    "rebalance": {
        "skewThreshold": "use startSkew (skew is the difference of worker fills, not a ratio)",
        "hysteresis": "use stopSkew",
    },
}
"""Keys accepted and ignored with a warning, per section."""


def _section_dict(section: DataclassInstance) -> dict[str, object]:
    out: dict[str, object] = {}
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if f.metadata["omit_default"] and value == f.default:
            continue
        out[f.metadata["key"]] = dict(value) if f.metadata["kind"] is dict else value
    return out


def _read_value(m: dict[str, object], f: dataclasses.Field[Any], path: str) -> object:
    meta = f.metadata
    key: str = meta["key"]
    if meta["kind"] is dict:  # name -> seconds, kept as sorted pairs (the settings stay hashable)
        mapping = fields.as_mapping(m[key], fields.sub(path, key))
        pairs = []
        for name in sorted(mapping, key=str):
            inner = fields.sub(path, key)
            seconds = fields.get_float(mapping, name, inner, 0.0)
            fields.check_range(seconds, fields.sub(inner, str(name)), meta["lo"], meta["hi"])
            pairs.append((str(name), seconds))
        return tuple(pairs)
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


def _read_section(default: _S, raw: object, path: str, warnings: list[str]) -> _S:
    m = {} if raw is None else dict(fields.as_mapping(raw, path))
    for key, hint in _IGNORED_KEYS.get(path, {}).items():
        if key in m:
            del m[key]
            warnings.append(f"{fields.sub(path, key)}: no longer a setting, ignored; {hint}")
    by_key = {f.metadata["key"]: f for f in dataclasses.fields(default)}
    fields.reject_unknown(m, path, by_key)
    changes = {by_key[k].name: _read_value(m, by_key[k], path) for k in m}
    return dataclasses.replace(default, **changes)


def parse_settings(text: str, warnings: list[str] | None = None) -> AgentSchedulerSettings:
    """Parse and validate ``agent-scheduler.yaml``; append ignored settings to ``warnings``.

    Raises ``PolicyConfigError`` (without ``source``) for anything that must not be applied.
    """
    found: list[str] = []
    doc = safeyaml.load_yaml(text)
    top = dict({} if doc is None else fields.as_mapping(doc, ""))
    for section, reason in _IGNORED_SECTIONS.items():
        if section in top:
            del top[section]
            found.append(f"{section}: no longer a setting, ignored; {reason}")
    fields.reject_unknown(top, "", _SECTIONS)
    base = AgentSchedulerSettings()
    settings = AgentSchedulerSettings(
        shards=_read_section(base.shards, top.get("shards"), "shards", found),
        rebalance=_read_section(base.rebalance, top.get("rebalance"), "rebalance", found),
    )
    rebalance = settings.rebalance
    if rebalance.stop_skew > rebalance.start_skew:
        raise PolicyConfigError(
            "rebalance.stopSkew",
            f"must be <= startSkew (got {rebalance.stop_skew:g} with startSkew {rebalance.start_skew:g})",
        )
    if warnings is not None:
        warnings.extend(found)
    return settings
