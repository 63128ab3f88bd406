"""The dispatch server over a real local TCP stream: DISPATCH, RESULTs for each outcome, leader terms."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import hmac
import socket
import struct
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgpack
import pytest

from common import protocol
from common.keyring import StaticKeys
from common.kube import Credentials, KubeClient
from common.records import NodeName, PodRecord, pod_from_json
from common.reporting import Reporter
from common.wellknown import DEFAULT_SCHEDULER_NAME
from tests.builders import make_node, make_pod
from tests.unit.worker.helpers import FixedShard
from worker import intake as intake_module
from worker.claims import Claims
from worker.intake import Intake, LeaderResults
from worker.scheduler import Scheduler
from worker.settings import WorkerSettings

TIMEOUT = 5.0
M = TypeVar("M", bound=protocol.Message)


class RecordingReporter(Reporter):
    def __init__(self, client: KubeClient) -> None:
        super().__init__(client, component="agent-scheduler")
        self.scheduled_pods: list[tuple[str, str]] = []
        self.failures: list[tuple[str, str]] = []

    def scheduled(self, pod: PodRecord, node: str) -> None:
        self.scheduled_pods.append((pod.key, node))

    def unschedulable(self, pod: PodRecord, message: str) -> None:
        self.failures.append((pod.key, message))


KEY = b"k" * 32


@dataclass
class Worker:
    sched: Scheduler
    results: LeaderResults
    intake: Intake
    shard: FixedShard
    reporter: RecordingReporter
    address: tuple[str, int]
    placing: list[bool]
    elected: list[int | None]


@pytest.fixture
async def worker() -> AsyncIterator[Worker]:
    async with running_worker() as w:
        yield w


@contextlib.asynccontextmanager
async def running_worker(
    *, preempt: bool = False, claims: Callable[[Callable[[], bool]], Claims] | None = None
) -> AsyncIterator[Worker]:
    """A worker with one node ("n1", 4 CPUs) serving the dispatch protocol on a local port; ``claims`` builds
    its ``worker.claims.Claims`` from its ``can_place``."""
    client = KubeClient(Credentials("http://127.0.0.1:9"))  # never called: no watch runs here
    reporter = RecordingReporter(client)
    shard = FixedShard(["n1"])
    placing = [True]
    elected: list[int | None] = [1]
    claimed = claims(lambda: placing[0]) if claims is not None else None
    results = LeaderResults(reporter, catching_up=shard.syncing, claims=claimed)
    sched = Scheduler(
        client,
        WorkerSettings(),
        shard=shard,
        outcomes=results,
        reporter=reporter,
        watch_pending=False,
        preempt=preempt,
        claims=claimed,
    )
    sched.cache.upsert_node(make_node("n1", cpu="4").record())
    intake = Intake(
        sched,
        results,
        worker_id="w1",
        shard=shard,
        keys=StaticKeys(KEY),
        elected=lambda: elected[0],
        scheduler_name=DEFAULT_SCHEDULER_NAME,
        can_place=lambda: placing[0],
        max_handshakes=4,
    )
    listener = socket.create_server(("127.0.0.1", 0))
    address = listener.getsockname()[:2]
    await intake.start(listener)
    try:
        yield Worker(sched, results, intake, shard, reporter, address, placing, elected)
    finally:
        await intake.close()
        await client.close()


@pytest.fixture(autouse=True)
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(protocol, "HELLO_TIMEOUT", 0.5)
    monkeypatch.setattr(intake_module, "TERM_WAIT", 0.1)


class Leader:
    """The leader's side of one stream, after a complete handshake (``connect``)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.capacity: protocol.Capacity | None = None
        self.session: protocol.Session | None = None
        self.welcome: protocol.Welcome | None = None
        self.hello_frame = b""

    @classmethod
    async def open(cls, w: Worker, term: int, key: bytes = KEY) -> tuple[Leader, bytes]:
        """Connect and send HELLO; returns the leader and the HELLO's nonce."""
        reader, writer = await asyncio.open_connection(*w.address)
        leader = cls(reader, writer)
        nonce = protocol.new_nonce()
        leader.hello_frame = protocol.seal_hello(key, protocol.Hello(leader="l", term=term, nonce=nonce))
        writer.write(leader.hello_frame)
        return leader, nonce

    @classmethod
    async def connect(cls, w: Worker, term: int, key: bytes = KEY) -> Leader:
        leader, nonce = await cls.open(w, term, key)
        async with asyncio.timeout(TIMEOUT):
            leader.welcome = await protocol.read_reply(leader.reader, key, nonce)
        leader.session = protocol.Session(
            key, hello_nonce=nonce, welcome_nonce=leader.welcome.nonce, leader=True
        )
        leader.send(protocol.Ping(ts=0.0))  # the first session frame: the worker takes the stream now
        assert (await leader.next(protocol.Pong)).ts == 0.0
        return leader

    @classmethod
    async def refused(cls, w: Worker, term: int) -> str:
        """HELLO with ``term``: the worker's ERROR message (then it closes)."""
        leader, nonce = await cls.open(w, term)
        with pytest.raises(protocol.ProtocolError, match="refused") as refusal:
            async with asyncio.timeout(TIMEOUT):
                await protocol.read_reply(leader.reader, KEY, nonce)
        assert await leader.closed()
        await leader.close()
        return str(refusal.value)

    def send(self, message: protocol.Message) -> None:
        assert self.session is not None
        self.writer.write(self.session.seal(message))

    async def next(self, kind: type[M]) -> M:
        """The next message of ``kind``; CAPACITY summaries in between are remembered, others fail."""
        assert self.session is not None
        async with asyncio.timeout(TIMEOUT):
            while True:
                msg = await self.session.read(self.reader)
                if isinstance(msg, kind):
                    return msg
                if isinstance(msg, protocol.Capacity):
                    self.capacity = msg
                    continue
                raise AssertionError(f"expected {kind.__name__}, got {msg}")

    async def closed(self) -> bool:
        """True once the worker closed the stream (whatever it sent before)."""
        async with asyncio.timeout(TIMEOUT):
            while await self.reader.read(65536):
                pass
        return True

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


async def test_dispatch_is_acked_and_queued(worker: Worker) -> None:
    worker.elected[0] = 3
    leader = await Leader.connect(worker, term=3)
    assert leader.welcome is not None and leader.welcome.term == 3
    leader.send(protocol.Dispatch(id=7, pod=make_pod("p").req(cpu="1").json()))
    assert (await leader.next(protocol.Ack)).id == 7
    assert worker.sched.queue.where("default/p") == "active"  # type: ignore[arg-type]
    assert worker.results.pending == {"default/p": (7, "")}
    await leader.close()


async def test_dispatch_waits_for_the_pod_watch_to_reach_min_rv(worker: Worker) -> None:
    """The topology lane's rule 2: ACKed at once, queued only once the pod watch has reached ``min_rv``."""
    watch = worker.sched.watches
    watch.pods.resource_version = "100"
    leader = await Leader.connect(worker, term=1)
    leader.send(protocol.Dispatch(id=5, pod=make_pod("p").req(cpu="1").json(), min_rv=150))
    assert (await leader.next(protocol.Ack)).id == 5
    assert "default/p" not in worker.sched.queue  # type: ignore[operator]
    assert len(worker.intake.gate) == 1
    watch.pods.resource_version = "150"
    assert worker.intake.gate.check() == 1  # what the gate's loop does on the pod feed's progress (test_gate)
    assert "default/p" in worker.sched.queue  # type: ignore[operator]
    assert worker.results.pending == {"default/p": (5, "")}
    await leader.close()


async def test_dispatch_is_rejected_at_once_while_fenced_or_draining(worker: Worker) -> None:
    worker.placing[0] = False
    leader = await Leader.connect(worker, term=1)
    leader.send(protocol.Dispatch(id=8, pod=make_pod("p").json()))
    result = await leader.next(protocol.Result)
    assert (result.id, result.outcome) == (8, protocol.REJECTED)
    assert "default/p" not in worker.sched.queue and not worker.results.pending  # type: ignore[operator]
    capacity = await leader.next(protocol.Capacity)
    assert capacity.nodes == 0 and capacity.max_cpu == 0  # the leader will not choose us
    await leader.close()


async def test_bound_pod_gets_a_result_and_its_scheduled_event(worker: Worker) -> None:
    leader = await Leader.connect(worker, term=1)
    leader.send(protocol.Dispatch(id=9, pod=make_pod("p").req(cpu="1").json()))
    await leader.next(protocol.Ack)
    qp = worker.sched.queue.pop_nowait()
    assert qp is not None
    decision = worker.sched.schedule_one(qp)
    assert decision is not None and decision.node == "n1"
    # What the binder does after a 201:
    worker.results.bound(qp.pod, NodeName("n1"), assumed_at=1.0, bound_at=2.0)
    result = await leader.next(protocol.Result)
    assert (result.id, result.outcome, result.node) == (9, protocol.BOUND, "n1")
    assert worker.reporter.scheduled_pods == [("default/p", "n1")]
    assert worker.results.binds_per_second() > 0
    await leader.close()


async def decided(
    worker: Worker, leader: Leader, dispatch_id: int, pod: dict[str, Any], *, preempt: str = ""
) -> protocol.Result:
    """DISPATCH ``pod``, let the worker decide it, and return its RESULT."""
    leader.send(protocol.Dispatch(id=dispatch_id, pod=pod, preempt=preempt))
    await leader.next(protocol.Ack)
    qp = worker.sched.queue.pop_nowait()
    assert qp is not None
    worker.sched.schedule_one(qp)
    return await leader.next(protocol.Result)


async def test_unschedulable_pod_goes_back_to_the_leader_and_leaves_the_queue(worker: Worker) -> None:
    leader = await Leader.connect(worker, term=1)
    result = await decided(worker, leader, 10, make_pod("big").req(cpu="64").json())
    assert (result.id, result.outcome, result.nodes) == (10, protocol.UNSCHEDULABLE, 1)
    assert result.reasons == {"Insufficient cpu": 1}
    assert "default/big" not in worker.sched.queue  # type: ignore[operator]
    assert not worker.reporter.failures  # the leader reports it when no shard can take it
    await leader.close()


async def test_no_fit_while_granted_nodes_catch_up_is_try_later_not_no(worker: Worker) -> None:
    """A shard with nodes still catching up answers over part of itself: that is not a "no" the leader may
    count in an unschedulable verdict (its node count would be short, and a node catching up may fit)."""
    leader = await Leader.connect(worker, term=1)
    worker.shard.syncing_nodes = 3
    result = await decided(worker, leader, 12, make_pod("big").req(cpu="64").json())
    assert (result.id, result.outcome) == (12, protocol.REJECTED)
    assert result.message == "3 granted nodes still catching up; try later"
    assert not worker.reporter.failures  # nothing said on the pod: the leader decides
    # caught up: the same pod is now a plain no over the whole shard
    worker.shard.syncing_nodes = 0
    result = await decided(worker, leader, 13, make_pod("big").req(cpu="64").json())
    assert (result.id, result.outcome, result.nodes) == (13, protocol.UNSCHEDULABLE, 1)
    await leader.close()


async def test_a_pod_preempting_here_is_answered_waiting_once_then_bound() -> None:
    """Sent to preempt on n1: the victim is evicted and the pod waits here for the room; the leader is told so
    (once per dispatch, however often the pod is retried meanwhile), then gets the final RESULT."""
    async with running_worker(preempt=True) as worker:
        low = make_pod("low").req(cpu="4").priority(1).on("n1").record()
        worker.sched.cache.upsert_pod(low)
        leader = await Leader.connect(worker, term=1)
        hi = make_pod("hi").req(cpu="4").priority(10)
        result = await decided(worker, leader, 14, hi.json(), preempt="n1")
        assert (result.id, result.outcome, result.node, result.uid) == (14, protocol.WAITING, "n1", "")
        assert worker.sched.cache.nominated_node[hi.record().key] == "n1"
        # retried while the victim terminates (its eviction still under way): still waiting, not said again
        assert worker.sched.preemption is not None
        worker.sched.preemption.executor._busy.clear()
        worker.sched.queue.activate(hi.record().key)
        qp = worker.sched.queue.pop_nowait()
        assert qp is not None and worker.sched.schedule_one(qp) is None
        assert hi.record().key in worker.sched.queue
        worker.results.bound(hi.record(), NodeName("n1"), assumed_at=1.0, bound_at=2.0)
        final = await leader.next(protocol.Result)
        assert (final.id, final.outcome) == (14, protocol.BOUND)
        await leader.close()


async def test_rejected_binding_gets_a_result_and_a_report(worker: Worker) -> None:
    leader = await Leader.connect(worker, term=1)
    pod = make_pod("p").json()
    leader.send(protocol.Dispatch(id=11, pod=pod))
    await leader.next(protocol.Ack)
    worker.results.rejected(make_pod("p").record(), "binding rejected: forbidden")
    result = await leader.next(protocol.Result)
    assert (result.id, result.outcome) == (11, protocol.REJECTED)
    assert result.message == "binding rejected: forbidden"
    assert worker.reporter.failures == [("default/p", "binding rejected: forbidden")]
    await leader.close()


async def test_the_newly_elected_term_replaces_the_stream_and_gets_no_answer_for_an_older_dispatch(
    worker: Worker,
) -> None:
    """An id of the old stream means nothing to the new leader, which numbers its own dispatches afresh: one
    of them could be taken for the answer (and its ACK window freed). Its watch shows the binding."""
    old = await Leader.connect(worker, term=1)
    old.send(protocol.Dispatch(id=12, pod=make_pod("p").json()))
    await old.next(protocol.Ack)
    worker.sched.cache.assume(make_pod("p").record(), NodeName("n1"))  # its binding is under way
    worker.elected[0] = 2  # etcd elected another leader
    new = await Leader.connect(worker, term=2)
    assert await old.closed()
    await old.close()
    new.send(protocol.Dispatch(id=12, pod=make_pod("q").json()))  # the new term's own dispatch 12
    await new.next(protocol.Ack)
    assert worker.results.pending == {"default/q": (12, "")}  # p's entry went with the old stream
    made_after = time.time()
    worker.results.bound(make_pod("p").record(), NodeName("n1"), assumed_at=1.0, bound_at=2.0)
    # ``next`` fails on any RESULT before a summary made after the binding: none was sent for p
    assert (await capacity_until(new, worker, lambda c: c.ts >= made_after)).earlier == 1
    await new.close()


async def capacity_until(
    leader: Leader, worker: Worker, done: Callable[[protocol.Capacity], bool]
) -> protocol.Capacity:
    """The first CAPACITY summary from now on for which ``done`` holds (each asked for: the check at rest
    waits for a poke), within ``TIMEOUT``."""
    async with asyncio.timeout(TIMEOUT):
        while True:
            worker.intake.poke()
            capacity = await leader.next(protocol.Capacity)
            if done(capacity):
                return capacity


async def test_a_new_stream_drops_what_earlier_streams_dispatched_unless_it_is_being_bound(
    worker: Worker,
) -> None:
    """The topology lane's rule 6, the worker's half: what an earlier stream dispatched is the new stream's
    leader's to dispatch again, except the bindings under way, which are counted until the pod watch shows
    them."""
    watch = worker.sched.watches
    watch.pods.resource_version = "100"
    old = await Leader.connect(worker, term=1)
    old.send(protocol.Dispatch(id=1, pod=make_pod("queued").req(cpu="100m").json()))
    old.send(protocol.Dispatch(id=2, pod=make_pod("binding").req(cpu="100m").json()))
    old.send(protocol.Dispatch(id=3, pod=make_pod("parked").req(cpu="100m").json(), min_rv=500))
    old.send(protocol.Dispatch(id=4, pod=make_pod("chosen").req(cpu="100m").json(), preempt="n1"))
    for _ in range(4):
        await old.next(protocol.Ack)
    binding = worker.sched.queue.pop_nowait()
    assert binding is not None and binding.pod.name == "queued"
    worker.sched.queue.done(binding, scheduled=False)  # still queued (its attempt put it back)
    popped = worker.sched.queue.pop_nowait()
    assert popped is not None and popped.pod.name == "binding"
    worker.sched.queue.done(popped, scheduled=True)
    worker.sched.cache.assume(popped.pod, NodeName("n1"))  # its binding is under way
    assert len(worker.intake.gate) == 1
    worker.elected[0] = 2
    new = await Leader.connect(worker, term=2)
    await old.close()
    assert "default/queued" not in worker.sched.queue  # type: ignore[operator]
    assert "default/chosen" not in worker.sched.queue  # type: ignore[operator]
    assert "default/chosen" not in worker.sched._preempt_on  # the old leader's choice goes with it
    assert len(worker.intake.gate) == 0
    watch.pods.resource_version = "600"
    watch.pods._event_version = "590"  # the newest pod it delivered (600: a bookmark's)
    assert worker.intake.gate.check() == 0  # the parked pod is not released later either
    assert worker.results.pending == {}  # no id of the old stream is answered over the new one
    assert worker.results.earlier == {"default/binding": ""}
    capacity = await capacity_until(new, worker, lambda c: c.revision == 590)
    assert capacity.earlier == 1
    # the binding is answered: no RESULT for dispatch 2 goes to the new leader (``next`` fails on one)
    made_after = time.time()
    worker.results.bound(popped.pod, NodeName("n1"), assumed_at=0.0, bound_at=0.0)
    summary = await capacity_until(new, worker, lambda c: c.ts >= made_after)
    assert summary.earlier == 1  # the watch has not shown it yet
    # the pod watch shows the binding: nothing of an earlier stream is under way any more
    worker.sched.cache.upsert_pod(make_pod("binding").req(cpu="100m").on("n1").record())
    watch.pods.resource_version = watch.pods._event_version = "601"
    capacity = await capacity_until(new, worker, lambda c: c.revision == 601)
    assert capacity.earlier == 0
    assert worker.results.earlier == {}
    await new.close()


async def test_every_binding_under_way_counts_when_a_new_stream_begins(worker: Worker) -> None:
    """Answered bindings the pod watch has not shown yet count too (their dispatch is no longer owed), and so
    do bindings of pods no DISPATCH sent (claimed): the cache's assumptions are what may still land."""
    old = await Leader.connect(worker, term=1)
    old.send(protocol.Dispatch(id=1, pod=make_pod("answered").req(cpu="100m").json()))
    await old.next(protocol.Ack)
    qp = worker.sched.queue.pop_nowait()
    assert qp is not None
    worker.sched.queue.done(qp, scheduled=True)
    worker.sched.cache.assume(qp.pod, NodeName("n1"))
    worker.results.bound(qp.pod, NodeName("n1"), assumed_at=1.0, bound_at=2.0)  # its RESULT went out
    worker.sched.cache.finish_binding(qp.pod.key, 2.0)
    assert "default/answered" not in worker.results.pending
    worker.sched.cache.assume(make_pod("claimed").req(cpu="100m").uid("u-c").record(), NodeName("n1"))
    await old.close()  # the stream ends first; the next one comes later
    worker.elected[0] = 2
    new = await Leader.connect(worker, term=2)
    assert worker.results.earlier == {"default/answered": "", "default/claimed": "u-c"}
    capacity = await capacity_until(new, worker, lambda c: True)
    assert capacity.earlier == 2
    await new.close()


async def test_a_dispatch_read_from_a_replaced_stream_is_refused(worker: Worker) -> None:
    old = await Leader.connect(worker, term=1)
    replaced = worker.results.stream
    assert replaced is not None
    worker.elected[0] = 2
    new = await Leader.connect(worker, term=2)
    await old.close()
    # a frame the replaced stream had buffered, handled after the new stream began
    worker.intake.handle(protocol.Dispatch(id=3, pod=make_pod("late").req(cpu="100m").json()), replaced)
    assert "default/late" not in worker.sched.queue  # type: ignore[operator]
    assert worker.results.pending == {} and len(worker.intake.gate) == 0
    await new.close()


async def test_a_pod_of_an_earlier_stream_whose_binding_fails_is_not_decided_again(worker: Worker) -> None:
    old = await Leader.connect(worker, term=1)
    old.send(protocol.Dispatch(id=1, pod=make_pod("a").req(cpu="100m").json()))
    old.send(protocol.Dispatch(id=2, pod=make_pod("b").req(cpu="100m").json()))
    for _ in range(2):
        await old.next(protocol.Ack)
    pods = {}
    for _ in range(2):
        qp = worker.sched.queue.pop_nowait()
        assert qp is not None
        worker.sched.queue.done(qp, scheduled=True)
        worker.sched.cache.assume(qp.pod, NodeName("n1"))
        pods[qp.pod.name] = qp.pod
    new = await Leader.connect(worker, term=1)  # the same leader, reconnecting
    await old.close()
    assert worker.results.earlier == {"default/a": "", "default/b": ""}
    new.send(protocol.Dispatch(id=7, pod=make_pod("b").req(cpu="100m").json()))  # b is the new stream's now
    assert (await new.next(protocol.Ack)).id == 7
    assert worker.results.earlier == {"default/a": ""}
    for pod in pods.values():  # both bindings fail transiently: the binder gives them back
        worker.sched.cache.forget(pod.key)
        worker.sched._requeue(pod, 1)
    assert "default/a" not in worker.sched.queue  # type: ignore[operator]
    assert "default/a" not in worker.results.pending and worker.results.earlier == {}
    assert worker.sched.queue.where("default/b") == "backoff"  # type: ignore[arg-type]
    assert worker.results.pending == {"default/b": (7, "")}
    await new.close()


async def test_a_lower_term_is_accepted_when_etcd_elects_it(worker: Worker) -> None:
    """After etcd was replaced by an empty one, revisions restart low: what counts is etcd's election."""
    worker.elected[0] = 900
    old = await Leader.connect(worker, term=900)
    worker.elected[0] = 2
    new = await Leader.connect(worker, term=2)
    assert await old.closed() and worker.results.term == 2
    await old.close()
    await new.close()


@pytest.mark.parametrize("term", [4, 6, 1 << 62], ids=["older", "newer", "forged-high"])
async def test_a_term_etcd_does_not_elect_is_refused_and_the_current_stream_stays(
    worker: Worker, term: int
) -> None:
    worker.elected[0] = 5
    current = await Leader.connect(worker, term=5)
    assert "not the elected leader's (5)" in await Leader.refused(worker, term)
    current.send(protocol.Ping(ts=123))
    assert (await current.next(protocol.Pong)).ts == 123
    assert worker.results.term == 5
    await current.close()


async def test_no_known_leader_refuses_every_term(worker: Worker) -> None:
    worker.elected[0] = None  # the election mirror is empty
    assert "not the elected" in await Leader.refused(worker, 1)


async def test_capacity_summary_comes_from_the_index(worker: Worker) -> None:
    worker.sched.cache.upsert_node(make_node("n2", cpu="8").record())  # not in the shard: not counted
    worker.shard.syncing_nodes = 1
    leader = await Leader.connect(worker, term=1)
    capacity = await leader.next(protocol.Capacity)
    assert (capacity.nodes, capacity.free_cpu, capacity.max_cpu) == (1, 4000, 4000)
    assert capacity.syncing == 1 and capacity.pending == 0
    await leader.close()


# ----- authentication and bounds ----------------------------------------------------------------------------


async def eof_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """Everything the worker sent until it closed the connection, which must happen within ``seconds``."""
    async with asyncio.timeout(seconds):
        return await reader.read()


async def test_a_hello_under_another_key_is_closed_unanswered(worker: Worker) -> None:
    leader, _ = await Leader.open(worker, term=1, key=b"x" * 32)
    assert await eof_within(leader.reader, TIMEOUT) == b""  # no WELCOME, no ERROR: nothing to learn
    await leader.close()
    assert worker.intake.failed_handshakes == 1 and worker.results.stream is None


async def test_a_hello_without_any_secret_is_refused(worker: Worker) -> None:
    leader, _ = await Leader.open(worker, term=1, key=b"")
    assert await eof_within(leader.reader, TIMEOUT) == b""
    await leader.close()


async def test_the_previous_key_is_accepted_during_a_rotation(worker: Worker) -> None:
    worker.intake.keys = StaticKeys(b"n" * 32, previous=KEY)
    leader = await Leader.connect(worker, term=1, key=KEY)
    leader.send(protocol.Dispatch(id=1, pod=make_pod("p").json()))
    assert (await leader.next(protocol.Ack)).id == 1
    await leader.close()
    worker.intake.keys = StaticKeys(b"n" * 32)  # the grace ended
    stale, _ = await Leader.open(worker, term=1, key=KEY)
    assert await eof_within(stale.reader, TIMEOUT) == b""
    await stale.close()


async def test_a_tampered_frame_closes_the_stream(worker: Worker) -> None:
    leader = await Leader.connect(worker, term=1)
    assert leader.session is not None
    frame = bytearray(leader.session.seal(protocol.Dispatch(id=1, pod=make_pod("p").json())))
    frame[-3] ^= 0x01  # one bit of the pod
    leader.writer.write(bytes(frame))
    assert await leader.closed()
    assert "default/p" not in worker.sched.queue  # type: ignore[operator]
    await leader.close()


async def test_a_replayed_frame_closes_the_stream(worker: Worker) -> None:
    leader = await Leader.connect(worker, term=1)
    assert leader.session is not None
    frame = leader.session.seal(protocol.Dispatch(id=1, pod=make_pod("p").json()))
    leader.writer.write(frame)
    await leader.next(protocol.Ack)
    leader.writer.write(frame)  # the same bytes again: their sequence number is used up
    assert await leader.closed()
    await leader.close()


async def test_a_replayed_hello_never_takes_the_stream(worker: Worker) -> None:
    real = await Leader.connect(worker, term=1)
    reader, writer = await asyncio.open_connection(*worker.address)
    writer.write(real.hello_frame)  # captured off the wire: it verifies, and gets a WELCOME ...
    # ... but the replayer cannot MAC the first session frame (it lacks the key): closed at the timeout
    await eof_within(reader, TIMEOUT)
    writer.close()
    real.send(protocol.Ping(ts=7))
    assert (await real.next(protocol.Pong)).ts == 7
    assert worker.intake.failed_handshakes == 1
    await real.close()


async def test_a_frame_before_the_welcome_is_not_a_session_frame(worker: Worker) -> None:
    leader, _ = await Leader.open(worker, term=1)
    # a frame sealed for some other session (or by someone without the session key) is refused
    other = protocol.Session(KEY, hello_nonce=b"a" * 16, welcome_nonce=b"b" * 16, leader=True)
    leader.writer.write(other.seal(protocol.Dispatch(id=1, pod=make_pod("p").json())))
    await eof_within(leader.reader, TIMEOUT)
    assert worker.results.stream is None and "default/p" not in worker.sched.queue  # type: ignore[operator]
    await leader.close()


async def test_a_newer_protocol_version_is_refused(worker: Worker) -> None:
    body = msgpack.packb(
        {"v": protocol.VERSION + 1, "t": "hello", "leader": "l", "term": 1, "nonce": protocol.new_nonce()}
    )
    mac = hmac.new(KEY, b"hello" + body, hashlib.sha256).digest()  # correctly authenticated
    reader, writer = await asyncio.open_connection(*worker.address)
    writer.write(struct.pack(">I", len(mac) + len(body)) + mac + body)
    assert await eof_within(reader, TIMEOUT) == b""
    writer.close()
    assert worker.intake.failed_handshakes == 1


async def test_an_oversized_hello_is_refused_before_its_body(worker: Worker) -> None:
    reader, writer = await asyncio.open_connection(*worker.address)
    writer.write(struct.pack(">I", protocol.MAX_HANDSHAKE_FRAME + 1))  # no body follows
    assert await eof_within(reader, 0.4) == b""  # before the handshake timeout: refused on the length
    writer.close()


async def test_a_silent_connection_is_closed_at_the_hello_timeout(worker: Worker) -> None:
    reader, writer = await asyncio.open_connection(*worker.address)
    t0 = asyncio.get_running_loop().time()
    assert await eof_within(reader, TIMEOUT) == b""
    assert asyncio.get_running_loop().time() - t0 >= protocol.HELLO_TIMEOUT * 0.9
    writer.close()


async def test_a_full_handshake_table_closes_its_oldest_silent_connection(
    worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(protocol, "HELLO_TIMEOUT", 5.0)  # no slot frees itself meanwhile, however loaded
    idle = [await asyncio.open_connection(*worker.address) for _ in range(4)]  # the cap is 4 here
    await asyncio.sleep(0.05)
    leader = await Leader.connect(worker, term=1)  # the newcomer is served ...
    assert (
        await eof_within(idle[0][0], 0.3) == b""
    )  # ... and the oldest silent one closed, not at its timeout
    await asyncio.sleep(0.05)
    assert not any(r.at_eof() for r, _ in idle[1:])  # only that one
    assert worker.intake.refused_connections == 1 and worker.intake.failed_handshakes == 0
    assert worker.results.stream is not None
    for _, w in idle:
        w.close()
    await leader.close()


async def test_a_leader_gets_in_through_a_flood_of_idle_connections(worker: Worker) -> None:
    """Peers that open connections and never speak, as fast as they are closed, do not keep the elected
    leader from connecting (refusing newcomers at the cap did: a few idle sockets per HELLO timeout sufficed)."""
    opened: list[asyncio.StreamWriter] = []
    overflowing = asyncio.Event()  # the cap (4) is full, and newcomers have evicted

    async def flood() -> None:
        while True:
            _, w = await asyncio.open_connection(*worker.address)
            opened.append(w)
            if len(opened) >= 8:
                overflowing.set()
            await asyncio.sleep(0.005)

    flooding = asyncio.create_task(flood())
    try:
        async with asyncio.timeout(TIMEOUT):
            await overflowing.wait()
        for _ in range(3):  # a leader that lost its stream reconnects, again and again
            leader = await Leader.connect(worker, term=1)
            assert worker.results.stream is not None
            await leader.close()
    finally:
        flooding.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flooding
        for w in opened:
            w.close()
    assert worker.intake.refused_connections >= 4


async def holding(worker: Worker, hello: bytes, nonce: bytes) -> Leader:
    """A connection that sent ``hello`` (a replay, say), got the WELCOME, and sends nothing more."""
    reader, writer = await asyncio.open_connection(*worker.address)
    writer.write(hello)
    async with asyncio.timeout(TIMEOUT):
        await protocol.read_reply(reader, KEY, nonce)
    return Leader(reader, writer)


async def test_unverified_connections_go_first_then_the_oldest_verified(
    worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A HELLO verified under our key with the elected term protects its connection while unverified ones are
    left to close; a table of verified ones (replays of a leader's HELLO: they verify, but the replayer cannot
    send the first session frame) still makes room for a newcomer, so replays cannot lock the leader out."""
    monkeypatch.setattr(protocol, "HELLO_TIMEOUT", 5.0)  # no slot frees itself meanwhile, however loaded
    recorded, nonce = await Leader.open(worker, term=1)  # the HELLO a passive listener captured
    hello = recorded.hello_frame
    await recorded.close()
    holder = await holding(worker, hello, nonce)
    silent = [await asyncio.open_connection(*worker.address) for _ in range(3)]  # the cap (4) is full
    await asyncio.sleep(0.05)
    leader = await Leader.connect(worker, term=1)
    assert await eof_within(silent[0][0], 0.3) == b""  # the oldest unverified one, not the older holder
    await asyncio.sleep(0.05)
    assert not holder.reader.at_eof() and not any(r.at_eof() for r, _ in silent[1:])
    await leader.close()
    for _, w in silent:
        w.close()
    await holder.close()
    await asyncio.sleep(0.05)

    replays = [await holding(worker, hello, nonce) for _ in range(4)]  # every slot held by a verified replay
    leader = await Leader.connect(worker, term=1)  # the leader still gets in ...
    assert await replays[0].closed()  # ... and the oldest replay made room
    await asyncio.sleep(0.05)
    assert not any(r.reader.at_eof() for r in replays[1:])
    await leader.close()
    for r in replays:
        await r.close()


async def test_a_flood_from_one_address_does_not_push_out_anothers_connection(
    worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader's connection is the oldest in a full table, its HELLO not yet read, when a flood from
    another address arrives: the flood's own oldest connections make room, not the leader's."""
    monkeypatch.setattr(protocol, "HELLO_TIMEOUT", 5.0)  # no slot frees itself meanwhile, however loaded
    reader, writer = await asyncio.open_connection(*worker.address)  # from 127.0.0.1, HELLO still to come
    await asyncio.sleep(0.05)
    flood = [await asyncio.open_connection(*worker.address, local_addr=("127.0.0.2", 0)) for _ in range(8)]
    await asyncio.sleep(0.05)
    assert worker.intake.refused_connections == 5  # 1 + 8 connections, 4 slots
    nonce = protocol.new_nonce()
    writer.write(protocol.seal_hello(KEY, protocol.Hello(leader="l", term=1, nonce=nonce)))
    async with asyncio.timeout(TIMEOUT):
        welcome = await protocol.read_reply(reader, KEY, nonce)
    assert welcome.term == 1
    writer.close()
    for _, w in flood:
        w.close()


async def test_another_schedulers_pod_is_refused_and_never_queued(worker: Worker) -> None:
    leader = await Leader.connect(worker, term=1)
    leader.send(protocol.Dispatch(id=5, pod=make_pod("p").scheduler("default-scheduler").json()))
    result = await leader.next(protocol.Result)
    assert (result.id, result.outcome) == (5, protocol.REJECTED)
    assert "default-scheduler" in result.message
    assert "default/p" not in worker.sched.queue and worker.intake.foreign_pods == 1  # type: ignore[operator]
    await leader.close()


async def test_results_carry_the_uid_and_only_answer_for_the_dispatched_pod(worker: Worker) -> None:
    leader = await Leader.connect(worker, term=1)
    new = make_pod("p").json()
    new["metadata"]["uid"] = "uid-new"
    leader.send(protocol.Dispatch(id=6, pod=new))
    await leader.next(protocol.Ack)
    old = make_pod("p").json()
    old["metadata"]["uid"] = "uid-old"
    # a binding of the pod's predecessor (same name) finishing now does not answer for the new pod
    worker.results.bound(pod_from_json(old), NodeName("n1"), assumed_at=1.0, bound_at=2.0)
    assert worker.results.pending == {"default/p": (6, "uid-new")}
    worker.results.bound(pod_from_json(new), NodeName("n1"), assumed_at=1.0, bound_at=2.0)
    result = await leader.next(protocol.Result)
    assert (result.id, result.uid, result.outcome) == (6, "uid-new", protocol.BOUND)
    await leader.close()


async def test_a_stream_whose_term_is_no_longer_elected_is_closed(worker: Worker) -> None:
    leader = await Leader.connect(worker, term=1)
    worker.elected[0] = None  # the mirror lost sight of the election: keep the stream
    await asyncio.sleep(3 * protocol.CAPACITY_INTERVAL)
    leader.send(protocol.Ping(ts=1))
    assert (await leader.next(protocol.Pong)).ts == 1
    worker.elected[0] = 2  # another leader's key is now the lowest
    assert await leader.closed()
    for _ in range(int(TIMEOUT / 0.01)):  # the worker's side of the close follows ours
        if worker.results.stream is None:
            break
        await asyncio.sleep(0.01)
    assert worker.results.stream is None
    await leader.close()


async def test_an_unchanged_capacity_summary_is_sent_only_as_the_heartbeat(
    worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(protocol, "HEARTBEAT_INTERVAL", 3600.0)  # no heartbeat within this test
    leader = await Leader.connect(worker, term=1)
    first = await leader.next(protocol.Capacity)
    assert first.free_cpu == 4000
    # Nothing changes: many capacity intervals pass without a summary (PONG is the next frame).
    await asyncio.sleep(5 * protocol.CAPACITY_INTERVAL)
    leader.send(protocol.Ping(ts=2.0))
    assert (await leader.next(protocol.Pong)).ts == 2.0
    assert leader.capacity is None  # ``next`` remembers any summary it skipped: there was none
    # A change is sent at the next interval.
    worker.sched.cache.upsert_node(make_node("n1", cpu="8").record())
    assert (await leader.next(protocol.Capacity)).free_cpu == 8000
    await leader.close()


async def test_an_unchanged_capacity_summary_still_goes_out_as_the_heartbeat(
    worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(protocol, "HEARTBEAT_INTERVAL", 2 * protocol.CAPACITY_INTERVAL)
    leader = await Leader.connect(worker, term=1)
    first = await leader.next(protocol.Capacity)
    again = await leader.next(protocol.Capacity)  # nothing changed: sent as the stream's heartbeat
    assert dataclasses.replace(again, ts=first.ts) == first
    await leader.close()


async def resting_leader(worker: Worker, monkeypatch: pytest.MonkeyPatch) -> Leader:
    """A leader's stream whose capacity check has come to rest: no heartbeat within the test, quiet after two
    capacity intervals, the first summary read and five intervals passed."""
    monkeypatch.setattr(protocol, "HEARTBEAT_INTERVAL", 3600.0)
    monkeypatch.setattr(intake_module, "CAPACITY_QUIET", 2 * protocol.CAPACITY_INTERVAL)
    leader = await Leader.connect(worker, term=1)
    await leader.next(protocol.Capacity)
    await asyncio.sleep(5 * protocol.CAPACITY_INTERVAL)  # quiet by now
    return leader


async def test_at_rest_the_capacity_check_waits_for_a_poke(
    worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After ``CAPACITY_QUIET`` with nothing changed the check stops running; a change of the index (its
    summary going stale pokes the intake) is still sent at once."""
    checks = [0]
    capacity = worker.intake.capacity

    def counted() -> protocol.Capacity:
        checks[0] += 1
        return capacity()

    monkeypatch.setattr(worker.intake, "capacity", counted)
    leader = await resting_leader(worker, monkeypatch)
    at_rest = checks[0]
    await asyncio.sleep(5 * protocol.CAPACITY_INTERVAL)
    assert checks[0] == at_rest  # no check ran at rest
    worker.sched.cache.upsert_node(make_node("n1", cpu="8").record())
    assert (await leader.next(protocol.Capacity)).free_cpu == 8000
    await leader.close()


async def test_at_rest_a_poke_closes_a_stream_whose_term_is_no_longer_elected(
    worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The election mirror's change pokes the intake (``CoordinatedWorker``): a resting check runs at once."""
    leader = await resting_leader(worker, monkeypatch)
    worker.elected[0] = 2
    await asyncio.sleep(3 * protocol.CAPACITY_INTERVAL)
    leader.send(protocol.Ping(ts=1))  # still open: nothing looked
    assert (await leader.next(protocol.Pong)).ts == 1
    worker.intake.poke()
    assert await leader.closed()
    await leader.close()


def test_a_summary_differing_only_in_what_is_shown_is_not_a_change() -> None:
    """The queue's count and the bind rate are only shown (the bind rate slides with the clock): they do not
    make a summary a change; every field the leader decides on does."""
    last = protocol.Capacity(
        nodes=2, free_cpu=4000, free_memory=8, max_cpu=2000, max_memory=4, pending=0, syncing=0,
        binds_per_s=10.0, ts=1.0, placing=True,
    )  # fmt: skip
    assert intake_module._changed(last, None)
    assert not intake_module._changed(dataclasses.replace(last, ts=2.0, pending=3, binds_per_s=0.0), last)
    decided_on: list[protocol.Capacity] = [
        dataclasses.replace(last, nodes=3),
        dataclasses.replace(last, free_cpu=1),
        dataclasses.replace(last, free_memory=1),
        dataclasses.replace(last, max_cpu=1),
        dataclasses.replace(last, max_memory=1),
        dataclasses.replace(last, syncing=1),
        dataclasses.replace(last, placing=False),
    ]
    for changed in decided_on:
        assert intake_module._changed(changed, last), changed
    # The sole worker's leader dispatches nothing: the free amounts are only shown, what ends or keeps the
    # period is still a change
    sole = dataclasses.replace(last, sole=True)
    assert not intake_module._changed(
        dataclasses.replace(sole, free_cpu=1, free_memory=1, max_cpu=1, max_memory=1, ts=2.0), sole, sole=True
    )
    for changed in [
        dataclasses.replace(sole, nodes=3),
        dataclasses.replace(sole, syncing=1),
        dataclasses.replace(sole, placing=False),
        dataclasses.replace(sole, earlier=1),
        dataclasses.replace(last, free_cpu=1),  # the summary before the worker took SOLE
    ]:
        assert intake_module._changed(changed, sole, sole=True), changed
