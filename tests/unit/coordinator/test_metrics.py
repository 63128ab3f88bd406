"""The coordinator's own metrics: the term's gauges read at scrape time, handoff durations, REST client
metrics, NodeShard write errors, and what ``/readyz`` says about an empty pool."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from aiohttp import ClientSession, web
from prometheus_client import REGISTRY

from common import metrics as shared
from common import restmetrics
from common.etcd.keys import WorkerId
from common.etcd.schema import ShardAssignment
from common.kube import Conflict, Credentials, KubeClient, ServerError
from common.records import NodeName
from coordinator import metrics
from coordinator.metrics import DispatchBacklog, HandoffTimer, TermView
from coordinator.nodeshards import store


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def view(*, redispatched: int = 0) -> TermView:
    return TermView(
        term=42,
        epoch=lambda: 7,
        backlog=lambda: DispatchBacklog(pending=5, parked=2, in_flight={"w1": 3}, redispatched=redispatched),
        nodes_per_worker=lambda: {WorkerId("w1"): 4, WorkerId("w2"): 6},
        agent_pool=lambda: 10,
    )


def test_a_standby_exports_is_leader_0_and_no_term() -> None:
    assert sample("agent_scheduler_coordinator_is_leader") == 0
    assert sample("agent_scheduler_coordinator_leader_term") is None
    assert sample("agent_scheduler_agent_pool_nodes") is None


def test_the_leader_exports_its_term() -> None:
    before = sample("agent_scheduler_coordinator_redispatches_total") or 0.0
    v = view(redispatched=3)
    metrics.COLLECTOR.lead(v)
    try:
        assert sample("agent_scheduler_coordinator_is_leader") == 1
        assert sample("agent_scheduler_coordinator_leader_term") == 42
        assert sample("agent_scheduler_coordinator_shard_epoch") == 7
        assert sample("agent_scheduler_coordinator_pending_pods", state="pending") == 5
        assert sample("agent_scheduler_coordinator_pending_pods", state="parked") == 2
        assert sample("agent_scheduler_coordinator_in_flight_dispatches", worker="w1") == 3
        assert sample("agent_scheduler_coordinator_worker_nodes", worker="w2") == 6
        assert sample("agent_scheduler_agent_pool_nodes") == 10
        assert sample("agent_scheduler_coordinator_redispatches_total") == before + 3
    finally:
        metrics.COLLECTOR.step_down(v)
    # the counter keeps what the ended term counted
    assert sample("agent_scheduler_coordinator_redispatches_total") == before + 3
    assert sample("agent_scheduler_coordinator_is_leader") == 0


def assignment(worker: str, granted: set[str] = set(), revoking: set[str] = set()) -> ShardAssignment:  # noqa: B006
    return ShardAssignment(
        WorkerId(worker),
        1,
        1,
        granted=frozenset(NodeName(n) for n in granted),
        revoking=frozenset(NodeName(n) for n in revoking),
    )


def test_handoff_phases_are_timed_from_the_revocation() -> None:
    now = [100.0]
    timer = HandoffTimer(clock=lambda: now[0])

    def count(phase: str) -> float:
        return sample("agent_scheduler_coordinator_handoff_duration_seconds_count", phase=phase) or 0.0

    release, grant = count("release"), count("grant")
    a0 = assignment("a", granted={"n1", "n2"})
    a1 = assignment("a", granted={"n2"}, revoking={"n1"})
    timer.written({WorkerId("a"): a0}, {WorkerId("a"): a1})  # n1 revoked at 100
    now[0] = 102.0
    a2 = assignment("a", granted={"n2"})
    b1 = assignment("b", granted={"n1"})
    timer.written({WorkerId("a"): a1}, {WorkerId("a"): a2, WorkerId("b"): b1})  # released and granted at 102
    assert count("release") == release + 1 and count("grant") == grant + 1
    total = sample("agent_scheduler_coordinator_handoff_duration_seconds_sum", phase="grant")
    assert total is not None and total >= 2.0
    # a node granted without a revocation seen (first grant) is not a handoff
    timer.written({}, {WorkerId("c"): assignment("c", granted={"n9"})})
    assert count("grant") == grant + 1


class Reply:
    def __init__(self) -> None:
        self.status = 200

    async def handle(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "Status"}, status=self.status)


@pytest.fixture
async def api() -> AsyncIterator[tuple[Reply, str]]:
    reply = Reply()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", reply.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield reply, f"127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_rest_client_metrics_count_every_request(api: tuple[Reply, str]) -> None:
    reply, host = api
    assert restmetrics.requests is not None

    def requests(code: str, method: str) -> float:
        return sample("rest_client_requests_total", code=code, method=method, host=host) or 0.0

    def gets() -> float:
        return sample("rest_client_request_duration_seconds_count", verb="GET", host=host) or 0.0

    # deltas, not totals: an earlier test in this process may have used the same ephemeral port (the host label)
    before = requests("200", "GET"), requests("409", "POST"), gets(), requests("200", "POST")
    async with KubeClient(Credentials(server=f"http://{host}", token="t")) as client:
        await client.get("/api/v1/nodes")
        reply.status = 409
        with pytest.raises(Conflict):
            await client.post("/api/v1/pods", {})
        # the same method again with another code, and the same code with another method: each its own series
        reply.status = 200
        await client.post("/api/v1/pods", {})
        await client.get("/api/v1/nodes")
    assert (requests("200", "GET"), requests("409", "POST"), gets(), requests("200", "POST")) == (
        before[0] + 2,
        before[1] + 1,
        before[2] + 2,
        before[3] + 1,
    )


async def test_nodeshard_write_errors_are_counted_by_part_and_reason() -> None:
    def errors(part: str, reason: str) -> float:
        return (
            sample("agent_scheduler_coordinator_nodeshard_write_errors_total", part=part, reason=reason)
            or 0.0
        )

    before = errors("spec", "conflict"), errors("status", "error")
    with pytest.raises(Conflict), store._counting_errors("spec"):
        raise Conflict(409, "changed")
    with pytest.raises(ServerError), store._counting_errors("status"):
        raise ServerError(500, "down")
    assert (errors("spec", "conflict"), errors("status", "error")) == (before[0] + 1, before[1] + 1)


async def test_a_ready_verdict_with_a_note_passes_and_shows_it() -> None:
    notes: Iterator[bool | str] = iter([shared.Ready("owns no nodes"), True, "fenced"])
    runner = await shared.serve("127.0.0.1", 0, lambda: next(notes))
    try:
        (address,) = shared.addresses(runner)
        async with ClientSession() as session:
            answers = []
            for _ in range(3):
                async with session.get(f"http://{address}/readyz") as resp:
                    answers.append((resp.status, await resp.text()))
    finally:
        await runner.cleanup()
    assert answers == [(200, "ok: owns no nodes"), (200, "ok"), (503, "fenced")]
