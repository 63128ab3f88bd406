"""The dispatch wire protocol between the coordinator leader and worker processes.

Transport: one TCP stream per worker. The worker listens (its address is in its etcd membership record); the
leader connects. A new leader simply connects again; a worker accepts one leader stream at a time and drops
an older one when a newer leader (higher ``term``) says HELLO.

Framing: each message is a 4-byte big-endian unsigned length, then that many bytes of one msgpack map.
Frames over ``MAX_FRAME`` bytes are a protocol error (the stream is closed). Every map has:
    ``v``: protocol version (``VERSION``); a peer refuses a different major version with ERROR and closes.
    ``t``: the message type, one of the constants below.

Leader -> worker
    HELLO     {leader, term}                   first frame; ``term`` is the leader's election revision
    DISPATCH  {id, pod}                        place this pod (the API object as the leader saw it)
    PING      {ts}                             heartbeat, every ``HEARTBEAT_INTERVAL``
Worker -> leader
    WELCOME   {worker, term}                   answer to HELLO
    ACK       {id}                             the pod is in the worker's queue (not yet placed)
    RESULT    {id, key, outcome, node, nodes, reasons, message}
              outcome: "bound" (node set), "unschedulable" (no owned node fits; ``nodes`` is how many
              nodes were considered, ``reasons`` maps kube-scheduler reasons to node counts), "gone" (the pod
              was deleted), "rejected" (the worker cannot take pods now, e.g. fenced or draining)
    CAPACITY  {nodes, free_cpu, free_memory, max_cpu, max_memory, pending, syncing, binds_per_s, ts}
              a compact summary of the worker's shard, every ``CAPACITY_INTERVAL``: totals of free
              millicores/bytes over usable owned nodes, and the largest free amounts on one node (a pod
              larger than ``max_*`` cannot fit this shard); ``syncing`` counts granted nodes not usable
              yet (the worker's cache is catching up with them)
    PONG      {ts}                             answer to PING
Either way
    ERROR     {message}                        then the sender closes the stream

Acks and duplicates: the leader keeps every dispatched pod until a RESULT (or the pod is seen bound by its
own watch). If the stream breaks, or no PONG/CAPACITY arrives for ``DEAD_AFTER``, the leader re-dispatches
that worker's pods elsewhere. A pod dispatched twice is harmless: the API server refuses the second binding
with 409 and the worker's cache confirms the first.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgpack

VERSION = 1
MAX_FRAME = 16 * 1024 * 1024
HEARTBEAT_INTERVAL = 1.0
CAPACITY_INTERVAL = 0.1
DEAD_AFTER = 5.0

HELLO = "hello"
WELCOME = "welcome"
DISPATCH = "dispatch"
ACK = "ack"
RESULT = "result"
CAPACITY = "capacity"
PING = "ping"
PONG = "pong"
ERROR = "error"

BOUND = "bound"
UNSCHEDULABLE = "unschedulable"
GONE = "gone"
REJECTED = "rejected"

_HEADER = struct.Struct(">I")


class ProtocolError(Exception):
    """Raised for a malformed frame, an oversized frame, or a peer speaking another protocol version."""


def encode(kind: str, **fields: Any) -> bytes:
    body: bytes = msgpack.packb({"v": VERSION, "t": kind, **fields}, use_bin_type=True)
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"{kind} message of {len(body)} bytes exceeds {MAX_FRAME}")
    return _HEADER.pack(len(body)) + body


async def read_message(reader: asyncio.StreamReader) -> dict[str, Any]:
    """Read one message. Raises ``asyncio.IncompleteReadError`` at end of stream, ``ProtocolError`` on garbage."""
    header = await reader.readexactly(_HEADER.size)
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ProtocolError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    body = await reader.readexactly(size)
    try:
        msg = msgpack.unpackb(body, raw=False)
    except (msgpack.UnpackException, ValueError) as e:
        raise ProtocolError(f"undecodable frame: {e}") from e
    if not isinstance(msg, dict) or "t" not in msg:
        raise ProtocolError("frame is not a message map")
    if msg.get("v") != VERSION:
        raise ProtocolError(f"protocol version {msg.get('v')!r} is not {VERSION}")
    return msg
