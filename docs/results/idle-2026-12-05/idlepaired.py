"""Ad hoc: one fresh cluster of NODES kwok nodes; contenders label=scheduler[@checkout] launched in turn
(ABAB..., ROUNDS rounds), each made ready, left 20 s, then its processes' CPU over WINDOW s at rest (psutil).
Usage: idlepaired.py OUTDIR NODES ROUNDS WINDOW label=scheduler[@checkout] ..."""
import asyncio, json, sys, tempfile, time
from pathlib import Path
import psutil
from scale.bench import cluster as bench_cluster
from scale.bench.schedulers import SCHEDULERS, launch, grant_agent_rbac
from scale.cluster import ClusterOptions, generate_nodes
from scale.cluster.lifecycle import stop_on_sigterm

async def main(out: Path, nodes: int, rounds: int, window: float, contenders: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    parsed = []
    for c in contenders:
        label, _, rest = c.partition("=")
        name, _, code = rest.partition("@")
        parsed.append((label, name, Path(code) if code else None))
    cluster = await bench_cluster.fresh_cluster(Path(tempfile.mkdtemp(prefix="idlepaired-")), nodes, ClusterOptions())
    results = []
    try:
        async with cluster.client(qps=50000, burst=50000, max_connections=256) as client:
            kubeconfig, notes = bench_cluster.measured_kubeconfig(cluster, await grant_agent_rbac(client))
            fleet = generate_nodes(nodes)
            for r in range(rounds):
                for i, (label, name, code) in enumerate(parsed):
                    spec = SCHEDULERS[name]
                    kw = {"code": code} if code else {}
                    running = launch(spec, cluster, out / "logs", kubeconfig=kubeconfig, tag=f"{label}-{r}", **kw)
                    try:
                        why = await bench_cluster.until_ready(client, spec, running, nodes=nodes, fleet=fleet, notes=notes)
                        assert not why, why
                        await asyncio.sleep(20)
                        procs = {c.name: psutil.Process(c.pid) for c in running.children}
                        before = {k: sum(p.cpu_times()[:2]) for k, p in procs.items()}
                        t0 = time.monotonic()
                        await asyncio.sleep(window)
                        dt = time.monotonic() - t0
                        cores = {k: (sum(p.cpu_times()[:2]) - before[k]) / dt for k, p in procs.items()}
                        row = {"label": label, "round": r, "cores": cores, "total": sum(cores.values())}
                        results.append(row)
                        print(json.dumps(row), flush=True)
                        (out / "idle.json").write_text(json.dumps(results, indent=1))
                    finally:
                        running.stop()
    finally:
        await asyncio.to_thread(cluster.stop)
    by = {}
    for row in results:
        by.setdefault(row["label"], []).append(row["total"])
    for label, xs in by.items():
        print(f"{label}: " + " ".join(f"{x:.4f}" for x in xs) + f"  mean {sum(xs)/len(xs):.4f} cores")

if __name__ == "__main__":
    stop_on_sigterm()
    a = sys.argv
    asyncio.run(main(Path(a[1]), int(a[2]), int(a[3]), float(a[4]), a[5:]))
