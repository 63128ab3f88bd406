"""The wire contract: every message survives a round trip, and whatever else arrives is a ProtocolError."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgpack
import pytest

from common import protocol
from common.protocol import (
    Ack,
    Capacity,
    Claims,
    Dispatch,
    Error,
    Hello,
    Message,
    Ping,
    Pong,
    ProtocolError,
    Result,
    Sole,
    Welcome,
    decode,
    encode,
    read_message,
)
from tests.builders import PodBuilder

CANDIDATE = protocol.Candidate(
    node="node-2",
    pdb_violations=0,
    highest_priority=10,
    priority_sum=2 * (10 + 2**31),
    victims=2,
    earliest_start=1700000000.5,
)
POD = PodBuilder("a").req(cpu="100m", memory="1Gi").label("app", "x").obj

MESSAGES: list[Message] = [
    Hello(leader="leader-1", term=7, nonce=b"h" * protocol.NONCE_SIZE),
    Welcome(worker="worker-1", term=7, nonce=b"w" * protocol.NONCE_SIZE),
    Dispatch(1, POD),
    Dispatch(2, POD, min_rv=12345),
    Dispatch(3, POD, preempt="node-2"),
    Ack(1),
    Result.bound(1, "default/a", "node-1"),
    Result.unschedulable(2, "default/a", nodes=3, reasons={"Insufficient cpu": 3}, message="0/3 nodes"),
    Result.unschedulable(
        5,
        "default/a",
        nodes=3,
        reasons={"Insufficient cpu": 3},
        message="0/3 nodes",
        preemption=CANDIDATE,
    ),
    Result.rejected(3, "default/a", "worker cannot place pods now"),
    Result(4, "default/a", protocol.GONE),
    Result.waiting(6, "default/a", "node-2", uid="u-1"),
    Result.unschedulable(
        protocol.CLAIMED, "default/a", nodes=3, reasons={"Insufficient cpu": 3}, message="0/3", uid="u-2"
    ),
    Claims(("worker-1", "worker-2")),
    Claims(()),
    Sole(),
    Capacity(
        nodes=2,
        free_cpu=4000,
        free_memory=8 << 30,
        max_cpu=2000,
        max_memory=4 << 30,
        pending=5,
        syncing=0,
        binds_per_s=12.5,
        ts=1.5,
    ),
    Capacity(
        nodes=2,
        free_cpu=4000,
        free_memory=8 << 30,
        max_cpu=2000,
        max_memory=4 << 30,
        pending=0,
        syncing=0,
        binds_per_s=0.0,
        ts=1.5,
        earlier=1,
        revision=17,
        sole=True,
    ),
    Ping(ts=1.25),
    Pong(ts=1.25),
    Error("bye"),
]


def body(message: Message) -> bytes:
    frame = encode(message)
    (size,) = struct.unpack(">I", frame[:4])
    assert size == len(frame) - 4
    return frame[4:]


def raw(message: Message) -> dict[str, Any]:
    fields: dict[str, Any] = msgpack.unpackb(body(message), raw=False)
    return fields


def pack(fields: Any) -> bytes:
    packed: bytes = msgpack.packb(fields, use_bin_type=True)
    return packed


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip(message: Message) -> None:
    assert decode(body(message)) == message


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
async def test_read_message_reads_one_frame_at_a_time(message: Message) -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(encode(message) + encode(Ack(99)))
    reader.feed_eof()
    assert await read_message(reader) == message
    assert await read_message(reader) == Ack(99)
    with pytest.raises(asyncio.IncompleteReadError):
        await read_message(reader)


def test_numbers_sent_as_integers_decode_as_floats() -> None:
    fields = raw(Ping(ts=2.0))
    fields["ts"] = 2
    message = decode(pack(fields))
    assert message == Ping(2.0) and isinstance(message, Ping) and isinstance(message.ts, float)


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_unknown_fields_are_ignored(message: Message) -> None:
    fields = raw(message)
    fields["added_by_a_newer_peer"] = {"nested": [1, 2]}
    assert decode(pack(fields)) == message


def test_frames_without_version_are_accepted_except_hello_and_welcome() -> None:
    fields = raw(Ack(5))
    del fields["v"]
    assert decode(pack(fields)) == Ack(5)
    fields["v"] = protocol.VERSION + 1  # only HELLO and WELCOME carry the version that counts
    assert decode(pack(fields)) == Ack(5)


@pytest.mark.parametrize("message", [MESSAGES[0], MESSAGES[1]], ids=["hello", "welcome"])
@pytest.mark.parametrize("version", [0, 1, 2, 3, 4, 5, 6, 7, 9, "8", None, True, 1.5])
def test_version_mismatch_in_hello_and_welcome(message: Message, version: Any) -> None:
    fields = raw(message)
    fields["v"] = version
    with pytest.raises(ProtocolError, match="version"):
        decode(pack(fields))


@pytest.mark.parametrize("message", [MESSAGES[0], MESSAGES[1]], ids=["hello", "welcome"])
def test_hello_and_welcome_without_version(message: Message) -> None:
    fields = raw(message)
    del fields["v"]
    with pytest.raises(ProtocolError):
        decode(pack(fields))


def _missing_field_cases() -> list[Any]:
    cases = []
    for message in MESSAGES:
        for name in raw(message):
            if name in ("v", "t") and not isinstance(message, Hello | Welcome):
                continue
            cases.append(pytest.param(message, name, id=f"{type(message).__name__}-{name}"))
    return cases


@pytest.mark.parametrize(("message", "name"), _missing_field_cases())
def test_missing_field(message: Message, name: str) -> None:
    fields = raw(message)
    del fields[name]
    with pytest.raises(ProtocolError):
        decode(pack(fields))


WRONG_VALUES: dict[str, list[Any]] = {
    "int": ["1", 1.5, True, None, [1], {"a": 1}, b"1"],
    "float": ["1.0", True, None, [1.0], b"x"],
    "str": [1, 1.5, True, None, ["x"], {"x": 1}, b"x"],
    "nonce": ["x" * 16, b"x" * 15, b"x" * 17, 1, None],
    "bool": [1, 0, "true", None],
}
FIELD_KINDS: dict[str, str] = {
    "leader": "str",
    "worker": "str",
    "term": "int",
    "id": "int",
    "key": "str",
    "node": "str",
    "nodes": "int",
    "message": "str",
    "free_cpu": "int",
    "free_memory": "int",
    "max_cpu": "int",
    "max_memory": "int",
    "pending": "int",
    "syncing": "int",
    "binds_per_s": "float",
    "ts": "float",
    "outcome": "str",
    "uid": "str",
    "nonce": "nonce",
    "placing": "bool",
    "preempt": "str",
}


def _wrong_type_cases() -> list[Any]:
    cases = []
    for message in MESSAGES:
        for name in raw(message):
            kind = FIELD_KINDS.get(name)
            if kind is None:
                continue
            for i, value in enumerate(WRONG_VALUES[kind]):
                cases.append(pytest.param(message, name, value, id=f"{type(message).__name__}-{name}-{i}"))
    return cases


@pytest.mark.parametrize(("message", "name", "value"), _wrong_type_cases())
def test_wrong_field_type(message: Message, name: str, value: Any) -> None:
    fields = raw(message)
    fields[name] = value
    with pytest.raises(ProtocolError):
        decode(pack(fields))


@pytest.mark.parametrize(
    "reasons",
    [[], "x", 3, {"Insufficient cpu": "3"}, {"Insufficient cpu": True}, {"a": 1.5}, {1: 2}, {"a": None}],
)
def test_bad_result_reasons(reasons: Any) -> None:
    fields = raw(Result.unschedulable(2, "default/a", nodes=3, reasons={"x": 3}, message="0/3 nodes"))
    fields["reasons"] = reasons
    with pytest.raises(ProtocolError):
        decode(pack(fields))


@pytest.mark.parametrize("outcome", ["placed", "", "BOUND"])
def test_unknown_result_outcome(outcome: str) -> None:
    fields = raw(Result.bound(1, "default/a", "node-1"))
    fields["outcome"] = outcome
    with pytest.raises(ProtocolError, match="outcome"):
        decode(pack(fields))


def _with(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    pod: dict[str, Any] = msgpack.unpackb(pack(POD), raw=False)
    cur = pod
    for key in path[:-1]:
        cur = cur.setdefault(key, {})
    cur[path[-1]] = value
    return pod


BAD_PODS: list[Any] = [
    pytest.param([POD], id="list"),
    pytest.param("pod", id="string"),
    pytest.param(None, id="null"),
    pytest.param({}, id="empty"),
    pytest.param(_with(("metadata",), "x"), id="metadata-string"),
    pytest.param(_with(("metadata",), None) | {"metadata": None}, id="metadata-null"),
    pytest.param(_with(("metadata", "name"), 5), id="name-int"),
    pytest.param(_with(("metadata", "name"), ""), id="name-empty"),
    pytest.param(_with(("metadata", "namespace"), ["default"]), id="namespace-list"),
    pytest.param(_with(("metadata", "uid"), 12), id="uid-int"),
    pytest.param(_with(("metadata", "labels"), ["a"]), id="labels-list"),
    pytest.param(_with(("metadata", "labels"), {"a": 1}), id="label-value-int"),
    pytest.param(_with(("metadata", "annotations"), "x"), id="annotations-string"),
    pytest.param(_with(("metadata", "deletionTimestamp"), 1), id="deletion-int"),
    pytest.param(_with(("spec",), [1]), id="spec-list"),
    pytest.param(_with(("spec", "schedulingGates"), 3), id="gates-int"),
    pytest.param(_with(("spec", "nodeName"), 3), id="nodename-int"),
    pytest.param(_with(("spec", "schedulerName"), {"a": 1}), id="schedulername-map"),
    pytest.param(_with(("status",), "Pending"), id="status-string"),
    pytest.param(_with(("status", "phase"), 1), id="phase-int"),
    pytest.param(_with(("spec", "containers"), [{"name": b"bytes"}]), id="nested-bytes"),
    pytest.param(_with(("spec", "nested"), {"deep": {"er": msgpack.ExtType(5, b"x")}}), id="nested-ext"),
]


@pytest.mark.parametrize("pod", BAD_PODS)
def test_garbage_pod(pod: Any) -> None:
    fields = raw(Dispatch(1, POD))
    fields["pod"] = pod
    with pytest.raises(ProtocolError):
        decode(pack(fields))


def test_deeply_nested_pod() -> None:
    deep: dict[str, Any] = {}
    cur = deep
    for _ in range(protocol._MAX_DEPTH + 10):
        cur["x"] = {}
        cur = cur["x"]
    fields = raw(Dispatch(1, POD))
    fields["pod"] = _with(("spec", "deep"), deep)
    with pytest.raises(ProtocolError):
        decode(pack(fields))


def test_nesting_is_allowed_exactly_to_the_depth_limit() -> None:
    # the pod map is the first container, spec the second: a chain of n maps under spec.deep is n + 2 deep
    for depth, ok in ((protocol._MAX_DEPTH - 2, True), (protocol._MAX_DEPTH - 1, False)):
        deep: Any = 1
        for _ in range(depth):
            deep = {"x": deep}
        fields = raw(Dispatch(1, POD))
        fields["pod"] = _with(("spec", "deep"), deep)
        if ok:
            assert isinstance(decode(pack(fields)), Dispatch)
        else:
            with pytest.raises(ProtocolError):
                decode(pack(fields))


def _json_like_reference(value: Any, depth: int = 1) -> bool:
    """The definition, recursively: maps with string keys, lists, and JSON scalars; containers at most
    ``_MAX_DEPTH`` deep (``depth``: how deep ``value`` is as a container)."""
    if value is None or isinstance(value, str | int | float | bool):
        return True
    if not isinstance(value, list | dict) or depth > protocol._MAX_DEPTH:
        return False
    if isinstance(value, list):
        return all(_json_like_reference(v, depth + 1) for v in value)
    return all(isinstance(k, str) and _json_like_reference(v, depth + 1) for k, v in value.items())


def test_the_json_check_agrees_with_its_definition() -> None:
    import random

    rng = random.Random(4)
    # what a msgpack decode can give besides JSON (no tuple: arrays decode as lists), and a set
    odd: list[Any] = [b"x", {1: 2}, {b"k": 2}, msgpack.ExtType(1, b""), msgpack.Timestamp(1, 0), set()]

    def value(depth: int) -> Any:
        # Random trees for the shapes, cut at 70 levels: each container has 1.05 children on average, so a
        # cut-off near the depth limit grows them exponentially (gigabytes). The chains below reach the limit.
        r = rng.random()
        if depth > 70 or r < 0.3:
            return rng.choice(odd) if rng.random() < 0.03 else rng.choice([1, "a", None, True, 1.5])
        if r < 0.65:
            return [value(depth + 1) for _ in range(rng.randint(0, 3))]
        return {str(i): value(depth + 1) for i in range(rng.randint(0, 3))}

    def chain(n: int, leaf: Any) -> Any:
        for i in range(n):
            leaf = [leaf] if i % 2 else {"k": leaf}
        return leaf

    for i in range(5000):
        v = value(0) if i % 2 else chain(rng.randint(248, 258), rng.choice([1, [], {}, [1], {"a": 1}, *odd]))
        assert protocol._json_like(v) == _json_like_reference(v), v


@pytest.mark.parametrize(
    "value", [pytest.param(-1, id="negative"), pytest.param("7", id="string"), pytest.param(True, id="bool")]
)
def test_bad_min_rv(value: Any) -> None:
    fields = raw(Dispatch(1, POD, min_rv=5))
    fields["min_rv"] = value
    with pytest.raises(ProtocolError):
        decode(pack(fields))


def test_dispatch_without_min_rv_is_refused() -> None:
    """A version-2 DISPATCH (no ``min_rv``) is not read as "no wait": the field is required."""
    fields = raw(Dispatch(1, POD))
    del fields["min_rv"]
    with pytest.raises(ProtocolError):
        decode(pack(fields))


def test_bad_spec_content_is_not_a_protocol_error() -> None:
    """Bad quantities and the like are the pod's problem, reported by the worker as a parse error."""
    pod = PodBuilder("a").req(cpu="lots").obj
    message = decode(body(Dispatch(1, pod)))
    assert isinstance(message, Dispatch) and message.pod == pod


NOT_MESSAGES: list[Any] = [
    pytest.param(b"", id="empty"),
    pytest.param(b"\xc1", id="reserved-byte"),
    pytest.param(b"\x82\xa1t", id="truncated"),
    pytest.param(b"\xd9\x03\xff\xfe\xfd", id="invalid-utf8"),
    pytest.param(pack({"t": "ack", "id": 1}) + b"\x00", id="trailing-bytes"),
    pytest.param(pack([1, 2]), id="array"),
    pytest.param(pack("ack"), id="string"),
    pytest.param(pack(7), id="int"),
    pytest.param(pack(None), id="nil"),
    pytest.param(pack({1: "ack"}), id="int-key"),
    pytest.param(pack({"id": 1}), id="no-type"),
    pytest.param(pack({"t": "launch", "id": 1}), id="unknown-type"),
    pytest.param(pack({"t": 3, "id": 1}), id="int-type"),
    pytest.param(pack({"t": ["ack"], "id": 1}), id="list-type"),
    pytest.param(pack({"t": b"ack", "id": 1}), id="bytes-type"),
    pytest.param(pack(msgpack.ExtType(1, b"x")), id="ext"),
    pytest.param(b"\x91" * 100_000 + b"\xc0", id="deep-arrays"),
    pytest.param(pack({"t": "claims"}), id="claims-without-workers"),
    pytest.param(pack({"t": "claims", "workers": "worker-1"}), id="claims-workers-string"),
    pytest.param(pack({"t": "claims", "workers": ["worker-1", 2]}), id="claims-workers-int"),
    pytest.param(pack({"t": "claims", "workers": [""]}), id="claims-workers-empty-id"),
    pytest.param(
        pack({"t": "claims", "workers": ["w"] * (protocol.MAX_CLAIMANTS + 1)}), id="claims-too-many"
    ),
]


@pytest.mark.parametrize("data", NOT_MESSAGES)
def test_not_a_message(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode(data)


@pytest.mark.parametrize("data", NOT_MESSAGES)
async def test_read_message_maps_garbage_to_protocol_error(data: bytes) -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(struct.pack(">I", len(data)) + data)
    reader.feed_eof()
    with pytest.raises(ProtocolError):
        await read_message(reader)


async def test_oversized_frame_is_refused_before_its_body_arrives() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(struct.pack(">I", protocol.MAX_FRAME + 1))  # no body follows: reading it would hang
    with pytest.raises(ProtocolError, match="exceeds"):
        await asyncio.wait_for(read_message(reader), 1.0)


def test_oversized_body_is_refused_by_decode() -> None:
    with pytest.raises(ProtocolError, match="exceeds"):
        decode(b"\x00" * (protocol.MAX_FRAME + 1))


def test_encode_refuses_an_oversized_message() -> None:
    huge = PodBuilder("a").label("big", "x" * protocol.MAX_FRAME).obj
    with pytest.raises(ProtocolError, match="exceeds"):
        encode(Dispatch(1, huge))


async def test_truncated_frame_is_end_of_stream() -> None:
    frame = encode(Ack(1))
    reader = asyncio.StreamReader()
    reader.feed_data(frame[:-1])
    reader.feed_eof()
    with pytest.raises(asyncio.IncompleteReadError):
        await read_message(reader)


# ----- encoding what msgpack cannot hold -----------------------------------------------------------------


def _deep(levels: int) -> dict[str, Any]:
    top: dict[str, Any] = {}
    node = top
    for _ in range(levels):
        node["a"] = {}
        node = node["a"]
    return top


@pytest.mark.parametrize(
    "message",
    [
        pytest.param(Ack(2**64), id="id-beyond-uint64"),
        pytest.param(Ack(-(2**63) - 1), id="id-below-int64"),
        pytest.param(
            Hello(leader="l", term=2**70, nonce=b"n" * protocol.NONCE_SIZE), id="term-beyond-uint64"
        ),
        pytest.param(
            Dispatch(1, {"metadata": {"name": "a"}, "spec": {"n": 10**5000}}), id="pod-int-5000-digits"
        ),
        pytest.param(Dispatch(1, {"metadata": {"name": "a"}, "spec": {"o": object()}}), id="pod-object"),
        pytest.param(Dispatch(1, _deep(100_000)), id="pod-nested-100000-deep"),
        pytest.param(Result.unschedulable(1, "k", nodes=2**64, reasons={}, message=""), id="result-nodes"),
        pytest.param(
            Result.unschedulable(1, "k", nodes=1, reasons={"r": 2**64}, message=""), id="result-reason"
        ),
    ],
)
def test_what_msgpack_cannot_hold_is_a_protocol_error_when_encoding(message: Message) -> None:
    with pytest.raises(ProtocolError, match="cannot be encoded"):
        encode(message)


def test_capacity_sums_beyond_64_bits_saturate_at_int64() -> None:
    # A shard of nodes each at the int64 edge (common.quantity allows it) sums beyond msgpack's range.
    huge = 3 * (2**63 - 1)
    frame = encode(Capacity(3, huge, huge, 2**63 - 1, 2**63 - 1, 0, 0, 0.0, 1.0))
    decoded = decode(frame[4:])
    assert isinstance(decoded, Capacity)
    assert decoded.free_cpu == decoded.free_memory == 2**63 - 1
    negative = decode(encode(Capacity(1, -huge, 0, 0, 0, 0, 0, 0.0, 1.0))[4:])
    assert isinstance(negative, Capacity) and negative.free_cpu == -(2**63)


def test_a_result_without_id_is_refused_as_any_missing_field() -> None:
    fields = raw(Result.bound(1, "default/a", "node-1"))
    del fields["id"]
    with pytest.raises(ProtocolError, match="'id'"):
        decode(pack(fields))


def _with_candidate(**changes: Any) -> bytes:
    fields = raw(MESSAGES[[isinstance(m, Result) and m.preemption is not None for m in MESSAGES].index(True)])
    fields["preemption"] = {**fields["preemption"], **changes}
    return pack(fields)


@pytest.mark.parametrize(
    "changes",
    [
        {"node": ""},
        {"node": "n" * 254},
        {"node": 1},
        {"victims": 0},
        {"victims": -1},
        {"victims": protocol.MAX_VICTIMS + 1},
        {"victims": True},
        {"pdb_violations": 3},  # more violations than victims
        {"pdb_violations": -1},
        {"highest_priority": 2**31},
        {"highest_priority": -(2**31) - 1},
        {"priority_sum": 10 + 2**31 - 1},  # less than the highest victim alone
        {"priority_sum": 2 * (10 + 2**31) + 1},  # more than every victim at the highest priority
        {"priority_sum": 1.5},
        {"earliest_start": float("nan")},
        {"earliest_start": float("inf")},
        {"earliest_start": "now"},
    ],
    ids=repr,
)
def test_hostile_preemption_candidate(changes: dict[str, Any]) -> None:
    """A summary no dry run can produce is refused, so it never steers the leader's choice."""
    with pytest.raises(ProtocolError):
        decode(_with_candidate(**changes))


@pytest.mark.parametrize("value", [[], "x", 1, True, b"x"])
def test_preemption_that_is_not_a_map(value: Any) -> None:
    fields = raw(MESSAGES[[isinstance(m, Result) and m.preemption is not None for m in MESSAGES].index(True)])
    fields["preemption"] = value
    with pytest.raises(ProtocolError):
        decode(pack(fields))


@pytest.mark.parametrize("outcome", [protocol.BOUND, protocol.GONE, protocol.REJECTED, protocol.WAITING])
def test_only_an_unschedulable_result_carries_a_candidate(outcome: str) -> None:
    fields = raw(MESSAGES[[isinstance(m, Result) and m.preemption is not None for m in MESSAGES].index(True)])
    fields["outcome"] = outcome
    with pytest.raises(ProtocolError):
        decode(pack(fields))


def test_candidate_missing_a_field() -> None:
    for name in ("node", "pdb_violations", "highest_priority", "priority_sum", "victims", "earliest_start"):
        fields = raw(
            MESSAGES[[isinstance(m, Result) and m.preemption is not None for m in MESSAGES].index(True)]
        )
        del fields["preemption"][name]
        with pytest.raises(ProtocolError):
            decode(pack(fields))


def test_extreme_but_consistent_candidates_survive() -> None:
    lowest = protocol.Candidate("n", 0, protocol.PRIORITY_MIN, 0, 1, 0.0)
    highest = protocol.Candidate(
        "n",
        protocol.MAX_VICTIMS,
        protocol.PRIORITY_MAX,
        protocol.MAX_VICTIMS * (2**32 - 1),
        protocol.MAX_VICTIMS,
        -1.0,
    )
    for c in (lowest, highest):
        message = Result.unschedulable(1, "default/a", nodes=1, reasons={}, message="", preemption=c)
        assert decode(body(message)) == message


def test_a_version_3_dispatch_or_result_is_refused() -> None:
    """``preempt`` and ``preemption`` are required: a version-3 peer would ignore them."""
    for message, name in (
        (Dispatch(1, POD), "preempt"),
        (Result(4, "default/a", protocol.GONE), "preemption"),
    ):
        fields = raw(message)
        del fields[name]
        with pytest.raises(ProtocolError):
            decode(pack(fields))


def test_candidate_rank_follows_kube_order() -> None:
    base = CANDIDATE
    fewer_violations = protocol.Candidate("a", 0, 99, 2 * (99 + 2**31), 2, 0.0)
    violating = protocol.Candidate("b", 1, 1, 2 * (1 + 2**31), 2, 0.0)
    assert fewer_violations.rank() < violating.rank()
    lower = protocol.Candidate("c", 0, 5, 2 * (5 + 2**31), 2, 0.0)
    assert lower.rank() < base.rank()
    later = protocol.Candidate(base.node, 0, 10, base.priority_sum, 2, base.earliest_start + 1)
    assert later.rank() < base.rank()
