"""Can Volcano's agent-scheduler be built here? A bounded attempt whose answer goes into the report.

Volcano (volcano.sh/volcano >= v1.14) ships ``cmd/agent-scheduler``. Its go.mod pins Kubernetes staging modules
with ``replace`` directives, which Go ignores in a dependency, so building it from the module proxy takes a
wrapper module that requires volcano and repeats every one of its replace directives. Steps, each with a
timeout, stopping at the first failure:

1. ``go list -m -versions volcano.sh/volcano``: which versions the proxy offers; pick the newest >= v1.14.
2. ``go mod download -json volcano.sh/volcano@V``: its go.mod, whose ``replace`` lines are copied.
3. ``go build`` of ``volcano.sh/volcano/cmd/agent-scheduler`` in the wrapper module.

The result says how far it got and why it stopped. A built binary is not yet run by ``bench cluster``: it
also needs Volcano's CRDs and scheduler configuration, which is follow-up work stated in the report.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

MODULE = "volcano.sh/volcano"
PACKAGE = "volcano.sh/volcano/cmd/agent-scheduler"
MIN_VERSION = (1, 14, 0)
LIST_TIMEOUT = 90.0
BUILD_TIMEOUT = 900.0  # the brief's bound: no more than about 15 minutes on Volcano


@dataclass(frozen=True, slots=True)
class VolcanoProbe:
    built: bool
    version: str
    binary: str
    reason: str  # why it was not built (or what remains to do when it was)
    seconds: float


def parse_version(text: str) -> tuple[int, int, int] | None:
    m = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)", text.strip())
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def newest_supported(versions: list[str]) -> str | None:
    """The newest plain release (no pre-release suffix) at or after ``MIN_VERSION``."""
    parsed = [(v, parse_version(v)) for v in versions]
    good = [(p, v) for v, p in parsed if p is not None and p >= MIN_VERSION]
    return max(good)[1] if good else None


def replace_directives(gomod: str) -> list[str]:
    """The ``replace`` lines of a go.mod (single-line and block form), as single-line directives."""
    out: list[str] = []
    in_block = False
    for raw in gomod.splitlines():
        line = raw.split("//", 1)[0].strip()
        if in_block:
            if line == ")":
                in_block = False
            elif line:
                out.append(f"replace {line}")
        elif line.startswith("replace ("):
            in_block = True
        elif line.startswith("replace "):
            out.append(line)
    return out


def _go(args: list[str], cwd: Path, timeout: float) -> tuple[int, str]:
    env = {**os.environ, "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
    try:
        proc = subprocess.run(
            ["go", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return 124, f"`go {' '.join(args)}` did not finish within {timeout:.0f}s"
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _first_error(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return " ".join(lines[:2])[:400] if lines else "no output"


def probe(out_dir: Path, *, build_timeout: float = BUILD_TIMEOUT) -> VolcanoProbe:
    """Try to build Volcano's agent-scheduler into ``out_dir``; never raises for an expected failure."""
    began = time.monotonic()

    def done(built: bool, version: str, binary: str, reason: str) -> VolcanoProbe:
        return VolcanoProbe(built, version, binary, reason, round(time.monotonic() - began, 1))

    if shutil.which("go") is None:
        return done(False, "", "", "no Go toolchain on PATH")
    with tempfile.TemporaryDirectory(prefix="volcano-wrapper-") as tmp:
        work = Path(tmp)
        code, text = _go(["list", "-m", "-versions", MODULE], work, LIST_TIMEOUT)
        if code != 0:
            return done(False, "", "", f"`go list -m -versions {MODULE}` failed: {_first_error(text)}")
        version = newest_supported(text.split()[1:])
        if version is None:
            return done(False, "", "", f"the module proxy lists no {MODULE} release >= v1.14 ({text[:200]})")
        code, text = _go(["mod", "download", "-json", f"{MODULE}@{version}"], work, LIST_TIMEOUT)
        try:
            info = json.loads(text) if text.startswith("{") else {}
        except json.JSONDecodeError:
            info = {}
        if code != 0 or not info.get("GoMod"):
            return done(False, version, "", f"downloading {MODULE}@{version} failed: {_first_error(text)}")
        replaces = replace_directives(Path(info["GoMod"]).read_text())
        (work / "go.mod").write_text(
            "\n".join(
                [
                    "module bench/volcano-wrapper",
                    "",
                    "go 1.24",
                    "",
                    f"require {MODULE} {version}",
                    "",
                    *replaces,
                    "",
                ]
            )
        )
        (work / "tools.go").write_text(f'//go:build tools\n\npackage tools\n\nimport _ "{PACKAGE}"\n')
        code, text = _go(["mod", "tidy"], work, LIST_TIMEOUT * 3)
        if code != 0:
            return done(False, version, "", f"resolving the wrapper module failed: {_first_error(text)}")
        out_dir.mkdir(parents=True, exist_ok=True)
        binary = out_dir / "volcano-agent-scheduler"
        code, text = _go(["build", "-o", str(binary), PACKAGE], work, build_timeout)
        if code != 0:
            return done(False, version, "", f"building {PACKAGE}@{version} failed: {_first_error(text)}")
    return done(
        True,
        version,
        str(binary),
        "built; not run as a scheduler under test yet (needs Volcano's CRDs and scheduler configuration)",
    )
