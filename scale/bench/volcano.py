"""Volcano's agent-scheduler for ``bench cluster``: the binary located or built, with a bounded attempt whose
answer goes into the report.

Volcano (volcano.sh/volcano >= v1.14) ships ``cmd/agent-scheduler``. Where it comes from, first match wins:

1. a binary given (``--volcano-binary`` or ``$VOLCANO_AGENT_SCHEDULER``);
2. a checkout of volcano-sh/volcano given (``--volcano-src``): ``go build ./cmd/agent-scheduler`` inside it, where
   its go.mod's ``replace`` directives apply (the way Volcano builds it);
3. the module proxy: Volcano's go.mod pins Kubernetes staging modules with ``replace`` directives, which Go
   ignores in a dependency, so this takes a wrapper module that requires volcano and repeats every one of its
   replace directives (``go list -m -versions``, ``go mod download``, ``go build``), each step with a timeout.

A binary found runs as the ``volcano-agent-*`` schedulers of ``scale.bench.schedulers`` in sharding mode
``none``, which needs none of Volcano's CRDs. The probe's ``reason`` says where the binary came from, or how far
the attempt got and why it stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MODULE = "volcano.sh/volcano"
PACKAGE = "volcano.sh/volcano/cmd/agent-scheduler"
MIN_VERSION = (1, 14, 0)
LIST_TIMEOUT = 90.0
BUILD_TIMEOUT = 900.0  # no more than about 15 minutes on Volcano
BINARY_ENV = "VOLCANO_AGENT_SCHEDULER"  # a prebuilt binary, when no --volcano-binary is given


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


def _go(args: list[str], cwd: Path, timeout: float, *, goflags: str = "-mod=mod") -> tuple[int, str]:
    env = {**os.environ, "GOFLAGS": goflags, "CGO_ENABLED": "0"}
    try:
        proc = subprocess.run(
            ["go", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return 124, f"`go {' '.join(args)}` did not finish within {timeout:.0f}s"
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _since(began: float) -> Callable[[bool, str, str, str], VolcanoProbe]:
    """A probe result with the seconds since ``began``."""

    def done(built: bool, version: str, binary: str, reason: str) -> VolcanoProbe:
        return VolcanoProbe(built, version, binary, reason, round(time.monotonic() - began, 1))

    return done


def _first_error(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return " ".join(lines[:2])[:400] if lines else "no output"


def locate(
    out_dir: Path, *, binary: str = "", src: Path | None = None, build_timeout: float = BUILD_TIMEOUT
) -> VolcanoProbe:
    """The binary given (``binary``, else ``$VOLCANO_AGENT_SCHEDULER``), else one built from the checkout ``src``,
    else the module-proxy attempt (``probe``)."""
    binary = binary or os.environ.get(BINARY_ENV, "")
    if binary:
        return given(binary)
    if src is not None:
        return build_checkout(src, out_dir, build_timeout=build_timeout)
    return probe(out_dir, build_timeout=build_timeout)


def given(binary: str) -> VolcanoProbe:
    """A prebuilt binary: usable when it is an executable file that answers ``--version``."""
    began = time.monotonic()
    path = Path(binary).expanduser().resolve()
    if not (path.is_file() and os.access(path, os.X_OK)):
        return VolcanoProbe(False, "", "", f"{binary} is not an executable file", 0.0)
    try:
        proc = subprocess.run(
            [str(path), "--version"], capture_output=True, text=True, timeout=LIST_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return VolcanoProbe(False, "", "", f"{binary} --version failed: {e}", 0.0)
    version = _version_line(proc.stdout + proc.stderr)
    return VolcanoProbe(True, version, str(path), f"given binary {path}", round(time.monotonic() - began, 1))


def _version_line(text: str) -> str:
    """The ``Version:`` (or first) line of Volcano's ``--version`` output."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if line.lower().startswith("version"):
            version = line.split(":", 1)[-1].strip()
            # a plain `go build` leaves Volcano's ldflags unset: "Version: Not provided."
            return "unversioned build" if version.lower().startswith("not provided") else version[:80]
    return lines[0][:80] if lines else "unknown"


def build_checkout(src: Path, out_dir: Path, *, build_timeout: float = BUILD_TIMEOUT) -> VolcanoProbe:
    """``go build ./cmd/agent-scheduler`` inside a checkout of volcano-sh/volcano."""
    began = time.monotonic()

    done = _since(began)

    if shutil.which("go") is None:
        return done(False, "", "", "no Go toolchain on PATH")
    if not (src / "cmd" / "agent-scheduler").is_dir():
        return done(False, "", "", f"{src} is not a volcano checkout with cmd/agent-scheduler")
    commit = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(
            ["git", "-C", str(src), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout.strip()
    out_dir.mkdir(parents=True, exist_ok=True)
    binary = out_dir / "volcano-agent-scheduler"
    # Inside the checkout Volcano's own go.mod (and its replace directives) governs the build, as it is.
    code, text = _go(["build", "-o", str(binary), "./cmd/agent-scheduler"], src, build_timeout, goflags="")
    if code != 0:
        return done(False, commit, "", f"building {src}/cmd/agent-scheduler failed: {_first_error(text)}")
    return done(
        True, commit or "checkout", str(binary), f"built from the checkout {src} ({commit or 'no git'})"
    )


def probe(out_dir: Path, *, build_timeout: float = BUILD_TIMEOUT) -> VolcanoProbe:
    """Try to build Volcano's agent-scheduler into ``out_dir``; never raises for an expected failure."""
    began = time.monotonic()

    done = _since(began)

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
    return done(True, version, str(binary), f"built {MODULE}@{version} from the module proxy")
