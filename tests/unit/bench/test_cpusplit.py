"""The CPU split of a profile: entry points' cumulative time, the feeds' handler split by its callees and a
list's apply by its caller, the rest; the table's shares and a scaled estimate leave out the start-up; every
entry point names a function that exists. Profiles are pstats' raw records built here by hand, or cProfile's
of small modules laid out under the paths the entry points name."""

from __future__ import annotations

import cProfile
import importlib.util
import pstats
import re
from pathlib import Path

import pytest

from scale.bench import cpusplit
from scale.bench.cpusplit import APPLY, FEED_REST, OVERLAP, PARSE, REST, STARTUP, TOTAL, RawStats
from scale.cluster.config import PROJECT_ROOT

FEED = ("/x/worker/feeds.py", 273, "event")
NODE_FEED = ("/x/worker/feeds.py", 90, "event")
PARSE_FN = ("/x/common/records.py", 1129, "pod_update")
APPLY_FN = ("/x/worker/feeds.py", 317, "_apply")
WATCH = ("/x/common/kube.py", 591, "watch")
LOOP = ("/x/worker/scheduler.py", 311, "scheduling_loop")
PARSER = ("/x/agent_scheduler/cli.py", 110, "_build_parser")
ELSEWHERE = ("/x/worker/engine.py", 1, "pod_update")  # same name as a parse, another file: not a parse
CATCH = ("/x/worker/shard.py", 297, "one")
REFLECTOR = ("/x/common/watching.py", 94, "run")
REPLACE = ("/x/worker/feeds.py", 240, "replace")
OTHER_REPLACE = ("/x/coordinator/dispatch/dispatcher.py", 103, "replace")
LISTS = "lists: applied by every feed (replace)"
CATCH_UP = "worker: catch-up of granted nodes (per-node reads)"


def _stats() -> RawStats:
    return {
        PARSER: (1, 1, 0.0, 1.0, {}),
        WATCH: (10, 10, 0.1, 0.5, {}),
        FEED: (10, 10, 0.1, 2.0, {}),
        NODE_FEED: (2, 2, 0.1, 0.25, {}),
        # parse is called from the feed (0.6 s) and from elsewhere (0.4 s): only the feed's share counts
        PARSE_FN: (20, 20, 0.5, 1.0, {FEED: (10, 10, 0.3, 0.6), LOOP: (10, 10, 0.2, 0.4)}),
        APPLY_FN: (10, 10, 0.2, 0.8, {FEED: (10, 10, 0.2, 0.8)}),
        LOOP: (3, 3, 0.5, 1.5, {}),
        ELSEWHERE: (1, 1, 0.3, 0.3, {FEED: (1, 1, 0.3, 0.3)}),
        CATCH: (4, 4, 0.1, 0.4, {}),
        # a list applied by the reflector counts, wherever the feed lives; a ``replace`` called by anything
        # else does not
        REPLACE: (2, 2, 0.1, 0.6, {REFLECTOR: (1, 1, 0.05, 0.5), LOOP: (1, 1, 0.05, 0.1)}),
        OTHER_REPLACE: (1, 1, 0.1, 0.2, {REFLECTOR: (1, 1, 0.1, 0.2)}),
    }


def test_split_names_each_activity_and_leaves_the_rest() -> None:
    out = cpusplit.split(_stats(), total=8.0)
    assert out[STARTUP] == pytest.approx(1.0)
    assert out[CATCH_UP] == pytest.approx(0.4)
    assert out[LISTS] == pytest.approx(0.5 + 0.2)
    assert out["watches: HTTP stream, lines, JSON decode"] == pytest.approx(0.5)
    assert out[PARSE] == pytest.approx(0.6)
    assert out[APPLY] == pytest.approx(0.8)
    # both handlers named ``event`` in feeds.py (2.0 + 0.25) less what the parse and apply took of them
    assert out[FEED_REST] == pytest.approx(2.25 - 0.6 - 0.8)
    assert out["scheduling loop"] == pytest.approx(1.5)
    assert out["binding"] == 0.0
    named = 1.0 + 0.4 + 0.7 + 0.5 + 0.6 + 0.8 + 0.85 + 1.5
    assert out[REST] == pytest.approx(8.0 - named)
    assert out[TOTAL] == 8.0
    assert out[OVERLAP] == 0.0


def test_activities_beyond_the_total_are_reported_as_overlap() -> None:
    out = cpusplit.split(_stats(), total=5.0)
    assert out[REST] == 0.0
    assert out[OVERLAP] == pytest.approx(6.35 - 5.0)
    lines = cpusplit.table({"a": out})
    assert "a's activities add up to 1.350 s more than its total" in lines[-1]


def test_table_shares_leave_the_startup_out() -> None:
    columns = {"a": cpusplit.split(_stats(), total=7.0)}
    lines = cpusplit.table(columns)
    assert lines[0] == "| activity | a CPU-s | a % |"
    assert not any("Warning" in line for line in lines)
    row = {line.split(" | ")[0].lstrip("| "): line for line in lines[2:]}
    assert row["scheduling loop"] == "| scheduling loop | 1.500 | 25.0 |"  # 1.5 of the 6.0 after start-up
    assert row[STARTUP].endswith("| 1.000 |  |")
    assert row[CATCH_UP].endswith("| 0.400 | 6.7 |")
    assert row[TOTAL] == "| total | 7.000 |  |"


def test_scaled_drops_the_startup_and_keeps_the_proportions() -> None:
    out = cpusplit.scaled(cpusplit.split(_stats(), total=7.0), 1.2)  # 6.0 s after start-up -> 1.2
    assert out[STARTUP] == 0.0
    assert out[TOTAL] == 1.2
    assert out["scheduling loop"] == pytest.approx(1.5 * 0.2)
    assert sum(v for k, v in out.items() if k not in (TOTAL, OVERLAP)) == pytest.approx(1.2)


def _module(root: Path, relative: str, source: str) -> object:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"probe_{relative.replace('/', '_')[:-3]}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _profiled(tmp_path: Path, name: str, function: object) -> str:
    profile = cProfile.Profile()
    profile.runcall(function)  # type: ignore[arg-type]
    path = tmp_path / name
    profile.dump_stats(path)
    return str(path)


def test_real_profiles_split_by_file_function_and_caller(tmp_path: Path) -> None:
    # modules laid out as the scheduler's are: a feed handler calling a parse and an apply, a parse also
    # called from outside the feed
    records = _module(tmp_path, "common/records.py", "def pod_update(n):\n    return sum(range(n))\n")
    feeds = _module(
        tmp_path,
        "worker/feeds.py",
        "def _apply(n):\n    return sum(range(n))\n"
        "def event(records):\n    records.pod_update(20000)\n    _apply(20000)\n",
    )

    def run() -> None:
        for _ in range(20):
            feeds.event(records)  # type: ignore[attr-defined]
        records.pod_update(200000)  # type: ignore[attr-defined]

    path = _profiled(tmp_path, "p.pstats", run)
    out = cpusplit.load([path])
    stats = pstats.Stats(path).stats  # type: ignore[attr-defined]
    parse_total = next(v[3] for k, v in stats.items() if k[2] == "pod_update")
    assert 0 < out[PARSE] < parse_total  # the call from outside the feed is not the feed's parse
    assert out[APPLY] > 0
    assert out[TOTAL] == pytest.approx(pstats.Stats(path).total_tt)  # type: ignore[attr-defined]

    both = cpusplit.load([path, path])
    assert both[PARSE] == pytest.approx(2 * out[PARSE])


def test_a_file_with_a_cpu_figure_is_scaled(tmp_path: Path) -> None:
    path = _profiled(tmp_path, "p.pstats", lambda: sum(i * i for i in range(20_000)))
    out = cpusplit.load([f"{path}:0.5"])
    assert out[TOTAL] == 0.5
    assert out[REST] == pytest.approx(0.5)
    for bad in ("-1", "nan", "inf"):
        with pytest.raises(ValueError, match="finite"):
            cpusplit.load([f"{path}:{bad}"])
    with pytest.raises(ValueError, match="every file of a label"):
        cpusplit.load([f"{path}:0.5", path])  # estimated CPU-s and profiled seconds do not add up


def test_a_colon_in_a_path_is_part_of_the_path(tmp_path: Path) -> None:
    path = _profiled(tmp_path, "a:b.pstats", lambda: None)
    assert cpusplit.load([path])[TOTAL] == pytest.approx(pstats.Stats(path).total_tt)  # type: ignore[attr-defined]


def test_main_refuses_what_it_cannot_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cpusplit.main(["sa"])
    assert "expected LABEL=FILE" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cpusplit.main([f"sa={tmp_path / 'missing.pstats'}"])
    assert "sa:" in capsys.readouterr().err


def test_every_entry_point_names_a_function_of_ours_that_exists() -> None:
    # A renamed function would move its time to "rest" without a word.
    for activity in cpusplit.ACTIVITIES:
        for entry in (*activity.entries, *([activity.within] if activity.within else [])):
            if entry.file.startswith("aiohttp/") or not entry.file:
                continue  # a library's, or any file's (``replace`` under the reflector)
            source = (PROJECT_ROOT / entry.file).read_text()
            pattern = rf"^\s*(async\s+)?def {re.escape(entry.name)}\("
            assert re.search(pattern, source, re.MULTILINE), f"{entry.file}: no function {entry.name}"
