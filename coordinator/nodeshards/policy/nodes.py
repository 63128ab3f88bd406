"""What the shard policy knows about a node: one immutable ``NodeView`` per node, built by the caller.

Utilisation follows Volcano's sharding controller: the sum of CPU *requests* of the pods on the node over the
node's allocatable CPU (no metrics server), rounded to two decimals before any comparison. Here the rounding is
exact integer arithmetic (``util_pct`` is a whole percentage, half rounded up), so a band edge of ``0.7`` means
exactly "70 % or more after rounding", never a float accident.

Deliberate differences from Volcano, both documented in the user-facing ConfigMap example:
- A node whose requests exceed allocatable (allocatable shrank under running pods) counts as 100 %, not as
  "outside every band": it is full, and dropping it from every shard would only cause churn.
- A node with no allocatable CPU (missing or zero) has no utilisation; ``allocation-rate`` rejects it, as
  Volcano rejects a node without metrics, and every score of it is 0.

``holder`` is the scheduler whose NodeShard lists the node now (its current ``spec.nodesDesired``); the caller
derives it from the NodeShards it watches. It drives hysteresis and move accounting and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from common.records import NodeName


def util_percent(requested_milli_cpu: int, allocatable_milli_cpu: int) -> int | None:
    """Requests over allocatable as a whole percentage in ``[0, 100]``, half rounded up; ``None`` if no CPU."""
    if allocatable_milli_cpu <= 0:
        return None
    requested = max(0, requested_milli_cpu)
    pct = (200 * requested + allocatable_milli_cpu) // (2 * allocatable_milli_cpu)
    return min(pct, 100)


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node as the shard policy sees it. Immutable; build a new one when the node changes."""

    name: NodeName
    allocatable_milli_cpu: int
    """Allocatable CPU of the node in millicores (``status.allocatable.cpu``)."""
    requested_milli_cpu: int
    """Sum of the CPU requests of the non-terminated pods bound to the node, in millicores."""
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    """The node's labels (for ``warmup``)."""
    holder: str | None = None
    """Scheduler whose NodeShard currently lists the node, or ``None``."""
    requested_by: Mapping[str, int] = field(default_factory=dict, hash=False, compare=False)
    """Millicores of ``requested_milli_cpu`` per pod ``schedulerName`` (for ``free-capacity``'s ``reclaim``)."""
    util_pct: int | None = field(init=False, compare=False)
    """Utilisation in whole percent, ``None`` when the node has no allocatable CPU (computed)."""

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "util_pct", util_percent(self.requested_milli_cpu, self.allocatable_milli_cpu)
        )
