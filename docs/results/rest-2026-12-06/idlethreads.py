"""Ad hoc: each scheduler process's CPU and voluntary context switches (wake-ups) at rest, per thread, for
contenders label=scheduler@checkout launched in turn on one fresh cluster of 1,000 kwok nodes, each made ready,
left 10 s, then measured over WINDOW s from /proc (clock ticks: 10 ms resolution).
Usage, from the project root: .venv/bin/python docs/results/rest-2026-12-06/idlethreads.py WINDOW label=scheduler@checkout ..."""
import asyncio, sys, tempfile, time, os
from pathlib import Path
sys.path.insert(0, os.getcwd())
from scale.bench.cluster import fresh_cluster, measured_kubeconfig, until_ready
from scale.cluster import ClusterOptions
from scale.bench.schedulers import SCHEDULERS, launch, grant_agent_rbac
from scale.cluster.nodes import generate_nodes
from scale.cluster.nodes import PREPULLED_FRACTION

TICK = os.sysconf("SC_CLK_TCK")

def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK

def threads(pid):
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            comm = open(f"/proc/{pid}/task/{t}/comm").read().strip()
            f = open(f"/proc/{pid}/task/{t}/stat").read().rsplit(")", 1)[1].split()
            v = [int(l.split()[1]) for l in open(f"/proc/{pid}/task/{t}/status") if l.startswith("voluntary_ctxt")][0]
        except OSError:
            continue
        out[t] = (comm, (int(f[11]) + int(f[12])) / TICK, v)
    return out

def vcs(pid):
    n = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        for line in open(f"/proc/{pid}/task/{t}/status"):
            if line.startswith("voluntary_ctxt_switches"):
                n += int(line.split()[1])
    return n

async def main(nodes, window, contenders):
    fleet = generate_nodes(nodes, prepulled=PREPULLED_FRACTION)
    cluster = await fresh_cluster(Path(tempfile.mkdtemp(prefix="idle-")), nodes, ClusterOptions())
    try:
        async with cluster.client(qps=50000, burst=50000, max_connections=256) as client:
            kubeconfig, _ = measured_kubeconfig(cluster, await grant_agent_rbac(client))
            for i, (label, name, code) in enumerate(contenders):
                spec = SCHEDULERS[name]
                running = launch(spec, cluster, Path(tempfile.mkdtemp(prefix="idlethreads-logs-")), kubeconfig=kubeconfig, tag=f"{label}-{i}", code=Path(code))
                try:
                    why = await until_ready(client, spec, running, nodes=nodes, fleet=fleet, notes=[])
                    assert not why, why
                    await asyncio.sleep(10)
                    names = running.process_names()
                    th0 = {p: threads(p) for p in names}; c0 = {p: cpu(p) for p in names}; v0 = {p: vcs(p) for p in names}; t0 = time.monotonic()
                    await asyncio.sleep(window)
                    dt = time.monotonic() - t0
                    parts = []
                    tot = 0.0
                    for p, n in names.items():
                        c = cpu(p) - c0[p]; tot += c
                        parts.append(f"{n} {1000*c/dt:.1f} ms/s {(vcs(p)-v0[p])/dt:.0f} wakeups/s")
                    for p, n in names.items():
                        th1 = threads(p)
                        for t, (comm, c, v) in th1.items():
                            b = th0[p].get(t, (comm, 0.0, 0))
                            if v - b[2] > 0:
                                print(f"   {label} {n} thread {t} {comm}: {1000*(c-b[1])/dt:.1f} ms/s {(v-b[2])/dt:.0f} wakeups/s")
                    print(f"{label}: total {1000*tot/dt:.1f} ms CPU per s ({'; '.join(parts)})", flush=True)
                finally:
                    running.stop()
    finally:
        await asyncio.to_thread(cluster.stop)

if __name__ == "__main__":
    window = float(sys.argv[1])
    contenders = [tuple(a.split("=", 1)[0:1] + a.split("=", 1)[1].split("@")) for a in sys.argv[2:]]
    asyncio.run(main(1000, window, contenders))
