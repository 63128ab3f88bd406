"""``agent-scheduler cluster``: flags reach the options, and ``down``/``status`` on nothing say so."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from agent_scheduler import cli
from scale.cluster import command


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(argv)


def test_up_flags() -> None:
    args = _parse(
        "up", "--nodes", "5000", "--with-kube-scheduler", "--dir", "/tmp/x", "--force",
        "--max-requests-inflight", "3000", "--max-mutating-requests-inflight", "1000",
        "--scheduler-qps", "5000", "--scheduler-burst", "6000",
    )  # fmt: skip
    assert args.action == "up" and args.nodes == 5000 and args.with_kube_scheduler and args.force
    assert args.dir == Path("/tmp/x")
    assert (args.max_requests_inflight, args.max_mutating_requests_inflight) == (3000, 1000)
    assert (args.scheduler_qps, args.scheduler_burst) == (5000.0, 6000)


def test_down_on_nothing_is_fine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["cluster", "down", "--dir", str(tmp_path / "none")]) == 0
    assert "nothing to stop" in capsys.readouterr().out


def test_status_on_nothing_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["cluster", "status", "--dir", str(tmp_path / "none")]) == 1
    assert "no cluster in" in capsys.readouterr().out


def test_up_explains_missing_tools(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["cluster", "up", "--dir", str(tmp_path / "c"), "--bin-dir", str(tmp_path)])
    assert code == 1
    assert "make tools" in capsys.readouterr().err
