"""An empty agent pool says why: a Warning event (on the policy ConfigMap, else the coordinator's Pod, else
none), the reason in the leader's readiness body (still passing), and nothing while the pool has nodes."""

from __future__ import annotations

from typing import Any

import pytest

from common.events import ObjectRef
from coordinator.command import Probes
from coordinator.leadership import emptypool
from coordinator.leadership.emptypool import GRACE, REPEAT, EmptyPoolNotice, PoolVerdict
from coordinator.workershards.pools import label_pool_reason


class Events:
    def __init__(self) -> None:
        self.sent: list[tuple[ObjectRef, str, str, str]] = []

    def emit(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        self.sent.append((ref, type_, reason, message))


CONFIGMAP = ObjectRef("v1", "ConfigMap", "agent-scheduler", "volcano-sharding-configmap")


def notice(
    size: list[int], target: ObjectRef | None, now: list[float]
) -> tuple[EmptyPoolNotice, Events, PoolVerdict]:
    events, verdict = Events(), PoolVerdict()
    n = EmptyPoolNotice(
        size=lambda: size[0],
        explain=lambda: label_pool_reason("pool=agents"),
        target=lambda: target,
        events=events,  # type: ignore[arg-type]
        verdict=verdict,
        clock=lambda: now[0],
    )
    return n, events, verdict


def test_an_empty_pool_is_reported_once_after_the_grace_then_cleared() -> None:
    size, now = [0], [0.0]
    n, events, verdict = notice(size, CONFIGMAP, now)
    n.check()
    assert not events.sent and verdict.reason is None  # within the grace
    now[0] = GRACE
    n.check()
    n.check()
    ((ref, type_, reason, message),) = events.sent
    assert (ref, type_, reason) == (CONFIGMAP, "Warning", "AgentPoolEmpty")
    assert "no node matches the agent node selector 'pool=agents'" in message
    assert verdict.reason == message
    now[0] += REPEAT
    n.check()
    assert len(events.sent) == 2  # repeated while it lasts
    size[0] = 3
    n.check()
    assert verdict.reason is None


def test_without_a_target_it_only_logs(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    n, events, verdict = notice([0], None, now)
    n.check()
    now[0] = GRACE
    n.check()
    assert not events.sent and verdict.reason
    assert "the agent pool is empty" in caplog.text


def test_the_coordinator_pod_comes_from_the_downward_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_NAME", raising=False)
    assert emptypool.own_pod() is None
    monkeypatch.setenv("POD_NAME", "coordinator-0")
    monkeypatch.setenv("POD_NAMESPACE", "agent-scheduler")
    assert emptypool.own_pod() == ObjectRef.pod("agent-scheduler", "coordinator-0")


class Term:
    class progress:
        @staticmethod
        def stalled() -> None:
            return None


class Election:
    term: Any = Term()
    standing_by = False


def test_the_leader_stays_ready_and_says_why() -> None:
    verdict = PoolVerdict()
    probes = Probes(Election(), None, progress_bound=10.0, pool=verdict)  # type: ignore[arg-type]
    assert probes.ready() is True
    verdict.reason = "the agent pool is empty: the cluster has no nodes"
    ready = probes.ready()
    assert isinstance(ready, str) and "the cluster has no nodes" in ready
    assert type(ready).__name__ == "Ready"  # passes: a standby would not fill the pool
