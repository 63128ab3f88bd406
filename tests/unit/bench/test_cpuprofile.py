"""``scale.bench.cpuprofile``: a whole run profiled, or only between SIGUSR1 and SIGUSR2 (``--window``), as
the bench profiles its measured windows; the command ``python_module`` builds for each."""

from __future__ import annotations

import os
import pstats
import subprocess
import sys
from pathlib import Path

from scale.bench.schedulers import python_module
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
    command = [sys.executable, "-m", "scale.bench.cpuprofile", *flags, str(out), "windowprobe"]
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
    command = [sys.executable, "-m", "scale.bench.cpuprofile", str(out), "wholeprobe"]
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
    assert python_module("m", "a", profile_to=out) == [
        sys.executable,
        "-m",
        "scale.bench.cpuprofile",
        str(out),
        "m",
        "a",
    ]
    assert python_module("m", "a", profile_to=out, window=True) == [
        sys.executable,
        "-m",
        "scale.bench.cpuprofile",
        "--window",
        str(out),
        "m",
        "a",
    ]
    assert python_module("m", window=True) == [sys.executable, "-m", "m"]  # nothing to profile into
