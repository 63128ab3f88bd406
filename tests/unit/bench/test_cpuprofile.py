"""``scale.bench.cpuprofile``: a whole run profiled, or only between SIGUSR1 and SIGUSR2 (``--window``), as
the bench profiles its measured windows; the command ``python_module`` builds for each."""

from __future__ import annotations

import os
import pstats
import subprocess
import sys
from pathlib import Path

from scale.bench.schedulers import PROFILER, python_module
from scale.cluster.config import PROJECT_ROOT

PROBE = """
import os, signal

def before(): return sum(range(1000))
def inside(): return sum(range(1000))
def after(): return sum(range(1000))

before()
os.kill(os.getpid(), signal.SIGUSR1)
inside()
os.kill(os.getpid(), signal.SIGUSR2)
after()
os.kill(os.getpid(), signal.SIGUSR1)
inside()
os.kill(os.getpid(), signal.SIGUSR2)
"""


def _profile(tmp_path: Path, *flags: str) -> dict[str, int]:
    (tmp_path / "windowprobe.py").write_text(PROBE)
    out = tmp_path / "probe.pstats"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(PROJECT_ROOT)])}
    # run by its path, as the bench runs it, from a folder where its neighbours are not importable
    command = [sys.executable, str(PROFILER), *flags, str(out), "windowprobe"]
    subprocess.run(command, env=env, check=True, timeout=60, cwd=tmp_path)
    stats = pstats.Stats(str(out)).stats  # type: ignore[attr-defined]
    return {func[2]: calls[1] for func, calls in stats.items() if func[0].endswith("windowprobe.py")}


def test_window_profiles_only_between_the_signals(tmp_path: Path) -> None:
    calls = _profile(tmp_path, "--window")
    assert calls.get("inside") == 2  # both windows, summed
    assert "before" not in calls
    assert "after" not in calls


def test_without_window_the_whole_run_is_profiled(tmp_path: Path) -> None:
    # (a probe that sends no signals: without --window they would end the process)
    (tmp_path / "wholeprobe.py").write_text("def f(): return 1\nf()\nf()\n")
    out = tmp_path / "whole.pstats"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(PROJECT_ROOT)])}
    command = [sys.executable, "-m", "scale.bench.cpuprofile", str(out), "wholeprobe"]  # as a module too
    subprocess.run(command, env=env, check=True, timeout=60, cwd=tmp_path)
    stats = pstats.Stats(str(out)).stats  # type: ignore[attr-defined]
    assert [c[1] for f, c in stats.items() if f[0].endswith("wholeprobe.py") and f[2] == "f"] == [2]


def test_usage_without_a_module() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "scale.bench.cpuprofile", "--window", "out.pstats"],
        cwd=PROJECT_ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "usage: python -m scale.bench.cpuprofile [--window]" in done.stderr


def test_python_module_commands() -> None:
    out = Path("/tmp/x.pstats")
    assert python_module("m", "a") == [sys.executable, "-m", "m", "a"]
    assert python_module("m", "a", profile_to=out) == [sys.executable, str(PROFILER), str(out), "m", "a"]
    assert python_module("m", "a", profile_to=out, window=True) == [
        sys.executable,
        str(PROFILER),
        "--window",
        str(out),
        "m",
        "a",
    ]
    assert PROFILER.is_file()
    assert python_module("m", window=True) == [sys.executable, "-m", "m"]  # nothing to profile into


def test_the_profiler_run_by_path_does_not_lend_its_folder_to_the_program(tmp_path: Path) -> None:
    # ``results`` is a neighbour of cpuprofile.py (scale/bench/results.py): the program must get its own
    (tmp_path / "results.py").write_text("WHO = 'program'\n")
    (tmp_path / "shadowprobe.py").write_text(
        "import results, sys\nsys.exit(0 if results.WHO == 'program' else 3)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    command = [sys.executable, str(PROFILER), str(tmp_path / "s.pstats"), "shadowprobe"]
    subprocess.run(command, env=env, check=True, timeout=60, cwd=tmp_path)
