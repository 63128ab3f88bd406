"""Rendering the Helm chart with the pinned helm (``.local/bin/helm``, built by ``make tools``)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "manifests" / "chart" / "agent-scheduler"
HELM = ROOT / ".local" / "bin" / "helm"
RELEASE, NAMESPACE = "agent-scheduler", "agent-scheduler"


def helm(*args: str | Path) -> str:
    if not HELM.is_file():
        pytest.fail(f"{HELM} is missing: build the pinned tools first (make tools)", pytrace=False)
    done = subprocess.run(
        [str(HELM), *(str(a) for a in args)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"helm {' '.join(map(str, args))} failed:\n{done.stdout}{done.stderr}"
    return done.stdout


def render(*sets: str, extra: Iterable[str] = ()) -> list[dict[str, Any]]:
    args: list[str | Path] = ["template", RELEASE, CHART, "--namespace", NAMESPACE, *extra]
    for s in sets:
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(helm(*args)) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = find(docs, kind, name)
    return doc
