"""``bench cluster --workloads preempt`` end to end on a small cluster, the standalone worker only: every node
filled with lowest-priority placeholders, then 100 high-priority agent pods that each need a victim. All of
them bind, placeholders were preempted, and no node ends up asking for more than it has. No wall-clock
assertion: the latency is what the bench reports, not what the test checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from scale.bench.results import load
from tests.integration.support import run_bench

pytestmark = [pytest.mark.integration]

NODES = 50
PODS = 100
GUARD_TIMEOUT = 600  # against a hang, not a speed requirement


def test_preempt_workload_binds_every_preemptor(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    run_bench(
        "cluster",
        out,
        f"--nodes={NODES}",
        "--schedulers=agent-standalone",
        "--workloads=preempt",
        f"--burst={PODS}",
        "--no-volcano",
        "--quiet-wait=0",
        timeout=GUARD_TIMEOUT,
    )
    (r,) = load(out / "results.json")
    assert r.error == "", r.error
    assert r.workload == "preempt" and r.pods == PODS
    assert r.unbound == 0, r.notes
    assert r.params["placeholders"] > PODS
    assert r.params["victims"] >= PODS  # each preemptor is the size of one placeholder: one victim at least
    assert r.params["overcommitted_nodes"] == 0
    assert 0 < r.p50_ms <= r.p99_ms
    assert "## Preemption" in (out / "report.md").read_text()
