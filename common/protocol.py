"""The dispatch wire protocol between the coordinator leader and worker processes: the one contract both
roles speak, one frozen dataclass per message.

Transport: one TCP stream per worker. The worker listens (its address is in its etcd membership record); the
leader connects. A new leader simply connects again; a worker accepts one leader stream at a time and drops
an older one when a newer leader (higher ``term``) says HELLO.

Framing: each message is a 4-byte big-endian unsigned length, then that many bytes of one msgpack map. The
length is checked against ``MAX_FRAME`` before the body is read, so an oversized frame is refused without
buffering it. Every map carries ``t``, the message type (one of the constants below), and its fields.

Version: ``VERSION`` travels in HELLO and WELCOME (field ``v``); a peer whose HELLO or WELCOME names another
version is refused (the worker answers ERROR and closes; the leader drops the stream). ``encode`` also writes
``v`` into every other frame because peers of the first protocol release check it per frame; ``decode``
reads it only in HELLO and WELCOME.

Leader -> worker
    HELLO     {v, leader, term}                first frame; ``term`` is the leader's election revision
    DISPATCH  {id, pod}                        place this pod (the API object as the leader saw it)
    PING      {ts}                             heartbeat, every ``HEARTBEAT_INTERVAL``
Worker -> leader
    WELCOME   {v, worker, term}                answer to HELLO
    ACK       {id}                             the pod is in the worker's queue (not yet placed)
    RESULT    {id, key, outcome, node, nodes, reasons, message}
              outcome: "bound" (node set), "unschedulable" (no owned node fits; ``nodes`` is how many
              nodes were considered, ``reasons`` maps kube-scheduler reasons to node counts), "gone" (the pod
              was deleted), "rejected" (the worker cannot take pods now, e.g. fenced or draining; sent
              instead of ACK)
    CAPACITY  {nodes, free_cpu, free_memory, max_cpu, max_memory, pending, syncing, binds_per_s, ts}
              a compact summary of the worker's shard, every ``CAPACITY_INTERVAL``: totals of free
              millicores/bytes over usable owned nodes, and the largest free amounts on one node (a pod
              larger than ``max_*`` cannot fit this shard); ``syncing`` counts granted nodes not usable
              yet (the worker's cache is catching up with them)
    PONG      {ts}                             answer to PING
Either way
    ERROR     {message}                        then the sender closes the stream

Encoding: ``encode`` raises ``ProtocolError`` and nothing else for a message it cannot write (an integer
beyond msgpack's 64 bits, a pod holding a value msgpack has no type for, nesting too deep, a frame over
``MAX_FRAME``). CAPACITY is the exception, as a summary: its integer fields are sums over a shard's nodes that
can exceed 64 bits even though each node's amount fits int64 (``common.quantity``), so they saturate at int64
rather than fail; "more than any pod can ask" is all the leader needs to read from them.

Decoding: ``decode`` (and ``read_message``, which frames it) returns one of the message classes or raises
``ProtocolError``, and nothing else, whatever the bytes: undecodable msgpack, a body that is not a map, an
unknown ``t``, a missing field or one of the wrong type (a bool is not an int, an int is not a string), an
unknown RESULT outcome, or a DISPATCH ``pod`` that is not a JSON object with a named ``metadata`` map and
well-shaped ``metadata``/``spec``/``status`` maps. Fields a message does not declare are ignored, so a newer
peer may add fields and still talk to an older one; removing or retyping a field needs a new ``VERSION``.

Flow control (ACK): the leader keeps at most ``MAX_UNACKED`` dispatches per worker stream that the worker has
not yet acknowledged with ACK (or answered with RESULT); a worker whose window is full is not chosen until an
ACK frees a slot. This bounds what a slow or stalled worker can have buffered in its socket and lets the
others take the burst.

Acks and duplicates: the leader keeps every dispatched pod until a RESULT (or the pod is seen bound by its
own watch). If the stream breaks, or no frame arrives for ``DEAD_AFTER``, the leader re-dispatches that
worker's pods elsewhere. A pod dispatched twice is harmless: the API server refuses the second binding with
409 and the worker's cache confirms the first. A RESULT whose id the leader no longer tracks is ignored.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgpack

VERSION: Final = 1
MAX_FRAME: Final = 16 * 1024 * 1024
HEARTBEAT_INTERVAL: Final = 1.0
CAPACITY_INTERVAL: Final = 0.1
DEAD_AFTER: Final = 5.0
MAX_UNACKED: Final = 256  # dispatches per worker stream awaiting ACK; see "Flow control" above

HELLO: Final = "hello"
WELCOME: Final = "welcome"
DISPATCH: Final = "dispatch"
ACK: Final = "ack"
RESULT: Final = "result"
CAPACITY: Final = "capacity"
PING: Final = "ping"
PONG: Final = "pong"
ERROR: Final = "error"

Outcome = Literal["bound", "unschedulable", "gone", "rejected"]
BOUND: Final = "bound"
UNSCHEDULABLE: Final = "unschedulable"
GONE: Final = "gone"
REJECTED: Final = "rejected"
OUTCOMES: Final[frozenset[str]] = frozenset({BOUND, UNSCHEDULABLE, GONE, REJECTED})

_HEADER = struct.Struct(">I")


class ProtocolError(Exception):
    """Raised for a malformed frame, an oversized frame, or a peer speaking another protocol version. The
    stream it came from is closed."""


# ----- messages ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    leader: str
    term: int
    version: int = VERSION


@dataclass(frozen=True, slots=True)
class Welcome:
    worker: str
    term: int
    version: int = VERSION


@dataclass(frozen=True, slots=True)
class Dispatch:
    id: int
    pod: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Ack:
    id: int


@dataclass(frozen=True, slots=True)
class Result:
    id: int
    key: str
    outcome: Outcome
    node: str = ""
    nodes: int = 0
    reasons: Mapping[str, int] = field(default_factory=dict)
    message: str = ""

    @classmethod
    def bound(cls, dispatch_id: int, key: str, node: str) -> Result:
        return cls(dispatch_id, key, BOUND, node=node)

    @classmethod
    def unschedulable(
        cls, dispatch_id: int, key: str, *, nodes: int, reasons: Mapping[str, int], message: str
    ) -> Result:
        return cls(dispatch_id, key, UNSCHEDULABLE, nodes=nodes, reasons=dict(reasons), message=message)

    @classmethod
    def rejected(cls, dispatch_id: int, key: str, message: str) -> Result:
        return cls(dispatch_id, key, REJECTED, message=message)


@dataclass(frozen=True, slots=True)
class Capacity:
    nodes: int
    free_cpu: int
    free_memory: int
    max_cpu: int
    max_memory: int
    pending: int
    syncing: int
    binds_per_s: float
    ts: float


@dataclass(frozen=True, slots=True)
class Ping:
    ts: float


@dataclass(frozen=True, slots=True)
class Pong:
    ts: float


@dataclass(frozen=True, slots=True)
class Error:
    message: str


Message = Hello | Welcome | Dispatch | Ack | Result | Capacity | Ping | Pong | Error


# ----- encoding ------------------------------------------------------------------------------------------


def _fields(message: Message) -> tuple[str, dict[str, Any]]:
    match message:
        case Hello(leader, term, version):
            return HELLO, {"v": version, "leader": leader, "term": term}
        case Welcome(worker, term, version):
            return WELCOME, {"v": version, "worker": worker, "term": term}
        case Dispatch(dispatch_id, pod):
            return DISPATCH, {"id": dispatch_id, "pod": pod}
        case Ack(dispatch_id):
            return ACK, {"id": dispatch_id}
        case Result(dispatch_id, key, outcome, node, nodes, reasons, text):
            return RESULT, {
                "id": dispatch_id,
                "key": key,
                "outcome": outcome,
                "node": node,
                "nodes": nodes,
                "reasons": dict(reasons),
                "message": text,
            }
        case Capacity():
            return CAPACITY, {
                "nodes": message.nodes,
                "free_cpu": message.free_cpu,
                "free_memory": message.free_memory,
                "max_cpu": message.max_cpu,
                "max_memory": message.max_memory,
                "pending": message.pending,
                "syncing": message.syncing,
                "binds_per_s": message.binds_per_s,
                "ts": message.ts,
            }
        case Ping(ts):
            return PING, {"ts": ts}
        case Pong(ts):
            return PONG, {"ts": ts}
        case Error(text):
            return ERROR, {"message": text}


_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


def _saturated(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return min(max(value, _INT64_MIN), _INT64_MAX)
    return value


def encode(message: Message) -> bytes:
    """One frame (length header and body) for ``message``. Raises ``ProtocolError`` if it cannot be encoded
    or exceeds ``MAX_FRAME`` (see "Encoding" above)."""
    kind, fields = _fields(message)
    if kind == CAPACITY:
        fields = {name: _saturated(value) for name, value in fields.items()}
    try:
        body: bytes = msgpack.packb({"v": VERSION, "t": kind, **fields}, use_bin_type=True)
    except (OverflowError, ValueError, TypeError, RecursionError) as e:
        raise ProtocolError(f"{kind} message cannot be encoded: {type(e).__name__}: {e}") from e
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"{kind} message of {len(body)} bytes exceeds {MAX_FRAME}")
    return _HEADER.pack(len(body)) + body


# ----- decoding ------------------------------------------------------------------------------------------


def _get(m: Mapping[str, Any], name: str) -> Any:
    try:
        return m[name]
    except KeyError:
        raise ProtocolError(f"{m.get('t')} message lacks {name!r}") from None


def _int(m: Mapping[str, Any], name: str) -> int:
    value = _get(m, name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolError(f"{m['t']}.{name} is not an integer: {value!r}")
    return value


def _float(m: Mapping[str, Any], name: str) -> float:
    value = _get(m, name)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ProtocolError(f"{m['t']}.{name} is not a number: {value!r}")
    return float(value)


def _str(m: Mapping[str, Any], name: str) -> str:
    value = _get(m, name)
    if not isinstance(value, str):
        raise ProtocolError(f"{m['t']}.{name} is not a string: {value!r}")
    return value


def _version(m: Mapping[str, Any]) -> int:
    version = _get(m, "v")
    if version != VERSION or isinstance(version, bool):
        raise ProtocolError(f"protocol version {version!r} is not {VERSION}")
    return VERSION


def _reasons(m: Mapping[str, Any]) -> dict[str, int]:
    value = _get(m, "reasons")
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(n, int) and not isinstance(n, bool) for k, n in value.items()
    ):
        raise ProtocolError(f"result.reasons is not a map of reason to count: {value!r}")
    return value


def _outcome(m: Mapping[str, Any]) -> Outcome:
    value = _str(m, "outcome")
    if value == BOUND:
        return BOUND
    if value == UNSCHEDULABLE:
        return UNSCHEDULABLE
    if value == GONE:
        return GONE
    if value == REJECTED:
        return REJECTED
    raise ProtocolError(f"unknown result outcome {value!r}")


def _json_like(value: Any, depth: int = 0) -> bool:
    """True for what a JSON document can hold: maps with string keys, lists, strings, numbers, bools, null."""
    if depth > 64:
        return False
    if value is None or isinstance(value, str | int | float | bool):
        return True
    if isinstance(value, list):
        return all(_json_like(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_like(v, depth + 1) for k, v in value.items())
    return False


def _optional_map(obj: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = obj.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProtocolError(f"dispatch.pod.{name} is not a map")
    return value


def _pod(m: Mapping[str, Any]) -> dict[str, Any]:
    """The pod object, shaped so that ``common.records.pod_from_json`` can read it (it reports bad spec
    content itself, as ``parse_error``; what it cannot survive is refused here)."""
    pod = _get(m, "pod")
    if not isinstance(pod, dict) or not _json_like(pod):
        raise ProtocolError("dispatch.pod is not a JSON object")
    meta = _optional_map(pod, "metadata")
    spec = _optional_map(pod, "spec")
    status = _optional_map(pod, "status")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ProtocolError("dispatch.pod has no metadata.name")
    for where, obj, keys in (
        ("metadata", meta, ("namespace", "uid", "resourceVersion", "deletionTimestamp")),
        ("spec", spec, ("schedulerName", "nodeName")),
        ("status", status, ("phase",)),
    ):
        for key in keys:
            if obj.get(key) is not None and not isinstance(obj[key], str):
                raise ProtocolError(f"dispatch.pod.{where}.{key} is not a string")
    for key in ("labels", "annotations"):
        value = meta.get(key)
        if value is not None and (
            not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values())
        ):
            raise ProtocolError(f"dispatch.pod.metadata.{key} is not a map of strings")
    gates = spec.get("schedulingGates")
    if gates is not None and not isinstance(gates, list):
        raise ProtocolError("dispatch.pod.spec.schedulingGates is not a list")
    return pod


_DECODERS: dict[str, Callable[[Mapping[str, Any]], Message]] = {
    HELLO: lambda m: Hello(_str(m, "leader"), _int(m, "term"), _version(m)),
    WELCOME: lambda m: Welcome(_str(m, "worker"), _int(m, "term"), _version(m)),
    DISPATCH: lambda m: Dispatch(_int(m, "id"), _pod(m)),
    ACK: lambda m: Ack(_int(m, "id")),
    RESULT: lambda m: Result(
        _int(m, "id"),
        _str(m, "key"),
        _outcome(m),
        node=_str(m, "node"),
        nodes=_int(m, "nodes"),
        reasons=_reasons(m),
        message=_str(m, "message"),
    ),
    CAPACITY: lambda m: Capacity(
        nodes=_int(m, "nodes"),
        free_cpu=_int(m, "free_cpu"),
        free_memory=_int(m, "free_memory"),
        max_cpu=_int(m, "max_cpu"),
        max_memory=_int(m, "max_memory"),
        pending=_int(m, "pending"),
        syncing=_int(m, "syncing"),
        binds_per_s=_float(m, "binds_per_s"),
        ts=_float(m, "ts"),
    ),
    PING: lambda m: Ping(_float(m, "ts")),
    PONG: lambda m: Pong(_float(m, "ts")),
    ERROR: lambda m: Error(_str(m, "message")),
}


def decode(body: bytes) -> Message:
    """The message in one frame body (without its length header). Raises ``ProtocolError`` for anything that
    is not a well-formed message of this protocol version."""
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(body)} bytes exceeds {MAX_FRAME}")
    try:
        raw = msgpack.unpackb(body, raw=False)
    except (msgpack.UnpackException, ValueError, TypeError, RecursionError) as e:
        raise ProtocolError(f"undecodable frame: {e}") from e
    if not isinstance(raw, dict):
        raise ProtocolError("frame is not a message map")
    kind = raw.get("t")
    decoder = _DECODERS.get(kind) if isinstance(kind, str) else None
    if decoder is None:
        raise ProtocolError(f"unknown message type {kind!r}")
    return decoder(raw)


async def read_message(reader: asyncio.StreamReader) -> Message:
    """Read one frame and decode it. Raises ``asyncio.IncompleteReadError`` at end of stream and
    ``ProtocolError`` for a malformed or oversized frame (the size is checked before the body is read)."""
    header = await reader.readexactly(_HEADER.size)
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ProtocolError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    return decode(await reader.readexactly(size))
