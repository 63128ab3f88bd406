"""The pure parts of ``bench footprint``: slopes, the goal's verdict, the report, the results file, the steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scale.bench.footprint import PodEvents, step_targets
from scale.bench.footprint_report import (
    GOAL_NODES,
    GOAL_PODS,
    KUBE_SCHEDULER,
    SchemaError,
    Step,
    dump,
    fitted_slopes,
    goal_rows,
    load,
    marginal_slope,
    markdown,
    rebuild,
    slope,
    table,
    verdict,
    write,
)


def step(
    pods: int,
    rss: dict[str, float],
    kube: float,
    *,
    scheduler: str = "agent-coord-2",
    nodes: int = 1000,
    cpu: dict[str, float] | None = None,
    events: int = 0,
    error: str = "",
) -> Step:
    return Step(
        scheduler=scheduler,
        kind="agent",
        nodes=nodes,
        pods=pods,
        rss_mib=rss,
        kube_scheduler_rss_mib=kube,
        apiserver_rss_mib=500.0,
        cpu_s=cpu or {},
        kube_scheduler_cpu_s=0.5,
        events=events,
        error=error,
    )


class TestSlope:
    def test_exact_line(self) -> None:
        assert slope([(0, 10.0), (1000, 14.0), (2000, 18.0)]) == pytest.approx(0.004)

    def test_least_squares_through_noise(self) -> None:
        assert slope([(0, 0.0), (1, 1.0), (2, 1.0), (3, 2.0)]) == pytest.approx(0.6)

    def test_degenerate(self) -> None:
        assert slope([]) == 0.0
        assert slope([(5, 1.0)]) == 0.0
        assert slope([(5, 1.0), (5, 3.0)]) == 0.0

    def test_marginal_per_process_and_kube(self) -> None:
        a = step(0, {"worker-1": 100.0}, 60.0)
        b = step(5000, {"worker-1": 120.0}, 100.0)
        assert marginal_slope(None, b, "worker-1") is None
        assert marginal_slope(a, b, "worker-1") == pytest.approx(4.0)
        assert marginal_slope(a, b, KUBE_SCHEDULER) == pytest.approx(8.0)
        assert marginal_slope(a, b, "coordinator") is None  # not a process of this configuration

    def test_fitted_slopes_include_the_same_clusters_kube_scheduler(self) -> None:
        run = [step(0, {"worker-1": 100.0}, 60.0), step(10000, {"worker-1": 130.0}, 140.0)]
        assert fitted_slopes(run) == {"worker-1": pytest.approx(3.0), KUBE_SCHEDULER: pytest.approx(8.0)}


class TestGoal:
    def test_not_measured_below_the_goal_size(self) -> None:
        assert verdict([step(10000, {"worker-1": 50.0}, 100.0)]) == "not measured"

    def test_met_when_every_worker_is_below_kube(self) -> None:
        steps = [
            step(
                GOAL_PODS, {"worker-1": 90.0, "worker-2": 95.0, "coordinator": 300.0}, 100.0, nodes=GOAL_NODES
            )
        ]
        assert verdict(steps) == "met"  # the coordinator holds no worker cache: not part of the goal

    def test_missed_when_one_worker_is_above(self) -> None:
        steps = [
            step(GOAL_PODS, {"worker": 90.0}, 100.0, nodes=GOAL_NODES, scheduler="agent-standalone"),
            step(GOAL_PODS, {"worker-1": 90.0, "worker-2": 101.0}, 100.0, nodes=GOAL_NODES),
        ]
        assert verdict(steps) == "missed"
        assert [ok for _, ok in goal_rows(steps)] == [True, False]

    def test_failed_runs_and_kube_configurations_do_not_count(self) -> None:
        kube = step(GOAL_PODS, {KUBE_SCHEDULER: 100.0}, 100.0, nodes=GOAL_NODES, scheduler="kube-scheduler")
        failed = step(GOAL_PODS, {}, 0.0, nodes=GOAL_NODES, error="cluster did not start")
        assert verdict([kube, failed]) == "not measured"


class TestReport:
    def steps(self) -> list[Step]:
        return [
            step(0, {"worker": 80.0}, 60.0, scheduler="agent-standalone"),
            step(
                5000,
                {"worker": 100.0},
                100.0,
                scheduler="agent-standalone",
                cpu={"worker": 2.0},
                events=10000,
            ),
            step(
                10000,
                {"worker": 110.0},
                140.0,
                scheduler="agent-standalone",
                cpu={"worker": 1.0},
                events=10000,
            ),
            step(10000, {}, 0.0, scheduler="agent-coord-1", error="probe: 0/10 pods bound"),
        ]

    def test_cpu_per_event(self) -> None:
        s = self.steps()[1]
        assert s.cpu_ms_per_event == pytest.approx(0.2)
        assert s.kube_cpu_ms_per_event == pytest.approx(0.05)
        assert self.steps()[0].cpu_ms_per_event == 0.0  # no events: no division

    def test_table_rows(self) -> None:
        lines = table(self.steps()).splitlines()
        assert len(lines) == 2 + 4
        assert (
            "| agent-standalone | 1,000 | 5,000 | worker 100 | 100 | 500 | worker 4.00 | 0.200 | 0.050 | **no** |"
            in lines
        )
        assert (
            "| agent-standalone | 1,000 | 10,000 | worker 110 | 140 | 500 | worker 2.00 | 0.100 | 0.050 | yes |"
            in lines
        )
        assert any("failed: probe: 0/10 pods bound" in line for line in lines)

    def test_markdown_states_goal_command_and_method(self) -> None:
        text = markdown(
            self.steps(),
            {"command": "agent-scheduler bench footprint", "commit": "abc", "notes": ["shared host"]},
        )
        assert "**not measured**" in text
        assert "`agent-scheduler bench footprint`" in text and "`abc`" in text
        assert "## Growth" in text and "| agent-standalone | 1,000 | worker 3.00 | 8.00 |" in text
        assert "- shared host" in text

    def test_round_trip_and_rebuild(self, tmp_path: Path) -> None:
        steps = self.steps()
        steps[0].notes.append("scheduler CPU not quiet after 120s")
        write(tmp_path, steps, {"command": "x"})
        loaded, meta = load(tmp_path / "results.json")
        assert loaded == steps and meta == {"command": "x"}
        (tmp_path / "report.md").unlink()
        assert rebuild(tmp_path).read_text() == markdown(steps, meta)

    def test_other_schema_refused(self, tmp_path: Path) -> None:
        dump([], tmp_path / "results.json")
        body = json.loads((tmp_path / "results.json").read_text())
        body["schema"] = "footprint/0"
        (tmp_path / "results.json").write_text(json.dumps(body))
        with pytest.raises(SchemaError):
            load(tmp_path / "results.json")


class TestSteps:
    def test_equal_steps_end_at_the_total(self) -> None:
        assert step_targets(10000, 4) == [2500, 5000, 7500, 10000]
        assert step_targets(10, 3) == [3, 7, 10]

    def test_never_more_steps_than_pods(self) -> None:
        assert step_targets(2, 5) == [1, 2]
        assert step_targets(0, 4) == [0]


class TestPodEvents:
    @staticmethod
    def pod(name: str, phase: str) -> dict[str, object]:
        return {"metadata": {"name": name}, "status": {"phase": phase}}

    def test_counts_events_and_running_pods(self) -> None:
        watch = PodEvents()
        watch.replace([self.pod("a", "Running")])
        watch.event("ADDED", self.pod("b", "Pending"))
        watch.event("MODIFIED", self.pod("b", "Running"))
        watch.event("DELETED", self.pod("a", "Running"))
        assert watch.events == 3  # the list is not an event
        assert watch.running == {"b"}
