"""``bench paired``'s contenders, run order and summary (the runs themselves: tests/integration)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from scale.bench.cluster import failed_result
from scale.bench.paired import (
    WARMUP,
    Contender,
    ContenderError,
    Ratio,
    Summary,
    Trial,
    cluster_options,
    drift,
    labels_of,
    load,
    parse_contender,
    parse_contenders,
    ratios,
    ratios_main,
    schedule,
    summarize,
    table,
    versus,
    versus_first,
)
from scale.bench.results import RunResult
from scale.bench.schedulers import SCHEDULERS, checkout_env
from scale.bench.workloads import BURST, WorkloadSpec
from scale.cluster import ClusterOptions
from scale.cluster.config import PROJECT_ROOT


def checkout(tmp_path: Path) -> Path:
    (tmp_path / "agent_scheduler").mkdir()
    (tmp_path / "agent_scheduler" / "cli.py").write_text("")
    return tmp_path


def test_a_contender_runs_from_this_checkout_or_another(tmp_path: Path) -> None:
    assert parse_contender("after=agent-coord-1") == Contender("after", "agent-coord-1", PROJECT_ROOT)
    other = checkout(tmp_path)
    assert parse_contender(f"before=agent-coord-2@{other}") == Contender("before", "agent-coord-2", other)
    assert parse_contender("ceiling=no-decision").scheduler == "no-decision"
    assert parse_contender("kube=kube-scheduler-qps5000") == Contender(
        "kube", "kube-scheduler-qps5000", PROJECT_ROOT
    )


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("agent-coord-1", "expected LABEL=SCHEDULER"),
        ("=agent-coord-1", "expected LABEL=SCHEDULER"),
        ("a=", "expected LABEL=SCHEDULER"),
        ("a=agent-coord-9", "unknown scheduler 'agent-coord-9'"),
        ("a=kube-scheduler-qps5000@/tmp", "the cluster's own process, not run from a checkout"),
        ("a=volcano-agent-1w", "cannot be paired on one cluster"),
        ("a=agent-standalone@/nonexistent/checkout", "is not a checkout of this project"),
        ("warm-up=agent-standalone", "not 'warm-up'"),  # the bench's own
        ("a/b=agent-standalone", "a label is letters, digits"),  # labels name files and etcd prefixes
    ],
)
def test_a_contender_that_cannot_run_is_refused_with_the_reason(text: str, why: str) -> None:
    with pytest.raises(ContenderError, match=why):
        parse_contender(text)


def test_contenders_need_two_and_distinct_labels() -> None:
    with pytest.raises(ContenderError, match="at least two"):
        parse_contenders(["a=agent-standalone"])
    with pytest.raises(ContenderError, match="a given twice"):
        parse_contenders(["a=agent-standalone", "a=agent-coord-1"])
    assert [c.label for c in parse_contenders(["a=agent-standalone", "b=agent-coord-1"])] == ["a", "b"]


def test_one_kube_scheduler_contender_sets_the_clusters_kube_scheduler() -> None:
    """The cluster runs one kube-scheduler: with its contender's client limits, else at 5000 as when it is not
    under test; two kube-scheduler contenders cannot share it."""
    with pytest.raises(ContenderError, match="one kube-scheduler contender at most"):
        parse_contenders(["a=kube-scheduler-qps5000", "b=kube-scheduler-default", "c=agent-standalone"])
    default = parse_contenders(["sa=agent-standalone", "kube=kube-scheduler-default"])
    assert cluster_options(default) == ClusterOptions(scheduler_qps=50.0, scheduler_burst=100)
    fast = parse_contenders(["kube=kube-scheduler-qps5000", "sa=agent-standalone"])
    assert cluster_options(fast) == ClusterOptions(scheduler_qps=5000.0, scheduler_burst=5000)
    ours = parse_contenders(["sa=agent-standalone", "c2=agent-coord-2"])
    assert cluster_options(ours) == ClusterOptions(scheduler_qps=5000.0, scheduler_burst=5000)
    kube = Summary(fast[0], rounds=1, failed=0, cpu_s_per_1k=(2.8, 2.8, 2.8), adjusted_cpu_s_per_1k=2.8)
    assert "| kube | kube-scheduler-qps5000 | - | 1 | 2.800 (2.800-2.800) |" in table([kube])


def test_odd_rounds_run_in_reversed_order() -> None:
    a, b, c = (Contender(x, "agent-standalone", PROJECT_ROOT) for x in "abc")
    order = [(r, x.label) for r, x in schedule([a, b, c], 3)]
    assert order == [(0, "a"), (0, "b"), (0, "c"), (1, "c"), (1, "b"), (1, "a"), (2, "a"), (2, "b"), (2, "c")]
    # every contender runs first and last equally often over an even number of rounds
    pairs = [x.label for _, x in schedule([a, b], 4)]
    assert pairs == ["a", "b", "b", "a", "a", "b", "b", "a"]


def result(
    cpu: float,
    p50: float,
    p99: float,
    *,
    by_process: dict[str, float],
    error: str = "",
    busy: bool = False,
    visible_p99: float = 0.0,
    ended: int = -1,
) -> RunResult:
    base = failed_result(SCHEDULERS["agent-coord-1"], WorkloadSpec(name=BURST, pods=100), 10, error)
    # as ``wait_quiet`` notes a trial it could not start quietly
    notes = ["started with 1.95 cores busy outside the bench (waited 30s for quiet)"] if busy else []
    return replace(
        base,
        notes=notes,
        pods=100,
        bound=100 if not error else 0,
        unbound=0 if not error else 100,
        cpu_s_per_1k_pods=cpu,
        p50_ms=p50,
        p99_ms=p99,
        pods_per_s=200.0,
        cpu_s_per_1k_pods_by_process=by_process,
        visible_p99_ms=visible_p99,
        apiserver_ended_pod_watches=ended,
    )


def test_the_summary_gives_means_spreads_and_the_change_against_the_first() -> None:
    before = Contender("before", "agent-coord-1", PROJECT_ROOT)
    after = Contender("after", "agent-coord-1", PROJECT_ROOT)
    trials = [
        Trial(WARMUP, -1, 0, result(0.5, 50, 100, by_process={"coordinator": 0.1, "worker-1": 0.4})),
        Trial("before", 0, 1, result(1.0, 100, 200, by_process={"coordinator": 0.3, "worker-1": 0.7})),
        Trial(
            "after",
            0,
            2,
            result(0.9, 90, 180, by_process={"coordinator": 0.2, "worker-1": 0.7}, visible_p99=50, ended=3),
        ),
        Trial(
            "after",
            1,
            3,
            result(
                0.8,
                110,
                220,
                by_process={"coordinator": 0.2, "worker-1": 0.6},
                busy=True,
                visible_p99=70,
                ended=0,
            ),
        ),
        Trial("before", 1, 4, result(1.2, 120, 240, by_process={"coordinator": 0.4, "worker-1": 0.8})),
        Trial("before", 2, 5, result(0.0, 0, 0, by_process={}, error="probe: 3/10 pods bound")),
    ]
    first, second = summarize([before, after], trials)
    assert (first.rounds, first.failed) == (2, 1)  # the failed trial is counted, not averaged; the warm-up
    assert first.cpu_s_per_1k == pytest.approx((1.1, 1.0, 1.2))  # neither
    assert first.p99_ms == pytest.approx((220, 200, 240))
    assert first.by_process == pytest.approx({"coordinator": 0.35, "worker-1": 0.75})
    assert (second.rounds, second.failed) == (2, 0)
    assert second.cpu_s_per_1k == pytest.approx((0.85, 0.8, 0.9))
    # balanced positions (1+4 and 2+3): the drift-adjusted levels are the (geometric) means
    assert (first.adjusted_cpu_s_per_1k, second.adjusted_cpu_s_per_1k) == pytest.approx((1.2**0.5, 0.72**0.5))
    text = table([first, second])
    assert "| before | agent-coord-1 | this | 2 (+1 failed) | 1.100 (1.000-1.200) | 1.095 | +0.0 % |" in text
    # two trials each, one degree of freedom left (t = 12.7): the 95 % interval says they are not told apart
    assert (
        "| after | agent-coord-1 | this | 2 (1 disturbed) | 0.850 (0.800-0.900) | 0.849 | -22.5 % (-83.1 to +254.8) |"
        in text
    )
    assert "coordinator 0.200, worker-1 0.650" in text
    # the API server's part and the watches it ended: measured in after's trials (mean, min-max), not in
    # before's (older results)
    assert second.ended_watches == pytest.approx((1.5, 0, 3))
    assert first.ended_watches is None
    assert "| 200 (180-220) | 60 (50-70) | 1.5 (0.0-3.0) | 200 (200-200) |" in text
    assert "| 220 (200-240) | - | - | 200 (200-200) |" in text


def test_the_drift_fit_recovers_levels_under_a_steady_drift() -> None:
    """Unbalanced positions (three contenders, three rounds): raw means are biased by the drift (3 % more per
    trial for every contender), the fitted levels are not."""
    levels = {"a": 1.0, "b": 1.1, "c": 0.9}
    growth = 0.03
    contenders = [Contender(x, "agent-standalone", PROJECT_ROOT) for x in "abc"]
    trials = [Trial(WARMUP, -1, 0, result(0.5, 1, 2, by_process={}))]
    for position, (r, c) in enumerate(schedule(contenders, 3), start=1):
        cpu = levels[c.label] * (1 + growth) ** position
        trials.append(Trial(c.label, r, position, result(cpu, 1, 2, by_process={})))
    fitted, at_center = drift(trials)
    assert fitted == pytest.approx(growth)
    center = 5.0  # the mean of positions 1..9
    assert at_center == pytest.approx({k: v * (1 + growth) ** center for k, v in levels.items()})
    first, second, third = summarize(contenders, trials)
    assert second.adjusted_cpu_s_per_1k / first.adjusted_cpu_s_per_1k == pytest.approx(1.1)
    raw = second.cpu_s_per_1k[0] / first.cpu_s_per_1k[0]
    assert raw != pytest.approx(1.1, abs=1e-3)  # the raw means are off
    assert "Drift: CPU per pod +3.0 % per trial" in table([first, second, third], fitted)


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """x with a x = b (Gaussian elimination with partial pivoting; a small dense system)."""
    n = len(b)
    m = [[*row, rhs] for row, rhs in zip(a, b, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


def _design_matrix_intervals(
    trials: list[Trial],
    labels: Sequence[str],
    t: float,
    read: Callable[[RunResult], float] = lambda r: r.cpu_s_per_1k_pods,
) -> dict[str, tuple[float, float]]:
    """The model ``versus_first`` fits, fitted from its design matrix instead (a level per contender and a
    slope; the contrast's interval from (X'X)^-1 and the residuals, with the 0.975 quantile ``t`` given for
    the degrees of freedom n - len(labels) - 1)."""
    rows = [r for r in trials if r.label != WARMUP and not r.result.error]
    k = len(labels)
    x = [[float(r.label == label) for label in labels] + [float(r.position)] for r in rows]
    y = [math.log(read(r.result)) for r in rows]
    xtx = [[sum(row[i] * row[j] for row in x) for j in range(k + 1)] for i in range(k + 1)]
    beta = _solve(xtx, [sum(row[i] * v for row, v in zip(x, y, strict=True)) for i in range(k + 1)])
    residuals = [v - sum(b * f for b, f in zip(beta, row, strict=True)) for row, v in zip(x, y, strict=True)]
    s2 = sum(e * e for e in residuals) / (len(rows) - k - 1)
    out = {}
    for i, label in enumerate(labels[1:], start=1):
        contrast = [-1.0 if j == 0 else 1.0 if j == i else 0.0 for j in range(k + 1)]
        change = sum(c * b for c, b in zip(contrast, beta, strict=True))
        half = t * math.sqrt(s2 * sum(c * z for c, z in zip(contrast, _solve(xtx, contrast), strict=True)))
        out[label] = (math.expm1(change - half), math.expm1(change + half))
    return out


def _drifting_run(
    levels: dict[str, float], rounds: int, noise: list[float], *, failed: int | None = None
) -> list[Trial]:
    """A run of ``levels``' contenders, CPU per pod growing 2 % a trial, times exp(noise) by position; the
    trial at position ``failed`` fails (an error: not measured)."""
    contenders = [Contender(label, "agent-standalone", PROJECT_ROOT) for label in levels]
    trials = [Trial(WARMUP, -1, 0, result(0.5, 1, 2, by_process={}))]
    for position, (r, c) in enumerate(schedule(contenders, rounds), start=1):
        cpu = levels[c.label] * 1.02**position * math.exp(noise[position - 1])
        error = "probe: 3/10 pods bound" if position == failed else ""
        trials.append(Trial(c.label, r, position, result(cpu, 1, 2, by_process={}, error=error)))
    return trials


def _same(got: dict[str, tuple[float, float]], want: dict[str, tuple[float, float]]) -> bool:
    return got.keys() == want.keys() and all(got[k] == pytest.approx(want[k]) for k in want)


def test_the_change_against_the_first_comes_with_the_fits_95_percent_interval() -> None:
    """``versus_first`` against the same model fitted from its design matrix, on balanced runs (every
    contender at the same mean position) and unbalanced ones (an odd number of rounds, a failed trial), where
    the drift's correction and its share of the variance count; a noise-free run gives the exact change with
    no width."""
    levels = {"a": 1.0, "b": 1.1, "c": 0.95}
    # by position (a: 1, 6, 7, 12; b: 2, 5, 8, 11; c: 3, 4, 9, 10), none of the contenders' means moved
    noise = [0.03, -0.05, 0.02, -0.01, 0.04, -0.03, -0.02, 0.03, 0.01, -0.02, -0.02, 0.02]

    exact = versus_first(_drifting_run(levels, 4, [0.0] * 12), "a")
    assert exact["b"] == pytest.approx((0.1, 0.1)) and exact["c"] == pytest.approx((-0.05, -0.05))

    trials = _drifting_run(levels, 4, noise)
    got = versus_first(trials, "a")
    assert _same(got, _design_matrix_intervals(trials, "abc", 2.306))  # 12 trials: 8 degrees
    for label in "bc":
        assert got[label][0] < levels[label] - 1 < got[label][1]  # this noise leaves the truth inside

    # three rounds of two (a: 1, 4, 5; b: 2, 3, 6): 3 degrees of freedom
    two = _drifting_run({"a": 1.0, "b": 1.1}, 3, noise)
    assert _same(versus_first(two, "a"), _design_matrix_intervals(two, "ab", 3.182))
    # a failed trial (c's at position 9) leaves 11 measured: 7 degrees
    gap = _drifting_run(levels, 4, noise, failed=9)
    assert _same(versus_first(gap, "a"), _design_matrix_intervals(gap, "abc", 2.365))

    contenders = [Contender(label, "agent-standalone", PROJECT_ROOT) for label in levels]
    first, second, _ = summarize(contenders, trials)
    assert first.versus_first is None and second.versus_first == got["b"]
    lo, hi = got["b"]
    assert f"({lo * 100:+.1f} to {hi * 100:+.1f})" in table([first, second])
    # one trial each: nothing left to estimate the noise from
    assert versus_first(trials[:4], "a") == {}


def test_another_checkout_runs_first_on_the_python_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert checkout_env(PROJECT_ROOT) is None  # this checkout: the environment as it is
    monkeypatch.setenv("PYTHONPATH", "/some/plugins")
    env = checkout_env(tmp_path)
    assert env is not None and env["PYTHONPATH"] == f"{tmp_path}{os.pathsep}/some/plugins"
    monkeypatch.delenv("PYTHONPATH")
    assert checkout_env(tmp_path) == {**os.environ, "PYTHONPATH": str(tmp_path)}


@pytest.mark.parametrize("idle_s, until_idle_s", [(-1.0, 0.0), (0.0, -1.0)])
def test_a_negative_idle_is_refused_before_any_cluster_starts(
    capsys: pytest.CaptureFixture[str], idle_s: float, until_idle_s: float
) -> None:
    from scale.bench import paired

    code = paired.main(
        runs=["a=agent-standalone", "b=agent-standalone"],
        nodes=10,
        workload=BURST,
        pods=10,
        rate=None,
        rounds=2,
        out=None,
        pull_delay_s=0.0,
        quiet_wait_s=0.0,
        idle_s=idle_s,
        until_idle_s=until_idle_s,
    )
    assert code == 2
    assert "--idle and --until-idle must be 0 or more" in capsys.readouterr().err


def _coordinated_rounds(*threads: dict[str, Any]) -> list[Trial]:
    """One trial of contender "c2" (a coordinator 0.3 and a worker 0.7 CPU-s per 1k pods) per round, each
    result with the per-process thread figures given for its round."""
    return [
        Trial(
            "c2",
            r,
            r + 1,
            replace(result(1.0, 100, 200, by_process={"coordinator": 0.3, "worker-1": 0.7}), **t),
        )
        for r, t in enumerate(threads)
    ]


def test_the_table_says_how_much_of_each_process_ran_on_its_main_thread() -> None:
    c = Contender("c2", "agent-coord-1", PROJECT_ROOT)
    trials = _coordinated_rounds(
        *({"main_thread_share_by_process": {"coordinator": share, "worker-1": 0.98}} for share in (0.9, 0.96))
    )
    trials.append(
        Trial("c2", 2, 3, result(1.0, 100, 200, by_process={"coordinator": 0.3}))
    )  # an older result
    (summary,) = summarize([c], trials)
    assert summary.main_share == pytest.approx({"coordinator": 0.93, "worker-1": 0.98})
    assert "coordinator 0.300 (93 % main thread), worker-1 0.467 (98 % main thread)" in table([summary])


def test_the_table_says_how_often_each_process_main_thread_slept_per_pod() -> None:
    c = Contender("c2", "agent-coord-1", PROJECT_ROOT)
    trials = _coordinated_rounds(
        *(
            {
                "main_thread_share_by_process": {"coordinator": 0.9},
                "main_sleeps_per_pod_by_process": {"coordinator": sleeps, "worker-1": 4.0},
            }
            for sleeps in (1.0, 2.0)
        )
    )
    (summary,) = summarize([c], trials)
    assert summary.sleeps_per_pod == pytest.approx({"coordinator": 1.5, "worker-1": 4.0})
    assert "coordinator 0.300 (90 % main thread, 1.50 sleeps/pod), worker-1 0.700 (4.00 sleeps/pod)" in (
        table([summary])
    )


def _rated_run(levels: dict[str, tuple[float, float]], rounds: int, noise: list[float]) -> list[Trial]:
    """A run where each contender has a (pods/s, CPU per pod) level, both drifting 2 % a trial (the rate
    down, the CPU up) and both times exp(noise) by position; p50 is the inverse of the level's rate, p99 that
    times its CPU (neither drifts nor is noisy)."""
    contenders = [Contender(label, "agent-standalone", PROJECT_ROOT) for label in levels]
    trials = [Trial(WARMUP, -1, 0, result(0.5, 1, 2, by_process={}))]
    for position, (r, c) in enumerate(schedule(contenders, rounds), start=1):
        rate, cpu = levels[c.label]
        k = math.exp(noise[position - 1])
        rated = replace(
            result(cpu * 1.02**position * k, 1000 / rate, 2000 * cpu / rate, by_process={}),
            pods_per_s=rate / 1.02**position * k,
        )
        trials.append(Trial(c.label, r, position, rated))
    return trials


def test_each_figure_is_fitted_against_the_first_with_its_interval() -> None:
    """``versus`` fits rate, latency and CPU alike: a noise-free run gives each exact ratio with no width; a
    noisy one an interval around it, the same as ``versus_first``'s for CPU per pod."""
    levels = {"sa": (500.0, 1.0), "c1": (450.0, 1.2), "nd": (600.0, 0.5)}
    exact = _rated_run(levels, 4, [0.0] * 12)
    rate = versus(exact, "nd", lambda r: r.pods_per_s)
    assert rate["sa"] == pytest.approx(Ratio(500 / 600, 500 / 600, 500 / 600))
    assert rate["c1"].ratio == pytest.approx(0.75)
    assert versus(exact, "sa", lambda r: r.p99_ms)["c1"].ratio == pytest.approx(500 / 450 * 1.2)
    assert versus(exact, "sa")["nd"].ratio == pytest.approx(0.5)  # CPU per pod by default

    noise = [0.03, -0.05, 0.02, -0.01, 0.04, -0.03, -0.02, 0.03, 0.01, -0.02, -0.02, 0.02]
    noisy = _rated_run(levels, 4, noise)
    cpu = versus(noisy, "sa")
    interval = versus_first(noisy, "sa")
    for label in ("c1", "nd"):
        low, high = cpu[label].low, cpu[label].high
        assert low is not None and high is not None
        assert (low - 1, high - 1) == pytest.approx(interval[label])
        assert low < cpu[label].ratio < high
    fitted = versus(noisy, "nd", lambda r: r.pods_per_s)["sa"]
    assert fitted.low is not None and fitted.high is not None
    assert fitted.low < 500 / 600 < fitted.high  # this noise leaves the truth inside

    # three rounds (sa: 1, 6, 7; c1: 2, 5, 8; nd: 3, 4, 9): unequal mean positions, so the drift's correction
    # counts; the rate's fit is the design matrix's (which gives the change: the ratio less 1)
    odd = _rated_run(levels, 3, noise)
    rate = versus(odd, "nd", lambda r: r.pods_per_s)
    want = _design_matrix_intervals(odd, ["nd", "sa", "c1"], 2.571, lambda r: r.pods_per_s)  # 9 - 4: 5 df
    for label in ("sa", "c1"):
        assert (rate[label].low, rate[label].high) == pytest.approx((want[label][0] + 1, want[label][1] + 1))

    # one trial each (sa at position 1, c1 at 2, nd at 3): the raw ratio, no drift nor interval fitted
    one = versus(exact[:4], "sa")
    assert one["c1"].ratio == pytest.approx(1.2 * 1.02) and one["nd"].ratio == pytest.approx(0.5 * 1.02**2)
    assert all(fit.low is None and fit.high is None for fit in one.values())
    assert versus(exact, "absent") == {}


def test_the_ratios_table_reads_every_figure_against_the_reference() -> None:
    levels = {"sa": (500.0, 1.0), "c1": (450.0, 1.2), "nd": (600.0, 0.5)}
    trials = _rated_run(levels, 4, [0.0] * 12)
    text = ratios(["nd", "sa", "c1"], trials)
    assert text.startswith("Against nd: ")
    assert "| contender | pods/s | p50 | p99 | CPU per pod |" in text
    assert (
        "| sa | 0.83 x (0.83-0.83) | 1.20 x (1.20-1.20) | 2.40 x (2.40-2.40) | 2.00 x (2.00-2.00) |" in text
    )
    assert (
        "| c1 | 0.75 x (0.75-0.75) | 1.33 x (1.33-1.33) | 3.20 x (3.20-3.20) | 2.40 x (2.40-2.40) |" in text
    )
    assert "| nd |" not in text  # the reference has no row
    # a contender with no measured trial has no figures; one trial each gives ratios without intervals
    assert "| gone | - | - | - | - |" in ratios(["nd", "gone"], trials)
    # (sa at position 1, nd at 3, no drift fitted from one trial each: 500/600 x 1.02^2 and 2 / 1.02^2)
    assert (
        "| sa | 0.87 x (no interval) | 1.20 x (no interval) | 2.40 x (no interval) | 1.92 x (no interval) |"
        in (ratios(["nd", "sa"], trials[:4]))
    )
    assert ratios(["nd"], trials) == ""


def test_a_runs_ratios_are_read_back_from_its_trials(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    levels = {"sa": (500.0, 1.0), "c1": (450.0, 1.2), "nd": (600.0, 0.5)}
    trials = _rated_run(levels, 4, [0.0] * 12)
    (tmp_path / "trials.json").write_text(json.dumps([t.to_json() for t in trials]))  # as the run writes it
    back = load(tmp_path / "trials.json")
    assert [(t.label, t.round, t.position) for t in back] == [(t.label, t.round, t.position) for t in trials]
    assert [t.result.pods_per_s for t in back] == pytest.approx([t.result.pods_per_s for t in trials])
    assert labels_of(back) == ["sa", "c1", "nd"]  # the run's order: its first round's
    failed = [
        *trials[:2],
        replace(trials[2], result=result(0.0, 0, 0, by_process={}, error="probe: 0/10")),
        *trials[3:],
    ]
    assert labels_of(failed) == ["sa", "c1", "nd"]  # a failed trial still names its contender
    assert labels_of(trials[:3]) == ["sa", "c1"]  # an interrupted run: the contenders it reached

    assert ratios_main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == ratios(["sa", "c1", "nd"], trials)
    assert ratios_main([str(tmp_path), "nd", "sa"]) == 0
    assert "| sa | 0.83 x (0.83-0.83) |" in capsys.readouterr().out
    assert ratios_main([str(tmp_path), "nd", "kube"]) == 2
    assert "no trials of kube" in capsys.readouterr().err
    assert ratios_main([]) == 2
    assert ratios_main([str(tmp_path / "absent")]) == 2
    assert "cannot read its trials.json" in capsys.readouterr().err
    (tmp_path / "trials.json").write_text(json.dumps([trials[0].to_json()]))  # the warm-up only
    assert ratios_main([str(tmp_path)]) == 2
    assert "fewer than two contenders" in capsys.readouterr().err
