"""The registry of shard-policy plugins: policy name -> argument parser.

The parser in ``coordinator.nodeshards.policy.volcano`` looks names up here and nowhere else; adding a policy means one
module implementing the interfaces of ``base`` and one line below. The names are Volcano's, except ``free-capacity`` (ours, in Volcano's format).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from coordinator.nodeshards.policy.plugins import allocation_rate, free_capacity, node_limit, warmup
from coordinator.nodeshards.policy.plugins.base import Filterer, Scorer, Selector, ShardPlugin

PluginParser = Callable[[Mapping[str, object], str, list[str]], ShardPlugin]
"""``parse(arguments, path_of_arguments, warnings) -> plugin``; raises ``PolicyConfigError``."""

REGISTRY: Mapping[str, PluginParser] = MappingProxyType(
    {
        allocation_rate.NAME: allocation_rate.parse,
        warmup.NAME: warmup.parse,
        node_limit.NAME: node_limit.parse,
        free_capacity.NAME: free_capacity.parse,
    }
)

__all__ = ["REGISTRY", "Filterer", "PluginParser", "Scorer", "Selector", "ShardPlugin"]
