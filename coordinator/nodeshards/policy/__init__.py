"""The shard policy: which scheduler should own which node. Pure: no client, no clock, no I/O but logs.

Public surface (everything else is private to this package):

- ``parse_configmap(data) -> EffectivePolicy`` - validate a sharding ConfigMap's ``data`` (``sharding.yaml`` in
  Volcano's format, ``agent-scheduler.yaml`` with our settings); raises ``PolicyConfigError``.
- ``default_policy() -> EffectivePolicy`` - Volcano's defaults, for a cluster without the ConfigMap.
- ``EffectivePolicy.evaluate(nodes) -> ShardEvaluation`` - each scheduler's desired nodes (``NodeView`` in).
- ``EffectivePolicy.summary()`` / ``.version`` - for ``agent-scheduler status`` and change detection.

Layout: ``safeyaml`` (the ConfigMap's text read within limits: size, depth, no aliases, bounded literals and
messages), ``fields`` (typed YAML reads), ``durations`` (Go durations), ``plugins`` (one module per Volcano
policy, a registry), ``volcano`` / ``agentsettings`` (the two ConfigMap keys), ``pipeline`` (filter -> sort ->
select), ``evaluate`` (hysteresis and the move budget), ``effective`` (the versioned whole).
"""

from __future__ import annotations

from coordinator.nodeshards.policy.agentsettings import (
    AgentSchedulerSettings,
    RebalanceSettings,
    ShardSettings,
    parse_settings,
)
from coordinator.nodeshards.policy.effective import (
    DEFAULT_CONFIGMAP_NAME,
    DEFAULT_CONFIGMAP_NAMESPACE,
    SETTINGS_KEY,
    SHARDING_KEY,
    EffectivePolicy,
    default_policy,
    parse_configmap,
)
from coordinator.nodeshards.policy.errors import PolicyConfigError
from coordinator.nodeshards.policy.evaluate import ShardEvaluation, ShardMove, evaluate
from coordinator.nodeshards.policy.nodes import NodeView
from coordinator.nodeshards.policy.volcano import AGENT_TYPE, SchedulerPolicy, ShardingConfig, parse_sharding

__all__ = [
    "AGENT_TYPE",
    "DEFAULT_CONFIGMAP_NAME",
    "DEFAULT_CONFIGMAP_NAMESPACE",
    "SETTINGS_KEY",
    "SHARDING_KEY",
    "AgentSchedulerSettings",
    "EffectivePolicy",
    "NodeView",
    "PolicyConfigError",
    "RebalanceSettings",
    "SchedulerPolicy",
    "ShardEvaluation",
    "ShardMove",
    "ShardSettings",
    "ShardingConfig",
    "default_policy",
    "evaluate",
    "parse_configmap",
    "parse_settings",
    "parse_sharding",
]
