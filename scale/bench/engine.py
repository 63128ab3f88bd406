"""``agent-scheduler bench engine``: the real decision engine, in-process, on synthetic nodes and pods.

No API server: nodes come from the same generator as the local cluster's kwok nodes, pods from
``scale.workload``. Each decision is timed alone (decide + assume, as the worker loop does); the report gives
decisions/s over the whole run, p50/p99 latency and CPU time per pod. Numbers are printed, never asserted.

Three mixes: ``plain`` agent pods, ``mix`` (a fifth each with node affinity and tolerations, GPUs, ...), and
``interpod``: sandbox pools of ``POOL_SIZE`` pods, a third spread over zones (maxSkew 1, DoNotSchedule), a
third with required anti-affinity on the hostname against their pool, a third with both a zone spread
(ScheduleAnyway) and preferred hostname anti-affinity; so every pool's counts are read and updated per pod.

``pool``: the pods of one template, as a warm pool or a burst from one workload sends them (one size, no
session, no rules), so every pod after the first reuses its shape's run (``worker.engine``'s batched
decisions). Other mixes are batched too where it pays, each shape's run kept while other shapes are
decided: the plain mix's 12 sizes in random order (a session is not part of a shape), the mix's 108 shapes;
the interpod mix's soft-rule pods only in the first window (then it pauses: ``worker.engine``). The ``batched``
column counts the decisions that reused their run; ``--no-batching`` decides every pod from scratch, for the
side-by-side comparison (the placements are the same).

A fourth, ``preempt``: every node is first filled with lowest-priority placeholder pods (``BALLOON`` each, as
many as its CPU holds), then high-priority agent pods of the same size arrive, so every one of them needs a victim. A decision
there is the whole of what the worker does on its decision path: the failed filter pass, preemption's dry run
and choice (``worker.preemption.Evaluator``, kube-scheduler's candidate counts), the nomination, and, once the
victims are gone from the cache (as the watch would show them), the placement on the nominated node. At most
``PREEMPT_PODS`` preemptors are run (each decision costs far more than a plain one).
"""

from __future__ import annotations

import gc
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from common.records import PodKey, PodRecord, node_from_json, pod_from_json
from scale.cluster.nodes import generate_nodes
from scale.workload import agent_pod, interpod_pod
from worker.budgets import Budgets
from worker.cache import Cache
from worker.engine import Decision, Engine
from worker.preemption import Evaluator
from worker.scheduler import build_engine
from worker.settings import WorkerSettings

MIXES = ("plain", "mix", "interpod", "preempt", "pool")
POOL_REQUESTS = {"cpu": "250m", "memory": "256Mi"}  # the pool mix's one size
BALLOON = {"cpu": "1", "memory": "2Gi"}  # one placeholder pod of the preempt mix
PREEMPTOR_PRIORITY = 1000
PREEMPT_PODS = 1000


def _pod(index: int, mix: str, seed: int) -> dict[str, Any]:
    if mix == "interpod":
        return interpod_pod(index, seed=seed)
    pod = agent_pod(index, mix=mix == "mix", seed=seed)
    if mix == "pool":
        pod["metadata"]["labels"] = {"app": "agent-pool"}
        pod["spec"]["containers"][0]["resources"]["requests"] = dict(POOL_REQUESTS)
    if mix == "preempt":
        # the size of a placeholder: the room one victim frees is taken whole, so the next pod needs its own
        pod["spec"]["priority"] = PREEMPTOR_PRIORITY
        pod["spec"]["containers"][0]["resources"]["requests"] = dict(BALLOON)
    return pod


def fill_with_balloons(cache: Cache) -> int:
    """Bind lowest-priority placeholders on every node until its CPU is full; how many were placed."""
    obj = agent_pod(0, prefix="balloon")
    obj["spec"]["priority"] = -1
    obj["spec"]["containers"][0]["resources"]["requests"] = dict(BALLOON)
    obj["status"] = {"phase": "Running"}
    template = pod_from_json(obj)  # parsed once; each placeholder is a copy with its own name and node
    milli = template.requests.milli_cpu
    placed = 0
    for name in sorted(cache.known):
        info = cache.nodes[name]
        count = min(info.node.allocatable.milli_cpu // milli, info.node.allocatable.pods - len(info.pods))
        for i in range(count):
            pod_name = f"balloon-{name}-{i}"
            cache.upsert_pod(
                replace(
                    template,
                    key=PodKey(f"{template.namespace}/{pod_name}"),
                    name=pod_name,
                    uid=pod_name,
                    node_name=name,
                )
            )
            placed += 1
    return placed


@dataclass(slots=True)
class EngineResult:
    nodes: int
    mix: str
    pods: int
    placed: int
    pods_per_s: float
    p50_us: float
    p99_us: float
    cpu_us_per_pod: float
    nodes_evaluated_mean: float
    full_scans: int
    batched: int = 0  # decisions that reused their batch's run


def run_engine_bench(
    nodes: int,
    pods: int,
    *,
    mix: bool | str,
    feasible_nodes: int = 16,
    seed: int = 0,
    batching: bool = True,
) -> EngineResult:
    """``mix``: one of ``MIXES`` (True and False stand for "mix" and "plain")."""
    kind = mix if isinstance(mix, str) else ("mix" if mix else "plain")
    if kind not in MIXES:
        raise ValueError(f"unknown mix {kind!r}: one of {MIXES}")
    settings = WorkerSettings()
    settings.scheduling.feasible_nodes = feasible_nodes
    cache = Cache(session_label=settings.scheduling.session_label)
    for obj in generate_nodes(nodes, seed=seed):
        cache.upsert_node(node_from_json(obj))
    engine = build_engine(settings, cache)
    engine.batching = batching
    evaluator: Evaluator | None = None
    if kind == "preempt":
        fill_with_balloons(cache)
        evaluator = Evaluator(cache, engine, Budgets(), rng=random.Random(seed))
        pods = min(pods, PREEMPT_PODS)
    records = [pod_from_json(_pod(i, kind, seed)) for i in range(pods)]
    latencies: list[float] = []
    evaluated = 0
    placed = 0
    gc.collect()
    gc.disable()  # a collection pause would be charged to whichever decision it lands on
    try:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for pod in records:
            t0 = time.perf_counter()
            d = engine.schedule(pod)
            if d.node is None and evaluator is not None:
                d = _preempt(engine, evaluator, pod, d)
            if d.node is not None:
                cache.assume(pod, d.node)
                placed += 1
            latencies.append(time.perf_counter() - t0)
            evaluated += d.evaluated
        wall = time.perf_counter() - wall0
        cpu = time.process_time() - cpu0
    finally:
        gc.enable()
    latencies.sort()
    return EngineResult(
        nodes=nodes,
        mix=kind,
        pods=pods,
        placed=placed,
        pods_per_s=round(pods / wall, 1),
        p50_us=round(statistics.median(latencies) * 1e6, 1),
        p99_us=round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e6, 1),
        cpu_us_per_pod=round(cpu / pods * 1e6, 1),
        nodes_evaluated_mean=round(evaluated / pods, 1),
        full_scans=engine.full_scans,
        batched=engine.batched,
    )


def _preempt(engine: Engine, evaluator: Evaluator, pod: PodRecord, failed: Decision) -> Decision:
    """The preemption path of one decision (see the module docstring)."""
    found = evaluator.evaluate(pod).candidate
    if found is None:
        return failed
    engine.cache.nominate(pod, found.node)
    for victim in found.victims:  # the watch shows them gone
        engine.cache.remove_pod(victim.key)
    return engine.schedule(pod)


def main(
    node_counts: list[int],
    pods: int,
    *,
    as_json: bool,
    feasible_nodes: int,
    mixes: list[str] | None = None,
    batching: bool = True,
) -> int:
    if not as_json:
        print(
            f"{'nodes':>6} {'mix':>8} {'pods':>7} {'placed':>7} {'pods/s':>9} {'p50 us':>8} {'p99 us':>8} {'cpu us/pod':>10} {'evaluated':>9} {'batched':>7}"
        )
    for n in node_counts:
        for mix in mixes or MIXES:
            r = run_engine_bench(n, pods, mix=mix, feasible_nodes=feasible_nodes, batching=batching)
            if as_json:
                print(json.dumps(asdict(r)), flush=True)
            else:
                print(
                    f"{r.nodes:>6} {r.mix:>8} {r.pods:>7} {r.placed:>7} {r.pods_per_s:>9.0f} {r.p50_us:>8.0f} "
                    f"{r.p99_us:>8.0f} {r.cpu_us_per_pod:>10.0f} {r.nodes_evaluated_mean:>9.1f} {r.batched:>7}",
                    flush=True,
                )
    return 0
