"""The bench's scheduler configurations: what each runs, and which are in ``bench cluster``'s default list."""

from __future__ import annotations

from scale.bench.schedulers import QUICK_SCHEDULERS, SCHEDULERS, VOLCANO, default_schedulers


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
