"""``agent-scheduler bench simulate``: the real shard assignment and the real engine at sizes beyond this machine.

No API server, no etcd, no processes: the coordinator's ``AssignmentPolicy``
(``coordinator.workershards.assignment``) plans node ownership for N workers over the deterministic node fleet,
and each simulated worker runs the worker's own ``Engine`` (``worker.scheduler.build_engine``) over a ``Cache``
that holds only its shard. Time is simulated:
policy rounds count as rounds (the shard map plans at least once a second, so one round ≈ one second), and
engine decisions are timed on the CPU they take here (each worker is its own process with its own core).

What it reports per worker count:
- shard balance after the first plan: nodes and capacity (allocatable CPU, the pool's weight) per worker, min
  and max, and the policy's CPU time for that plan;
- a worker joining a settled map: rounds until nothing moves, rounds until the newcomer holds at least 90 % of
  its fair share (``FAIR_SHARE``), nodes moved (against the ideal, the newcomer's fair share), the most nodes in
  transit at once (every handoff of a round is modelled as finishing before the next round, so that is the
  largest round), CPU per round. The policy bounds nodes in transit (``AssignmentConfig.transit_limit``);
  rounds past ``max_rounds`` are not run but estimated from the newcomer's remaining deficit (marked as an
  estimate);
- a worker leaving: rounds until its nodes all have a live owner (they are free, so they are placed, not
  handed off) and until nothing moves; any further moves are counted;
- decisions per second per worker: each simulated worker's pod stream is ``pods / workers`` pods (the
  coordinator's dispatch is modelled as round-robin). To stay within minutes on two cores, the first part of
  each stream is packed onto the shard in bulk (first fit, in node-name order, the way a bin-packing
  MostAllocated profile fills nodes one after another), and only the last ``sample`` pods of the stream go
  through the engine and are timed; only ``sample_workers`` workers, spread over the shard map, are simulated.
  Both samplings are stated in the output.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from common.etcd.keys import WorkerId
from common.records import NodeName, NodeRecord, PodKey, PodRecord, node_from_json, pod_from_json
from coordinator.workershards.assignment import AssignmentConfig, AssignmentPolicy, WorkerInfo, skew
from scale.cluster.nodes import make_node
from scale.workload import agent_pod
from worker.cache import Cache
from worker.scheduler import build_engine
from worker.settings import WorkerSettings

ROUND_SECONDS = 1.0  # coordinator.workershards.shardmap plans at least this often; one simulated round
FAIR_SHARE = 0.9  # a joining worker has reached its fair share once it holds this fraction of it


@dataclass(slots=True)
class Balance:
    workers: int
    nodes_min: int
    nodes_max: int
    capacity_min: float
    capacity_max: float
    skew: float
    plan_cpu_s: float

    @property
    def nodes_ratio(self) -> float:
        return round(self.nodes_max / self.nodes_min, 3) if self.nodes_min else math.inf

    @property
    def capacity_ratio(self) -> float:
        return round(self.capacity_max / self.capacity_min, 3) if self.capacity_min else math.inf


@dataclass(slots=True)
class Rebalance:
    event: str  # "join" or "leave"
    workers_before: int
    workers_after: int
    rounds: int
    moved: int
    ideal: int  # join: the newcomer's fair share in nodes; leave: the departed worker's nodes
    moved_capacity: float  # capacity (cores) of the nodes whose owner changed
    ideal_capacity: (
        float  # the least capacity any assignment must move: newcomer's share / departed's capacity
    )
    settled: bool
    final_skew: float
    cpu_per_round_s: float
    estimated_rounds: int  # when not settled within max_rounds: rounds still needed (estimate), else 0
    estimated_moved: int
    rounds_to_fair_share: int | None = None  # join: newcomer >= FAIR_SHARE of its share; leave: all placed
    max_in_transit: int = 0  # the most nodes handed off in one round (all in transit at once)

    @property
    def simulated_s(self) -> float:
        return (self.rounds + self.estimated_rounds) * ROUND_SECONDS


@dataclass(slots=True)
class EngineSample:
    sampled_workers: int
    stream_per_worker: int
    timed_per_worker: int
    prefilled_per_worker: int
    decisions_per_s: list[float] = field(default_factory=list)
    placed: int = 0
    unschedulable: int = 0
    shard_nodes: list[int] = field(default_factory=list)

    @property
    def median_per_s(self) -> float:
        return round(statistics.median(self.decisions_per_s), 1) if self.decisions_per_s else 0.0


@dataclass(slots=True)
class SimResult:
    nodes: int
    pods: int
    workers: int
    balance: Balance
    join: Rebalance
    leave: Rebalance
    engine: EngineSample

    @property
    def cluster_decisions_per_s(self) -> float:
        """Every worker deciding at the sampled median rate on its own core."""
        return round(self.engine.median_per_s * self.workers, 1)

    @property
    def simulated_s_for_pods(self) -> float:
        rate = self.cluster_decisions_per_s
        return round(self.pods / rate, 1) if rate > 0 else math.inf

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["balance"]["nodes_ratio"] = self.balance.nodes_ratio
        out["balance"]["capacity_ratio"] = self.balance.capacity_ratio
        out["join"]["simulated_s"] = self.join.simulated_s
        out["leave"]["simulated_s"] = self.leave.simulated_s
        out["engine"]["median_per_s"] = self.engine.median_per_s
        out["cluster_decisions_per_s"] = self.cluster_decisions_per_s
        out["simulated_s_for_pods"] = self.simulated_s_for_pods
        return out


def build_fleet(count: int, *, seed: int = 0) -> dict[NodeName, NodeRecord]:
    """Node records of the deterministic fleet (the same nodes the local cluster creates)."""
    stamp = "2026-01-01T00:00:00Z"
    return {
        NodeName(f"{r.name}"): r
        for r in (node_from_json(make_node(i, seed=seed, now=stamp)) for i in range(count))
    }


def pool_weights(fleet: Mapping[NodeName, NodeRecord]) -> dict[NodeName, float]:
    """The pool's weights as the coordinator's label pool computes them: allocatable cores, at least 1."""
    return {name: max(1.0, r.allocatable.milli_cpu / 1000.0) for name, r in fleet.items()}


def worker_ids(count: int, *, start: int = 0) -> list[WorkerId]:
    return [WorkerId(f"sim-worker-{i:03d}") for i in range(start, start + count)]


def balance_of(
    target: Mapping[NodeName, WorkerId],
    pool: Mapping[NodeName, float],
    workers: Sequence[WorkerId],
    plan_cpu_s: float,
) -> Balance:
    nodes: Counter[WorkerId] = Counter()
    capacity: dict[WorkerId, float] = defaultdict(float)
    for node, owner in target.items():
        nodes[owner] += 1
        capacity[owner] += pool[node]
    total = sum(pool.values())
    share = {w: total / len(workers) for w in workers}
    return Balance(
        workers=len(workers),
        nodes_min=min(nodes[w] for w in workers),
        nodes_max=max(nodes[w] for w in workers),
        capacity_min=round(min(capacity[w] for w in workers), 1),
        capacity_max=round(max(capacity[w] for w in workers), 1),
        skew=round(skew(capacity, share), 4),
        plan_cpu_s=round(plan_cpu_s, 3),
    )


def _rounds(
    policy: AssignmentPolicy,
    pool: Mapping[NodeName, float],
    workers: Mapping[WorkerId, WorkerInfo],
    current: dict[NodeName, WorkerId],
    *,
    max_rounds: int,
    reached: Callable[[Mapping[NodeName, WorkerId]], bool],
) -> tuple[int, int, bool, float, float, int | None, int]:
    """Plan rounds until nothing moves; handoffs complete between rounds. Returns (rounds, moved, settled,
    final skew, CPU seconds per round, the first round after which ``reached(current)`` held, the most moves of
    one round). ``current`` is updated in place."""
    moved = rounds = 0
    cpu = 0.0
    settled = False
    last_skew = 0.0
    first_reached: int | None = None
    widest = 0
    while rounds < max_rounds:
        began = time.process_time()
        plan = policy.plan(pool, workers, current)
        cpu += time.process_time() - began
        rounds += 1
        last_skew = plan.skew
        for node, owner in plan.target.items():
            if node not in current:
                current[node] = owner  # a free node: placed, no handoff
        for move in plan.moves:
            current[move.node] = move.target
            moved += 1
        widest = max(widest, len(plan.moves))
        if first_reached is None and reached(current):
            first_reached = rounds
        if not plan.moves and not plan.rebalancing:
            settled = True
            break
    return rounds, moved, settled, round(last_skew, 4), round(cpu / max(1, rounds), 4), first_reached, widest


def simulate_join(
    pool: Mapping[NodeName, float],
    initial: Mapping[NodeName, WorkerId],
    workers: list[WorkerId],
    config: AssignmentConfig,
    *,
    max_rounds: int,
) -> Rebalance:
    newcomer = worker_ids(1, start=len(workers))[0]
    members = {w: WorkerInfo() for w in [*workers, newcomer]}
    current = dict(initial)
    before = dict(initial)
    policy = AssignmentPolicy(config)
    total = sum(pool.values())
    share = total / len(members)

    def fair(state: Mapping[NodeName, WorkerId]) -> bool:
        return sum(pool[n] for n, w in state.items() if w == newcomer) >= FAIR_SHARE * share

    rounds, moved, settled, final, per_round, to_share, widest = _rounds(
        policy, pool, members, current, max_rounds=max_rounds, reached=fair
    )
    held = sum(pool[n] for n, w in current.items() if w == newcomer)
    est_rounds = est_moved = 0
    if not settled:
        mean_weight = total / len(pool)
        deficit = max(0.0, share * (1 - config.settle_skew) - held)
        est_moved = math.ceil(deficit / mean_weight)
        est_rounds = math.ceil(est_moved / max(1, config.transit_limit(len(pool))))
    return Rebalance(
        event="join",
        workers_before=len(workers),
        workers_after=len(members),
        rounds=rounds,
        moved=moved,
        ideal=round(len(pool) / len(members)),
        moved_capacity=round(sum(pool[n] for n, w in current.items() if before.get(n) != w), 1),
        ideal_capacity=round(share, 1),
        settled=settled,
        final_skew=final,
        cpu_per_round_s=per_round,
        estimated_rounds=est_rounds,
        estimated_moved=est_moved,
        rounds_to_fair_share=to_share,
        max_in_transit=widest,
    )


def simulate_leave(
    pool: Mapping[NodeName, float],
    initial: Mapping[NodeName, WorkerId],
    workers: list[WorkerId],
    config: AssignmentConfig,
    *,
    max_rounds: int,
) -> Rebalance:
    leaving = workers[0]
    members = {w: WorkerInfo() for w in workers if w != leaving}
    current = {n: w for n, w in initial.items() if w != leaving}
    freed = len(initial) - len(current)
    before = dict(current)
    policy = AssignmentPolicy(config)

    def placed(state: Mapping[NodeName, WorkerId]) -> bool:
        return len(state) == len(pool)

    rounds, _, settled, final, per_round, to_share, widest = _rounds(
        policy, pool, members, current, max_rounds=max_rounds, reached=placed
    )
    moved_held = sum(1 for n, w in before.items() if current[n] != w)
    return Rebalance(
        event="leave",
        workers_before=len(workers),
        workers_after=len(members),
        rounds=rounds,
        moved=freed + moved_held,
        ideal=freed,
        moved_capacity=round(sum(pool[n] for n, w in current.items() if before.get(n) != w), 1),
        ideal_capacity=round(sum(pool[n] for n, w in initial.items() if w == leaving), 1),
        settled=settled,
        final_skew=final,
        cpu_per_round_s=per_round,
        estimated_rounds=0,
        estimated_moved=0,
        rounds_to_fair_share=to_share,
        max_in_transit=widest,
    )


def _fits(cache: Cache, name: NodeName, pod: PodRecord) -> bool:
    info = cache.nodes[name]
    alloc, used, want = info.node.allocatable, info.requested, pod.requests
    return (
        used.milli_cpu + want.milli_cpu <= alloc.milli_cpu
        and used.memory + want.memory <= alloc.memory
        and len(info.pods) < alloc.pods
    )


def prefill(cache: Cache, count: int, prototypes: Sequence[PodRecord], *, tag: str) -> int:
    """Place ``count`` bound pods (copies of ``prototypes``, no session label) first fit in node-name order on
    the untainted schedulable nodes; returns how many fitted."""
    names = sorted(
        n for n, info in cache.nodes.items() if not info.node.taints and not info.node.unschedulable
    )
    placed = 0
    position = 0
    for i in range(count):
        proto = prototypes[i % len(prototypes)]
        pod = replace(proto, key=PodKey(f"fill/{tag}-{i}"), name=f"{tag}-{i}", uid=f"{tag}-{i}", labels={})
        while position < len(names) and not _fits(cache, names[position], pod):
            position += 1
        if position >= len(names):
            break
        cache.upsert_pod(replace(pod, node_name=names[position]))
        placed += 1
    return placed


def simulate_engine(
    fleet: Mapping[NodeName, NodeRecord],
    target: Mapping[NodeName, WorkerId],
    workers: list[WorkerId],
    *,
    pods: int,
    sample: int,
    sample_workers: int,
    seed: int = 0,
) -> EngineSample:
    stream = pods // len(workers)
    timed = min(stream, sample)
    chosen = [
        workers[round(k * (len(workers) - 1) / max(1, sample_workers - 1))]
        for k in range(min(sample_workers, len(workers)))
    ]
    chosen = list(dict.fromkeys(chosen))
    shards: dict[WorkerId, list[NodeName]] = defaultdict(list)
    for node, owner in target.items():
        shards[owner].append(node)
    settings = WorkerSettings()
    prototypes = [pod_from_json(agent_pod(i, seed=seed)) for i in range(64)]
    out = EngineSample(len(chosen), stream, timed, stream - timed)
    for w in chosen:
        index = workers.index(w)
        cache = Cache(session_label=settings.scheduling.session_label)
        for name in shards[w]:
            cache.upsert_node(fleet[name])
        engine = build_engine(settings, cache)
        prefill(cache, stream - timed, prototypes, tag=w)
        # This worker's pods under round-robin dispatch: stream positions index, index+W, ...; the last `timed`.
        first = (stream - timed) * len(workers) + index
        records = [
            pod_from_json(agent_pod(first + k * len(workers), namespace="sim", seed=seed))
            for k in range(timed)
        ]
        began = time.process_time()
        for record in records:
            decision = engine.schedule(record)
            if decision.node is None:
                out.unschedulable += 1
                continue
            cache.assume(record, decision.node)
            out.placed += 1
        cpu = time.process_time() - began
        out.decisions_per_s.append(round(len(records) / cpu, 1) if cpu > 0 else 0.0)
        out.shard_nodes.append(len(shards[w]))
    return out


def run(
    *,
    nodes: int,
    pods: int,
    workers: Sequence[int],
    sample: int,
    sample_workers: int,
    max_rounds: int,
    config: AssignmentConfig | None = None,
    seed: int = 0,
    progress: bool = False,
) -> list[SimResult]:
    cfg = config or AssignmentConfig()

    def say(text: str) -> None:
        if progress:
            print(text, flush=True)

    began = time.monotonic()
    fleet = build_fleet(nodes, seed=seed)
    pool = pool_weights(fleet)
    say(f"fleet of {nodes} nodes built in {time.monotonic() - began:.1f}s")
    results = []
    for count in workers:
        ids = worker_ids(count)
        t0 = time.process_time()
        plan = AssignmentPolicy(cfg).plan(pool, {w: WorkerInfo() for w in ids}, {})
        balance = balance_of(plan.target, pool, ids, time.process_time() - t0)
        say(
            f"{count} workers: first plan {balance.plan_cpu_s:.1f}s CPU, nodes {balance.nodes_min}..{balance.nodes_max}"
        )
        join = simulate_join(pool, plan.target, ids, cfg, max_rounds=max_rounds)
        say(
            f"{count} workers: join {join.rounds} rounds, {join.moved} moved ({join.cpu_per_round_s:.2f}s CPU/round)"
        )
        leave = simulate_leave(pool, plan.target, ids, cfg, max_rounds=max_rounds)
        engine = simulate_engine(
            fleet, plan.target, ids, pods=pods, sample=sample, sample_workers=sample_workers, seed=seed
        )
        say(f"{count} workers: engine median {engine.median_per_s:.0f} decisions/s per worker")
        results.append(SimResult(nodes, pods, count, balance, join, leave, engine))
    say(f"simulation done in {time.monotonic() - began:.0f}s")
    return results


def render(results: Sequence[SimResult], *, config: AssignmentConfig) -> str:
    if not results:
        return "no results"
    r0 = results[0]
    lines = [
        f"Simulation: {r0.nodes:,} nodes, {r0.pods:,} pods; real coordinator.workershards.assignment policy "
        f"({config.describe()}: {config.transit_limit(r0.nodes):,} here; one round ≈ {ROUND_SECONDS:.0f}s) "
        "and real worker engine.",
        f"Engine sampling: {r0.engine.sampled_workers} workers per configuration simulated; of each worker's stream "
        f"the last {r0.engine.timed_per_worker:,} pods are decided and timed, the rest packed in bulk.",
        "",
        "| workers | nodes/worker min..max | capacity (cores) min..max | first plan CPU s | join: moved, cores moved of the fair share | join rounds | join s (sim) | leave: moved (departed) nodes, cores | leave rounds | decisions/s/worker (min..median..max) | cluster decisions/s | s for all pods |",
        "|---:|---|---|---:|---|---:|---:|---|---:|---|---:|---:|",
    ]
    transit: list[str] = []
    for r in results:
        b, j, lv, e = r.balance, r.join, r.leave, r.engine
        join_moved = (
            f"{j.moved:,}"
            + (f" + ~{j.estimated_moved:,} est." if j.estimated_moved else "")
            + f" nodes, {j.moved_capacity:,.0f} of {j.ideal_capacity:,.0f} cores"
        )
        join_rounds = f"{j.rounds}" + (f" + ~{j.estimated_rounds} est." if j.estimated_rounds else "")
        rates = (
            f"{min(e.decisions_per_s):,.0f}..{e.median_per_s:,.0f}..{max(e.decisions_per_s):,.0f}"
            if e.decisions_per_s
            else "-"
        )
        transit.append(
            f"- {r.workers} workers: join {_fair(j)}, at most {j.max_in_transit:,} nodes in transit at once; "
            f"leave: every departed node placed after {_fair(lv)}, at most {lv.max_in_transit:,} in transit."
        )
        lines.append(
            f"| {r.workers} | {b.nodes_min:,}..{b.nodes_max:,} | {b.capacity_min:,.0f}..{b.capacity_max:,.0f} | {b.plan_cpu_s:.1f} "
            f"| {join_moved} | {join_rounds} | {j.simulated_s:,.0f} "
            f"| {lv.moved:,} ({lv.ideal:,}) nodes, {lv.moved_capacity:,.0f} of {lv.ideal_capacity:,.0f} cores | {lv.rounds} "
            f"| {rates} | {r.cluster_decisions_per_s:,.0f} | {r.simulated_s_for_pods:,.1f} |"
        )
    lines += [
        "",
        f"Rounds to fair share (a newcomer at {FAIR_SHARE:.0%} of its share) and nodes in transit:",
        *transit,
    ]
    slow = [r for r in results if r.join.cpu_per_round_s > 0.25]
    if slow:
        lines += [
            "",
            "Join rounds cost the leader "
            + ", ".join(f"{r.join.cpu_per_round_s:.2f}s CPU at {r.workers} workers" for r in slow)
            + " (each giver's nodes are hashed and sorted once per round).",
        ]
    return "\n".join(lines)


def _fair(r: Rebalance) -> str:
    if r.rounds_to_fair_share is not None:
        return f"{r.rounds_to_fair_share} round{'s' if r.rounds_to_fair_share != 1 else ''}"
    return f"more than {r.rounds} rounds"


def main(args: argparse.Namespace) -> int:
    counts = list(args.workers)
    if not counts or min(counts) < 2:
        print("--workers: give worker counts of at least 2 (a leave needs somebody to take the nodes)")
        return 2
    config = AssignmentConfig()
    if args.max_moves_per_round is not None:
        config = replace(config, max_moves_per_round=args.max_moves_per_round)
    if args.max_transit_fraction is not None:
        config = replace(config, max_transit_fraction=args.max_transit_fraction)
    results = run(
        nodes=args.nodes,
        pods=args.pods,
        workers=counts,
        sample=args.sample,
        sample_workers=args.sample_workers,
        max_rounds=args.max_rounds,
        config=config,
        seed=args.seed,
        progress=True,
    )
    text = render(results, config=config)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "simulate.json").write_text(json.dumps([r.to_json() for r in results], indent=1) + "\n")
        (args.out / "simulate.md").write_text("# Simulation\n\n" + text + "\n")
    return 0
