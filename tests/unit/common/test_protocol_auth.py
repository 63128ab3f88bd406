"""The sealed framing: the handshake binds both nonces and the key, every session frame is bound to its
direction and position, and anything else is a ProtocolError before its body is decoded."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import struct

import pytest

from common import protocol
from common.protocol import Ack, Dispatch, Hello, Ping, ProtocolError, Session, Welcome

KEY = b"k" * 32
HN, WN = b"h" * protocol.NONCE_SIZE, b"w" * protocol.NONCE_SIZE


def reader_of(*frames: bytes, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    for frame in frames:
        reader.feed_data(frame)
    if eof:
        reader.feed_eof()
    return reader


def pair(key: bytes = KEY) -> tuple[Session, Session]:
    return (
        Session(key, hello_nonce=HN, welcome_nonce=WN, leader=True),
        Session(key, hello_nonce=HN, welcome_nonce=WN, leader=False),
    )


async def test_session_frames_travel_both_ways_in_order() -> None:
    leader, worker = pair()
    frames = [leader.seal(Ping(1.0)), leader.seal(Dispatch(1, {"metadata": {"name": "a"}}))]
    reader = reader_of(*frames)
    assert await worker.read(reader) == Ping(1.0)
    assert await worker.read(reader) == Dispatch(1, {"metadata": {"name": "a"}})
    assert await leader.read(reader_of(worker.seal(Ack(1)))) == Ack(1)


def test_session_macs_are_the_documented_hmacs() -> None:
    # The wire format, computed from the module docstring alone: S = HMAC(K, "session" | hello nonce |
    # welcome nonce), each frame's MAC = HMAC(S, direction | seq (8 bytes, big-endian) | body). Both ends
    # must agree with it frame after frame, whatever state a session keeps between frames.
    session_key = hmac.new(KEY, b"session" + HN + WN, hashlib.sha256).digest()
    leader, worker = pair()
    messages: list[protocol.Message] = [Ping(1.0), Ack(3), Dispatch(4, {"metadata": {"name": "a"}}), Ack(5)]
    for seq, message in enumerate(messages):
        for side, direction in ((leader, b"L"), (worker, b"W")):
            frame = side.seal(message)
            (size,) = struct.unpack(">I", frame[:4])
            mac, body = frame[4 : 4 + protocol.MAC_SIZE], frame[4 + protocol.MAC_SIZE :]
            assert size == len(frame) - 4 and body == protocol.pack(message)
            expected = hmac.new(session_key, direction + seq.to_bytes(8, "big") + body, hashlib.sha256)
            assert mac == expected.digest()


async def test_a_tampered_body_fails() -> None:
    leader, worker = pair()
    frame = bytearray(leader.seal(Ack(7)))
    frame[-1] ^= 0x01
    with pytest.raises(ProtocolError, match="not authenticated"):
        await worker.read(reader_of(bytes(frame)))


async def test_a_tampered_mac_fails() -> None:
    leader, worker = pair()
    frame = bytearray(leader.seal(Ack(7)))
    frame[4] ^= 0x80
    with pytest.raises(ProtocolError, match="not authenticated"):
        await worker.read(reader_of(bytes(frame)))


async def test_another_key_fails() -> None:
    leader, _ = pair(b"other" * 8)
    _, worker = pair()
    with pytest.raises(ProtocolError):
        await worker.read(reader_of(leader.seal(Ack(1))))


async def test_replayed_reordered_and_reflected_frames_fail() -> None:
    leader, worker = pair()
    first, second = leader.seal(Ack(1)), leader.seal(Ack(2))
    reader = reader_of(first, first)
    await worker.read(reader)
    with pytest.raises(ProtocolError):  # replay: its sequence number is used up
        await worker.read(reader)
    _, fresh = pair()
    with pytest.raises(ProtocolError):  # reordered: frame 1 where frame 0 is due
        await fresh.read(reader_of(second))
    with pytest.raises(ProtocolError):  # reflected: a leader frame sent back to the leader
        await pair()[0].read(reader_of(pair()[0].seal(Ack(1))))


async def test_frames_of_another_stream_fail() -> None:
    other = Session(KEY, hello_nonce=HN, welcome_nonce=b"x" * protocol.NONCE_SIZE, leader=True)
    _, worker = pair()
    with pytest.raises(ProtocolError):
        await worker.read(reader_of(other.seal(Ack(1))))


async def test_the_handshake_picks_the_key_that_verifies() -> None:
    hello = Hello("l", 3, HN)
    got, key = await protocol.read_hello(reader_of(protocol.seal_hello(b"old" * 8, hello)), [KEY, b"old" * 8])
    assert got == hello and key == b"old" * 8
    with pytest.raises(ProtocolError, match="not authenticated"):
        await protocol.read_hello(reader_of(protocol.seal_hello(b"zzz" * 8, hello)), [KEY, b"old" * 8])


async def test_the_answer_is_bound_to_its_hello() -> None:
    welcome = Welcome("w", 3, WN)
    frame = protocol.seal_reply(KEY, HN, welcome)
    assert await protocol.read_reply(reader_of(frame), KEY, HN) == welcome
    with pytest.raises(ProtocolError, match="not authenticated"):
        await protocol.read_reply(reader_of(frame), KEY, b"z" * protocol.NONCE_SIZE)
    refusal = protocol.seal_reply(KEY, HN, protocol.Error("term 3 is not the elected leader's"))
    with pytest.raises(ProtocolError, match="refused: term 3"):
        await protocol.read_reply(reader_of(refusal), KEY, HN)


async def test_a_first_frame_that_is_not_hello_is_refused() -> None:
    body = protocol.pack(Ack(1))
    mac = hmac.new(KEY, b"hello" + body, hashlib.sha256).digest()
    with pytest.raises(ProtocolError, match="expected hello"):
        await protocol.read_hello(reader_of(struct.pack(">I", 32 + len(body)) + mac + body), [KEY])


@pytest.mark.parametrize(
    ("header", "limit"),
    [
        (protocol.MAX_HANDSHAKE_FRAME + 1, protocol.MAX_HANDSHAKE_FRAME),
        (protocol.MAX_FRAME + 1, protocol.MAX_FRAME),
    ],
)
async def test_oversized_frames_are_refused_before_their_body(header: int, limit: int) -> None:
    reader = reader_of(struct.pack(">I", header), eof=False)  # no body follows: reading it would hang
    with pytest.raises(ProtocolError, match="exceeds"):
        await asyncio.wait_for(protocol.read_frame(reader, limit), 1.0)


async def test_a_frame_too_short_for_a_mac_is_refused() -> None:
    with pytest.raises(ProtocolError, match="no MAC"):
        await protocol.read_frame(reader_of(struct.pack(">I", 5) + b"\x00" * 5))


async def test_an_unauthenticated_body_is_never_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    decoded: list[bytes] = []
    monkeypatch.setattr(protocol, "decode", decoded.append)
    _, worker = pair()
    garbage = b"\xc1" * 64
    with pytest.raises(ProtocolError):
        await worker.read(reader_of(struct.pack(">I", 32 + len(garbage)) + b"\x00" * 32 + garbage))
    with pytest.raises(ProtocolError):
        await protocol.read_hello(
            reader_of(struct.pack(">I", 32 + len(garbage)) + b"\x00" * 32 + garbage), [KEY]
        )
    assert decoded == []
