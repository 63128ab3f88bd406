"""One benchmark at a time on a machine (``scale.bench.lock``), and the refusal ``bench cluster`` gives."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scale.bench import command
from scale.bench.lock import BUSY, LOCK_ENV, BenchRunning, exclusive


def test_a_second_run_is_refused_while_the_first_holds_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "bench.lock"
    with exclusive("bench cluster", path):
        assert f"pid {os.getpid()}: bench cluster" in path.read_text()
        refused = pytest.raises(
            BenchRunning, match=r"another benchmark is running on this machine \(pid \d+: bench"
        )
        with refused, exclusive("bench footprint", path):
            pass
    with exclusive("bench footprint", path):  # released at the end of the first run
        pass


def test_the_lock_goes_with_the_process_that_held_it(tmp_path: Path) -> None:
    path = tmp_path / "bench.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom pathlib import Path\nfrom scale.bench.lock import exclusive\n"
            f"with exclusive('held', Path({str(path)!r})):\n"
            "    print('held', flush=True)\n    time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(BenchRunning, match=rf"pid {holder.pid}: held"), exclusive("second", path):
            pass
    finally:
        holder.kill()  # no clean exit: the lock must still go
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()
    with exclusive("second", path):
        pass


def test_bench_cluster_refuses_to_start_while_another_benchmark_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bench.lock"
    monkeypatch.setenv(LOCK_ENV, str(path))
    started: list[str] = []

    def run(args: argparse.Namespace) -> int:
        started.append(args.bench)
        return 0

    monkeypatch.setattr(command, "_run", run)
    with exclusive("bench footprint", path):
        assert command.run(argparse.Namespace(bench="cluster")) == BUSY
        assert command.run(argparse.Namespace(bench="engine")) == 0  # no cluster: not locked
        # rebuilding a footprint report starts no cluster either
        assert command.run(argparse.Namespace(bench="footprint", report=tmp_path)) == 0
    assert "agent-scheduler bench: error: another benchmark is running" in capsys.readouterr().err
    assert started == ["engine", "footprint"]
    assert command.run(argparse.Namespace(bench="cluster")) == 0
    assert started == ["engine", "footprint", "cluster"]
