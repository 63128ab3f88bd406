"""``EffectivePolicy``: the validated ConfigMap as one immutable value with a stable version.

The coordinator turns each observed ConfigMap into an ``EffectivePolicy`` with ``parse_configmap``; on
``PolicyConfigError`` it logs and keeps the previous one (and keeps the last one when the ConfigMap is
deleted), as Volcano does. With no ConfigMap at all it starts from ``default_policy()``, Volcano's built-in
defaults.

``version`` is the first 12 hex digits of a SHA-256 over the canonical JSON of the *normalised* policy
(defaults filled in, legacy fields converted), so comments, key order, quoting or ``60s`` vs ``1m`` do not
change it, while any change that could change an evaluation does. Warnings do not enter the version.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache

from common.records import NodeName
from coordinator.nodeshards.policy.agentsettings import AgentSchedulerSettings, parse_settings
from coordinator.nodeshards.policy.durations import format_seconds
from coordinator.nodeshards.policy.errors import PolicyConfigError
from coordinator.nodeshards.policy.evaluate import ShardEvaluation, evaluate
from coordinator.nodeshards.policy.nodes import NodeView
from coordinator.nodeshards.policy.safeyaml import MAX_SHOWN, check_data
from coordinator.nodeshards.policy.volcano import SchedulerPolicy, ShardingConfig, parse_sharding

log = logging.getLogger(__name__)

SHARDING_KEY = "sharding.yaml"
"""ConfigMap data key holding Volcano's sharding configuration."""
SETTINGS_KEY = "agent-scheduler.yaml"
"""ConfigMap data key holding this project's settings (``coordinator.nodeshards.policy.agentsettings``)."""
DEFAULT_CONFIGMAP_NAME = "volcano-sharding-configmap"
DEFAULT_CONFIGMAP_NAMESPACE = "volcano-system"
MAX_LOGGED_FINDINGS = 20
"""At most this many warnings of one ConfigMap are logged (all are kept on the policy)."""
SCHEMA_VERSION = 1
"""Bumped when the meaning of the normalised form changes, so versions never collide across releases."""

DEFAULT_SHARDING_YAML = """\
schedulerConfigs:
  - name: volcano
    type: volcano
    policies:
      - {name: allocation-rate, weight: 1, arguments: {minCPUUtil: 0.0, maxCPUUtil: 0.6}}
      - {name: node-limit, arguments: {minNodes: 2, maxNodes: 100}}
  - name: agent-scheduler
    type: agent
    policies:
      - {name: allocation-rate, weight: 1, arguments: {minCPUUtil: 0.7, maxCPUUtil: 1.0}}
      - {name: warmup, weight: 1}
      - {name: node-limit, arguments: {minNodes: 2, maxNodes: 100}}
shardSyncPeriod: "60s"
enableNodeEventTrigger: true
"""
"""Volcano's flag defaults (``volcano:volcano:0.0:0.6:false:2:100``, ``agent-scheduler:agent:0.7:1.0:true:2:100``)."""


@dataclass(frozen=True, slots=True)
class EffectivePolicy:
    """What the coordinator applies: Volcano's sharding config plus our settings, and a version."""

    sharding: ShardingConfig
    settings: AgentSchedulerSettings = field(default_factory=AgentSchedulerSettings)
    warnings: tuple[str, ...] = field(default=(), compare=False)
    """Non-fatal findings (deprecated fields converted or ignored, unknown top-level fields ignored)."""
    version: str = field(init=False, compare=False)
    """Stable hash of the normalised policy (see the module docstring)."""

    def __post_init__(self) -> None:
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        object.__setattr__(self, "version", hashlib.sha256(canonical.encode()).hexdigest()[:12])

    def to_dict(self) -> dict[str, object]:
        """The normalised policy as plain data (what ``version`` hashes)."""
        return {
            "schema": SCHEMA_VERSION,
            SHARDING_KEY: self.sharding.to_dict(),
            SETTINGS_KEY: self.settings.to_dict(),
        }

    def agent_scheduler(self, name: str | None = None) -> SchedulerPolicy:
        """The ``agent``-type entry called ``name``, or the only one when ``name`` is ``None``.

        Raises ``LookupError`` when there is no such entry, or several and no name.
        """
        agents = self.sharding.agent_schedulers
        if name is None:
            if len(agents) != 1:
                raise LookupError(f"{len(agents)} agent schedulers configured; name the one to use")
            return agents[0]
        for agent in agents:
            if agent.name == name:
                return agent
        raise LookupError(f"no scheduler of type agent named {name!r}")

    def evaluate(self, nodes: Iterable[NodeView], resting: Collection[NodeName] = ()) -> ShardEvaluation:
        """Each scheduler's desired nodes for this policy (``coordinator.nodeshards.policy.evaluate``);
        ``resting``: nodes that moved less than ``minResidenceSeconds`` ago (they stay with their holder)."""
        return evaluate(self.sharding, self.settings.shards, nodes, resting)

    def summary(self) -> str:
        """A compact multi-line description for ``agent-scheduler status``."""
        s, shards, reb = self.sharding, self.settings.shards, self.settings.rebalance
        moves = "unbounded" if shards.max_moves_per_sync is None else str(shards.max_moves_per_sync)
        lines = [
            f"policy {self.version}: sync every {format_seconds(s.shard_sync_period_ns)}, "
            f"node events {'on' if s.enable_node_event_trigger else 'off'}"
        ]
        lines += [f"  {i}. {scheduler.describe()}" for i, scheduler in enumerate(s.schedulers, 1)]
        rest = [("", shards.min_residence_seconds)] if shards.min_residence_seconds else []
        rest += [(f" {name}", seconds) for name, seconds in shards.min_residence_by_scheduler]
        residence = "".join(
            f", residence{name} {format_seconds(round(seconds * 1e9))}" for name, seconds in rest
        )
        lines.append(
            f"  shards: band hysteresis {shards.band_hysteresis:g}, rank hysteresis {shards.rank_hysteresis:g}, "
            f"moves/sync {moves}{residence}"
        )
        lines.append(f"  workers: {reb.assignment_config().describe()}")
        if self.warnings:
            lines.append(f"  warnings: {len(self.warnings)} (first: {self.warnings[0]})")
        return "\n".join(lines)


def parse_configmap(data: Mapping[str, str] | None) -> EffectivePolicy:
    """Parse and validate a sharding ConfigMap's ``data``; warnings are logged and kept on the result.

    ``sharding.yaml`` is required; ``agent-scheduler.yaml`` is optional (all defaults). Other keys are ignored
    with a warning. Sizes are capped before any YAML is read (``safeyaml.check_data``). Raises
    ``PolicyConfigError`` whose ``source`` names the offending key.
    """
    data = data or {}
    check_data(data, _KEYS)
    warnings: list[str] = []
    text = data.get(SHARDING_KEY)
    if text is None:
        raise PolicyConfigError("", "key missing from the ConfigMap", source=SHARDING_KEY)
    try:
        sharding = parse_sharding(text, warnings)
    except PolicyConfigError as e:
        raise e.in_source(SHARDING_KEY) from e
    settings_warnings: list[str] = []
    try:
        settings = parse_settings(data.get(SETTINGS_KEY, ""), settings_warnings)
    except PolicyConfigError as e:
        raise e.in_source(SETTINGS_KEY) from e
    findings = [f"{SHARDING_KEY}: {w}" for w in warnings]
    findings += [f"{SETTINGS_KEY}: {w}" for w in settings_warnings]
    findings += [
        f"{key[:MAX_SHOWN]}: unknown ConfigMap key ignored" for key in sorted(data) if key not in _KEYS
    ]
    for finding in findings[:MAX_LOGGED_FINDINGS]:
        log.warning("sharding ConfigMap: %s", finding)
    if len(findings) > MAX_LOGGED_FINDINGS:
        log.warning("sharding ConfigMap: %d more warnings not logged", len(findings) - MAX_LOGGED_FINDINGS)
    return EffectivePolicy(sharding, settings, tuple(findings))


_KEYS = (SHARDING_KEY, SETTINGS_KEY)


@cache
def default_policy() -> EffectivePolicy:
    """Volcano's built-in defaults and our default settings, for when no ConfigMap exists yet."""
    return EffectivePolicy(parse_sharding(DEFAULT_SHARDING_YAML, []))
