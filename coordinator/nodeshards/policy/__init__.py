"""The shard policy: which scheduler should own which node. Pure: no client, no clock, no I/O but logs.

Public surface (everything else is private to this package):

- ``parse_configmap(data) -> EffectivePolicy`` - validate a sharding ConfigMap's ``data`` (``sharding.yaml`` in
  Volcano's format, ``agent-scheduler.yaml`` with our settings); raises ``PolicyConfigError``.
- ``default_policy() -> EffectivePolicy`` - Volcano's defaults, for a cluster without the ConfigMap.
- ``EffectivePolicy.evaluate(nodes) -> Assignment`` - each scheduler's desired nodes (``NodeView`` in).
- ``EffectivePolicy.summary()`` / ``.version`` - for ``agent-scheduler status`` and change detection.

Layout: ``fields`` (typed YAML reads), ``durations`` (Go durations), ``plugins`` (one module per Volcano
policy, a registry), ``sharding`` / ``settings`` (the two ConfigMap keys), ``pipeline`` (filter -> sort ->
select), ``evaluate`` (hysteresis and the move budget), ``effective`` (the versioned whole).
"""

from __future__ import annotations

from coordinator.policy.effective import (
    DEFAULT_CONFIGMAP_NAME,
    DEFAULT_CONFIGMAP_NAMESPACE,
    SETTINGS_KEY,
    SHARDING_KEY,
    EffectivePolicy,
    default_policy,
    parse_configmap,
)
from coordinator.policy.errors import PolicyConfigError
from coordinator.policy.evaluate import Assignment, Move, evaluate
from coordinator.policy.nodes import NodeView
from coordinator.policy.settings import (
    AgentSchedulerSettings,
    DispatchSettings,
    LeaseSettings,
    RebalanceSettings,
    ShardSettings,
    parse_settings,
)
from coordinator.policy.sharding import AGENT_TYPE, SchedulerPolicy, ShardingConfig, parse_sharding

__all__ = [
    "AGENT_TYPE",
    "DEFAULT_CONFIGMAP_NAME",
    "DEFAULT_CONFIGMAP_NAMESPACE",
    "SETTINGS_KEY",
    "SHARDING_KEY",
    "AgentSchedulerSettings",
    "Assignment",
    "DispatchSettings",
    "EffectivePolicy",
    "LeaseSettings",
    "Move",
    "NodeView",
    "PolicyConfigError",
    "RebalanceSettings",
    "SchedulerPolicy",
    "ShardSettings",
    "ShardingConfig",
    "default_policy",
    "evaluate",
    "parse_configmap",
    "parse_settings",
    "parse_sharding",
]
