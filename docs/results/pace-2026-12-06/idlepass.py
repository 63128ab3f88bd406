"""How long an idle pass of the event loop takes (``aiotools.IDLE_PASS`` is the line between idle and not): a
callback that puts itself back on the loop with nothing else to run, the time between two of its runs, on
uvloop and on the standard library's loop. Run from the project root:
``PYTHONPATH=. .venv/bin/python docs/results/pace-2026-12-06/idlepass.py``."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time

import uvloop

N = 200_000


async def passes() -> list[float]:
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    stamps: list[float] = []

    def again() -> None:
        stamps.append(time.perf_counter())
        if len(stamps) < N:
            loop.call_soon(again)
        else:
            done.set_result(None)

    loop.call_soon(again)
    await done
    return [b - a for a, b in itertools.pairwise(stamps)]


def main() -> None:
    for name, run in (("uvloop", uvloop.run), ("asyncio", asyncio.run)):
        gaps = sorted(run(passes()))
        p50, p99 = gaps[len(gaps) // 2], gaps[len(gaps) * 99 // 100]
        print(
            f"{name}: {N} passes, p50 {p50 * 1e6:.2f} µs, p99 {p99 * 1e6:.2f} µs, mean {statistics.fmean(gaps) * 1e6:.2f} µs"
        )


if __name__ == "__main__":
    main()
