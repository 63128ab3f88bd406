"""``bench engine``'s preempt mix: every preemptor needs a victim, and every one ends placed."""

from __future__ import annotations

from scale.bench.engine import run_engine_bench


def test_bench_engine_runs_the_preempt_mix() -> None:
    r = run_engine_bench(40, 30, mix="preempt")
    assert r.mix == "preempt" and r.placed == 30
    assert r.full_scans == 30  # every pod failed the plain pass first: each needed preemption
