"""Where an unschedulable pod goes: standalone it stays in this worker's queue and is reported on the pod;
under a coordinator it is handed back (see ``worker.intake``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from common.kube import Credentials, KubeClient
from common.records import PodRecord
from common.reporting import Reporter
from tests.builders import make_node, make_pod
from worker.outcomes import PodReports
from worker.scheduler import Scheduler
from worker.settings import WorkerSettings
from worker.shard import WholeCluster


class RecordingReporter(Reporter):
    def __init__(self, client: KubeClient) -> None:
        super().__init__(client, component="agent-scheduler")
        self.failures: list[tuple[str, str]] = []

    def unschedulable(self, pod: PodRecord, message: str) -> None:
        self.failures.append((pod.key, message))


@pytest.fixture
async def client() -> AsyncIterator[KubeClient]:
    c = KubeClient(Credentials("http://127.0.0.1:9"))  # never called: no watch runs here
    yield c
    await c.close()


async def test_standalone_unschedulable_pod_is_reported_and_kept_for_retry(client: KubeClient) -> None:
    reporter = RecordingReporter(client)
    sched = Scheduler(
        client, WorkerSettings(), shard=WholeCluster(), outcomes=PodReports(reporter), reporter=reporter
    )
    sched.cache.upsert_node(make_node("n1", cpu="1").record())
    sched.submit(make_pod("big").req(cpu="2").record())
    qp = sched.queue.pop_nowait()
    assert qp is not None
    decision = sched.schedule_one(qp)
    assert decision is not None and decision.node is None
    assert sched.queue.where(qp.pod.key) == "unschedulable"
    assert reporter.failures == [("default/big", "0/1 nodes are available: 1 Insufficient cpu.")]
    assert sched.unschedulable == 1
