"""One worker link against an in-process worker stand-in on a local socket: HELLO first, typed messages to
the owner, and a broken stream (ERROR, garbage, close) reported as link_down before it connects again."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator

import pytest

from common import protocol
from common.keyring import StaticKeys
from coordinator.dispatch import links
from coordinator.dispatch.links import Inbound, Link, Transport

CAPACITY = protocol.Capacity(
    nodes=1,
    free_cpu=1000,
    free_memory=1,
    max_cpu=1000,
    max_memory=1,
    pending=0,
    syncing=0,
    binds_per_s=0.0,
    ts=0.0,
)


class Events:
    def __init__(self) -> None:
        self.log: list[str] = []
        self.messages: list[Inbound] = []
        self.changed = asyncio.Event()

    def link_up(self, link: Transport) -> None:
        self.log.append("up")
        self.changed.set()

    def received(self, link: Transport, message: Inbound) -> None:
        self.messages.append(message)
        self.changed.set()

    def link_down(self, link: Transport) -> None:
        self.log.append("down")
        self.changed.set()

    async def until(self, predicate: str) -> None:
        async with asyncio.timeout(5):
            while predicate not in self.log:
                self.changed.clear()
                await self.changed.wait()


class WorkerStandIn:
    """Accepts leader streams; each one is handed to the test as (reader, writer)."""

    def __init__(self) -> None:
        self.streams: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self.streams.put((reader, writer))

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    async def accept(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        async with asyncio.timeout(5):
            return await self.streams.get()


@pytest.fixture
async def worker() -> AsyncIterator[tuple[WorkerStandIn, str]]:
    stand_in = WorkerStandIn()
    address = await stand_in.start()
    yield stand_in, address
    assert stand_in.server is not None
    stand_in.server.close()


@pytest.fixture(autouse=True)
def fast_reconnect(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(links, "CONNECT_RETRY", 0.01)


async def welcome(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, keys: list[bytes] | None = None
) -> tuple[protocol.Hello, protocol.Session]:
    """Play the worker's side of the handshake; returns the HELLO and the worker's session (after the
    leader's first session frame, a PING, has been read and verified)."""
    hello, key = await protocol.read_hello(reader, keys or [b""])
    nonce = protocol.new_nonce()
    writer.write(protocol.seal_reply(key, hello.nonce, protocol.Welcome("w1", hello.term, nonce)))
    session = protocol.Session(key, hello_nonce=hello.nonce, welcome_nonce=nonce, leader=False)
    assert isinstance(await session.read(reader), protocol.Ping)
    return hello, session


async def link_up(
    stand_in: WorkerStandIn, address: str, events: Events, *, leader_id: str = "l", term: int = 1
) -> tuple[Link, asyncio.StreamReader, asyncio.StreamWriter, protocol.Session]:
    """A started link whose stream the stand-in welcomed: the link, the worker's reader and writer, its
    session. The caller stops the link."""
    link = Link("w1", address, events, leader_id=leader_id, term=term).start()
    try:
        reader, writer = await stand_in.accept()
        _, session = await welcome(reader, writer)
        await events.until("up")
    except BaseException:
        link.stop()
        raise
    return link, reader, writer, session


async def test_hello_then_typed_messages_then_reconnect_after_error(
    worker: tuple[WorkerStandIn, str],
) -> None:
    stand_in, address = worker
    events = Events()
    link = Link("w1", address, events, leader_id="leader-1", term=9).start()
    try:
        reader, writer = await stand_in.accept()
        hello, session = await welcome(reader, writer)
        assert (hello.leader, hello.term) == ("leader-1", 9)
        await events.until("up")
        assert link.connected
        writer.write(session.seal(CAPACITY))
        writer.write(session.seal(protocol.Ack(1)))
        writer.write(session.seal(protocol.Result.bound(1, "default/a", "n1")))
        writer.write(session.seal(protocol.Pong(1.0)))
        await writer.drain()
        async with asyncio.timeout(5):
            while len(events.messages) < 3:
                events.changed.clear()
                await events.changed.wait()
        assert events.messages == [CAPACITY, protocol.Ack(1), protocol.Result.bound(1, "default/a", "n1")]
        link.send(protocol.Dispatch(2, {"metadata": {"name": "b"}}))
        assert await session.read(reader) == protocol.Dispatch(2, {"metadata": {"name": "b"}})
        writer.write(session.seal(protocol.Error("fenced")))
        await writer.drain()
        await events.until("down")
        assert not link.connected
        reader2, writer2 = await stand_in.accept()  # it connects again, with HELLO first
        await welcome(reader2, writer2)
        writer.close()
        writer2.close()
    finally:
        link.stop()


async def test_frames_sent_together_go_out_in_one_write(
    worker: tuple[WorkerStandIn, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Frames sent within ``protocol.COALESCE`` of the first are one write on the stream, in order, even when
    loop passes end between them (longer here than in production, so the test does not race a busy host's
    clock)."""
    monkeypatch.setattr(protocol, "COALESCE", 0.2)
    stand_in, address = worker
    events = Events()
    link, reader, writer, session = await link_up(stand_in, address, events)
    try:
        assert link._outbox is not None
        stream = link._outbox.writer
        written: list[bytes] = []
        write = stream.write

        def logged(data: bytes) -> None:
            written.append(bytes(data))
            write(data)

        monkeypatch.setattr(stream, "write", logged)
        sent = [protocol.Dispatch(i, {"metadata": {"name": f"p{i}"}}) for i in (1, 2, 3)]
        link.send(sent[0])
        await asyncio.sleep(0.05)  # the loop passes that ended meanwhile wrote nothing
        assert written == []
        for message in sent[1:]:
            link.send(message)
        async with asyncio.timeout(5):
            assert [await session.read(reader) for _ in sent] == sent
        assert len(written) == 1
        writer.close()
    finally:
        link.stop()


async def test_the_link_is_up_only_after_a_welcome_under_its_key(worker: tuple[WorkerStandIn, str]) -> None:
    stand_in, address = worker
    events = Events()
    key = b"k" * 32
    link = Link("w1", address, events, leader_id="l", term=1, keys=StaticKeys(key)).start()
    writers: list[asyncio.StreamWriter] = []
    try:
        reader, writer = await stand_in.accept()
        writers.append(writer)
        with pytest.raises(protocol.ProtocolError, match="not authenticated"):
            await protocol.read_hello(reader, [b"wrong" * 8])
        writer.close()
        # a WELCOME under another key, or bound to another HELLO, is refused: the link never comes up
        for reply_key, bound_to in ((b"x" * 32, None), (key, protocol.new_nonce())):
            reader, writer = await stand_in.accept()
            writers.append(writer)
            hello, _ = await protocol.read_hello(reader, [key])
            welcome_frame = protocol.Welcome("w1", 1, protocol.new_nonce())
            writer.write(protocol.seal_reply(reply_key, bound_to or hello.nonce, welcome_frame))
            await writer.drain()
        reader, writer = await stand_in.accept()
        writers.append(writer)
        await welcome(reader, writer, [key])
        await events.until("up")
        assert events.log == ["up"]
    finally:
        link.stop()
        for w in writers:
            w.close()


async def test_a_refusing_worker_is_retried(worker: tuple[WorkerStandIn, str]) -> None:
    stand_in, address = worker
    events = Events()
    link = Link("w1", address, events, leader_id="l", term=1).start()
    try:
        reader, writer = await stand_in.accept()
        hello, key = await protocol.read_hello(reader, [b""])
        writer.write(protocol.seal_reply(key, hello.nonce, protocol.Error("term 1 is not the elected one")))
        await writer.drain()
        writer.close()
        reader, writer = await stand_in.accept()  # connects again
        await welcome(reader, writer)
        await events.until("up")
        writer.close()
    finally:
        link.stop()


@pytest.mark.parametrize(
    "garbage",
    [
        struct.pack(">I", 3) + b"\xc1\xc1\xc1",
        struct.pack(">I", protocol.MAX_FRAME + 1),
        struct.pack(">I", 40) + b"\x00" * 40,
    ],
    ids=["too-short", "oversized", "bad-mac"],
)
async def test_garbage_from_a_worker_breaks_the_stream(
    worker: tuple[WorkerStandIn, str], garbage: bytes
) -> None:
    stand_in, address = worker
    events = Events()
    link, _reader, writer, _ = await link_up(stand_in, address, events)
    try:
        writer.write(garbage)
        await writer.drain()
        await events.until("down")
        assert events.messages == []
        with contextlib.suppress(ConnectionError):
            writer.close()
    finally:
        link.stop()


async def test_send_on_a_link_never_connected_is_dropped() -> None:
    events = Events()
    link = Link("w1", "127.0.0.1:1", events, leader_id="l", term=1)
    link.send(protocol.Ack(1))
    await link.drain()
    assert not link.connected and events.log == []


async def test_a_worker_that_stops_reading_bounds_drain_and_is_dropped(
    worker: tuple[WorkerStandIn, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(protocol, "DEAD_AFTER", 0.5)
    stand_in, address = worker
    events = Events()
    link, _reader, writer, _ = await link_up(stand_in, address, events)
    try:
        big = {"metadata": {"name": "p", "annotations": {"pad": "x" * 200_000}}}
        assert not link.flush()  # nothing written yet: the dispatch loop does not wait for this link
        for i in range(64):  # ~12 MiB the worker never reads: far beyond the socket buffers
            link.send(protocol.Dispatch(i, big))
        assert link.flush()  # written, and backed up far above the high-water mark: the loop drains it
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await link.drain()
        assert loop.time() - t0 < 10 * links.DRAIN_WAIT  # bounded, not until the worker reads
        await events.until("down")  # nothing came back for DEAD_AFTER: the stream is aborted
        assert not link.connected
        writer.close()
    finally:
        link.stop()


async def test_a_worker_that_keeps_talking_stays_up_past_many_dead_afters(
    worker: tuple[WorkerStandIn, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The liveness deadline is pushed back as frames arrive (not re-armed per frame): a stream whose frames
    # keep coming must outlive many DEAD_AFTER periods, and go down once they stop.
    monkeypatch.setattr(protocol, "DEAD_AFTER", 0.3)
    monkeypatch.setattr(links, "DEADLINE_SLACK", 0.1)
    stand_in, address = worker
    events = Events()
    link, _reader, writer, session = await link_up(stand_in, address, events)
    try:
        for _ in range(40):  # ~2 s of CAPACITY every 50 ms: several DEAD_AFTER + DEADLINE_SLACK periods
            writer.write(session.seal(CAPACITY))
            await writer.drain()
            await asyncio.sleep(0.05)
        assert events.log == ["up"] and link.connected
        assert len(events.messages) == 40
        await events.until("down")  # silent from now on
        assert not link.connected
        writer.close()
    finally:
        link.stop()
