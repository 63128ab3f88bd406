"""Ad hoc (kept as it ran): what does sharding cost without a coordinator, and what do wake-ups cost?

One fresh 1,000-node cluster (the bench's), bursts of 2,000 plain agent pods measured as `bench paired`
measures them (``scale.bench.cluster.run_workload``), a warm-up trial of the first label then ROUNDS rounds of
the labels, order reversed on odd rounds. Labels:
- sa, c2: the bench's agent-standalone and agent-coord-2 (uvloop);
- split: two standalone workers (uvloop) with disjoint nodes (``--node-selector``: zone local-1a, the other
  two zones) and their own scheduler names; every second pod of the burst (and of the readiness probe) names
  the second one;
- own: split, run from OWN_CHECKOUT (default /tmp/wt-own: ``own.diff`` applied), whose workers watch only
  the pods of their own scheduler name;
- sa-a, split-a: sa and split on the standard library's loop (``--event-loop asyncio``);
- sa-t, split-t: the same from /tmp/wt-tick (``tick.diff`` applied: that loop polls for I/O at most every
  5 ms while busy).
With AGENT_BENCH_PROFILE_DIR set, every process runs under the bench's windowed cProfile.

Usage: python split.py OUT ROUNDS [LABEL,LABEL,...]  (default sa,split,c2), from the project root with its
virtualenv's python."""
import asyncio, json, logging, sys, tempfile
from pathlib import Path
from scale.bench import cluster as bc
from scale.bench import schedulers as sch
from scale.bench.schedulers import SCHEDULERS, Running, launch, grant_agent_rbac, start, python_module, free_ports, LOOPBACK
from scale.bench.workloads import default_workloads, scaled
from scale.bench.paired import WARMUP
from scale.bench.results import RunResult
from scale.cluster import ClusterOptions, generate_nodes
from scale.cluster.nodes import PREPULLED_FRACTION
from scale.cluster.lifecycle import stop_on_sigterm

B_NAME = "agent-scheduler-b"
import os
PROF = os.environ.get("AGENT_BENCH_PROFILE_DIR", "")
SPLIT = False
_orig = bc.arrivals
def arrivals(*a, **k):
    plan = _orig(*a, **k)
    if SPLIT:
        for i, arr in enumerate(plan):
            if i % 2:
                arr.pod["spec"]["schedulerName"] = B_NAME
    return plan
bc.arrivals = arrivals

OWN = Path(os.environ.get("OWN_CHECKOUT", "/tmp/wt-own"))

TICK = Path("/tmp/wt-tick")
# label: (workers, checkout, event loop); "sa" and "c2" are the bench's own launches
CUSTOM = {
    "split": (2, None, "uvloop"), "own": (2, OWN, "uvloop"),
    "sa-a": (1, None, "asyncio"), "sa-t": (1, TICK, "asyncio"),
    "split-a": (2, None, "asyncio"), "split-t": (2, TICK, "asyncio"),
}

def launch_split(spec, cluster, logs, kubeconfig, tag, code=None, n=2, loop="uvloop"):
    addrs = [f"{LOOPBACK}:{p}" for p in free_ports(n)]
    kids = []
    shards = [(sch.AGENT_SCHEDULER_NAME, "topology.kubernetes.io/zone=local-1a"),
              (B_NAME, "topology.kubernetes.io/zone!=local-1a")] if n == 2 else [(sch.AGENT_SCHEDULER_NAME, "")]
    for i, (name, sel) in enumerate(shards):
        argv = python_module("agent_scheduler.cli", "worker", "--standalone", f"--kubeconfig={kubeconfig}",
                             f"--scheduler-name={name}", f"--kube-api-qps={sch.CLIENT_QPS:g}",
                             f"--kube-api-burst={sch.CLIENT_BURST}", *([f"--node-selector={sel}"] if sel else []), f"--event-loop={loop}",
                             f"--metrics-address={addrs[i]}", f"--bind-concurrency={spec.bind_concurrency}",
                             f"--id=bench-split-{i}",
                             profile_to=(Path(PROF) / f"split-{'ab'[i]}-{tag}.pstats") if PROF else None, window=bool(PROF))
        kids.append(start(f"worker-{'ab'[i]}", argv, logs / f"split-{'ab'[i]}-{tag}.log", **({"code": code} if code else {})))
    return Running(spec, cluster, kids, metrics_addresses=addrs, profiled_windows=bool(PROF))

async def main(out: Path, rounds: int, labels: list[str], nodes: int = 1000, pods: int = 2000):
    global SPLIT
    out.mkdir(parents=True, exist_ok=True)
    specs = default_workloads(nodes, burst=pods, pods=pods, rate=None)
    workload = scaled(specs["burst"], pull_delay_s=0.0)
    fleet = generate_nodes(nodes, prepulled=PREPULLED_FRACTION)
    bench = bc.BenchConfig(nodes=[nodes], schedulers=["agent-standalone"], out=out, stall_s=30, timeout_s=300, quiet_wait_s=30, pull_delay_s=0)
    cluster = await bc.fresh_cluster(Path(tempfile.mkdtemp(prefix="split-")), nodes, ClusterOptions())
    order = [labels[0]] + [c for r in range(rounds) for c in (labels if r % 2 == 0 else labels[::-1])]
    trials = []
    try:
        from scale.bench import stages
        await asyncio.to_thread(stages.install, cluster)
        async with cluster.client(qps=50000, burst=50000, max_connections=256) as client:
            kubeconfig, notes = bc.measured_kubeconfig(cluster, await grant_agent_rbac(client))
            for pos, label in enumerate(order):
                spec = SCHEDULERS["agent-coord-2" if label == "c2" else "agent-standalone"]
                SPLIT = label in CUSTOM and CUSTOM[label][0] == 2
                running = None
                try:
                    if label in CUSTOM:
                        n, code, loop = CUSTOM[label]
                        running = launch_split(spec, cluster, out / "logs", kubeconfig, f"{label}-{pos}", code, n, loop)
                    else:
                        running = launch(spec, cluster, out / "logs", kubeconfig=kubeconfig, tag=f"{label}-{pos}", profile_windows=True)
                    why = await bc.until_ready(client, spec, running, nodes=nodes, fleet=fleet, notes=list(notes))
                    assert not why, why
                    if SPLIT:
                        await asyncio.sleep(3)
                    await bc.wait_quiet(cluster, running, cores=bench.quiet_cores, max_wait=30)
                    r = await bc.run_workload(client, cluster, running, workload, nodes=nodes, fleet=fleet, config=bench, notes=[])
                finally:
                    if running is not None:
                        running.stop()
                print(label if pos else "warm-up", r.bound, r.cpu_s_per_1k_pods, r.p50_ms, r.p99_ms, r.cpu_s_per_1k_pods_by_process, r.main_sleeps_per_pod_by_process, flush=True)
                trials.append({"label": label if pos else "warm-up", "position": pos, "result": r.to_json()})
                (out / "trials.json").write_text(json.dumps(trials, indent=1))
    finally:
        await asyncio.to_thread(cluster.stop)

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    stop_on_sigterm()
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(",") if len(sys.argv) > 3 else ["sa", "split", "c2"]))
