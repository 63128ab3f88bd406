"""The bench's scheduler configurations: what each runs, and which are in ``bench cluster``'s default list."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from scale.bench import schedulers
from scale.bench.schedulers import (
    PAUSED_LEASE_TTL,
    QUICK_SCHEDULERS,
    SCHEDULERS,
    VOLCANO,
    default_schedulers,
    launch,
    paused_lease_ttl,
)
from scale.cluster import Cluster
from scale.cluster.config import PROJECT_ROOT
from worker.settings import ApiSettings, BindingSettings


def test_coordinator_plus_one_runs_the_default_and_the_dispatched_path_has_its_own_name() -> None:
    assert SCHEDULERS["agent-coord-1"].coordinator_flags == ()  # the sole worker: the coordinator's default
    assert SCHEDULERS["agent-coord-1-dispatched"].coordinator_flags == ("--no-sole-worker",)
    assert SCHEDULERS["agent-coord-1-sole"].coordinator_flags == ("--sole-worker",)


def test_the_default_list_runs_each_configuration_once() -> None:
    names = default_schedulers(quick=False)
    assert "agent-coord-1" in names and "agent-coord-1-dispatched" in names
    assert "agent-coord-1-sole" not in names  # the same configuration as agent-coord-1, its flag spelled out
    assert not [n for n in names if SCHEDULERS[n].kind == VOLCANO]  # added only when its binary is found
    assert default_schedulers(quick=True) == list(QUICK_SCHEDULERS)


def _launched(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, *, lease_ttl: int | None
) -> dict[str, list[str]]:
    """The argv of each process ``launch`` starts for ``name`` (nothing is started)."""
    started: dict[str, list[str]] = {}

    def start(process: str, argv: list[str], log_path: Path, *, code: Path = PROJECT_ROOT) -> object:
        started[process] = argv
        return object()

    monkeypatch.setattr(schedulers, "start", start)
    cluster = cast(Cluster, SimpleNamespace(etcd_endpoint="http://127.0.0.1:2379"))
    launch(SCHEDULERS[name], cluster, tmp_path, kubeconfig=tmp_path / "kubeconfig", lease_ttl=lease_ttl)
    return started


def test_a_backlog_runs_coordinated_processes_with_a_lease_that_outlasts_the_pause(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    coordinated, standalone = SCHEDULERS["agent-coord-2"], SCHEDULERS["agent-standalone"]
    assert paused_lease_ttl(coordinated, paused=True) == PAUSED_LEASE_TTL
    assert PAUSED_LEASE_TTL / 2 > 30  # fenced at half the TTL: far longer than creating a backlog takes here
    assert paused_lease_ttl(coordinated, paused=False) is None  # a burst runs the product's default
    assert paused_lease_ttl(standalone, paused=True) is None  # no lease
    assert paused_lease_ttl(SCHEDULERS["no-decision"], paused=True) is None

    started = _launched(monkeypatch, tmp_path, "agent-coord-2", lease_ttl=PAUSED_LEASE_TTL)
    assert set(started) == {"worker-1", "worker-2", "coordinator"}
    for argv in started.values():
        assert f"--lease-ttl={PAUSED_LEASE_TTL}" in argv
    started = _launched(monkeypatch, tmp_path, "agent-coord-2", lease_ttl=None)
    assert not [a for argv in started.values() for a in argv if a.startswith("--lease-ttl")]


def test_agent_configurations_bind_with_the_workers_default_concurrency(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    default = BindingSettings().concurrency
    assert default == ApiSettings().max_connections  # one write connection per binding in flight, no fewer
    assert SCHEDULERS["agent-standalone"].bind_concurrency == default
    assert SCHEDULERS["agent-coord-1"].bind_concurrency == default
    assert (
        f"--bind-concurrency={default}"
        in _launched(monkeypatch, tmp_path, "agent-standalone", lease_ttl=None)["worker"]
    )
