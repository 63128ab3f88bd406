"""CPU per write to a real API server: ``KubeClient``'s aiohttp session against its write pool.

Ad hoc (kept as it ran). Each mode posts ``N`` Scheduled-like Events, 32 at a time, through one shipped
``KubeClient`` on uvloop, after the same number as a warm-up, and prints the process's CPU per request:
``aiohttp`` sends them with ``request(..., pooled=False)`` (the transport every write took before the pool),
``pool`` with ``pooled=True`` (what ``post`` does now); both carry the same token bucket, authentication,
metrics and reply decoding. Run from the project root, against a cluster of ``agent-scheduler cluster up``:

    PYTHONPATH=. .venv/bin/python docs/results/writes-2026-12-06/writecost.py KUBECONFIG [N] [ROUNDS]
"""

import asyncio
import sys
import time

import uvloop

from common.events import ObjectRef, event_body, events_path
from common.kube import KubeClient, load_credentials

CONCURRENCY = 32


def body(i: int) -> dict[str, object]:
    return event_body(
        ObjectRef.pod("default", f"p{i}", "u"),
        type_="Normal",
        reason="Scheduled",
        message=f"Successfully assigned default/p{i} to n1",
        component="agent-scheduler",
        instance="writecost",
    )


async def measure(client: KubeClient, pooled: bool, n: int) -> tuple[float, float]:
    slots = asyncio.Semaphore(CONCURRENCY)
    path = events_path("default")

    async def one(i: int) -> None:
        async with slots:
            await client.request("POST", path, body=body(i), pooled=pooled)

    await asyncio.gather(*(one(i) for i in range(n)))  # warm-up: connections open, code paths hot
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return (time.process_time() - cpu) / n, n / (time.perf_counter() - wall)


async def main(kubeconfig: str, n: int, rounds: int) -> None:
    for r in range(rounds):
        for mode in ("aiohttp", "pool") if r % 2 == 0 else ("pool", "aiohttp"):
            async with KubeClient(load_credentials(kubeconfig)) as client:
                per, rate = await measure(client, mode == "pool", n)
            print(
                f"round {r + 1} {mode:8} {per * 1e3:.3f} ms CPU per request, {rate:,.0f} requests/s",
                flush=True,
            )


if __name__ == "__main__":
    uvloop.run(
        main(
            sys.argv[1],
            int(sys.argv[2]) if len(sys.argv) > 2 else 2000,
            int(sys.argv[3]) if len(sys.argv) > 3 else 3,
        )
    )
