"""The Reporter's promises: coalescing, deduplication, the rate limit, bounded Scheduled events, forget."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import REGISTRY

from common import aiotools, reporting
from common.kube import NotFound, ServerError
from common.records import PodRecord
from common.reporting import REPEAT_AFTER, Reporter, unschedulable_message
from tests.builders import make_pod
from tests.unit.common.fakes import FakeKube, cancel, record_sleeps


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The reporter's clock (only the reporter's: the event loop keeps the real one)."""
    fake = FakeClock()
    monkeypatch.setattr(reporting, "time", SimpleNamespace(monotonic=fake))
    return fake


def _pod(name: str) -> PodRecord:
    return make_pod(name).record()


def _messages(kube: FakeKube) -> list[tuple[str, str]]:
    """(reason, message) of every Event posted, in order."""
    return [(body["reason"], body["message"]) for _, body in kube.posts]


def _condition(patch: Any) -> dict[str, Any]:
    condition: dict[str, Any] = patch["status"]["conditions"][0]
    return condition


async def _report(reporter: Reporter, kube: FakeKube, events: int) -> None:
    """Run the reporter until ``events`` Events were posted in all, then stop it."""
    task = asyncio.create_task(reporter.run())
    try:
        await kube.wait_posts(events)
    finally:
        await cancel(task)


def test_unschedulable_message_has_kube_schedulers_shape() -> None:
    assert unschedulable_message(40, {"Insufficient cpu": 12, "node(s) had untolerated taint": 28}) == (
        "0/40 nodes are available: 12 Insufficient cpu, 28 node(s) had untolerated taint."
    )
    assert unschedulable_message(0, {}) == "0/0 nodes are available."


async def test_a_pod_failing_again_before_its_report_is_sent_has_one_report_the_newest(
    clock: FakeClock,
) -> None:
    kube = FakeKube()
    reporter = Reporter(kube.client(), component="agent-scheduler", qps=0)
    reporter.unschedulable(_pod("a"), "0/3 nodes are available: 3 Insufficient cpu.")
    reporter.unschedulable(_pod("b"), "0/3 nodes are available: 3 Insufficient memory.")
    reporter.unschedulable(_pod("a"), "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")
    assert reporter.pending() == 2

    await _report(reporter, kube, 2)

    assert [path for path, _, _ in kube.patches] == [
        "/api/v1/namespaces/default/pods/b/status",
        "/api/v1/namespaces/default/pods/a/status",
    ], "oldest first; a moved behind b when it failed again"
    assert [kind for _, _, kind in kube.patches] == ["strategic", "strategic"]
    condition = _condition(kube.patches[1][1])
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "PodScheduled",
        "False",
        "Unschedulable",
    )
    assert condition["message"] == "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    assert _messages(kube) == [
        ("FailedScheduling", "0/3 nodes are available: 3 Insufficient memory."),
        ("FailedScheduling", "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."),
    ]
    assert kube.posts[0][0] == "/api/v1/namespaces/default/events"
    assert reporter.pending() == 0 and reporter.sent == 2


async def test_the_same_message_is_not_repeated_within_repeat_after(clock: FakeClock) -> None:
    kube = FakeKube()
    reporter = Reporter(kube.client(), component="agent-scheduler", qps=0)
    pod = _pod("a")
    reporter.unschedulable(pod, "no room")
    await _report(reporter, kube, 1)

    clock.now += REPEAT_AFTER - 1
    reporter.unschedulable(pod, "no room")
    assert reporter.pending() == 0, "same message, reported less than REPEAT_AFTER ago"
    clock.now += 2
    reporter.unschedulable(pod, "no room")
    assert reporter.pending() == 1, "after REPEAT_AFTER the same message is reported again"


async def test_a_changed_message_or_another_pod_is_reported_at_once(clock: FakeClock) -> None:
    kube = FakeKube()
    reporter = Reporter(kube.client(), component="agent-scheduler", qps=0)
    pod = _pod("a")
    reporter.unschedulable(pod, "no room")
    await _report(reporter, kube, 1)

    clock.now += 1
    reporter.unschedulable(_pod("b"), "no room")
    assert reporter.pending() == 1, "another pod with the same message is reported"
    reporter.unschedulable(pod, "still no room")
    assert reporter.pending() == 2, "a changed message is reported at once"


async def test_failure_reports_are_sent_at_qps_at_most(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = FakeKube()
    record_sleeps(monkeypatch, kube.calls)
    reporter = Reporter(kube.client(), component="agent-scheduler", qps=20.0)
    for name in ("a", "b", "c"):
        reporter.unschedulable(_pod(name), "no room")

    await _report(reporter, kube, 3)

    steps = [c[0] if c[0] != "sleep" else ("sleep", c[1]) for c in kube.calls]
    assert steps[:9] == [
        "patch",
        "post",
        ("sleep", 0.05),
        "patch",
        "post",
        ("sleep", 0.05),
        "patch",
        "post",
        ("sleep", 0.05),
    ], "one report, then 1/qps seconds of quiet, before the next"


async def test_scheduled_events_are_dropped_and_counted_only_when_their_queue_is_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reporting, "MAX_SCHEDULED_EVENTS_QUEUED", 2)
    kube = FakeKube()
    reporter = Reporter(kube.client(), component="agent-scheduler")

    def dropped() -> float:
        return REGISTRY.get_sample_value("agent_scheduler_events_dropped_total") or 0.0

    before = dropped()
    reporter.scheduled(_pod("a"), "n1")
    reporter.scheduled(_pod("b"), "n1")
    assert reporter.pending() == 2 and dropped() == before
    reporter.scheduled(_pod("c"), "n1")
    assert reporter.pending() == 2 and dropped() == before + 1

    for name in "defgh":  # failure reports are never dropped, whatever the Scheduled queue holds
        reporter.unschedulable(_pod(name), "no room")
    assert reporter.pending() == 7 and dropped() == before + 1

    await _report(reporter, kube, 7)
    scheduled = sorted(note for reason, note in _messages(kube) if reason == "Scheduled")
    assert scheduled == [
        "Successfully assigned default/a to n1",
        "Successfully assigned default/b to n1",
    ]
    assert sum(1 for reason, _ in _messages(kube) if reason == "FailedScheduling") == 5


async def test_a_bound_pod_has_no_failure_report_pending_and_no_scheduled_event_when_disabled() -> None:
    kube = FakeKube()
    reporter = Reporter(kube.client(), component="agent-scheduler", scheduled_events=False)
    pod = _pod("a")
    reporter.unschedulable(pod, "no room")
    reporter.scheduled(pod, "n1")
    assert reporter.pending() == 0


async def test_forget_drops_what_is_pending_and_the_dedup_memory(clock: FakeClock) -> None:
    kube = FakeKube()
    reporter = Reporter(kube.client(), component="agent-scheduler", qps=0)
    pod = _pod("a")
    reporter.unschedulable(pod, "no room")
    reporter.scheduled(_pod("b"), "n1")
    reporter.forget(pod.key)
    reporter.forget(_pod("b").key)
    assert reporter.pending() == 0

    reporter.unschedulable(pod, "no room")
    await _report(reporter, kube, 1)
    reporter.forget(pod.key)
    reporter.unschedulable(pod, "no room")
    assert reporter.pending() == 1, "a forgotten pod that comes back is reported afresh"


async def test_a_pod_gone_before_its_report_gets_no_event_and_a_failed_patch_still_gets_one(
    clock: FakeClock,
) -> None:
    kube = FakeKube()
    kube.patch_errors = [NotFound(404, "pods gone"), ServerError(500, "etcd hiccup")]
    reporter = Reporter(kube.client(), component="agent-scheduler", qps=0)
    reporter.unschedulable(_pod("gone"), "no room")
    reporter.unschedulable(_pod("flaky"), "no room")

    await _report(reporter, kube, 1)

    assert [body["involvedObject"]["name"] for _, body in kube.posts] == ["flaky"]
    clock.now += 1
    reporter.unschedulable(_pod("gone"), "no room")
    assert reporter.pending() == 1, "the vanished pod was forgotten, so it is not deduplicated"


class BoundMeanwhile(FakeKube):
    """The API server's answer to the status patch shows the pod already bound."""

    async def patch(self, path: str, body: Any, *, kind: str = "merge") -> Any:
        await super().patch(path, body, kind=kind)
        return {"metadata": {"name": "a"}, "spec": {"nodeName": "n1"}, "status": body["status"]}


async def test_a_failure_report_landing_after_the_binding_is_undone(clock: FakeClock) -> None:
    """Another worker (or a retry) bound the pod while its failure report was on the way: the condition the
    binding set goes back to True, and no FailedScheduling event is sent."""
    kube = BoundMeanwhile()
    reporter = Reporter(kube.client(), component="agent-scheduler", qps=0)
    pod = _pod("a")
    reporter.unschedulable(pod, "binding rejected: denied")
    task = asyncio.create_task(reporter.run())
    try:
        async with asyncio.timeout(10):  # a guard against hanging
            while len(kube.patches) < 2:
                kube._changed.clear()
                await kube._changed.wait()
    finally:
        await cancel(task)
    assert [_condition(body)["status"] for _, body, _ in kube.patches] == ["False", "True"]
    restored = _condition(kube.patches[1][1])
    assert restored["reason"] is None and restored["message"] is None  # deleted by the strategic merge
    assert kube.posts == [], "no FailedScheduling event for a bound pod"
    reporter.unschedulable(pod, "binding rejected: denied")
    assert reporter.pending() == 1, "not deduplicated against a report that was undone"


async def test_a_failure_report_on_a_pending_pod_is_kept(clock: FakeClock) -> None:
    kube = FakeKube()  # answers with the patch itself: no node
    reporter = Reporter(kube.client(), component="agent-scheduler", qps=0)
    reporter.unschedulable(_pod("a"), "binding rejected: denied")
    await _report(reporter, kube, 1)
    assert len(kube.patches) == 1 and _messages(kube) == [("FailedScheduling", "binding rejected: denied")]


def test_each_scheduled_event_queued_pokes_the_pacer(monkeypatch: pytest.MonkeyPatch) -> None:
    pokes: list[int] = []
    reporter = Reporter(FakeKube().client(), component="agent-scheduler")
    monkeypatch.setattr(aiotools, "PACER", SimpleNamespace(poke=lambda: pokes.append(reporter.pending())))
    reporter.scheduled(_pod("a"), "n1")
    reporter.scheduled(_pod("b"), "n1")
    assert pokes == [1, 2]  # after the event is queued: the pacer sees it


async def test_scheduled_events_waiting_for_a_sender_count_in_the_pacers_backlog_while_the_reporter_runs() -> (
    None
):
    kube = FakeKube()
    reporter = Reporter(kube.client(), component="agent-scheduler")
    before = aiotools.PACER.backlog()
    for name in ("a", "b"):
        reporter.scheduled(_pod(name), "n1")
    assert aiotools.PACER.backlog() == before  # not running: not counted
    task = asyncio.create_task(reporter.run())
    try:
        await asyncio.sleep(0)
        assert aiotools.PACER.backlog() == before + 2
        await kube.wait_posts(2)
        assert aiotools.PACER.backlog() == before
    finally:
        await cancel(task)
