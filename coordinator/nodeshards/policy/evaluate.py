"""Evaluation: nodes in, each scheduler's desired node set out. Pure; no clock, no client.

Semantics (Volcano's, plus the dampers an operator needs):
1. Ideal pass: the pipeline (``pipeline.run``) over all schedulers in config order, with the incumbent
   hysteresis of ``ShardSettings`` (wider band and a score bonus for nodes a scheduler already holds).
2. Moves: a node *moves* when it has a holder and its new owner differs (another scheduler or none).
   Assigning a node nobody holds - a fresh cluster, a new node - is not a move and is never throttled.
3. Budget: when the ideal pass wants more than ``maxMovesPerSync`` moves, the most urgent ones are kept -
   nodes their holder's band rejects even with the margin first, then by node name - and every other held node
   is pinned to its holder; a second pass fills the remaining slots. At most the budget moves happen; the rest
   are reported as ``deferred`` and come back on the next sync, which converges because each sync applies some.
   While deferred, a node may sit outside its holder's band, and a holder may exceed ``maxNodes`` if it held
   more nodes than a newly lowered limit allows. Because deferred nodes keep their slots, an allowed move may
   land somewhere other than the ideal pass put it (possibly nowhere) until a later sync.
4. Residence (``minResidenceSeconds``, per holder ``minResidenceSecondsByScheduler``): nodes the caller names
   ``resting`` - held nodes that moved to their holder more recently than its residence - are pinned to their
   holder in every pass, like deferred nodes (they keep their slots, and selectors do not see them), and are not
   moves. The caller keeps the move times (the evaluation has no clock). A node thus never leaves a holder
   before its residence there is over, whatever the policy wants. When the residence with the side that lends
   is longer than the gap between two waves' needs, the nodes lent after one wave are not the ones taken back
   before the next: lent nodes rotate, and each moves at most once per wave.

All nodes are evaluated in one pass: there is no batching (Volcano's 50-node batches forgot earlier batches'
choices).

A holder that is not a configured scheduler any more (its entry was removed) counts as no holder: its nodes are
free at once. The caller chooses which nodes to offer (e.g. whether cordoned nodes take part).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from common.records import NodeName
from coordinator.nodeshards.policy import pipeline
from coordinator.nodeshards.policy.agentsettings import ShardSettings
from coordinator.nodeshards.policy.nodes import NodeView
from coordinator.nodeshards.policy.volcano import ShardingConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ShardMove:
    """A held node changing hands; ``target`` ``None`` means no scheduler wants it."""

    node: NodeName
    source: str
    target: str | None


@dataclass(frozen=True, slots=True)
class ShardEvaluation:
    """The outcome of one evaluation. Read-only mappings; node tuples are sorted by name."""

    desired: Mapping[str, tuple[NodeName, ...]]
    """Every configured scheduler -> its ``spec.nodesDesired`` (possibly empty), in config order."""
    unassigned: tuple[NodeName, ...]
    """Nodes no scheduler wants."""
    moves: tuple[ShardMove, ...]
    """Held nodes whose owner changes in this result."""
    deferred: tuple[ShardMove, ...]
    """Moves the ideal pass wanted but the move budget held back (target as the ideal pass had it)."""
    shortfall: Mapping[str, int]
    """Schedulers with fewer nodes than their node-limit ``minNodes`` -> how many fewer (informational)."""
    owners: Mapping[NodeName, str]
    """Every assigned node -> its scheduler (the inverse of ``desired``)."""

    def owner(self, node: NodeName) -> str | None:
        """The scheduler that wants ``node``, if any."""
        return self.owners.get(node)


def _owners(result: Mapping[str, list[NodeView]]) -> dict[NodeName, str]:
    return {node.name: name for name, nodes in result.items() for node in nodes}


def _moves(nodes: Iterable[NodeView], owners: Mapping[NodeName, str]) -> list[ShardMove]:
    return [
        ShardMove(n.name, n.holder, owners.get(n.name))
        for n in nodes
        if n.holder is not None and owners.get(n.name) != n.holder
    ]


def evaluate(
    sharding: ShardingConfig,
    settings: ShardSettings,
    nodes: Iterable[NodeView],
    resting: Collection[NodeName] = (),
) -> ShardEvaluation:
    """Compute every scheduler's desired nodes; see the module docstring for the rules. ``resting`` nodes (rule 4)
    stay with their holder; a resting node without a (known) holder is ignored.

    Raises ``ValueError`` if two views share a node name.
    """
    known = {s.name for s in sharding.schedulers}
    views = sorted(
        (n if n.holder is None or n.holder in known else replace(n, holder=None) for n in nodes),
        key=lambda n: n.name,
    )
    for a, b in itertools.pairwise(views):
        if a.name == b.name:
            raise ValueError(f"node {a.name!r} given twice")
    damping = pipeline.Damping.of(settings)
    rest = {n.name: n.holder for n in views if n.holder is not None and n.name in resting}
    result = pipeline.run(sharding.schedulers, views, damping, rest)
    wanted = _moves(views, _owners(result))
    deferred: list[ShardMove] = []
    budget = settings.max_moves_per_sync
    if budget is not None and len(wanted) > budget:
        by_name = {n.name: n for n in views}
        holders = {s.name: s for s in sharding.schedulers}

        def urgency(move: ShardMove) -> tuple[int, str]:
            leaving = not pipeline.wants(holders[move.source], by_name[move.node], damping)
            return (0 if leaving else 1, move.node)

        ordered = sorted(wanted, key=urgency)
        allowed = {m.node for m in ordered[:budget]}
        deferred = ordered[budget:]
        # Every held node not allowed to move is pinned, resting ones included (they were never moves).
        pinned = {n.name: n.holder for n in views if n.holder is not None and n.name not in allowed}
        result = pipeline.run(sharding.schedulers, views, damping, pinned)
    owners = _owners(result)
    moves = _moves(views, owners)
    shortfall = {}
    for scheduler in sharding.schedulers:
        short = max((sel.shortfall(len(result[scheduler.name])) for sel in scheduler.selectors), default=0)
        if short:
            shortfall[scheduler.name] = short
    log.debug(
        "shard evaluation: %d moves, %d deferred, %d unassigned",
        len(moves),
        len(deferred),
        len(views) - len(owners),
    )
    return ShardEvaluation(
        desired=MappingProxyType(
            {name: tuple(sorted(n.name for n in chosen)) for name, chosen in result.items()}
        ),
        unassigned=tuple(n.name for n in views if n.name not in owners),
        moves=tuple(moves),
        deferred=tuple(deferred),
        shortfall=MappingProxyType(shortfall),
        owners=MappingProxyType(owners),
    )
