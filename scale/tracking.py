"""Create-to-bound times of the pods a load generator created, on the generator's own clock.

One implementation for the demo and the benchmarks:
- ``PodTimes`` is one pod as the generator saw it: when its create was sent and answered, when its watch first
  delivered it (``visible``: the API server's commit and watch fan-out, which every scheduler waits for too),
  when it was first seen bound and to which node.
- ``BindWatch`` is the handler of a ``common.watching.Reflector`` on the workload's namespace. The first time
  it sees an expected pod with ``spec.nodeName`` set, it stamps that pod's ``bound`` time. A watch event
  arrives a few milliseconds after the binding is stored, for every scheduler alike; ``creationTimestamp`` is
  not used (one-second resolution).
- ``wait_bound`` waits until every created pod is bound, or binds stop coming, or a deadline passes;
  ``wait_running`` the same for the bound pods' ``status.phase`` Running (the first time it is seen:
  ``running``), for runs that time create -> running.

Invariants: a pod's ``visible``, ``bound`` and ``running`` are each stamped once (later events, relists and deletions do not move it); a pod the
generator did not ``expect`` is ignored. Time comes from the injected clock (``time.monotonic`` by default).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

POLL = 0.05

Clock = Callable[[], float]


@dataclass(slots=True)
class PodTimes:
    """One pod as the load generator saw it, on its monotonic clock (nan: did not happen)."""

    kind: str
    sent: float = math.nan
    acked: float = math.nan
    bound: float = math.nan
    node: str = ""
    error: str = ""
    #: when the pod could first be scheduled, if later than ``sent`` (backlog: the scheduler's release)
    eligible: float = math.nan
    #: when the pod was first seen Running
    running: float = math.nan
    #: when the generator's watch first delivered the pod (an event or a relist), bound or not
    visible: float = math.nan

    @property
    def is_bound(self) -> bool:
        return not math.isnan(self.bound)

    @property
    def latency(self) -> float:
        """Seconds from create sent (or from when it became eligible, if later) to bind seen; nan if unbound."""
        return self.bound - self.start

    @property
    def start(self) -> float:
        return self.sent if math.isnan(self.eligible) else max(self.sent, self.eligible)

    @property
    def running_latency(self) -> float:
        """Seconds from create sent (or eligible) to Running seen; nan if not seen Running."""
        return self.running - self.start


class BindWatch:
    """Watch handler that stamps the first moment each expected pod is seen bound."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self.clock = clock
        self.pods: dict[str, PodTimes] = {}
        self.bound = 0
        self.last_bind = math.nan
        self.deleted = 0
        self.running = 0
        self.last_running = math.nan

    def expect(self, name: str, kind: str) -> PodTimes:
        times = self.pods.get(name)
        if times is None:
            times = self.pods[name] = PodTimes(kind)
        return times

    def _see(self, obj: dict[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name") or ""
        times = self.pods.get(name)
        if times is None:
            return
        node = (obj.get("spec") or {}).get("nodeName")
        binds = bool(node) and not times.is_bound
        starts = (
            bool(node) and math.isnan(times.running) and (obj.get("status") or {}).get("phase") == "Running"
        )
        if not (binds or starts or math.isnan(times.visible)):
            return  # nothing to stamp: most events of a tracked pod come after all three (kubelet's status)
        now = self.clock()
        if math.isnan(times.visible):
            times.visible = now
        if binds:
            times.bound = now
            times.node = str(node)
            self.bound += 1
            self.last_bind = now
        if starts:
            times.running = self.last_running = now
            self.running += 1

    def replace(self, objects: list[dict[str, Any]]) -> None:
        for obj in objects:
            self._see(obj)

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.deleted += 1
        self._see(obj)

    def of_kind(self, kind: str) -> list[PodTimes]:
        return [t for t in self.pods.values() if t.kind == kind]

    def sent(self) -> int:
        """How many creates were sent so far."""
        return sum(1 for t in self.pods.values() if not math.isnan(t.sent))


async def wait_bound(
    watch: BindWatch,
    *,
    stall_s: float,
    timeout_s: float,
    since: float,
    first_bind_s: float = 0.0,
    clock: Clock = time.monotonic,
) -> bool:
    """Wait until every created pod is bound (True), or no bind for ``stall_s`` seconds after ``since`` (for
    ``first_bind_s`` if longer, until the first bind) or ``timeout_s`` seconds after ``since`` (False)."""
    wanted = sum(1 for t in watch.pods.values() if not t.error)
    deadline = since + timeout_s
    while True:
        if watch.bound >= wanted:
            return True
        now = clock()
        if math.isnan(watch.last_bind):
            last, limit = since, max(stall_s, first_bind_s)
        else:
            last, limit = watch.last_bind, stall_s
        if now - max(last, since) > limit or now > deadline:
            return False
        await asyncio.sleep(POLL)


async def wait_running(
    watch: BindWatch,
    *,
    stall_s: float,
    timeout_s: float,
    since: float,
    clock: Clock = time.monotonic,
) -> bool:
    """Wait until every bound pod was seen Running (True), or none started for ``stall_s`` seconds after
    ``since``, or ``timeout_s`` passed (False)."""
    deadline = since + timeout_s
    while True:
        if watch.running >= watch.bound:
            return True
        now = clock()
        last = watch.last_running if not math.isnan(watch.last_running) else since
        if now - max(last, since) > stall_s or now > deadline:
            return False
        await asyncio.sleep(POLL)
