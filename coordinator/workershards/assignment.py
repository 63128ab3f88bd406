"""Assignment policy: which worker should own each agent node. Pure: no I/O, no clock, no randomness.

Three layers, each answering one question:
1. Shares. How much node capacity should each worker carry? Its capacity weight, scaled by a load
   factor (workers under more pressure than the average get less; bounded to [0.5, 1.5] by default).
2. Placement of free nodes (new nodes, nodes of departed workers, nodes in transit): weighted rendezvous
   (highest-random-weight) hashing, bounded: a node goes to the best-ranked worker that stays within
   its share, else to the least filled one. Free nodes cost no handoff, so they are placed for balance
   first and hash affinity second. Rendezvous is why a join or a leave moves few nodes: a node's ranking
   of the other workers does not change when one worker comes or goes.
3. Rebalancing of held nodes, with hysteresis. Nothing moves until skew exceeds ``skew_threshold``; then
   nodes move, largest first, from over-full workers (most over-full first) to under-full ones (most
   under-full first), each move shrinking both the giver's and the taker's deviation from their share,
   until skew falls to ``settle_skew``, no move helps, or the round's budget of nodes in transit is spent.
   The rebalancing state carries over between rounds; that is the policy's only state.

Nodes in transit (a handoff: released by the old owner, not yet usable by the new one) are bounded so that a
join converges in a few rounds at any pool size while no worker loses much of its shard at once:
- at most ``transit_limit(pool)`` = max(``max_moves_per_round``, ``max_transit_fraction`` x pool nodes) nodes
  are in transit at once over all workers (handoffs still in flight use up the round's budget);
- one round takes at most max(``max_moves_per_round``, ``max_transit_fraction`` x its nodes) from any one
  worker, so a round leaves every worker at least 1 - ``max_transit_fraction`` of the nodes it could use
  (at large pools; the policy does not know which worker a handoff still in flight came from, so only the
  global bound covers handoffs of earlier rounds).
Every handoff of a round starts together and a node in transit never moves again before it arrives, so a
node is unusable for at most one handoff time, and a pod is held up at most that long. With the defaults
(10 %), a worker joining 8 on the 100,000-node fleet of ``bench simulate`` is within the ``settle_skew`` band
after one round (3,869 of the largest nodes in transit; 10,000 would be allowed); ``max_moves_per_round``
keeps small pools moving as before.
A departed worker's nodes are free, not handoffs: they are all placed in the next round.

Skew, the one definition (the ConfigMap's ``rebalance`` settings use it too): a worker's *fill* is the capacity
it holds divided by its share (1.0 = exactly its share, 0 = nothing); skew is the highest fill minus the lowest,
over the live workers. 0 is perfect balance; with two equal workers, a 55/45 split is skew 0.2; a worker that
just joined (fill 0) makes skew the fill of the fullest one.

The operator sets ``skew_threshold``, ``settle_skew``, ``max_moves_per_round`` and ``max_transit_fraction``
through the sharding ConfigMap (``coordinator.nodeshards.policy.agentsettings``); ``configure`` takes a new ``AssignmentConfig``
between rounds. The load-factor knobs are not exposed.

Nodes held by a live worker stay where they are unless rebalancing moves them (stickiness). Output is
deterministic for equal inputs, whatever the iteration order of the mappings passed in.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass

from common.etcd.keys import WorkerId
from common.etcd.schema import LoadReport
from common.records import NodeName

EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class AssignmentConfig:
    """The assignment's balancing knobs. Defaults suit tens of workers and hundreds to thousands of nodes."""

    skew_threshold: float = 0.25  # start rebalancing when max fill - min fill exceeds this
    settle_skew: float = 0.10  # ... and stop once it is back under this (hysteresis band)
    max_moves_per_round: int = (
        32  # handoffs in flight at once, at least; each costs a release + ack round trip
    )
    max_transit_fraction: float = (
        0.10  # ... and up to this fraction of the pool, of each worker's nodes a round
    )
    load_sensitivity: float = 0.5  # share change per unit of pressure above/below the workers' mean
    pending_soft_limit: int = 500  # this many pending pods count as pressure 1.0 (one busy core)
    min_load_factor: float = 0.5
    max_load_factor: float = 1.5

    def __post_init__(self) -> None:
        if not 0 <= self.settle_skew <= self.skew_threshold:
            raise ValueError("want 0 <= settle_skew <= skew_threshold")
        if not 0 <= self.max_transit_fraction <= 1:
            raise ValueError("want 0 <= max_transit_fraction <= 1")
        if self.max_moves_per_round < 0 or self.pending_soft_limit <= 0 or self.load_sensitivity < 0:
            raise ValueError("max_moves_per_round and load_sensitivity must be >= 0, pending_soft_limit > 0")
        if not 0 < self.min_load_factor <= 1 <= self.max_load_factor:
            raise ValueError("want 0 < min_load_factor <= 1 <= max_load_factor")

    def describe(self) -> str:
        """One line for logs and ``agent-scheduler status``."""
        return (
            f"rebalance when skew > {self.skew_threshold:g} until <= {self.settle_skew:g}, "
            f"at most max({self.max_moves_per_round}, {self.max_transit_fraction:.0%} of the pool) nodes in transit"
        )

    def transit_limit(self, pool_nodes: int) -> int:
        """Nodes that may be in transit at once over all workers, for a pool of ``pool_nodes`` nodes."""
        return max(self.max_moves_per_round, math.floor(self.max_transit_fraction * pool_nodes))

    def source_quota(self, held_nodes: int) -> int:
        """Nodes one round may take from a worker holding ``held_nodes`` nodes."""
        return max(self.max_moves_per_round, math.floor(self.max_transit_fraction * held_nodes))


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    weight: float = 1.0  # capacity hint from the worker's membership record
    load: LoadReport | None = None  # latest load report, if any


@dataclass(frozen=True, slots=True)
class WorkerMove:
    """A held node handed from one worker process to another."""

    node: NodeName
    source: WorkerId
    target: WorkerId


@dataclass(frozen=True, slots=True)
class Plan:
    target: Mapping[NodeName, WorkerId]  # every pool node, when there is at least one worker
    moves: tuple[WorkerMove, ...]  # held nodes to hand over (the rest of the target is new placements)
    skew: float  # skew of the target
    rebalancing: bool  # still inside a rebalancing episode after this round


def hrw_score(node: NodeName, worker: WorkerId, weight: float = 1.0) -> float:
    """Weighted rendezvous score; the highest-scoring worker wins a node. A worker of weight 2 wins twice
    as often as one of weight 1 (score = weight / -ln(u), u uniform in (0, 1) from a stable hash)."""
    digest = hashlib.blake2b(f"{node}\x00{worker}".encode(), digest_size=8).digest()
    u = (int.from_bytes(digest, "big") + 0.5) / 2.0**64
    return weight / -math.log(u)


def pressure(load: LoadReport, config: AssignmentConfig) -> float:
    """How hard a worker is pushed, in "busy cores": its CPU use, or its backlog if that is worse."""
    backlog = load.pending_pods / config.pending_soft_limit
    return min(max(load.process_cpu, backlog), 2.0)


def effective_weights(
    workers: Mapping[WorkerId, WorkerInfo], config: AssignmentConfig
) -> dict[WorkerId, float]:
    """Capacity weight times load factor. Workers without a report count as average."""
    pressures = {w: pressure(info.load, config) for w, info in workers.items() if info.load is not None}
    mean = sum(pressures.values()) / len(pressures) if pressures else 0.0
    weights = {}
    for w, info in workers.items():
        factor = 1.0 + config.load_sensitivity * (mean - pressures.get(w, mean))
        weights[w] = info.weight * min(max(factor, config.min_load_factor), config.max_load_factor)
    return weights


def shares(weights: Mapping[WorkerId, float], total_capacity: float) -> dict[WorkerId, float]:
    """Each worker's share of ``total_capacity``, in proportion to its effective weight. One computation for
    ``plan`` and ``stands``: ``stands`` promises what ``plan`` would do, so both must compute the same floats."""
    total_weight = sum(weights.values())
    return {w: total_capacity * weights[w] / total_weight for w in weights}


def skew(held: Mapping[WorkerId, float], share: Mapping[WorkerId, float]) -> float:
    """Highest fill (held / share) minus lowest, over the workers with a share; 0 is perfect balance."""
    fills = [held.get(w, 0.0) / s for w, s in share.items() if s > 0]
    return max(fills) - min(fills) if fills else 0.0


class AssignmentPolicy:
    """Computes targets round after round; remembers only whether a rebalancing episode is under way."""

    def __init__(self, config: AssignmentConfig | None = None) -> None:
        self._config = config or AssignmentConfig()
        self._rebalancing = False
        # What ``stands`` needs of the latest plan when that plan kept every node where it was (no free node
        # placed, no move) and ended outside an episode: the capacity each worker held, and the pool's total.
        self._kept: tuple[dict[WorkerId, float], float] | None = None

    @property
    def config(self) -> AssignmentConfig:
        return self._config

    def configure(self, config: AssignmentConfig) -> None:
        """Use ``config`` from the next ``plan`` on. A rebalancing episode under way continues under the new
        thresholds (it ends at once if skew is already within the new ``settle_skew``)."""
        self._config = config

    @property
    def rebalancing(self) -> bool:
        return self._rebalancing

    def stands(self, weights: Mapping[WorkerId, float]) -> bool:
        """Would the latest ``plan``, on the same inputs but with these effective weights
        (``effective_weights``), return the same target, move nothing and leave the policy as it is? True
        only if that plan placed no free node, moved nothing and ended outside a rebalancing episode, the
        workers are the same, and the skew against the shares these weights give stays within
        ``skew_threshold`` (so no episode starts). Then ``plan`` would keep every node where it is: the
        target is ``current`` plus ``pending`` either way, and only the shares depend on the weights.

        The configuration must be the one that plan ran under (the caller compares it; ``configure`` alone
        does not forget the plan)."""
        if self._kept is None:  # also while an episode is under way: only a plan that ended outside one keeps
            return False
        held, total_capacity = self._kept
        if weights.keys() != held.keys() or sum(weights.values()) <= 0:
            return False
        return skew(held, shares(weights, total_capacity)) <= self._config.skew_threshold

    def plan(
        self,
        nodes: Mapping[NodeName, float],
        workers: Mapping[WorkerId, WorkerInfo],
        current: Mapping[NodeName, WorkerId],
        *,
        pending: Mapping[NodeName, WorkerId] | None = None,
        in_transit: int = 0,
    ) -> Plan:
        """Target owner for every node in ``nodes`` (name -> capacity weight).

        ``current``: nodes a live worker holds and may keep using (movable). ``pending``: nodes on their
        way to a live worker (being released by their old owner); they count as the receiver's and stay
        put, so the policy does not change its mind mid-handoff. Any other node (free, held by departed
        workers, in transit to nobody known) is placed afresh. ``in_transit`` counts handoffs not
        finished yet; they use up this round's move budget.
        """
        self._kept = None
        if not workers or not nodes:
            self._rebalancing = False
            return Plan({}, (), 0.0, False)
        cfg = self._config
        weights = effective_weights(workers, cfg)
        total_capacity = sum(nodes.values())
        share = shares(weights, total_capacity)
        order = sorted(workers)

        target: dict[NodeName, WorkerId] = {}
        held = dict.fromkeys(order, 0.0)
        by_worker: dict[WorkerId, set[NodeName]] = {w: set() for w in order}
        for node, owner in current.items():
            if node in nodes and owner in by_worker:
                target[node] = owner
                held[owner] += nodes[node]
                by_worker[owner].add(node)
        for node, owner in (pending or {}).items():
            if node in nodes and owner in by_worker and node not in target:
                target[node] = owner  # not in by_worker: not movable until it has arrived
                held[owner] += nodes[node]

        # Free nodes, heaviest first so the bound leaves room for them; names break ties for determinism.
        free = sorted((n for n in nodes if n not in target), key=lambda n: (-nodes[n], n))
        for node in free:
            size = nodes[node]
            ranked = sorted(order, key=lambda w: (-hrw_score(node, w, weights[w]), w))
            fitting = [w for w in ranked if held[w] + size <= share[w] + EPSILON]
            owner = fitting[0] if fitting else min(order, key=lambda w: ((held[w] + size) / share[w], w))
            target[node] = owner
            held[owner] += size
            by_worker[owner].add(node)

        moves: list[WorkerMove] = []
        spread = skew(held, share)
        if not self._rebalancing and spread > cfg.skew_threshold:
            self._rebalancing = True
        budget = max(cfg.transit_limit(len(nodes)) - in_transit, 0)
        if self._rebalancing and budget > 0 and spread > cfg.settle_skew:
            moves, helped = self._rebalance(nodes, held, share, by_worker, order=order, budget=budget)
            for move in moves:
                target[move.node] = move.target
            spread = skew(held, share)
            if not helped:
                self._rebalancing = False  # nothing helps; wait for the skew to grow past the threshold
        if spread <= cfg.settle_skew:
            self._rebalancing = False
        if not free and not moves and not self._rebalancing:
            self._kept = (held, total_capacity)
        return Plan(target, tuple(moves), spread, self._rebalancing)

    def _rebalance(
        self,
        nodes: Mapping[NodeName, float],
        held: dict[WorkerId, float],
        share: Mapping[WorkerId, float],
        by_worker: Mapping[WorkerId, set[NodeName]],
        *,
        order: list[WorkerId],
        budget: int,
    ) -> tuple[list[WorkerMove], bool]:
        """One round's moves, at most ``budget`` and at most ``source_quota`` per giver; updates ``held``.
        Returns the moves and whether a move could still help (False: the remaining imbalance is made of
        nodes too large to move without overshooting, so the episode ends).

        Each step moves one node from the most over-full giver to the most under-full taker, provided it
        shrinks both deviations (size below twice the giver's excess and twice the taker's deficit). A giver
        offers its largest nodes first, so the capacity moves with the fewest handoffs (first fit decreasing:
        a node too large for what is left is skipped for the round), and among nodes of one size the ones it
        ranks lowest by rendezvous hash, so the choice is stable. Cost: one hash and one sort per held node
        of each giver, plus O(workers) per move."""
        cfg = self._config
        offers: dict[WorkerId, list[NodeName]] = {}
        quota: dict[WorkerId, int] = {}
        for w in order:
            if held[w] - share[w] > EPSILON and by_worker[w]:
                # pop() yields the largest node first (fewest handoffs for the capacity moved), among equals the
                # one this giver ranks lowest by hash.
                offers[w] = sorted(by_worker[w], key=lambda n: (nodes[n], -hrw_score(n, w), n))
                quota[w] = cfg.source_quota(len(by_worker[w]))
        moves: list[WorkerMove] = []
        limited = False
        while offers and skew(held, share) > cfg.settle_skew:
            if len(moves) >= budget:
                limited = True
                break
            source = max(offers, key=lambda w: (held[w] - share[w], w))
            target = min(order, key=lambda w: (held[w] - share[w], w))
            excess, deficit = held[source] - share[source], share[target] - held[target]
            if excess <= EPSILON or deficit <= EPSILON:
                break
            node = None
            queue = offers[source]
            while queue:
                candidate = queue.pop()
                if nodes[candidate] < 2 * excess and nodes[candidate] < 2 * deficit:
                    node = candidate
                    break
            if node is None:
                del offers[source]
                continue
            size = nodes[node]
            held[source] -= size
            held[target] += size
            by_worker[source].remove(node)
            by_worker[target].add(node)
            moves.append(WorkerMove(node, source, target))
            quota[source] -= 1
            if quota[source] <= 0:
                limited = True
                del offers[source]
        helped = limited or skew(held, share) <= cfg.settle_skew
        return moves, helped
