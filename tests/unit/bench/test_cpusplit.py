"""The CPU split of a profile: entry points' cumulative time, the pod feed's handler split by its callees, the
rest; the table's shares and a scaled estimate leave out the work before a trial's window (start-up, first
lists, catch-up). Profiles are pstats' raw records, built here by hand, or cProfile's of a small function."""

from __future__ import annotations

import cProfile
import pstats
from pathlib import Path

import pytest

from scale.bench import cpusplit
from scale.bench.cpusplit import CATCH_UP, RELISTS, REST, STARTUP, TOTAL, RawStats

FEED = ("/x/worker/feeds.py", 273, "event")
NODE_FEED = ("/x/worker/feeds.py", 90, "event")
PARSE = ("/x/common/records.py", 1129, "pod_update")
APPLY = ("/x/worker/feeds.py", 317, "_apply")
WATCH = ("/x/common/kube.py", 591, "watch")
LOOP = ("/x/worker/scheduler.py", 311, "scheduling_loop")
PARSER = ("/x/agent_scheduler/cli.py", 110, "_build_parser")
ELSEWHERE = ("/x/worker/engine.py", 1, "pod_update")  # same name as a parse, another file: not a parse
CATCH = ("/x/worker/shard.py", 297, "one")
RELIST = ("/x/worker/feeds.py", 240, "replace")


def _stats() -> RawStats:
    return {
        PARSER: (1, 1, 0.0, 1.0, {}),
        WATCH: (10, 10, 0.1, 0.5, {}),
        FEED: (10, 10, 0.1, 2.0, {}),
        NODE_FEED: (2, 2, 0.1, 0.25, {}),
        # parse is called from the feed (0.6 s) and from elsewhere (0.4 s): only the feed's share counts
        PARSE: (20, 20, 0.5, 1.0, {FEED: (10, 10, 0.3, 0.6), LOOP: (10, 10, 0.2, 0.4)}),
        APPLY: (10, 10, 0.2, 0.8, {FEED: (10, 10, 0.2, 0.8)}),
        LOOP: (3, 3, 0.5, 1.5, {}),
        ELSEWHERE: (1, 1, 0.3, 0.3, {FEED: (1, 1, 0.3, 0.3)}),
        CATCH: (4, 4, 0.1, 0.4, {}),
        RELIST: (1, 1, 0.1, 0.6, {}),
    }


def test_split_names_each_activity_and_leaves_the_rest() -> None:
    out = cpusplit.split(_stats(), total=8.0)
    assert out[STARTUP] == pytest.approx(1.0)
    assert out[CATCH_UP] == pytest.approx(0.4)
    assert out[RELISTS] == pytest.approx(0.6)
    assert out["watches: HTTP stream, lines, JSON decode"] == pytest.approx(0.5)
    assert out["pod feed: parse a pod"] == pytest.approx(0.6)
    assert out["pod feed: apply to the cache"] == pytest.approx(0.8)
    # both handlers named ``event`` in feeds.py (2.0 + 0.25) less what the parse and apply took of them
    assert out["feeds: rest of the event handlers"] == pytest.approx(2.25 - 0.6 - 0.8)
    assert out["scheduling loop"] == pytest.approx(1.5)
    assert out["binding"] == 0.0
    named = 1.0 + 0.4 + 0.6 + 0.5 + 0.6 + 0.8 + 0.85 + 1.5
    assert out[REST] == pytest.approx(8.0 - named)
    assert out[TOTAL] == 8.0


def test_rest_is_never_negative() -> None:
    assert cpusplit.split(_stats(), total=1.0)[REST] == 0.0


def test_table_shares_leave_the_work_before_the_window_out() -> None:
    columns = {"a": cpusplit.split(_stats(), total=8.0)}
    lines = cpusplit.table(columns)
    assert lines[0] == "| activity | a CPU-s | a % |"
    row = {line.split(" | ")[0].lstrip("| "): line for line in lines[2:]}
    # 1.5 of the 6.0 left without start-up (1.0), relists (0.6) and catch-up (0.4)
    assert row["scheduling loop"] == "| scheduling loop | 1.500 | 25.0 |"
    assert row[STARTUP].endswith("| 1.000 |  |")
    assert row[CATCH_UP].endswith("| 0.400 |  |")
    assert row[TOTAL] == "| total | 8.000 |  |"


def _busy() -> int:
    return sum(i * i for i in range(20_000))


def test_load_sums_the_processes_of_a_label(tmp_path: Path) -> None:
    paths = []
    for i in range(2):
        profile = cProfile.Profile()
        profile.runcall(_busy)
        path = tmp_path / f"p{i}.pstats"
        profile.dump_stats(path)
        paths.append(str(path))
    one = cpusplit.load(paths[:1])
    both = cpusplit.load(paths)
    assert one[TOTAL] == pytest.approx(pstats.Stats(paths[0]).total_tt)  # type: ignore[attr-defined]
    assert both[TOTAL] == pytest.approx(one[TOTAL] + cpusplit.load(paths[1:])[TOTAL])
    assert both[REST] == pytest.approx(both[TOTAL])  # nothing of the scheduler's in it


def test_main_refuses_a_column_without_files(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cpusplit.main(["sa"])
    assert "expected LABEL=FILE" in capsys.readouterr().err


def test_scaled_drops_the_work_before_the_window_and_keeps_the_proportions() -> None:
    out = cpusplit.scaled(cpusplit.split(_stats(), total=8.0), 1.2)  # 6.0 s in the window -> 1.2
    assert out[STARTUP] == out[RELISTS] == out[CATCH_UP] == 0.0
    assert out[TOTAL] == 1.2
    assert out["scheduling loop"] == pytest.approx(1.5 * 0.2)
    assert sum(v for k, v in out.items() if k != TOTAL) == pytest.approx(1.2)


def test_a_file_with_a_cpu_figure_is_scaled(tmp_path: Path) -> None:
    profile = cProfile.Profile()
    profile.runcall(_busy)
    path = tmp_path / "p.pstats"
    profile.dump_stats(path)
    out = cpusplit.load([f"{path}:0.5"])
    assert out[TOTAL] == 0.5
    assert out[REST] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="negative"):
        cpusplit.load([f"{path}:-1"])


def test_main_says_which_file_it_could_not_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cpusplit.main([f"sa={tmp_path / 'missing.pstats'}"])
    assert "sa:" in capsys.readouterr().err
