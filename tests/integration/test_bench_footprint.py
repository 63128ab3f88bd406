"""``agent-scheduler bench footprint`` end to end on a small cluster: agent standalone and kube-scheduler.

Runs the real command as a subprocess (its own clusters on free ports, stopped at the end) and checks the results
directory: a reading after every step for both schedulers with positive RSS, events and CPU per event, the same
cluster's kube-scheduler read alongside, and the report with its goal line. No wall-clock assertion.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scale.bench.footprint_report import KUBE_SCHEDULER, load
from tests.integration.support import run_bench

pytestmark = [pytest.mark.integration]

SCHEDULERS = ("agent-standalone", "kube-scheduler-qps5000")
NODES = 100
PODS = 1000
STEPS = 2
GUARD_TIMEOUT = 600  # against a hang, not a speed requirement


def test_footprint_writes_results_and_report(tmp_path: Path) -> None:
    out = tmp_path / "footprint"
    run_bench(
        "footprint",
        out,
        f"--nodes={NODES}",
        f"--pods={PODS}",
        f"--steps={STEPS}",
        f"--schedulers={','.join(SCHEDULERS)}",
        timeout=GUARD_TIMEOUT,
    )

    steps, meta = load(out / "results.json")
    assert meta["command"].startswith("agent-scheduler bench footprint") and meta["commit"]
    assert sorted((s.scheduler, s.pods) for s in steps) == sorted(
        (name, pods) for name in SCHEDULERS for pods in (0, PODS // 2, PODS)
    )
    for s in steps:
        assert s.error == "", s.error
        assert s.nodes == NODES
        assert s.rss_mib and all(v > 10 for v in s.rss_mib.values())
        assert s.kube_scheduler_rss_mib > 10 and s.apiserver_rss_mib > 10
        assert not s.notes, s.notes  # every step's pods ran and the scheduler settled
        if s.pods:
            # Each bound pod is at least ADDED, and kwok's status update makes it Running.
            assert s.events >= 2 * (PODS // STEPS)
            assert s.cpu_ms_per_event > 0 and s.duration_s > 0
    assert {name for s in steps for name in s.rss_mib} == {"worker", KUBE_SCHEDULER}

    report = (out / "report.md").read_text()
    assert "## Goal" in report and "**not measured**" in report
    assert "| agent-standalone | 100 | 1,000 | worker " in report
    assert "| kube-scheduler-qps5000 | 100 | 1,000 | kube-scheduler " in report
