"""What the dispatch protocol costs per pod, step by step: measured directly, and under cProfile.

``python -m scale.bench.protocolcost [--pods N] [--rounds R]`` does, in one process, the protocol work that
one pod dispatched on the coordinated path costs, for N pods as the API server writes them (the pending pod
captured in ``tests/unit/worker/data/pod_events.json``, without ``managedFields`` as a DISPATCH carries it,
renamed and given a new uid per pod: a burst of one template):

- leader: parse the pod event (the pod watch handler's ``pod_from_json``), seal the DISPATCH;
- worker: read and open the DISPATCH (length, MAC, msgpack, the pod's checks), parse its pod, seal the ACK and
  the RESULT ``bound``;
- leader: read and open the ACK and the RESULT.

Every step but the worker's parse is extra over the standalone worker, which parses each pending pod once,
from its own watch. Each step is timed by the process's CPU clock (``time.process_time``), the fastest of R
rounds, and then again under cProfile timed by the same clock, as ``AGENT_BENCH_PROFILE_DIR`` profiles the
processes (``scale.bench.cpuprofile``). The table gives CPU µs per pod plain and profiled and their ratio:
how much the profile inflates each step, which ``scale.bench.cpusplit``'s scaled estimate assumes is alike
across a process's activities. The replay is checked as it goes: every message opened equals what was sealed,
or it raises.

Left out, so the processes spend more per pod than the sum here: the event loop (a task wake-up per frame
read, the writes and their system calls); the leader's copy of the pod without ``managedFields`` and its parse
of the full object (the replay starts from the stripped pod); the leader's bookkeeping (the ACK window, timers,
the dispatch choice, the pending table); the worker's (the lookup of the pod's previous record, the results
owed, the gate); CAPACITY and PING frames.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from common import protocol
from common.records import PodRecord, pod_from_json
from scale.cluster.config import PROJECT_ROOT

CAPTURED = PROJECT_ROOT / "tests" / "unit" / "worker" / "data" / "pod_events.json"
KEY = bytes(range(32))
NODE = "kwok-node-00005"
WORKER_PARSE = "worker: parse its pod"
STEPS = (
    "leader: parse the pod event",
    "leader: seal DISPATCH",
    "worker: read DISPATCH",
    WORKER_PARSE,
    "worker: seal ACK",
    "worker: seal RESULT",
    "leader: read ACK",
    "leader: read RESULT",
)


def pending_pods(count: int, source: Path = CAPTURED) -> list[dict[str, Any]]:
    """``count`` pending pods of the captured pod's template, as a DISPATCH carries them."""
    events = orjson.loads(source.read_bytes())
    base = next(iter(events.values()))[0]["object"]  # the first pod's ADDED: still pending
    base["metadata"].pop("managedFields", None)
    pods = []
    for i in range(count):
        pod = orjson.loads(orjson.dumps(base))  # a separate object per pod, as a watch decode gives
        pod["metadata"]["name"] = f"agent-{i:06d}"
        pod["metadata"]["uid"] = str(uuid.UUID(int=i + 1))
        pod["metadata"]["resourceVersion"] = str(10_000 + i)
        pods.append(pod)
    return pods


def sessions() -> tuple[protocol.Session, protocol.Session]:
    """Both ends of one authenticated stream: the leader's and the worker's."""
    hello, welcome = b"h" * protocol.NONCE_SIZE, b"w" * protocol.NONCE_SIZE
    return (
        protocol.Session(KEY, hello_nonce=hello, welcome_nonce=welcome, leader=True),
        protocol.Session(KEY, hello_nonce=hello, welcome_nonce=welcome, leader=False),
    )


async def _read_all(session: protocol.Session, frames: list[bytes]) -> list[protocol.Message]:
    reader = asyncio.StreamReader(limit=protocol.MAX_FRAME)
    reader.feed_data(b"".join(frames))
    reader.feed_eof()
    return [await session.read(reader) for _ in frames]


@dataclass
class Replay:
    """One round of every step over the same pods; ``run`` times each with ``clock``, under ``profile`` if
    given (switched on only around the steps)."""

    pods: list[dict[str, Any]]

    def run(
        self, clock: Callable[[], float] = time.process_time, profile: cProfile.Profile | None = None
    ) -> dict[str, float]:
        leader, worker = sessions()
        loop = asyncio.new_event_loop()
        spent: dict[str, float] = {}

        def step(name: str, work: Callable[[], Any]) -> Any:
            if profile is not None:
                profile.enable()
            start = clock()
            out = work()
            spent[name] = clock() - start
            if profile is not None:
                profile.disable()
            return out

        try:
            pods = self.pods
            records: list[PodRecord] = step(STEPS[0], lambda: [pod_from_json(p) for p in pods])
            dispatches = [protocol.Dispatch(i + 1, p, 0, "") for i, p in enumerate(pods)]
            frames = step(STEPS[1], lambda: [leader.seal(d) for d in dispatches])
            opened = step(STEPS[2], lambda: loop.run_until_complete(_read_all(worker, frames)))
            if opened != dispatches:
                raise AssertionError("a DISPATCH opened differs from the one sealed")
            parsed: list[PodRecord] = step(
                WORKER_PARSE,
                lambda: [pod_from_json(m.pod) for m in opened if isinstance(m, protocol.Dispatch)],
            )
            if [r.key for r in parsed] != [r.key for r in records]:
                raise AssertionError("the worker parsed other pods than the leader")
            acks = [protocol.Ack(d.id) for d in dispatches]
            ack_frames = step(STEPS[4], lambda: [worker.seal(a) for a in acks])
            results = [
                protocol.Result.bound(d.id, r.key, NODE, uid=r.uid)
                for d, r in zip(dispatches, parsed, strict=True)
            ]
            result_frames = step(STEPS[5], lambda: [worker.seal(r) for r in results])
            if step(STEPS[6], lambda: loop.run_until_complete(_read_all(leader, ack_frames))) != acks:
                raise AssertionError("an ACK opened differs from the one sealed")
            if step(STEPS[7], lambda: loop.run_until_complete(_read_all(leader, result_frames))) != results:
                raise AssertionError("a RESULT opened differs from the one sealed")
        finally:
            loop.close()
        return spent


def measure(pods: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Per step: CPU µs per pod plain and under cProfile, each the fastest of ``rounds``."""
    replay = Replay(pending_pods(pods))
    plain = [replay.run() for _ in range(rounds)]
    profiled = [replay.run(profile=cProfile.Profile(time.process_time)) for _ in range(rounds)]
    return {
        name: (
            min(r[name] for r in plain) / pods * 1e6,
            min(r[name] for r in profiled) / pods * 1e6,
        )
        for name in STEPS
    }


def _ratio(profiled: float, plain: float) -> str:
    return f"{profiled / plain:.1f} ×" if plain > 0 else "–"  # a step too quick for the clock: no ratio


def table(costs: dict[str, tuple[float, float]]) -> str:
    lines = [
        "| step | CPU µs per pod | under cProfile | profiled / plain | extra over standalone |",
        "|---|---:|---:|---:|---|",
    ]
    for name, (plain, profiled) in costs.items():
        extra = "no" if name == WORKER_PARSE else "yes"
        lines.append(f"| {name} | {plain:.1f} | {profiled:.1f} | {_ratio(profiled, plain)} | {extra} |")
    extra_plain = sum(p for n, (p, _) in costs.items() if n != WORKER_PARSE)
    extra_profiled = sum(q for n, (_, q) in costs.items() if n != WORKER_PARSE)
    lines.append(
        f"| **extra steps** | **{extra_plain:.1f}** | **{extra_profiled:.1f}** | "
        f"**{_ratio(extra_profiled, extra_plain)}** | CPU-s per 1,000 pods: {extra_plain / 1000:.3f} plain, "
        f"{extra_profiled / 1000:.3f} profiled |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m scale.bench.protocolcost", description=__doc__)
    parser.add_argument("--pods", type=int, default=5000, help="pods per round (default 5000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the fastest counts (default 5)")
    args = parser.parse_args(argv)
    if args.pods < 1 or args.rounds < 1:
        parser.error("--pods and --rounds must be at least 1")
    print(table(measure(args.pods, args.rounds)))


if __name__ == "__main__":
    main()
