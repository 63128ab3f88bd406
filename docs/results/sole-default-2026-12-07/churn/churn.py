"""Experiment: coordinator + 1 with a backlog of pods that fit nowhere while nodes are added one at a time.
Compares --sole-worker with --no-sole-worker (the default) and a standalone worker (mode ``standalone``): CPU of each scheduler process and of the API
server over the node-adding window, and how often the sole worker's period ended."""
import asyncio, os, sys, time, json
from pathlib import Path
from scale.cluster import start_cluster
from scale.cluster.nodes import make_node, create_node
from scale.demo import Processes, _workers_ready
from scale.workload import agent_pod

TICK = os.sysconf("SC_CLK_TCK")

def cpu(pid: int) -> float:
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK

def apiserver_pid() -> int:
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                cmd = open(f"/proc/{d}/cmdline").read()
            except OSError:
                continue
            if "kube-apiserver" in cmd.split("\0")[0] and "/tmp/churn/" in cmd:
                return int(d)
    raise RuntimeError("no apiserver")

async def main(mode: str, root: Path, pods: int, adds: int, every: float) -> dict:
    cluster = start_cluster(root / "cluster", nodes=20, force=True)
    run_dir = root / "schedulers"; run_dir.mkdir(parents=True, exist_ok=True)
    procs = Processes(run_dir)
    common = [f"--kubeconfig={cluster.kubeconfig}", f"--etcd-endpoints={cluster.etcd_endpoint}"]
    try:
        if mode == "standalone":
            procs.start("worker-0", ["worker", "--standalone", f"--kubeconfig={cluster.kubeconfig}"])
            await asyncio.sleep(5)  # its watches synced
        else:
            procs.start("coordinator", ["coordinator", *common, "--id=c0", "--no-sole-worker" if mode == "dispatched" else "--sole-worker"])
            procs.start("worker-0", ["worker", *common, "--id=w0"])
            await _workers_ready(cluster, 1)
        await asyncio.sleep(3)
        client = cluster.client()
        try:
            sem = asyncio.Semaphore(32)
            async def one(i: int) -> None:
                pod = agent_pod(i, namespace="default")
                for c in pod["spec"]["containers"]:
                    c.setdefault("resources", {}).setdefault("requests", {})["cpu"] = "500"
                async with sem:
                    await client.post("/api/v1/namespaces/default/pods", pod)
            await asyncio.gather(*(one(i) for i in range(pods)))
            await asyncio.sleep(10)  # every pod tried once
            api = apiserver_pid()
            pids = {r.name: r.pid for r in procs.records}
            before = {n: cpu(p) for n, p in pids.items()} | {"apiserver": cpu(api)}
            t0 = time.monotonic()
            for k in range(adds):
                await create_node(client, make_node(1000 + k))
                await asyncio.sleep(max(0.0, t0 + (k + 1) * every - time.monotonic()))
            await asyncio.sleep(5)
            after = {n: cpu(p) for n, p in pids.items()} | {"apiserver": cpu(api)}
            window = time.monotonic() - t0
        finally:
            await client.close()
    finally:
        procs.stop()
        cluster.stop()
    log = (run_dir / "coordinator.log").read_text() if mode != "standalone" else ""
    return {
        "mode": mode, "window_s": round(window, 1),
        "cpu_s": {n: round(after[n] - before[n], 2) for n in after},
        "periods_taken": log.count("took the sole worker's role"),
        "periods_ended": log.count("is no longer the sole worker"),
    }

if __name__ == "__main__":
    mode, pods, adds, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    out = asyncio.run(main(mode, Path(f"/tmp/churn/{mode}"), pods, adds, every))
    print(json.dumps(out))
