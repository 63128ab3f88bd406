"""Latency and API server CPU of single writes at a steady rate: ``KubeClient``'s aiohttp session against its
write pool. Ad hoc (kept as it ran, at 3375121). Each mode posts N Events, one started every GAP seconds,
after 20 sequential ones as a warm-up, and prints the API server's CPU per request (its process read with
psutil), the client's, and the requests' latency. Run from the project root against a cluster of
``agent-scheduler cluster up --dir /tmp/mc`` (its ``state.json`` names the API server's PID):

    PYTHONPATH=. .venv/bin/python docs/results/writes-2026-12-06/steadyprobe.py N GAP
"""

import asyncio
import json
import statistics as st
import sys
import time

import psutil
import uvloop

from common.events import ObjectRef, event_body, events_path
from common.kube import KubeClient, load_credentials

with open("/tmp/mc/state.json") as f:
    state = json.load(f)
api = psutil.Process(next(p["pid"] for p in state["processes"] if p["name"] == "kube-apiserver"))
N = int(sys.argv[1])
GAP = float(sys.argv[2])


def body(i):
    return event_body(
        ObjectRef.pod("default", f"p{i}", "u"),
        type_="Normal",
        reason="Scheduled",
        message=f"Successfully assigned default/p{i} to n1",
        component="agent-scheduler",
        instance="x",
    )


async def run(client, pooled):
    lat = []
    path = events_path("default")

    async def one(i):
        t = time.perf_counter()
        await client.request("POST", path, body=body(i), pooled=pooled)
        lat.append(time.perf_counter() - t)

    for i in range(20):
        await one(i)
    lat.clear()
    a0 = sum(api.cpu_times()[:2])
    c0 = time.process_time()
    tasks = []
    for i in range(N):
        tasks.append(asyncio.create_task(one(i)))
        await asyncio.sleep(GAP)
    await asyncio.gather(*tasks)
    a1 = sum(api.cpu_times()[:2])
    c1 = time.process_time()
    lat.sort()
    return (
        (a1 - a0) / N * 1e3,
        (c1 - c0) / N * 1e3,
        st.mean(lat) * 1e3,
        lat[len(lat) // 2] * 1e3,
        lat[int(len(lat) * 0.99)] * 1e3,
    )


async def main():
    for r in range(4):
        for mode in ("aiohttp", "pool") if r % 2 == 0 else ("pool", "aiohttp"):
            async with KubeClient(load_credentials("/tmp/mc/kubeconfig")) as c:
                a, cl, m, p50, p99 = await run(c, mode == "pool")
            print(
                f"{mode:8} apiserver {a:.3f} ms CPU/req, client {cl:.3f}, latency mean {m:.2f} p50 {p50:.2f} p99 {p99:.2f} ms",
                flush=True,
            )


uvloop.run(main())
