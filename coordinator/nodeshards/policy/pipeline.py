"""One pass of Volcano's per-scheduler pipeline over all schedulers: filter -> sort -> select.

Invariants:
- Schedulers run in config order; a node chosen (or pinned) for one scheduler is not offered to any other, so
  every node ends up with at most one scheduler.
- Ranking is deterministic: weighted score descending, then node name ascending; input order never matters.
  Scores are rounded to 1e-9 before comparing so float noise cannot reorder equal scores.
- ``pinned`` nodes (deferred moves, see ``evaluate``) stay with their holder unconditionally, are offered to
  nobody else, and occupy their holder's slots (selectors see them as ``reserved``).

Damping for nodes a scheduler already holds (its incumbents): filters are widened by ``band_margin_pct`` and
the weighted score gets ``rank_bonus``. Nothing else here knows about hysteresis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from common.records import NodeName
from coordinator.nodeshards.policy.agentsettings import ShardSettings
from coordinator.nodeshards.policy.nodes import NodeView
from coordinator.nodeshards.policy.plugins.allocation_rate import to_percent
from coordinator.nodeshards.policy.volcano import SchedulerPolicy


@dataclass(frozen=True, slots=True)
class Damping:
    """Hysteresis applied to incumbents: a wider band and a score bonus."""

    band_margin_pct: int = 0
    rank_bonus: float = 0.0

    @classmethod
    def of(cls, settings: ShardSettings) -> Damping:
        return cls(to_percent(settings.band_hysteresis), settings.rank_hysteresis)


def accepts(scheduler: SchedulerPolicy, node: NodeView, margin_pct: int) -> bool:
    """Whether every filter of ``scheduler`` accepts ``node`` (no filter: yes)."""
    return all(f.accepts(node, margin_pct) for f in scheduler.filters)


def wants(scheduler: SchedulerPolicy, node: NodeView, damping: Damping) -> bool:
    """Whether ``scheduler``'s filters accept ``node``, with the incumbent margin when it holds the node."""
    margin = damping.band_margin_pct if node.holder == scheduler.name else 0
    return accepts(scheduler, node, margin)


def rank(scheduler: SchedulerPolicy, pool: Sequence[NodeView], damping: Damping) -> list[NodeView]:
    """The nodes of ``pool`` that pass the filters, best first."""
    scored: list[tuple[float, NodeName, NodeView]] = []
    for node in pool:
        if not wants(scheduler, node, damping):
            continue
        total = sum(weight * scorer.score(node) for weight, scorer in scheduler.scorers)
        if node.holder == scheduler.name:
            total += damping.rank_bonus
        scored.append((-round(total, 9), node.name, node))
    scored.sort(key=lambda entry: (entry[0], entry[1]))
    return [entry[2] for entry in scored]


def select(scheduler: SchedulerPolicy, ranked: Sequence[NodeView], reserved: int) -> list[NodeView]:
    """Run the selectors in config order, each on the previous one's output."""
    chosen: Sequence[NodeView] = ranked
    for selector in scheduler.selectors:
        if not chosen:
            break
        chosen = selector.select(chosen, reserved, scheduler.name)
    return list(chosen)


def run(
    schedulers: Sequence[SchedulerPolicy],
    nodes: Sequence[NodeView],
    damping: Damping,
    pinned: Mapping[NodeName, str],
) -> dict[str, list[NodeView]]:
    """Each scheduler's nodes (pinned first, then selected in rank order)."""
    by_name = {node.name: node for node in nodes}
    taken: set[NodeName] = set(pinned)
    result: dict[str, list[NodeView]] = {}
    for scheduler in schedulers:
        own = [by_name[name] for name, holder in pinned.items() if holder == scheduler.name]
        pool = [node for node in nodes if node.name not in taken]
        chosen = select(scheduler, rank(scheduler, pool, damping), len(own))
        taken.update(node.name for node in chosen)
        result[scheduler.name] = own + chosen
    return result
