"""Per-stage latency of a run, from the schedulers' own ``/metrics``.

Our processes export ``agent_scheduler_pod_scheduling_stage_duration_seconds{stage}`` (``common.metrics`` says
what each stage measures and which process observes it). The bench starts each of them with a known
``--metrics-address`` (``schedulers.launch``), scrapes every one just before a workload and again at its end,
and keeps the difference: the histograms are cumulative over the process's life, which spans several
workloads. Histograms of the same stage from several processes (the workers of ``agent-coord-2``) are added.

Per stage: ``count`` (observations in the run), ``mean_ms`` (exact, from the sum) and ``p50_ms``/``p99_ms``
estimated from the buckets the way Prometheus' ``histogram_quantile`` does (linear within a bucket; a
quantile in the open top bucket reports that bucket's lower bound).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from common.metrics import LEADER_STAGES, STAGE_METRIC, WORKER_STAGES

STAGES = (*LEADER_STAGES, *WORKER_STAGES)  # in path order
SCRAPE_TIMEOUT = 5.0


@dataclass(slots=True)
class Histogram:
    """One stage's cumulative histogram: upper bound -> cumulative count, sum and count."""

    buckets: dict[float, float] = field(default_factory=dict)
    total: float = 0.0
    count: float = 0.0

    def plus(self, other: Histogram, sign: float = 1.0) -> Histogram:
        bounds = set(self.buckets) | set(other.buckets)
        return Histogram(
            {b: self.buckets.get(b, 0.0) + sign * other.buckets.get(b, 0.0) for b in bounds},
            self.total + sign * other.total,
            self.count + sign * other.count,
        )

    def quantile(self, q: float) -> float:
        """Seconds; 0 without observations."""
        if self.count <= 0:
            return 0.0
        rank = q * self.count
        lower, below = 0.0, 0.0
        for bound in sorted(self.buckets):
            cumulative = self.buckets[bound]
            if cumulative >= rank:
                if math.isinf(bound):
                    return lower
                inside = cumulative - below
                return lower + (bound - lower) * ((rank - below) / inside if inside > 0 else 1.0)
            lower, below = bound, cumulative
        return lower


Stages = dict[str, Histogram]


def parse(text: str) -> Stages:
    """The stage histograms in one ``/metrics`` answer (empty when the process exports none)."""
    out: Stages = {}
    for family in text_string_to_metric_families(text):
        if family.name != STAGE_METRIC:
            continue
        for sample in family.samples:
            stage = sample.labels.get("stage", "")
            h = out.setdefault(stage, Histogram())
            if sample.name.endswith("_bucket"):
                h.buckets[float(sample.labels["le"])] = sample.value
            elif sample.name.endswith("_sum"):
                h.total = sample.value
            elif sample.name.endswith("_count"):
                h.count = sample.value
    return out


def combine(scrapes: Iterable[Stages]) -> Stages:
    """The same stage of several processes, added."""
    out: Stages = {}
    for stages in scrapes:
        for stage, h in stages.items():
            out[stage] = out[stage].plus(h) if stage in out else h
    return out


def difference(after: Stages, before: Stages) -> Stages:
    """What was observed between two scrapes."""
    return {stage: h.plus(before[stage], -1.0) if stage in before else h for stage, h in after.items()}


def summary(stages: Stages) -> dict[str, dict[str, float]]:
    """``results.json``'s ``stages``: per stage with observations, in path order (unknown stages last)."""
    order = [s for s in STAGES if s in stages] + sorted(s for s in stages if s not in STAGES)
    out = {}
    for stage in order:
        h = stages[stage]
        if h.count <= 0:
            continue
        out[stage] = {
            "count": round(h.count),
            "mean_ms": round(1000 * h.total / h.count, 3),
            "p50_ms": round(1000 * h.quantile(0.5), 3),
            "p99_ms": round(1000 * h.quantile(0.99), 3),
        }
    return out


async def scrape(addresses: Sequence[str]) -> tuple[Stages, list[str]]:
    """Scrape every ``host:port``; returns the combined stages and a note per process that did not answer."""
    problems: list[str] = []
    timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT)

    async def one(session: aiohttp.ClientSession, address: str) -> Stages:
        try:
            async with session.get(f"http://{address}/metrics") as response:
                response.raise_for_status()
                return parse(await response.text())
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            problems.append(f"stage metrics: {address} did not answer ({e or type(e).__name__})")
            return {}

    async with aiohttp.ClientSession(timeout=timeout) as session:
        scraped = await asyncio.gather(*(one(session, a) for a in addresses))
    return combine(scraped), problems


def stage_means(record: Mapping[str, Any]) -> dict[str, float]:
    """Mean milliseconds per stage of one ``results.json`` object (empty for schedulers without stages)."""
    stages = record.get("stages") or {}
    return {s: float(v.get("mean_ms", 0.0)) for s, v in stages.items() if isinstance(v, Mapping)}
