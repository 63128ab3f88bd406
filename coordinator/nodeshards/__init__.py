"""The NodeShard level: which nodes are for this scheduler's agents and which for Volcano's batch schedulers.

The operator writes the sharding ConfigMap (Volcano's ``sharding.yaml`` plus our ``agent-scheduler.yaml``); the
leader evaluates it, writes one Volcano ``NodeShard`` per scheduler, and hands the agent share to the worker-shard
level (``coordinator.workershards``) through ``PolicyPool``. This package never decides which worker process owns
a node; that is the shard map's job. It imports ``coordinator.workershards`` (the pool seam and the assignment's
balance settings) and is never imported by it.

Public surface:

- ``ShardingOptions`` - ConfigMap name/namespace, the scheduler served, the managed nodes.
- ``ShardingController(client, etcd, term, options, pool=..., held=shardmap.nodes_in_use, keys=...,
  assignment=...)`` - one term's loop; ``run()``, ``ready``.
- ``PolicyRecord`` / ``policy_key`` - what ``agent-scheduler status`` reads from etcd.

Modules: ``policy/`` (the pure policy: parse, validate, evaluate), ``configsource`` (the ConfigMap: judge each
version, keep the last good policy, Events), ``usage`` (CPU requests per node from a pod watch), ``bodies``
(NodeShard request bodies built and parsed), ``store`` (NodeShard watch and writes), ``controller`` (evaluate ->
NodeShard specs -> claim -> offer), ``eventsender`` (Event posting off the caller's path), ``published`` (the
policy record in etcd).
"""

from __future__ import annotations

from coordinator.nodeshards.configsource import REASON_APPLIED, REASON_INVALID, PolicySource, agent_entry
from coordinator.nodeshards.controller import HeldNodes, ShardingController, ShardingOptions
from coordinator.nodeshards.published import PolicyRecord, PolicyRecordError, policy_key

__all__ = [
    "REASON_APPLIED",
    "REASON_INVALID",
    "HeldNodes",
    "PolicyRecord",
    "PolicyRecordError",
    "PolicySource",
    "ShardingController",
    "ShardingOptions",
    "agent_entry",
    "policy_key",
]
