"""``bench cluster --workloads spread`` end to end on a small cluster through the sharded path (a coordinator and
two workers): a backlog of sandbox pools with inter-pod rules, every pod bound, and the bench's own audit of the
placements (read back from the API server) finds no pool over its zone skew and no anti-affinity pool sharing a
node. No wall-clock assertion: the latency is what the bench reports, not what the test checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from scale.bench.results import load
from scale.workload import POOL_SIZE
from tests.integration.support import run_bench

pytestmark = [pytest.mark.integration]

NODES = 50
PODS = 96  # 12 pools of 8: four of each kind
GUARD_TIMEOUT = 600  # against a hang, not a speed requirement


def test_spread_workload_keeps_every_pools_hard_rules_across_shards(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    run_bench(
        "cluster",
        out,
        f"--nodes={NODES}",
        "--schedulers=agent-coord-2",
        "--workloads=spread",
        f"--burst={PODS}",
        "--no-volcano",
        "--quiet-wait=0",
        "--pull-delay=0",
        timeout=GUARD_TIMEOUT,
    )
    (r,) = load(out / "results.json")
    assert r.error == "", r.error
    assert r.workload == "spread" and r.pods == PODS
    assert r.unbound == 0, r.notes
    pools = PODS // POOL_SIZE
    assert r.params["spread_pools"] == r.params["anti_affinity_pools"] == pools // 3
    assert r.params["skew_violations"] == 0 and r.params["anti_affinity_violations"] == 0, r.params
    assert "## Spread: sandbox pools with inter-pod rules" in (out / "report.md").read_text()
