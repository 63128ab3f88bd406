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

With ``reclaim: true`` the free CPU of a node is allocatable minus the requests of *this scheduler's own* pods
(``NodeView.requested_by``, by pod ``schedulerName``): other schedulers' pods on a node the shard takes leave as
they finish (the other side releases the node and places nothing new there), so their CPU counts as coming back.
The walk then takes nodes free of other schedulers' pods first (their CPU is usable now) and the rest after, each
group in rank order, so a node whose batch pods have drained is never handed back in favour of one still draining;
the result is still a subsequence of the ranked list.
This is what lets the shard grow when a batch backlog keeps every other node full (plain free CPU is then never
there to find), and stops it counting a taken node's draining batch pods as used (which would make it overshoot
and then hand the surplus back). It takes a filter that lets full nodes in (``maxCPUUtil: 1.0``); the price is
that capacity taken this way reaches the agents only as the other side's pods end.

Arguments: ``minFreeCPU`` (cores, > 0, required), ``reclaim`` (bool, default false).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from coordinator.nodeshards.policy import fields
from coordinator.nodeshards.policy.errors import PolicyConfigError
from coordinator.nodeshards.policy.nodes import NodeView

NAME = "free-capacity"
MIN_FREE_KEY = "minFreeCPU"
RECLAIM_KEY = "reclaim"


@dataclass(frozen=True, slots=True)
class FreeCapacity:
    """Keep ranked nodes until their free CPU reaches ``min_free_milli_cpu`` (``reclaim``: see the module)."""

    min_free_milli_cpu: int
    reclaim: bool = False

    @property
    def name(self) -> str:
        return NAME

    def _free(self, node: NodeView, scheduler: str) -> int:
        used = node.requested_by.get(scheduler, 0) if self.reclaim else node.requested_milli_cpu
        return max(0, node.allocatable_milli_cpu - used)

    def select(self, ranked: Sequence[NodeView], reserved: int, scheduler: str) -> Sequence[NodeView]:
        if self.reclaim:
            return self._reclaiming(ranked, scheduler)
        free = 0
        for i, node in enumerate(ranked):
            if free >= self.min_free_milli_cpu:
                return ranked[:i]
            free += self._free(node, scheduler)
        return ranked

    def _reclaiming(self, ranked: Sequence[NodeView], scheduler: str) -> Sequence[NodeView]:
        """Nodes without other schedulers' pods first (their CPU is free now), then the rest, each group in rank
        order; the chosen nodes are returned in rank order (a subsequence: nothing reordered)."""

        def others(node: NodeView) -> bool:
            return node.requested_milli_cpu > node.requested_by.get(scheduler, 0)

        order = sorted(range(len(ranked)), key=lambda i: (others(ranked[i]), i))
        free, keep = 0, []
        for i in order:
            if free >= self.min_free_milli_cpu:
                break
            free += self._free(ranked[i], scheduler)
            keep.append(i)
        return [ranked[i] for i in sorted(keep)]

    def shortfall(self, selected: int) -> int:
        return 0  # the target is CPU, not a node count: nothing to report in nodes

    def arguments(self) -> dict[str, object]:
        out: dict[str, object] = {MIN_FREE_KEY: self.min_free_milli_cpu / 1000}
        if self.reclaim:
            out[RECLAIM_KEY] = True
        return out

    def describe(self) -> str:
        return f"free CPU >= {self.min_free_milli_cpu / 1000:g}" + (" (reclaiming)" if self.reclaim else "")


def parse(args: Mapping[str, object], path: str, warnings: list[str]) -> FreeCapacity:
    """Build the plugin from ``arguments`` found at ``path``."""
    fields.reject_unknown(args, path, (MIN_FREE_KEY, RECLAIM_KEY))
    if MIN_FREE_KEY not in args:
        raise PolicyConfigError(fields.sub(path, MIN_FREE_KEY), "required (cores of free CPU to keep)")
    cores = fields.get_float(args, MIN_FREE_KEY, path, 0.0)
    if cores <= 0:
        raise PolicyConfigError(fields.sub(path, MIN_FREE_KEY), f"must be > 0, got {cores:g}")
    fields.check_range(cores, fields.sub(path, MIN_FREE_KEY), hi=1e9)
    return FreeCapacity(round(cores * 1000), fields.get_bool(args, RECLAIM_KEY, path, False))
