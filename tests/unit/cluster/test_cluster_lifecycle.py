"""Failure paths of the lifecycle, with stand-in components (no Kubernetes binaries needed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from scale.cluster.components import Component, Ports
from scale.cluster.config import ClusterOptions, Layout
from scale.cluster.errors import ComponentFailed, DirectoryInUse, ToolMissing
from scale.cluster.lifecycle import Cluster, claim_directory, start_cluster, start_component
from scale.cluster.processes import ProcessRecord, is_running, terminate
from scale.cluster.state import ClusterState, save


def _cluster(tmp_path: Path, options: ClusterOptions | None = None) -> Cluster:
    layout = Layout(tmp_path / "c")
    layout.logs.mkdir(parents=True)
    return Cluster(layout, ClusterState(dir=str(layout.root)), options)


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_component_that_exits_reports_its_log(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    failing = Component(
        "broken",
        ("p",),
        lambda ports: _python(
            "import sys\nfor i in range(80): print('line', i)\nprint('fatal: bad flag')\nsys.exit(2)"
        ),
        lambda ports: "not yet",
    )
    with pytest.raises(ComponentFailed) as info:
        start_component(failing, cluster)
    message = str(info.value)
    assert "broken exited (status 2) before it was ready" in message
    assert "fatal: bad flag" in message
    assert "line 31\n" in message and "line 30\n" not in message, "the last 50 lines, no more"
    assert info.value.log_path == str(cluster.layout.log("broken"))


def test_component_not_ready_in_time_is_reported_and_stays_recorded(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path, ClusterOptions(ready_timeout=0.5))
    slow = Component(
        "slow",
        ("p",),
        lambda ports: _python("print('starting', flush=True)\nimport time; time.sleep(60)"),
        lambda p: "503",
    )
    try:
        with pytest.raises(ComponentFailed, match=r"slow was not ready after 0s \(last probe: 503\)"):
            start_component(slow, cluster)
        record = cluster.state.process("slow")
        assert record is not None and is_running(record), "recorded, so that stopping the cluster covers it"
    finally:
        cluster.stop(remove=False)
    assert not is_running(record)


def test_port_taken_is_retried_on_fresh_ports(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    marker = tmp_path / "attempts"
    seen: list[Ports] = []

    def command(ports: Ports) -> list[str]:
        seen.append(ports)
        # First attempt: dies like a Go server that lost its port; later attempts stay up.
        return _python(
            "import pathlib, sys, time\n"
            f"m = pathlib.Path({str(marker)!r})\n"
            "n = int(m.read_text()) if m.exists() else 0\n"
            "m.write_text(str(n + 1))\n"
            "if n == 0:\n"
            "    print('listen tcp 127.0.0.1:1: bind: address already in use', flush=True); sys.exit(1)\n"
            "time.sleep(60)\n"
        )

    flaky = Component(
        "flaky",
        ("a", "b"),
        command,
        lambda ports: None if marker.exists() and int(marker.read_text()) > 1 else "no",
    )
    try:
        ports = start_component(flaky, cluster)
        assert len(seen) == 2 and ports == seen[1]
        assert [p.name for p in cluster.state.processes] == ["flaky"], "the dead attempt is forgotten"
    finally:
        cluster.stop(remove=False)


def _leftover(tmp_path: Path, processes: list[ProcessRecord]) -> Layout:
    layout = Layout(tmp_path / "old")
    layout.logs.mkdir(parents=True)
    save(ClusterState(dir=str(layout.root), phase="running", processes=processes), layout.state)
    return layout


def test_leftover_of_a_crashed_run_needs_force(tmp_path: Path) -> None:
    dead = ProcessRecord("etcd", 999_999_999, 1.0, ("etcd",), "")
    layout = _leftover(tmp_path, [dead])
    with pytest.raises(DirectoryInUse, match="--force") as info:
        claim_directory(layout, force=False, grace=1)
    assert not info.value.running
    claim_directory(layout, force=True, grace=1)
    assert not layout.root.exists()


def test_running_leftover_is_stopped_by_force(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    sleeper = Component("etcd", ("p",), lambda ports: _python("import time; time.sleep(60)"), lambda p: None)
    start_component(sleeper, cluster)
    record = cluster.state.processes[0]
    save(cluster.state, cluster.layout.state)
    try:
        with pytest.raises(DirectoryInUse, match="already running") as info:
            claim_directory(cluster.layout, force=False, grace=1)
        assert info.value.running
        claim_directory(cluster.layout, force=True, grace=5)
        assert not is_running(record)
        assert not cluster.layout.root.exists()
    finally:
        terminate([record], grace=1)


def test_force_never_wipes_foreign_files(tmp_path: Path) -> None:
    layout = _leftover(tmp_path, [])
    (layout.root / "thesis.tex").write_text("precious")
    with pytest.raises(DirectoryInUse, match="does not look like a cluster directory"):
        claim_directory(layout, force=True, grace=1)
    assert (layout.root / "thesis.tex").read_text() == "precious"


def test_missing_binary_is_explained_before_touching_the_directory(tmp_path: Path) -> None:
    with pytest.raises(ToolMissing, match="make tools"):
        start_cluster(tmp_path / "c", options=ClusterOptions(bin_dir=tmp_path / "nowhere"))
    assert not (tmp_path / "c").exists()


def test_state_file_is_json(tmp_path: Path) -> None:
    layout = _leftover(tmp_path, [])
    assert json.loads(layout.state.read_text())["phase"] == "running"
