"""``free-capacity``: keep the fewest nodes, in rank order, whose free CPU adds up to ``minFreeCPU`` (a selector).

Not one of Volcano's policies (its selector, ``node-limit``, counts nodes): this one sizes a shard by headroom,
so an agent shard holds as many nodes as its free capacity needs and no more - fewer when the nodes it ranks first
(busiest first under ``allocation-rate``) still have room, more while its pods fill them. Written in Volcano's
format (a ``policies`` entry with ``arguments``) so the ConfigMap stays one document; Volcano's own controller
rejects the unknown name, so a cluster running it must keep it off (docs/volcano.md).

Free CPU of a node = allocatable - requested, never below 0. The selector walks the ranked list and keeps nodes
until the kept nodes' free CPU reaches ``minFreeCPU`` (the node that reaches it is kept); a list that never
reaches it is kept whole. Nodes pinned to the scheduler by deferred moves (``reserved``) are not visible to a
selector, so their free CPU is not counted: the shard may then hold more than the target, never less.

Arguments: ``minFreeCPU`` (cores, > 0, required).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from coordinator.nodeshards.policy import fields
from coordinator.nodeshards.policy.errors import PolicyConfigError
from coordinator.nodeshards.policy.nodes import NodeView

NAME = "free-capacity"
MIN_FREE_KEY = "minFreeCPU"


@dataclass(frozen=True, slots=True)
class FreeCapacity:
    """Keep ranked nodes until their free CPU reaches ``min_free_milli_cpu``."""

    min_free_milli_cpu: int

    @property
    def name(self) -> str:
        return NAME

    def select(self, ranked: Sequence[NodeView], reserved: int) -> Sequence[NodeView]:
        free = 0
        for i, node in enumerate(ranked):
            if free >= self.min_free_milli_cpu:
                return ranked[:i]
            free += max(0, node.allocatable_milli_cpu - node.requested_milli_cpu)
        return ranked

    def shortfall(self, selected: int) -> int:
        return 0  # the target is CPU, not a node count: nothing to report in nodes

    def arguments(self) -> dict[str, object]:
        return {MIN_FREE_KEY: self.min_free_milli_cpu / 1000}

    def describe(self) -> str:
        return f"free CPU >= {self.min_free_milli_cpu / 1000:g}"


def parse(args: Mapping[str, object], path: str, warnings: list[str]) -> FreeCapacity:
    """Build the plugin from ``arguments`` found at ``path``."""
    fields.reject_unknown(args, path, (MIN_FREE_KEY,))
    if MIN_FREE_KEY not in args:
        raise PolicyConfigError(fields.sub(path, MIN_FREE_KEY), "required (cores of free CPU to keep)")
    cores = fields.get_float(args, MIN_FREE_KEY, path, 0.0)
    if cores <= 0:
        raise PolicyConfigError(fields.sub(path, MIN_FREE_KEY), f"must be > 0, got {cores:g}")
    fields.check_range(cores, fields.sub(path, MIN_FREE_KEY), hi=1e9)
    return FreeCapacity(round(cores * 1000))
