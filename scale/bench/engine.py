"""``agent-scheduler bench engine``: the real decision engine, in-process, on synthetic nodes and pods.

No API server: nodes come from the same generator as the local cluster's kwok nodes, pods from
``scale.workload``. Each decision is timed alone (decide + assume, as the worker loop does); the report gives
decisions/s over the whole run, p50/p99 latency and CPU time per pod. Numbers are printed, never asserted.

Three mixes: ``plain`` agent pods, ``mix`` (a fifth each with node affinity and tolerations, GPUs, ...), and
``interpod``: sandbox pools of ``POOL_SIZE`` pods, a third spread over zones (maxSkew 1, DoNotSchedule), a
third with required anti-affinity on the hostname against their pool, a third with both a zone spread
(ScheduleAnyway) and preferred hostname anti-affinity; so every pool's counts are read and updated per pod.
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

from common.records import node_from_json, pod_from_json
from scale.cluster.nodes import LABEL_ZONE, generate_nodes
from scale.workload import agent_pod
from worker.cache import Cache
from worker.scheduler import build_engine
from worker.settings import WorkerSettings

POOL_SIZE = 8
HOSTNAME = "kubernetes.io/hostname"
MIXES = ("plain", "mix", "interpod")


def interpod_pod(index: int, *, seed: int = 0) -> dict[str, Any]:
    """An agent pod of sandbox pool ``index // POOL_SIZE``, with that pool's inter-pod rules."""
    pod = agent_pod(index, seed=seed)
    pool = index // POOL_SIZE
    selector = {"matchLabels": {"pool": f"pool-{pool}"}}
    pod["metadata"].setdefault("labels", {})["pool"] = f"pool-{pool}"
    spec = pod["spec"]
    kind = pool % 3
    if kind == 0:
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": LABEL_ZONE,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": selector,
            }
        ]
    elif kind == 1:
        spec["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": HOSTNAME, "labelSelector": selector}
                ]
            }
        }
    else:
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 2,
                "topologyKey": LABEL_ZONE,
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": selector,
            }
        ]
        spec["affinity"] = {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 50, "podAffinityTerm": {"topologyKey": HOSTNAME, "labelSelector": selector}}
                ]
            }
        }
    return pod


def _pod(index: int, mix: str, seed: int) -> dict[str, Any]:
    if mix == "interpod":
        return interpod_pod(index, seed=seed)
    return agent_pod(index, mix=mix == "mix", seed=seed)


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


def run_engine_bench(
    nodes: int, pods: int, *, mix: bool | str, feasible_nodes: int = 16, seed: int = 0
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
    )


def main(node_counts: list[int], pods: int, *, as_json: bool, feasible_nodes: int) -> int:
    if not as_json:
        print(
            f"{'nodes':>6} {'mix':>8} {'pods':>7} {'placed':>7} {'pods/s':>9} {'p50 us':>8} {'p99 us':>8} {'cpu us/pod':>10} {'evaluated':>9}"
        )
    for n in node_counts:
        for mix in MIXES:
            r = run_engine_bench(n, pods, mix=mix, feasible_nodes=feasible_nodes)
            if as_json:
                print(json.dumps(asdict(r)), flush=True)
            else:
                print(
                    f"{r.nodes:>6} {r.mix:>8} {r.pods:>7} {r.placed:>7} {r.pods_per_s:>9.0f} {r.p50_us:>8.0f} "
                    f"{r.p99_us:>8.0f} {r.cpu_us_per_pod:>10.0f} {r.nodes_evaluated_mean:>9.1f}",
                    flush=True,
                )
    return 0
