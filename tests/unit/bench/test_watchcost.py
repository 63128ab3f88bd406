"""The parts of ``scale.bench.watchcost`` that need no cluster: frame counting, the per-node share, the summary."""

from __future__ import annotations

import pytest

from scale.bench.watchcost import FrameCounter, ReaderResult, every_nth, main, summary


def _frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def test_frames_are_counted_across_the_chunks_they_arrive_in() -> None:
    stream = _frame(b"a" * 300) + _frame(b"") + _frame(b"b" * 5)
    counter = FrameCounter()
    start = 0
    for end in (1, 3, 150, 304, 306, 309):  # inside a length, inside a payload, on a frame's end
        counter.feed(stream[start:end])
        start = end
    assert counter.frames == 2  # the last frame is not complete yet
    counter.feed(stream[start:])
    assert counter.frames == 3


def test_per_node_reads_every_nth_sorted_node() -> None:
    assert every_nth(["n3", "n1", "n2", "n4"], 2) == ["n1", "n3"]
    assert every_nth(["n1", "n2"], 1) == ["n1", "n2"]
    with pytest.raises(ValueError, match="at least 1"):
        every_nth(["n1"], 0)


def _result(mode: str, cpu: float, *, ended: int = 0, failed: list[str] | None = None) -> ReaderResult:
    return ReaderResult(
        mode=mode,
        trial=1,
        cpu_s_per_1k_pods=cpu,
        events_per_pod=5.0,
        bytes_per_pod=12_000.0,
        watches=500 if mode == "per-node" else 1,
        ended=ended,
        failed=failed or [],
    )


def test_the_summary_averages_valid_trials_and_counts_the_others() -> None:
    results = [
        _result("cluster", 0.3),
        _result("cluster", 0.5),
        _result("cluster", 9.0, ended=1),  # its stream ended early: what it read is not the whole burst
        _result("per-node", 0.2),
        _result("cluster-decoded", 0.4, failed=["watch answered 403"]),
    ]
    text = summary(results, [1.0, 1.2], share=2)
    assert (
        "| cluster | 2 (+1 invalid) | 0.400 (0.300-0.500) | 80 (60-100) | 5.00 (5.00-5.00) | 12.0 (12.0-12.0) | 1 |"
        in text
    )
    assert "| per-node (1 of 2 shards) | 1 | 0.200 (0.200-0.200) | 40 (40-40) |" in text
    assert "| cluster-decoded | 0 (+1 invalid) | - | - |" in text
    assert "cluster-protobuf" not in text  # not run
    assert "The scheduler itself: 1.100 (1.000-1.200) CPU-s/1k pods." in text


def test_a_bad_share_is_refused_before_any_cluster_starts(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--share", "0"])
    assert exit_info.value.code == 2
    assert "must be positive" in capsys.readouterr().err
