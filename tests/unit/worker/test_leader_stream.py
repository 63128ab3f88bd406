"""The worker's end of a leader stream (a ``protocol.Outbox``, as the leader's end is) writes what it sends
within ``protocol.COALESCE`` of the first frame not yet written in one write, in order, each frame sealed by
the stream's session, even when loop passes end between them; ``drain`` and ``flush`` write at once, and a
flush cancels the one that was due; once discarded it writes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from common import protocol
from worker.intake import LeaderStream

KEY = b"k" * 32
HELLO, WELCOME = b"h" * protocol.NONCE_SIZE, b"w" * protocol.NONCE_SIZE


def session(*, leader: bool) -> protocol.Session:
    return protocol.Session(KEY, hello_nonce=HELLO, welcome_nonce=WELCOME, leader=leader)


@pytest.fixture
async def connected() -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """(the leader's reader, the worker's writer) of one local TCP stream."""
    accepted: asyncio.Queue[asyncio.StreamWriter] = asyncio.Queue()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put(writer)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    reader, leader_writer = await asyncio.open_connection(host, port)
    worker_writer = await accepted.get()
    yield reader, worker_writer
    for writer in (worker_writer, leader_writer):
        writer.close()
        await writer.wait_closed()
    server.close()
    await server.wait_closed()


def counting(writer: asyncio.StreamWriter, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    written: list[bytes] = []
    write = writer.write

    def logged(data: bytes) -> None:
        written.append(bytes(data))
        write(data)

    monkeypatch.setattr(writer, "write", logged)
    return written


ANSWERS: list[protocol.Message] = [
    protocol.Ack(1),
    protocol.Ack(2),
    protocol.Result.bound(1, "default/a", "n1"),
]


async def test_frames_sent_together_are_one_write(
    connected: tuple[asyncio.StreamReader, asyncio.StreamWriter], monkeypatch: pytest.MonkeyPatch
) -> None:
    # longer than in production, so the test does not race a busy host's clock
    monkeypatch.setattr(protocol, "COALESCE", 0.2)
    reader, writer = connected
    written = counting(writer, monkeypatch)
    stream = LeaderStream(writer, session(leader=False), term=1)
    stream.send(ANSWERS[0])
    await asyncio.sleep(0.05)  # the loop passes that ended meanwhile wrote nothing
    assert written == [] and stream.buffered() > 0
    for message in ANSWERS[1:]:
        stream.send(message)
    leader = session(leader=True)
    async with asyncio.timeout(5):
        assert [await leader.read(reader) for _ in ANSWERS] == ANSWERS
    assert len(written) == 1


async def test_drain_writes_at_once(
    connected: tuple[asyncio.StreamReader, asyncio.StreamWriter], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(protocol, "COALESCE", 3600.0)  # only ``drain`` can write them
    reader, writer = connected
    written = counting(writer, monkeypatch)
    stream = LeaderStream(writer, session(leader=False), term=1)
    for message in ANSWERS:
        stream.send(message)
    await stream.drain()
    assert len(written) == 1 and stream.buffered() == 0
    leader = session(leader=True)
    async with asyncio.timeout(5):
        assert [await leader.read(reader) for _ in ANSWERS] == ANSWERS


async def test_frames_sent_after_a_flush_wait_their_own_coalescing_time(
    connected: tuple[asyncio.StreamReader, asyncio.StreamWriter], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the flush that was due for the first frame is cancelled by the explicit flush: it does not write the
    # next frame early (at most one flush is scheduled)
    monkeypatch.setattr(protocol, "COALESCE", 0.3)
    reader, writer = connected
    written = counting(writer, monkeypatch)
    stream = LeaderStream(writer, session(leader=False), term=1)
    stream.send(ANSWERS[0])
    await asyncio.sleep(0.2)
    stream.flush()
    stream.send(ANSWERS[1])
    await asyncio.sleep(0.2)  # past the first frame's due time, not the second's
    assert len(written) == 1
    leader = session(leader=True)
    async with asyncio.timeout(5):
        assert [await leader.read(reader) for _ in ANSWERS[:2]] == ANSWERS[:2]
    assert len(written) == 2


async def test_a_discarded_stream_writes_nothing_more(
    connected: tuple[asyncio.StreamReader, asyncio.StreamWriter], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(protocol, "COALESCE", 0.05)
    _, writer = connected
    written = counting(writer, monkeypatch)
    stream = LeaderStream(writer, session(leader=False), term=1)
    stream.send(ANSWERS[0])
    stream.discard()
    stream.send(ANSWERS[1])
    stream.flush()
    await asyncio.sleep(0.2)  # past every flush that was or would have been due
    assert written == [] and stream.buffered() == 0
