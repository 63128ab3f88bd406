"""``bench engine``'s pool mix: pods of one template, decided as one batch after the first."""

from __future__ import annotations

from scale.bench.engine import run_engine_bench


def test_bench_engine_pool_mix_is_batched() -> None:
    batched = run_engine_bench(40, 60, mix="pool")
    alone = run_engine_bench(40, 60, mix="pool", batching=False)
    assert batched.placed == alone.placed == 60
    assert batched.batched == 59  # every pod from the second on reused the run the first made
    assert alone.batched == 0
    assert batched.nodes_evaluated_mean == alone.nodes_evaluated_mean
