"""``PolicySource``: each ConfigMap version judged once, the last good policy kept, one Event per verdict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from coordinator.nodeshards import REASON_APPLIED, REASON_INVALID, PolicySource, agent_entry
from coordinator.nodeshards.policy import PolicyConfigError, default_policy, parse_configmap
from tests.unit.nodeshards.helpers import SHARDING, configmap


@dataclass
class Emitted:
    events: list[tuple[str, str, str]] = field(default_factory=list)

    def emit(self, ref: Any, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))


def source(*, use_default: bool = False, scheduler: str = "agent") -> tuple[PolicySource, Emitted, list[int]]:
    emitted, calls = Emitted(), []
    src = PolicySource("ns", "cm", scheduler_name=scheduler, use_default=use_default, events=emitted)  # type: ignore[arg-type]
    src.listeners.append(lambda: calls.append(1))
    return src, emitted, calls


# ---- PolicySource ----


def test_valid_configmap_is_applied_with_a_normal_event() -> None:
    src, emitted, calls = source()
    assert src.current is None  # no flag: no policy until a ConfigMap is seen
    src.replace([configmap({"sharding.yaml": SHARDING % 3}, "10")])
    assert src.current == parse_configmap({"sharding.yaml": SHARDING % 3})
    assert src.agent is not None and src.agent.name == "agent"
    assert src.origin == "configmap ns/cm@10" and src.present
    assert [e[:2] for e in emitted.events] == [("Normal", REASON_APPLIED)]
    assert calls


def test_invalid_configmap_keeps_the_policy_and_warns_with_the_field() -> None:
    src, emitted, _ = source()
    src.event("ADDED", configmap({"sharding.yaml": SHARDING % 3}, "10"))
    good = src.current
    src.event("MODIFIED", configmap({"sharding.yaml": SHARDING % -1}, "11"))
    assert src.current is good
    kind, reason, message = emitted.events[-1]
    assert (kind, reason) == ("Warning", REASON_INVALID)
    assert "resourceVersion 11" in message
    assert "schedulerConfigs[0].policies[1].arguments.maxNodes" in message and "must be > 0" in message
    assert good is not None and f"keeping policy {good.version}" in message
    assert src.last_verdict is not None and not src.last_verdict.accepted


def test_a_version_is_judged_once() -> None:
    src, emitted, _ = source()
    bad = configmap({"sharding.yaml": "x: ["}, "12")
    src.event("ADDED", bad)
    src.replace([bad])  # a relist replays it
    assert len(emitted.events) == 1


def test_unchanged_policy_in_a_new_version_emits_nothing() -> None:
    src, emitted, _ = source()
    src.event("ADDED", configmap({"sharding.yaml": SHARDING % 3}, "10"))
    src.event("MODIFIED", configmap({"sharding.yaml": "# a comment\n" + SHARDING % 3}, "13"))
    assert len(emitted.events) == 1
    assert src.origin == "configmap ns/cm@13"


def test_deletion_keeps_the_last_policy() -> None:
    src, _, calls = source()
    src.event("ADDED", configmap({"sharding.yaml": SHARDING % 3}, "10"))
    good = src.current
    src.event("DELETED", configmap({"sharding.yaml": SHARDING % 3}, "14"))
    assert src.current is good and not src.present
    src.replace([])  # a relist without it
    assert src.current is good
    assert len(calls) >= 2


def test_other_configmaps_are_ignored() -> None:
    src, emitted, _ = source()
    src.event("ADDED", configmap({"sharding.yaml": "x: ["}, "10", name="other"))
    assert emitted.events == [] and not src.present


def test_explicit_flag_starts_from_volcano_defaults() -> None:
    src, _, _ = source(use_default=True, scheduler="whatever")
    assert src.current is default_policy()
    assert src.agent is not None and src.agent.name == "agent-scheduler"  # the only agent entry
    assert src.origin == "built-in default"


def test_agent_entry_by_name_or_only_one() -> None:
    two = parse_configmap(two_data())
    assert agent_entry(two, "b").name == "b"
    with pytest.raises(PolicyConfigError, match="none named 'c'"):
        agent_entry(two, "c")
    src, emitted, _ = source(scheduler="c")
    src.event("ADDED", configmap(two_data(), "20"))
    assert src.current is None and emitted.events[-1][1] == REASON_INVALID


def two_data() -> dict[str, str]:
    return {
        "sharding.yaml": "schedulerConfigs:\n- {name: a, type: agent, policies: [{name: warmup}]}\n"
        "- {name: b, type: agent, policies: [{name: warmup}]}\n"
    }


# ---- usage tables ----
