"""``agent-scheduler bench share`` end to end on a tiny run: the four shard policies side by side, each with its own
nodes, coordinator + worker and batch stand-in (issue 15).

Runs the real command as a subprocess (its own cluster on free ports, stopped at the end) and checks the
invariants the run audits and the results directory: no pod lost or bound twice, every agent pod bound on a node
its agent shard published, every batch pod on a node the batch shard published and its release allowed (the run
exits non-zero on any violation), and the report with its plots. Numbers are what the bench reports, not what the
test checks; no wall-clock assertion.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scale.bench.share import ShareSpec, share_plan
from scale.bench.share_run import KNOWN, STATIC, TUNED
from tests.integration.support import ROOT, bench_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]

GUARD_TIMEOUT = 600  # against a hang, not a speed requirement
COMPRESSION = 30.0
WAVE_RATE = 1.0
BACKLOG = 60


def test_tiny_share_run_keeps_the_invariants_and_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "share"
    cmd = [
        sys.executable,
        "-m",
        "agent_scheduler.cli",
        "bench",
        "share",
        "--nodes=4",
        "--agent-nodes=2",
        "--node-cpu=4",
        "--tuned-free-cpu=4",  # one node's worth: the tuned agent shard must leave the batch side nodes
        f"--compression={COMPRESSION:g}",
        f"--wave-rate={WAVE_RATE:g}",
        f"--backlog={BACKLOG}",
        # the scheduled configuration too (its ConfigMap edits during the run, switching node counts), free-
        # capacity's reclaim, and the residences the coordinator keeps per node (minResidenceSeconds, and per
        # scheduler for the batch shard)
        "--configs=static,volcano-example,tuned,scheduled",
        "--tuned-reclaim",
        "--scheduled-nodes-high=2",
        "--scheduled-nodes-low=1",
        "--tuned-residence=30",
        "--tuned-batch-residence=60",
        f"--out={out}",
    ]
    proc = subprocess.run(
        cmd, cwd=ROOT, env=bench_env(out), capture_output=True, text=True, timeout=GUARD_TIMEOUT, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    result = json.loads((out / "results.json").read_text())
    planned = len(
        share_plan(
            ShareSpec(compression=COMPRESSION, wave_rate=WAVE_RATE, batch_backlog=BACKLOG),
            namespace="x",
            scheduler_name="x",
        ).agents
    )
    by_name = {c["config"]: c for c in result["configs"]}
    assert sorted(by_name) == sorted(KNOWN)
    for name, conf in by_name.items():
        assert conf["violations"] == [], name
        assert conf["agent_pods"] == planned, name  # every created agent pod seen: none lost
        assert conf["batch_started"] > 0, name
        assert 0 < conf["cpu_alloc_mean"] <= 1 and 0 < conf["mem_alloc_mean"] <= 1, name
        assert conf["samples"], name
        print(name, "versions with a node in both shards' nodesInUse:", conf["dual_in_use_versions"])
    for name in (STATIC, TUNED):  # both always give the agent shard nodes: every agent pod is placed
        assert by_name[name]["agent_unbound"] == 0, name
    assert by_name[STATIC]["moves"] == 0  # the static split never moves a node
    report = (out / "report.md").read_text()
    assert "## Goal" in report and "bench share" in report
    for plot in ("allocation.png", "latency_cdf.png", "moves.png"):
        assert (out / plot).stat().st_size > 0
