"""Latency statistics, throughput and the results file's schema (``scale.bench.results``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from scale.bench.results import (
    CDF_POINTS,
    REQUIRED_FIELDS,
    SCHEMA_VERSION,
    RunResult,
    SchemaError,
    Usage,
    cdf,
    dump,
    latency_stats,
    load,
    percentile,
    summarize,
    sustained_rate,
    timeline,
)
from scale.tracking import PodTimes


class TestPercentile:
    def test_interpolates_between_order_statistics_like_numpy(self) -> None:
        values = [1.0, 2.0, 3.0, 4.0]
        assert percentile(values, 0) == 1.0
        assert percentile(values, 100) == 4.0
        assert percentile(values, 50) == pytest.approx(2.5)
        assert percentile(values, 90) == pytest.approx(3.7)

    def test_single_value_and_empty(self) -> None:
        assert percentile([7.0], 99) == 7.0
        assert math.isnan(percentile([], 50))

    def test_rejects_out_of_range(self) -> None:
        with pytest.raises(ValueError):
            percentile([1.0], 101)


class TestLatencyStats:
    def test_milliseconds_from_seconds(self) -> None:
        stats = latency_stats([0.001 * i for i in range(1, 101)])  # 1..100 ms
        assert stats.count == 100
        assert stats.p50_ms == pytest.approx(50.5)
        assert stats.p99_ms == pytest.approx(99.01)
        assert stats.max_ms == 100.0
        assert stats.mean_ms == pytest.approx(50.5)

    def test_order_does_not_matter(self) -> None:
        assert latency_stats([0.3, 0.1, 0.2]) == latency_stats([0.1, 0.2, 0.3])

    def test_no_latencies_give_zeros(self) -> None:
        stats = latency_stats([])
        assert (stats.count, stats.p50_ms, stats.p99_ms) == (0, 0.0, 0.0)


class TestSustainedRate:
    def test_constant_rate_is_recovered(self) -> None:
        times = [i / 200.0 for i in range(1000)]  # 200 binds/s
        assert sustained_rate(times) == pytest.approx(200.0, rel=0.01)

    def test_slow_start_and_stragglers_do_not_dilute_it(self) -> None:
        middle = [10.0 + i / 100.0 for i in range(900)]  # 100/s for 9 s
        stragglers = [60.0 + i for i in range(50)]
        slow_start = [float(i) for i in range(50)]
        assert sustained_rate(slow_start + middle + stragglers) == pytest.approx(100.0, rel=0.05)

    def test_few_or_simultaneous_binds(self) -> None:
        assert sustained_rate([]) == 0.0
        assert sustained_rate([1.0]) == 0.0
        assert sustained_rate([1.0, 2.0, 3.0]) == pytest.approx(1.0)
        assert sustained_rate([5.0] * 20) == 0.0


class TestCdfAndTimeline:
    def test_cdf_has_fixed_points_and_is_monotonic(self) -> None:
        points = cdf([0.01 * i for i in range(1, 500)])
        assert len(points) == CDF_POINTS
        assert points == sorted(points)
        assert points[0] == pytest.approx(10.0)
        assert cdf([]) == []

    def test_timeline_is_cumulative_and_bounded(self) -> None:
        times = [100.0 + i * 0.01 for i in range(5000)]
        line = timeline(times, origin=100.0, points=200)
        assert line[0] == [0.0, 0]
        assert line[-1][1] == 5000
        assert len(line) <= 202
        counts = [p[1] for p in line]
        assert counts == sorted(counts)
        assert timeline([], origin=0.0) == []


def _times(kind: str, sent: float, bound: float | None, *, acked: float | None = None) -> PodTimes:
    t = PodTimes(kind, sent=sent, acked=acked if acked is not None else sent + 0.01)
    if bound is not None:
        t.bound = bound
    return t


class TestSummarize:
    def test_counts_latency_cpu_and_unbound(self) -> None:
        agent = [_times("agent", i * 0.01, i * 0.01 + 0.05) for i in range(100)]
        agent.append(_times("agent", 1.0, None))
        batch = [_times("batch", 0.5, 0.7), _times("batch", 0.6, None)]
        result = summarize(
            scheduler="agent-standalone",
            scheduler_kind="agent",
            workload="steady",
            nodes=50,
            agent=agent,
            batch=batch,
            origin=0.0,
            end=2.0,
            usage={"scheduler": Usage(0.5, 100 * 2**20, 1), "apiserver": Usage(1.0, 0, 1)},
            host_cpu_s=3.0,
        )
        assert (result.pods, result.bound, result.unbound) == (101, 100, 1)
        assert result.p50_ms == pytest.approx(50.0)
        assert result.p99_ms == pytest.approx(50.0)
        assert result.cpu_s_per_1k_pods == pytest.approx(5.0)
        assert result.peak_rss_mb == pytest.approx(100.0)
        assert result.apiserver_cpu_s == 1.0
        assert result.host_other_cpu_s == pytest.approx(1.5)
        assert (result.batch_pods, result.batch_bound) == (2, 1)
        assert result.create_p50_ms == pytest.approx(10.0)
        assert result.pods_per_s == pytest.approx(100.0, rel=0.05)
        assert result.duration_s == 2.0

    def test_visible_is_measured_from_the_start_and_never_negative(self) -> None:
        agent = [_times("agent", i * 0.01, i * 0.01 + 0.5) for i in range(100)]
        for i, t in enumerate(agent):
            t.visible = t.sent + (0.1 if i < 40 else 0.3)
        released = _times("agent", 0.0, 2.5)
        released.eligible, released.visible = 2.0, 0.05  # a backlog pod: visible before its release
        unbound = _times("agent", 0.0, None)
        unbound.visible = 9.0  # not bound: not counted
        result = summarize(
            scheduler="agent-standalone",
            scheduler_kind="agent",
            workload="burst",
            nodes=50,
            agent=[*agent, released, unbound],
            batch=[],
            origin=0.0,
            end=3.0,
            usage={},
            host_cpu_s=0.0,
        )
        assert result.visible_mean_ms == pytest.approx((40 * 100 + 60 * 300) / 101, abs=0.01)
        assert result.visible_p50_ms == pytest.approx(300.0, abs=0.01)
        assert result.visible_p99_ms == pytest.approx(300.0, abs=0.01)
        assert RunResult.from_json(result.to_json()).visible_mean_ms == result.visible_mean_ms
        assert len(result.cdf_ms) == CDF_POINTS

    @staticmethod
    def _coordinated_burst(scheduler: Usage) -> RunResult:
        """200 pods bound by a coordinator (PID 10) and two workers (11, 12) using ``scheduler``."""
        return summarize(
            scheduler="agent-coord-2",
            scheduler_kind="agent",
            workload="burst",
            nodes=10,
            agent=[_times("agent", i * 0.01, i * 0.01 + 0.05) for i in range(200)],
            origin=0.0,
            end=2.0,
            usage={"scheduler": scheduler},
            host_cpu_s=3.0,
            process_names={10: "coordinator", 11: "worker-1", 12: "worker-2"},
        )

    def test_splits_the_scheduler_cpu_by_named_process(self) -> None:
        result = self._coordinated_burst(Usage(0.9, 0, 4, {10: 0.2, 11: 0.3, 12: 0.3, 13: 0.1}))
        # per 1k of the 200 bound pods; a PID without a name (a child process) is summed as "other"
        assert result.cpu_s_per_1k_pods_by_process == pytest.approx(
            {"coordinator": 1.0, "other": 0.5, "worker-1": 1.5, "worker-2": 1.5}
        )
        assert sum(result.cpu_s_per_1k_pods_by_process.values()) == pytest.approx(result.cpu_s_per_1k_pods)
        assert RunResult.from_json(result.to_json()).cpu_s_per_1k_pods_by_process == (
            result.cpu_s_per_1k_pods_by_process
        )

    def test_counts_each_process_main_thread_sleeps_per_bound_pod(self) -> None:
        result = self._coordinated_burst(
            Usage(0.9, 0, 3, {10: 0.2, 11: 0.3, 12: 0.3}, {}, {10: 100, 11: 700, 12: 50})
        )
        assert result.main_sleeps_per_pod_by_process == {
            "coordinator": 0.5,
            "worker-1": 3.5,
            "worker-2": 0.25,
        }
        assert RunResult.from_json(result.to_json()).main_sleeps_per_pod_by_process == (
            result.main_sleeps_per_pod_by_process
        )

    def test_a_bind_seen_before_the_send_returned_counts_as_zero_latency(self) -> None:
        result = summarize(
            scheduler="s",
            scheduler_kind="agent",
            workload="burst",
            nodes=1,
            agent=[_times("agent", 1.0, 0.999)],
            origin=0.0,
            end=1.0,
            usage={},
            host_cpu_s=0.0,
        )
        assert result.p50_ms == 0.0

    def test_nothing_bound(self) -> None:
        result = summarize(
            scheduler="s",
            scheduler_kind="agent",
            workload="burst",
            nodes=1,
            agent=[_times("agent", 0.0, None)],
            origin=0.0,
            end=1.0,
            usage={"scheduler": Usage(1.0, 0, 1)},
            host_cpu_s=0.0,
        )
        assert (result.bound, result.unbound, result.cpu_s_per_1k_pods, result.pods_per_s) == (0, 1, 0.0, 0.0)


def _result(**changes: object) -> RunResult:
    base = summarize(
        scheduler="agent-standalone",
        scheduler_kind="agent",
        workload="burst",
        nodes=10,
        agent=[_times("agent", 0.0, 0.1)],
        origin=0.0,
        end=1.0,
        usage={},
        host_cpu_s=0.0,
    )
    for key, value in changes.items():
        setattr(base, key, value)
    return base


class TestSchema:
    def test_every_required_field_is_in_the_json(self) -> None:
        data = _result().to_json()
        for name in REQUIRED_FIELDS:
            assert name in data
        assert data["schema"] == SCHEMA_VERSION
        json.dumps(data)  # serializable as is

    def test_round_trip_through_a_file(self, tmp_path: Path) -> None:
        results = [_result(), _result(scheduler="no-decision", scheduler_kind="no-decision")]
        path = tmp_path / "results.json"
        dump(results, path)
        assert load(path) == results
        assert not path.with_suffix(".json.tmp").exists()

    def test_missing_required_field_is_refused(self) -> None:
        data = _result().to_json()
        del data["p99_ms"]
        with pytest.raises(SchemaError, match="p99_ms"):
            RunResult.from_json(data)

    def test_wrong_types_are_refused(self) -> None:
        for field, bad in (("nodes", "10"), ("pods_per_s", "fast"), ("scheduler", 3), ("unbound", True)):
            data = _result().to_json()
            data[field] = bad
            with pytest.raises(SchemaError, match=field):
                RunResult.from_json(data)

    def test_unknown_fields_are_ignored_and_missing_optional_ones_default(self) -> None:
        data = {name: _result().to_json()[name] for name in REQUIRED_FIELDS}
        data["from_the_future"] = [1, 2]
        result = RunResult.from_json(data)
        assert result.scheduler == "agent-standalone"
        assert result.bound == 0 and result.notes == [] and result.error == ""

    def test_a_file_that_is_not_a_list_is_refused(self, tmp_path: Path) -> None:
        path = tmp_path / "results.json"
        path.write_text("{}")
        with pytest.raises(SchemaError):
            load(path)
