"""Create-to-bound latency, measured with the load generator's own clocks.

``BindTracker`` watches the pods of one namespace and notes the monotonic time at which each pod is first
seen with ``spec.nodeName``; the generator notes when it sent each create. creationTimestamp is not used: it
has one-second resolution.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from typing import Any

from common.kube import KubeClient
from common.watching import Reflector


class BindTracker:
    def __init__(self, client: KubeClient, namespace: str) -> None:
        self.sent: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.node_of: dict[str, str] = {}
        self._changed = asyncio.Event()
        self.reflector = Reflector(
            client, f"/api/v1/namespaces/{namespace}/pods", self, name=f"track-{namespace}"
        )

    def created(self, name: str, at: float | None = None) -> None:
        self.sent.setdefault(name, time.monotonic() if at is None else at)

    def _see(self, obj: dict[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name") or ""
        node = (obj.get("spec") or {}).get("nodeName")
        if node and name not in self.bound:
            self.bound[name] = time.monotonic()
            self.node_of[name] = node
            self._changed.set()

    async def wait_bound(self, count: int, timeout: float) -> bool:
        """Wait until ``count`` pods are bound; False if ``timeout`` passed first."""
        deadline = time.monotonic() + timeout
        while len(self.bound) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)
        return True

    def replace(self, objects: list[dict[str, Any]]) -> None:
        for obj in objects:
            self._see(obj)

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind != "DELETED":
            self._see(obj)

    def latencies(self) -> list[float]:
        """Seconds from create sent to bound seen, for every pod that is both."""
        return sorted(self.bound[n] - t for n, t in self.sent.items() if n in self.bound)

    def summary(self) -> dict[str, Any]:
        lat = self.latencies()
        if not lat:
            return {"bound": 0}
        first = min(self.sent.values())
        last = max(self.bound[n] for n in self.sent if n in self.bound)
        return {
            "bound": len(lat),
            "pods_per_s": len(lat) / max(1e-9, last - first),
            "p50_ms": 1000 * statistics.median(lat),
            "p90_ms": 1000 * lat[int(0.90 * (len(lat) - 1))],
            "p99_ms": 1000 * lat[int(0.99 * (len(lat) - 1))],
            "max_ms": 1000 * lat[-1],
        }
