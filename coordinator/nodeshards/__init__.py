"""The shard policy at run time: the sharding ConfigMap watched and hot-reloaded, the agent pool it yields, and the
NodeShard handoff with Volcano's schedulers. The pure policy (parse, validate, evaluate) is ``coordinator.policy``.

Public surface:

- ``ShardingOptions`` - ConfigMap name/namespace, the scheduler served, the managed nodes.
- ``PolicyPool`` - the ``PoolSource`` the shard map reads (``coordinator.shardmap``).
- ``ShardingController(client, etcd, term, options, pool=..., held=shardmap.nodes_in_use, keys=...)`` - one
  term's loop; ``run()``, ``ready``, ``statistics()``.
- ``PolicyRecord`` / ``policy_key`` - what ``agent-scheduler status`` reads from etcd.

Modules: ``configsource`` (the ConfigMap: judge each version, keep the last good policy, Events), ``usage`` (nodes
and CPU requests per node from two watches), ``nodeshards`` (NodeShard watch and writes), ``pool``
(``PolicyPool``), ``controller`` (evaluate -> NodeShard specs -> claim -> offer), ``events`` (Event posting),
``record`` (the etcd report).
"""

from __future__ import annotations

from coordinator.sharding.configsource import REASON_APPLIED, REASON_INVALID, PolicySource, agent_entry
from coordinator.sharding.controller import HeldNodes, ShardingController, ShardingOptions, ShardingStats
from coordinator.sharding.pool import PolicyPool
from coordinator.sharding.record import PolicyRecord, PolicyRecordError, policy_key

__all__ = [
    "REASON_APPLIED",
    "REASON_INVALID",
    "HeldNodes",
    "PolicyPool",
    "PolicyRecord",
    "PolicyRecordError",
    "PolicySource",
    "ShardingController",
    "ShardingOptions",
    "ShardingStats",
    "agent_entry",
    "policy_key",
]
