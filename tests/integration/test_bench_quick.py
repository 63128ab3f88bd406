"""``agent-scheduler bench cluster`` end to end on a tiny cluster: two schedulers, backlog and churn, with
simulated image pulls (create -> running).

Runs the real command as a subprocess (its own clusters on free ports, stopped at the end) and checks the
results directory: every run in ``results.json`` with sane numbers, and the report with its plots. No
wall-clock assertion: speed is what the bench reports, not what the test checks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scale.bench.results import REQUIRED_FIELDS, load
from tests.integration.support import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCHEDULERS = ("agent-standalone", "kube-scheduler-qps5000")
WORKLOADS = ("backlog", "churn")
NODES = 50
PODS = 200
PULL_DELAY_S = 3.0
GUARD_TIMEOUT = 900  # against a hang, not a speed requirement


def test_tiny_bench_writes_results_and_report(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    run_bench(
        "cluster",
        out,
        f"--nodes={NODES}",
        f"--schedulers={','.join(SCHEDULERS)}",
        f"--workloads={','.join(WORKLOADS)}",
        f"--burst={PODS}",
        f"--pods={PODS}",
        "--rate=40",
        "--no-volcano",
        "--quiet-wait=0",
        # only the warm nodes (about 10 %) hold the agent image: pods placed elsewhere wait for a pull
        "--prepulled=0",
        f"--pull-delay={PULL_DELAY_S}",
        timeout=GUARD_TIMEOUT,
    )

    raw = json.loads((out / "results.json").read_text())
    assert all(name in item for item in raw for name in REQUIRED_FIELDS)
    results = load(out / "results.json")
    assert sorted((r.scheduler, r.workload) for r in results) == sorted(
        (s, w) for s in SCHEDULERS for w in WORKLOADS
    )
    for r in results:
        assert r.error == "", r.error
        assert r.nodes == NODES and r.pods == PODS
        assert r.unbound == 0, r.notes
        assert 0 < r.p50_ms <= r.p99_ms <= r.max_ms
        assert r.pods_per_s > 0
        assert r.cpu_s > 0 and r.cpu_s_per_1k_pods > 0
        assert r.peak_rss_mb > 10
        assert r.apiserver_cpu_s > 0
        assert r.apiserver_ended_pod_watches >= 0, r.notes  # the API server's /metrics answered, twice
        assert len(r.cdf_ms) == 101 and r.timeline[-1][1] == PODS
        # simulated pulls (on by default): every pod was seen running, no sooner than bound
        assert r.params["pull_delay_s"] > 0 and r.running == PODS, r.notes
        assert r.p50_ms <= r.running_p50_ms and r.p99_ms <= r.running_p99_ms
    # 200 pods do not fit on the few warm nodes under either scheduler's scores: some waited for a pull, and
    # the bench's pull stage held them back at least that long
    assert sum(r.pods_waiting_for_pulls for r in results) > 0
    for r in results:
        assert r.pods_waiting_for_pulls <= r.pulls * r.pods
        if r.pods_waiting_for_pulls >= 3:  # more than 1 % of the pods: the p99 is one of them
            assert r.running_p99_ms >= PULL_DELAY_S * 1000, r
    churn = [r for r in results if r.workload == "churn"]
    assert all(r.params["lifetime_s"] > 0 for r in churn)
    backlog = [r for r in results if r.workload == "backlog"]
    assert all(r.params["paused"] for r in backlog)  # the schedulers were stopped and released
    for r in results:  # per-stage latency, scraped from our worker's /metrics around each run
        if r.scheduler == "agent-standalone":
            assert list(r.stages) == ["queued", "decided", "bind_sent", "bound"], r.notes
            assert r.stages["bound"]["count"] == PODS
            assert all(v["count"] >= PODS and 0 <= v["p50_ms"] <= v["p99_ms"] for v in r.stages.values())
        else:
            assert r.stages == {}

    report = (out / "report.md").read_text()
    assert "## Goals" in report and "## Results" in report
    assert "## Where the time goes: per-stage latency" in report
    assert "create→running" in report
    for png in (f"latency-cdf-{NODES}.png", f"bound-over-time-{NODES}.png", f"stages-{NODES}.png"):
        assert (out / png).stat().st_size > 1000
        assert png in report
    assert any((out / "logs" / str(NODES)).glob("agent-standalone-worker.log"))
