"""A wheel built the way the image builds it (the product packages only: no ``scale``, no tests) installs into a
fresh virtual environment and runs: ``--version``, the roles' ``--help``, and a one-line refusal of the
development commands.

Quick: building the wheel fetches only the build backend (pip's isolated build, as in the image; cached after
the first run); the fresh venv has no pip of its own, this tree's pip installs the wheel into it without
dependencies, and a ``.pth`` file lends it the dependencies already installed here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# What the Dockerfile copies into its build stage.
IMAGE_SOURCES = (
    "pyproject.toml",
    "README.md",
    "LICENSE",
    "common",
    "worker",
    "coordinator",
    "agent_scheduler",
)


def _copy_sources(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in IMAGE_SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        else:
            shutil.copy2(src, dest / name)


def _run(*argv: str | Path, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.slow
def test_wheel_without_scale_installs_and_runs(tmp_path: Path) -> None:
    src, dist, venv = tmp_path / "src", tmp_path / "dist", tmp_path / "venv"
    src.mkdir()
    _copy_sources(src)
    built = _run(
        sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", dist, src, cwd=tmp_path,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = dist.glob("agent_scheduler-*.whl")
    names = subprocess.run(
        [sys.executable, "-m", "zipfile", "-l", str(wheel)], capture_output=True, text=True, check=True
    ).stdout
    assert "scale/" not in names and "tests/" not in names
    assert "agent_scheduler/cli.py" in names and "worker/command.py" in names
    assert ".dist-info/licenses/LICENSE" in names  # the license travels with the package

    made = _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    installed = _run(
        sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel,
        cwd=tmp_path,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr
    site = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path)
    (Path(site.stdout.strip()) / "_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KUBECONFIG")}
    cli = venv / "bin" / "agent-scheduler"
    version = _run(cli, "--version", cwd=tmp_path, env=env)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == "agent-scheduler 0.1.0"

    where = _run(
        python, "-c", "import agent_scheduler, worker; print(agent_scheduler.__file__)", cwd=tmp_path, env=env
    )
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr
    no_scale = _run(python, "-c", "import scale", cwd=tmp_path, env=env)
    assert no_scale.returncode != 0

    for role in ("worker", "coordinator", "status"):
        helped = _run(cli, role, "--help", cwd=tmp_path, env=env)
        assert helped.returncode == 0, helped.stderr
    for command in ("cluster", "bench", "demo"):
        refused = _run(cli, command, "--help", cwd=tmp_path, env=env)
        assert refused.returncode == 1
        assert refused.stderr.count("\n") == 1 and "development command" in refused.stderr


def test_dockerfile_builds_from_the_same_sources_without_dev_parts() -> None:
    lines = [line.split() for line in (ROOT / "Dockerfile").read_text().splitlines() if line.strip()]
    stages = [line for line in lines if line[0] == "FROM"]
    assert len(stages) == 2, "multi-stage: build, then a runtime image with only the virtual environment"
    copied = [
        word
        for line in lines
        if line[0] == "COPY" and not line[1].startswith("--from")
        for word in line[1:-1]
    ]
    assert sorted(copied) == sorted(IMAGE_SOURCES)
    text = (ROOT / "Dockerfile").read_text()
    assert "[dev]" not in text and "COPY scale" not in text and "COPY tests" not in text
    assert "USER 65532:65532" in text
