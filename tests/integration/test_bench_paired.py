"""``agent-scheduler bench paired`` end to end on a tiny cluster: a coordinated configuration run from another
checkout of the project against a standalone worker from this one and the cluster's kube-scheduler, a warm-up
trial and two rounds in alternating order.

Runs the real command as a subprocess and checks what it wrote: every trial in ``trials.json`` in run order,
all pods bound, CPU per process for the coordinated trials, the CPU window run on after the last bind
(``--until-idle``), the summary table, and (through a line the other checkout's worker package prints at
import) that the "before" processes really ran that checkout's code. No wall-clock assertion.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from scale.bench.results import RunResult
from scale.cluster.config import PROJECT_ROOT
from tests.integration.support import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NODES = 30
PODS = 100
GUARD_TIMEOUT = 900  # against a hang, not a speed requirement
UNTIL_IDLE = 20.0
MARKER = "worker package imported from the paired checkout"


def other_checkout(tmp_path: Path) -> Path:
    """A copy of this checkout's code whose worker package says so at import."""
    root = tmp_path / "baseline"
    for package in ("agent_scheduler", "common", "worker", "coordinator", "scale"):
        shutil.copytree(PROJECT_ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    init = root / "worker" / "__init__.py"
    init.write_text(init.read_text() + f"\nimport sys\n\nprint({MARKER!r}, file=sys.stderr)\n")
    return root


def test_paired_runs_alternate_on_one_cluster_and_use_each_checkout(tmp_path: Path) -> None:
    baseline = other_checkout(tmp_path)
    out = tmp_path / "paired"
    run_bench(
        "paired",
        out,
        f"--run=before=agent-coord-1@{baseline}",
        "--run=after=agent-standalone",
        "--run=kube=kube-scheduler-qps5000",
        f"--nodes={NODES}",
        f"--pods={PODS}",
        "--rounds=2",
        "--quiet-wait=0",
        f"--until-idle={UNTIL_IDLE}",
        timeout=GUARD_TIMEOUT,
    )
    trials = json.loads((out / "trials.json").read_text())
    assert [(t["label"], t["round"], t["position"]) for t in trials] == [
        ("warm-up", -1, 0),  # the first contender, not counted
        ("before", 0, 1),
        ("after", 0, 2),
        ("kube", 0, 3),
        ("kube", 1, 4),
        ("after", 1, 5),
        ("before", 1, 6),
    ]
    for t in trials:
        r = RunResult.from_json(t["result"])
        assert r.error == "" and r.nodes == NODES and r.pods == PODS and r.unbound == 0, r.notes
        assert r.cpu_s_per_1k_pods > 0 and 0 < r.p50_ms <= r.p99_ms
        # counted on after the last bind: at least one window of a second, at most one past the limit
        assert 1.0 <= r.params["cpu_tail_s"] <= UNTIL_IDLE + 2.0, r.params
        assert any(
            n.startswith("CPU counted until the scheduler and the API server were idle") for n in r.notes
        ), r.notes
        expected = {"after": {"worker"}, "kube": {"kube-scheduler"}}.get(
            t["label"], {"coordinator", "worker-1"}
        )
        assert set(r.cpu_s_per_1k_pods_by_process) == expected, r.cpu_s_per_1k_pods_by_process
    summary = (out / "summary.md").read_text()
    assert f"| before | agent-coord-1 | {baseline} | 2 |" in summary
    assert "| after | agent-standalone | this | 2 |" in summary
    assert "| kube | kube-scheduler-qps5000 | - | 2 |" in summary  # the cluster's own, started once
    assert "CPU counted until the scheduler and the API server were idle" in summary
    # the ratios against the first contender close the summary, one row per other contender
    assert "Against before: " in summary and "| contender | pods/s | p50 | p99 | CPU per pod |" in summary
    assert all(f"| {label} | " in summary.split("Against before: ")[1] for label in ("after", "kube"))
    # each trial's processes logged under logs/; only the other checkout's printed the marker
    logs = {p.name: p.read_text() for p in (out / "logs").glob("*.log")}
    before = [text for name, text in logs.items() if "-before-" in name]
    after = [text for name, text in logs.items() if "-after-" in name]
    assert len(before) == 4 and len(after) == 2, sorted(logs)  # coordinator and worker, twice; worker twice
    assert all(MARKER in text for name, text in logs.items() if "-after-" not in name and "worker" in name)
    assert not any(MARKER in text for text in after)
