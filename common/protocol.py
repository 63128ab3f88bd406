"""The dispatch wire protocol between the coordinator leader and worker processes: the one contract both
roles speak, one frozen dataclass per message, and the authenticated framing that carries them.

Transport: one TCP stream per worker. The worker listens (its address is in its etcd membership record); the
leader connects. A new leader simply connects again; a worker keeps one leader stream at a time, and only the
stream of the leader etcd currently elects (see "Terms" below).

Framing: each frame is a 4-byte big-endian unsigned length, then a 32-byte MAC, then the body: one msgpack
map. The length covers MAC and body and is checked before either is read: against ``MAX_HANDSHAKE_FRAME``
(a few KiB) for HELLO and the answer to it, which arrive before the peer is authenticated, and against
``MAX_FRAME`` afterwards. The MAC is verified before the body is decoded, so bytes from a peer that does
not hold the secret are never unpacked. Every map carries ``t``, the message type, and its fields.

Authentication (shared secret, HMAC-SHA256): both roles read the same secret from a file
(``common.keyring``); with none configured the key is empty (integrity only: the worker then refuses to
listen beyond loopback unless told ``--insecure-dispatch``). A stream opens with a handshake:
1. leader -> worker  HELLO {v, leader, term, nonce}, MAC = HMAC(K, "hello" | body); ``nonce`` is 16 fresh
   random bytes. The worker tries its current key, then the previous one while the rotation grace lasts;
   the key that verifies is the stream's key K.
2. worker -> leader  WELCOME {v, worker, term, nonce} (the worker's fresh nonce) or ERROR, with
   MAC = HMAC(K, "reply" | hello nonce | body): the answer is bound to this HELLO.
3. Both derive the session key S = HMAC(K, "session" | hello nonce | welcome nonce). Every later frame in
   either direction carries MAC = HMAC(S, direction | seq | body), where direction is "L" (leader to worker)
   or "W" and ``seq`` counts that direction's frames from 0 (8 bytes, big-endian; not sent, each side
   counts). A replayed, reordered, dropped, reflected or tampered frame therefore fails its MAC, and frames
   from another stream (other nonces) never verify.
4. The worker treats the stream as the leader's only after the leader's first session frame (the leader
   sends PING at once) verified: a replayed HELLO gets a WELCOME but can never follow it, and the stream
   currently in use is not touched. The handshake must complete within ``HELLO_TIMEOUT``.
Any frame that fails its MAC, is malformed or oversized, or names another version raises ``ProtocolError``;
the side that reads it closes the stream (the leader connects again).

Terms: HELLO's ``term`` is the create revision of the leader's election key. The worker accepts the stream
only if it equals the lowest create revision under the election prefix in its mirror of etcd, i.e. the
leader etcd elects now (not "the highest term seen", which would lock out a real leader after etcd is
restored or replaced, its revisions restarting low), and it closes a stream whose term etcd no longer elects.

Version: ``VERSION`` travels in HELLO and WELCOME (field ``v``); a peer whose HELLO or WELCOME names another
version is refused. A peer of another framing fails the MAC check of its first frame. Version 3 added
DISPATCH's ``min_rv``: a version-2 worker would ignore it and decide a pod with an inter-pod rule on a view
that may lack a placement the rule depends on, so the two versions must not talk (adding an ignorable field
would not need a new version; this one is not ignorable). Version 4 added preemption across shards (issue 12
item 3): RESULT's ``preemption`` and DISPATCH's ``preempt``. A version-3 worker would ignore ``preempt`` and
answer "no" without ever preempting, and a version-3 leader would ignore the candidates, so both are
required fields and the versions must not talk. Version 5 added RESULT ``waiting``: a version-4 leader would
refuse the unknown outcome and close the stream, and a version-4 worker would never send it (its preempting
pods would be withdrawn after the leader's dispatch timeout and sent to preempt again elsewhere). Version 6
added CLAIMS and the RESULT of a claimed pod (id 0): a version-5 worker would claim nothing, and every pod
the leader counted as claimed would wait for the claim timeout. Version 7 added CAPACITY's ``earlier`` and
``revision``: a new term's leader holds back the pods a placement of an earlier term could make wrong until
every worker has said it binds none (the topology lane's rule 6), and a version-6 worker would never say so
(the leader would hold them for ``LOST_HOLD`` at every term's start). Version 8 added SOLE and CAPACITY's
``sole``: a version-7 worker would ignore SOLE, and the leader, which dispatches nothing over that stream after
it, would leave every pod pending.

Leader -> worker
    HELLO     {v, leader, term, nonce}         first frame
    DISPATCH  {id, pod, min_rv, preempt}       place this pod (the API object as the leader saw it, its
                                               ``metadata.managedFields`` left out), but
                                               decide only once the worker's pod watch has reached
                                               resourceVersion ``min_rv`` (0: at once); see "The topology
                                               lane" in docs/architecture.md. ``preempt``: "" (place it
                                               if it fits), or the name of an owned node whose candidate
                                               this worker reported and the leader chose: if the pod fits
                                               nowhere, re-check that node's victims and preempt there
    CLAIMS    {workers}                        the claim set: the worker ids among which plain pods are claimed
                                               (``common.claims``); sent on every change, and to each new stream
                                               at once. Empty: claim nothing. A worker that has
                                               no stream claims nothing
    SOLE      {}                               the sole worker (on unless ``--no-sole-worker``): the
                                               worker owns the whole pool and is the only one, so it places
                                               every pending pod of ours from its own watch, reports and
                                               preempts as a standalone worker does, until this stream
                                               ends; no DISPATCH follows over this stream. Sent only while
                                               nothing is in flight to it. A worker that cannot (fenced,
                                               draining, a claim set held) closes the stream instead; one
                                               that can answers CAPACITY ``sole``
    PING      {ts}                             heartbeat, every ``HEARTBEAT_INTERVAL`` (and once at once)
Worker -> leader
    WELCOME   {v, worker, term, nonce}         answer to HELLO
    ACK       {id}                             the pod is in the worker's queue (not yet placed)
    RESULT    {id, key, uid, outcome, node, nodes, reasons, message, preemption}
              outcome: "bound" (node set), "unschedulable" (no owned node fits; ``nodes`` is how many
              nodes were considered, ``reasons`` maps kube-scheduler reasons to node counts; ``preemption``
              is nil or the shard's best preemption candidate, a ``Candidate``: {node, pdb_violations,
              highest_priority, priority_sum, victims, earliest_start}, found by a dry run that evicted and
              nominated nothing; only an unschedulable RESULT may carry one), "gone" (the pod
              was deleted), "rejected" (try later: the worker cannot take pods now, e.g. fenced or draining,
              sent instead of ACK; or the binding was refused; or no node fits among those usable while
              granted ones are still catching up; or the pod is not for this scheduler), "waiting" (not
              final: the pod is nominated to ``node``, where this worker has preempted for it, and stays in
              its queue until the victims are gone; its final RESULT follows, and until then the leader
              keeps the dispatch past its usual timeout). ``uid``
              is the pod's uid as the worker saw it, so a pod recreated under the same name is not answered
              for by its predecessor's result. A RESULT with ``id`` 0 (never a dispatch id) is about a pod
              this worker claimed (``common.claims``), outcome "unschedulable" or "rejected" only: the
              worker hands the pod to the leader (a bound claimed pod is not answered: the leader's watch
              shows it).
    CAPACITY  {nodes, free_cpu, free_memory, max_cpu, max_memory, pending, syncing, binds_per_s, ts,
               placing, earlier, revision, sole}
              a compact summary of the worker's shard, when it changed (looked at every
              ``CAPACITY_INTERVAL`` while things move, at once on a change at rest: ``worker.intake``)
              and at least every ``HEARTBEAT_INTERVAL`` (the worker's heartbeat): totals of free
              millicores/bytes over usable owned nodes, and the largest free amounts on one node (a pod
              larger than ``max_*`` cannot fit this shard); ``syncing`` counts granted nodes not usable
              yet (the worker's cache is catching up with them); ``placing`` is false while the worker cannot
              take pods (fenced, draining: ``nodes`` is then 0, but its shard is not known to be empty);
              ``earlier`` counts the pods dispatched or claimed over an earlier stream (of this leader or
              an earlier one) whose binding this worker still has under way, its pod watch not having shown
              it yet (those it had queued or parked it dropped when this stream began); ``revision`` is
              the highest resourceVersion of a pod its pod watch delivered when the summary was made (an
              event's or a listed pod's, never a bookmark's or a list's: every worker's pod watch reaches
              it by its own events): once ``earlier`` is 0, every such binding the watch showed is at or
              below it (an assumption the watch never confirms expires ``binding.assume_ttl`` after the
              binding's answer, 30 s by default, and leaves the count then); ``sole``: the worker took
              the stream's SOLE and places every pending pod of ours itself (it ends it only by ending the
              stream); while it does, a change of the free amounts alone waits for the heartbeat
    PONG      {ts}                             answer to PING
Either way
    ERROR     {message}                        then the sender closes the stream

Encoding: ``pack`` (and ``encode``, ``Session.seal``) raise ``ProtocolError`` and nothing else for a message it cannot write (an integer
beyond msgpack's 64 bits, a pod holding a value msgpack has no type for, nesting too deep, a frame over
``MAX_FRAME``). CAPACITY is the exception, as a summary: its integer fields are sums over a shard's nodes that
can exceed 64 bits even though each node's amount fits int64 (``common.quantity``), so they saturate at int64
rather than fail; "more than any pod can ask" is all the leader needs to read from them.

Decoding: ``decode`` returns one of the message classes or raises ``ProtocolError``, and nothing else,
whatever the bytes: undecodable msgpack, a body that is not a map, an unknown ``t``, a missing field or one
of the wrong type (a bool is not an int, an int is not a string), an unknown RESULT outcome, or a DISPATCH
``pod`` that is not a JSON object with a named ``metadata`` map and well-shaped ``metadata``/``spec``/
``status`` maps. Fields a message does not declare are ignored, so a newer peer may add fields and still
talk to an older one; removing or retyping a field needs a new ``VERSION``. ``encode``/``decode`` and
``read_message`` are the codec under the MAC (unsealed frames); streams use ``Session`` and the handshake
functions.

Flow control (ACK): the leader keeps at most ``MAX_UNACKED`` dispatches per worker stream that the worker has
not yet acknowledged with ACK (or answered with RESULT); a worker whose window is full is not chosen until an
ACK frees a slot. Writers that can pile up wait for ``drain()``: the worker stops reading a leader that does
not read its answers.

Coalescing: each end writes the frames it sends (through an ``Outbox``, the sending half both ends use) at
most ``COALESCE`` after the first of them not yet written, in one write, in order (``drain``, the end of a
dispatch pass, the leader's first PING and a worker's stream being replaced by a newer one write at once). Every frame written wakes the peer's loop and costs both processes a system call: in a burst the leader
sends DISPATCHes and the worker ACKs and RESULTs a few ms apart, so waiting a little turns several writes and
wake-ups into one. For the same reason the leader's dispatch loop, woken by a newly arrived pod, waits
``COALESCE`` for the burst's next pods before its pass. So a new pod's DISPATCH leaves up to ``COALESCE``
after the pod arrived and an answer up to ``COALESCE`` after it was sent; a pod the topology lane holds until
another pod's RESULT waits as much more for each RESULT it waits on. Every deadline of this protocol is
seconds long.

Acks and duplicates: the leader keeps every dispatched pod until a final RESULT (or the pod is seen bound by
its own watch). If the stream breaks, no frame arrives for ``DEAD_AFTER``, or no RESULT arrives within the
leader's dispatch timeout (longer after a RESULT ``waiting``), the leader dispatches the pod again. A pod dispatched twice is harmless: the API
server refuses the second binding with 409 and the worker's cache confirms the first. A RESULT whose id (or
uid) the leader no longer tracks is ignored.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import math
import secrets
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

import msgpack
import orjson

VERSION: Final = 8
MAX_FRAME: Final = 16 * 1024 * 1024
MAX_HANDSHAKE_FRAME: Final = 4096  # HELLO and its answer: read before the peer is authenticated
MAC_SIZE: Final = 32  # HMAC-SHA256
NONCE_SIZE: Final = 16
HELLO_TIMEOUT: Final = 5.0  # connect to first verified session frame
HEARTBEAT_INTERVAL: Final = 1.0
CAPACITY_INTERVAL: Final = 0.1
DEAD_AFTER: Final = 5.0
MAX_UNACKED: Final = 256  # dispatches per worker stream awaiting ACK; see "Flow control" above
# Frames sent within this long of the first unwritten one go out in one write (both ends; see "Coalescing").
COALESCE: Final = 0.005

HELLO: Final = "hello"
WELCOME: Final = "welcome"
DISPATCH: Final = "dispatch"
ACK: Final = "ack"
RESULT: Final = "result"
CLAIMS: Final = "claims"
SOLE: Final = "sole"
CAPACITY: Final = "capacity"
PING: Final = "ping"
PONG: Final = "pong"
ERROR: Final = "error"

Outcome = Literal["bound", "unschedulable", "gone", "rejected", "waiting"]
BOUND: Final = "bound"
UNSCHEDULABLE: Final = "unschedulable"
GONE: Final = "gone"
REJECTED: Final = "rejected"
WAITING: Final = "waiting"  # not final: see the module docstring
OUTCOMES: Final[frozenset[str]] = frozenset({BOUND, UNSCHEDULABLE, GONE, REJECTED, WAITING})

_HEADER = struct.Struct(">I")


class ProtocolError(Exception):
    """Raised for a malformed, oversized or unauthenticated frame, or a peer speaking another protocol
    version. The stream it came from is closed."""


# ----- messages ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    leader: str
    term: int
    nonce: bytes  # NONCE_SIZE fresh random bytes (``new_nonce``)
    version: int = VERSION


@dataclass(frozen=True, slots=True)
class Welcome:
    worker: str
    term: int
    nonce: bytes  # NONCE_SIZE fresh random bytes (``new_nonce``)
    version: int = VERSION


@dataclass(frozen=True, slots=True)
class Dispatch:
    id: int
    pod: dict[str, Any]
    min_rv: int = 0  # decide only once the pod watch has reached this resourceVersion (0: no wait)
    preempt: str = ""  # "" or the owned node the leader chose for this pod's preemption


PRIORITY_MIN: Final = -(2**31)  # a pod's priority is an int32 (PriorityClass.value)
PRIORITY_MAX: Final = 2**31 - 1
MAX_VICTIMS: Final = 1 << 20  # more pods than any node holds
_PRIORITY_OFFSET: Final = 2**31  # as worker.preemption's priority sum: each victim adds priority + 2**31


class Ranked(Protocol):
    """What ranks a preemption candidate: ``Candidate`` on the wire, ``worker.preemption.Summary`` in a shard."""

    @property
    def pdb_violations(self) -> int: ...
    @property
    def highest_priority(self) -> int: ...
    @property
    def priority_sum(self) -> int: ...
    @property
    def victims(self) -> int: ...
    @property
    def earliest_start(self) -> float: ...


def candidate_rank(c: Ranked) -> tuple[int, int, int, int, float]:
    """kube-scheduler's pickOneNodeForPreemption order, one rule for the shard and the leader: smaller is better,
    criterion by criterion -- fewest budget violations, lowest highest priority, smallest sum, fewest victims,
    latest start."""
    return (c.pdb_violations, c.highest_priority, c.priority_sum, c.victims, -c.earliest_start)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One shard's best preemption candidate, what kube-scheduler's pickOneNodeForPreemption compares: the
    node, how many victims violate a PodDisruptionBudget, the highest victim priority, the sum of
    ``priority + 2**31`` over the victims, their number, and the earliest start time (epoch seconds) among
    the highest-priority victims. No pod names cross the wire: the chosen worker finds its victims again."""

    node: str
    pdb_violations: int
    highest_priority: int
    priority_sum: int
    victims: int
    earliest_start: float

    def rank(self) -> tuple[int, int, int, int, float]:
        """Smaller is better (``candidate_rank``)."""
        return candidate_rank(self)


MAX_CLAIMANTS: Final = 4096  # workers in one claim set (far more than a cluster runs)
CLAIMED: Final = 0  # the dispatch id of a RESULT about a claimed pod


@dataclass(frozen=True, slots=True)
class Claims:
    workers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Sole:
    pass


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
    uid: str = ""  # the pod's uid as the worker saw it ("" if it had none)
    preemption: Candidate | None = None  # unschedulable only: the shard's best preemption candidate

    @classmethod
    def bound(cls, dispatch_id: int, key: str, node: str, *, uid: str = "") -> Result:
        return cls(dispatch_id, key, BOUND, node=node, uid=uid)

    @classmethod
    def unschedulable(
        cls,
        dispatch_id: int,
        key: str,
        *,
        nodes: int,
        reasons: Mapping[str, int],
        message: str,
        uid: str = "",
        preemption: Candidate | None = None,
    ) -> Result:
        return cls(
            dispatch_id,
            key,
            UNSCHEDULABLE,
            nodes=nodes,
            reasons=dict(reasons),
            message=message,
            uid=uid,
            preemption=preemption,
        )

    @classmethod
    def rejected(cls, dispatch_id: int, key: str, message: str, *, uid: str = "") -> Result:
        return cls(dispatch_id, key, REJECTED, message=message, uid=uid)

    @classmethod
    def waiting(cls, dispatch_id: int, key: str, node: str, *, uid: str = "") -> Result:
        return cls(dispatch_id, key, WAITING, node=node, uid=uid)


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
    placing: bool = True
    earlier: int = 0  # bindings under way of pods dispatched or claimed over an earlier stream
    revision: int = 0  # the highest resourceVersion of a pod the worker's pod watch delivered
    sole: bool = False  # the worker took this stream's SOLE


@dataclass(frozen=True, slots=True)
class Ping:
    ts: float


@dataclass(frozen=True, slots=True)
class Pong:
    ts: float


@dataclass(frozen=True, slots=True)
class Error:
    message: str


Message = Hello | Welcome | Dispatch | Claims | Sole | Ack | Result | Capacity | Ping | Pong | Error


# ----- encoding ------------------------------------------------------------------------------------------


def _fields(message: Message) -> tuple[str, dict[str, Any]]:
    match message:
        case Hello(leader, term, nonce, version):
            return HELLO, {"v": version, "leader": leader, "term": term, "nonce": nonce}
        case Welcome(worker, term, nonce, version):
            return WELCOME, {"v": version, "worker": worker, "term": term, "nonce": nonce}
        case Dispatch(dispatch_id, pod, min_rv, preempt):
            return DISPATCH, {"id": dispatch_id, "pod": pod, "min_rv": min_rv, "preempt": preempt}
        case Claims(workers):
            return CLAIMS, {"workers": list(workers)}
        case Sole():
            return SOLE, {}
        case Ack(dispatch_id):
            return ACK, {"id": dispatch_id}
        case Result(dispatch_id, key, outcome, node, nodes, reasons, text, uid, preemption):
            return RESULT, {
                "id": dispatch_id,
                "key": key,
                "uid": uid,
                "outcome": outcome,
                "node": node,
                "nodes": nodes,
                "reasons": dict(reasons),
                "message": text,
                "preemption": None
                if preemption is None
                else {
                    "node": preemption.node,
                    "pdb_violations": preemption.pdb_violations,
                    "highest_priority": preemption.highest_priority,
                    "priority_sum": preemption.priority_sum,
                    "victims": preemption.victims,
                    "earliest_start": preemption.earliest_start,
                },
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
                "placing": message.placing,
                "earlier": message.earlier,
                "revision": message.revision,
                "sole": message.sole,
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


def pack(message: Message) -> bytes:
    """The body for ``message`` (no header, no MAC). Raises ``ProtocolError`` if it cannot be encoded or a
    frame would exceed ``MAX_FRAME`` (see "Encoding" above)."""
    kind, fields = _fields(message)
    if kind == CAPACITY:
        fields = {name: _saturated(value) for name, value in fields.items()}
    try:
        body: bytes = msgpack.packb({"v": VERSION, "t": kind, **fields}, use_bin_type=True)
    except (OverflowError, ValueError, TypeError, RecursionError) as e:
        raise ProtocolError(f"{kind} message cannot be encoded: {type(e).__name__}: {e}") from e
    if len(body) + MAC_SIZE > MAX_FRAME:
        raise ProtocolError(f"{kind} message of {len(body)} bytes exceeds {MAX_FRAME}")
    return body


def encode(message: Message) -> bytes:
    """One unsealed frame (length header and body, no MAC): the codec under the MAC, for tests and tools.
    Streams send ``Session.seal`` frames. Raises ``ProtocolError`` if it exceeds ``MAX_FRAME``."""
    body = pack(message)
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


def _bool(m: Mapping[str, Any], name: str) -> bool:
    value = _get(m, name)
    if not isinstance(value, bool):
        raise ProtocolError(f"{m['t']}.{name} is not a boolean: {value!r}")
    return value


def _str(m: Mapping[str, Any], name: str) -> str:
    value = _get(m, name)
    if not isinstance(value, str):
        raise ProtocolError(f"{m['t']}.{name} is not a string: {value!r}")
    return value


def _bytes(m: Mapping[str, Any], name: str, size: int) -> bytes:
    value = _get(m, name)
    if not isinstance(value, bytes) or len(value) != size:
        raise ProtocolError(f"{m['t']}.{name} is not {size} bytes")
    return value


def _revision(m: Mapping[str, Any], name: str) -> int:
    value = _int(m, name)
    if value < 0:
        raise ProtocolError(f"{m['t']}.{name} is negative: {value}")
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
    if value == WAITING:
        return WAITING
    raise ProtocolError(f"unknown result outcome {value!r}")


def _bounded(m: Mapping[str, Any], name: str, low: int, high: int) -> int:
    value = _int(m, name)
    if not low <= value <= high:
        raise ProtocolError(f"{m['t']}.{name} is out of range [{low}, {high}]: {value}")
    return value


def _candidate(m: Mapping[str, Any]) -> Candidate | None:
    """RESULT's ``preemption``: nil, or a candidate whose numbers are consistent with one another (a hostile or
    broken worker must not steer the leader's choice with a summary no real dry run can produce)."""
    value = _get(m, "preemption")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ProtocolError(f"result.preemption is not a map: {value!r}")
    c: dict[str, Any] = {"t": "result.preemption", **value}
    node = _str(c, "node")
    if not node or len(node) > 253:
        raise ProtocolError("result.preemption.node is not a node name")
    victims = _bounded(c, "victims", 1, MAX_VICTIMS)
    violations = _bounded(c, "pdb_violations", 0, victims)
    highest = _bounded(c, "highest_priority", PRIORITY_MIN, PRIORITY_MAX)
    # every victim's priority is at most the highest one and at least PRIORITY_MIN (adding 0 to the sum)
    total = _bounded(c, "priority_sum", highest + _PRIORITY_OFFSET, victims * (highest + _PRIORITY_OFFSET))
    start = _float(c, "earliest_start")
    if not math.isfinite(start):
        raise ProtocolError("result.preemption.earliest_start is not finite")
    if _outcome(m) != UNSCHEDULABLE:
        raise ProtocolError("result.preemption on a result that is not unschedulable")
    return Candidate(node, violations, highest, total, victims, start)


# How deep the containers of a DISPATCH's pod may nest (the pod map is the first): orjson's own limit, which
# its check below applies and the tests pin. Deeper than any pod the API server admits; what a DISPATCH may
# hold is what the worker's own watch of the pod could have given it (decoded by orjson too).
_MAX_DEPTH = 254


def _json_like(value: Any) -> bool:
    """True for what a JSON document can hold: maps with string keys, lists, strings, numbers, bools, null;
    containers nested at most ``_MAX_DEPTH`` deep. orjson's serializer decides (every DISPATCH's pod passes
    here, and it is in C: about a microsecond per pod). For what a msgpack decode gives it refuses exactly
    the rest: bytes, extension types, non-string keys, deeper nesting. (It would take a tuple, which a
    msgpack decode never yields: arrays decode as lists.)"""
    try:
        orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError
        return False
    return True


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


def _workers(m: Mapping[str, Any]) -> tuple[str, ...]:
    value = _get(m, "workers")
    if not isinstance(value, list) or len(value) > MAX_CLAIMANTS:
        raise ProtocolError(f"workers is not a list of at most {MAX_CLAIMANTS}")
    if not all(isinstance(w, str) and w for w in value):
        raise ProtocolError("workers holds something other than worker ids")
    return tuple(value)


_DECODERS: dict[str, Callable[[Mapping[str, Any]], Message]] = {
    HELLO: lambda m: Hello(_str(m, "leader"), _int(m, "term"), _bytes(m, "nonce", NONCE_SIZE), _version(m)),
    WELCOME: lambda m: Welcome(
        _str(m, "worker"), _int(m, "term"), _bytes(m, "nonce", NONCE_SIZE), _version(m)
    ),
    DISPATCH: lambda m: Dispatch(_int(m, "id"), _pod(m), _revision(m, "min_rv"), _str(m, "preempt")),
    CLAIMS: lambda m: Claims(_workers(m)),
    SOLE: lambda m: Sole(),
    ACK: lambda m: Ack(_int(m, "id")),
    RESULT: lambda m: Result(
        _int(m, "id"),
        _str(m, "key"),
        _outcome(m),
        node=_str(m, "node"),
        nodes=_int(m, "nodes"),
        reasons=_reasons(m),
        message=_str(m, "message"),
        uid=_str(m, "uid"),
        preemption=_candidate(m),
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
        placing=_bool(m, "placing"),
        earlier=_revision(m, "earlier"),
        revision=_revision(m, "revision"),
        sole=_bool(m, "sole"),
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


# ----- sealed frames: the handshake and the session -------------------------------------------------------

_HELLO_CONTEXT: Final = b"hello"
_REPLY_CONTEXT: Final = b"reply"
_SESSION_CONTEXT: Final = b"session"
LEADER_TO_WORKER: Final = b"L"
WORKER_TO_LEADER: Final = b"W"


def _mac(key: bytes, *parts: bytes) -> bytes:
    h = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        h.update(part)
    return h.digest()


def _frame(mac: bytes, body: bytes) -> bytes:
    return _HEADER.pack(MAC_SIZE + len(body)) + mac + body


async def read_frame(reader: asyncio.StreamReader, limit: int = MAX_FRAME) -> tuple[bytes, bytes]:
    """One sealed frame's (MAC, body), unverified. The length is checked against ``limit`` before anything
    else is read. Raises ``asyncio.IncompleteReadError`` at end of stream, ``ProtocolError`` if oversized or
    too short to hold a MAC."""
    (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    if size > limit:
        raise ProtocolError(f"frame of {size} bytes exceeds {limit}")
    if size < MAC_SIZE:
        raise ProtocolError(f"frame of {size} bytes has no MAC")
    data = await reader.readexactly(size)
    return data[:MAC_SIZE], data[MAC_SIZE:]


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_SIZE)


def seal_hello(key: bytes, hello: Hello) -> bytes:
    """The leader's first frame, under the stream's key."""
    body = pack(hello)
    return _frame(_mac(key, _HELLO_CONTEXT, body), body)


async def read_hello(reader: asyncio.StreamReader, keys: Sequence[bytes]) -> tuple[Hello, bytes]:
    """The worker reads the first frame: a HELLO under one of ``keys`` (current first). Returns it and the
    key that verified it. ``ProtocolError`` for anything else, including a frame no key verifies (its body is
    then not decoded)."""
    mac, body = await read_frame(reader, MAX_HANDSHAKE_FRAME)
    for key in keys:
        if hmac.compare_digest(mac, _mac(key, _HELLO_CONTEXT, body)):
            hello = decode(body)
            if not isinstance(hello, Hello):
                raise ProtocolError(f"expected hello, got {type(hello).__name__}")
            return hello, key
    raise ProtocolError("hello not authenticated")


def seal_reply(key: bytes, hello_nonce: bytes, reply: Welcome | Error) -> bytes:
    """The worker's answer to a HELLO (WELCOME or ERROR), bound to that HELLO's nonce."""
    body = pack(reply)
    return _frame(_mac(key, _REPLY_CONTEXT, hello_nonce, body), body)


async def read_reply(reader: asyncio.StreamReader, key: bytes, hello_nonce: bytes) -> Welcome:
    """The leader reads the answer to its HELLO. An ERROR answer, or any frame that is not a WELCOME bound to
    this HELLO under ``key``, raises ``ProtocolError``."""
    mac, body = await read_frame(reader, MAX_HANDSHAKE_FRAME)
    if not hmac.compare_digest(mac, _mac(key, _REPLY_CONTEXT, hello_nonce, body)):
        raise ProtocolError("answer to hello not authenticated")
    reply = decode(body)
    if isinstance(reply, Error):
        raise ProtocolError(f"worker refused: {reply.message}")
    if not isinstance(reply, Welcome):
        raise ProtocolError(f"expected welcome, got {type(reply).__name__}")
    return reply


class Session:
    """One side of one authenticated stream after the handshake: seals what it sends and opens what it
    reads, each direction with its own frame counter bound into the MAC (see "Authentication" above).
    Sealed frames must be written in the order they were sealed, and once one is dropped unwritten nothing
    more may be written to that stream (the peer's frame counter would disagree): ``Outbox`` keeps both."""

    def __init__(self, key: bytes, *, hello_nonce: bytes, welcome_nonce: bytes, leader: bool) -> None:
        self._key = _mac(key, _SESSION_CONTEXT, hello_nonce, welcome_nonce)
        self._out = LEADER_TO_WORKER if leader else WORKER_TO_LEADER
        self._in = WORKER_TO_LEADER if leader else LEADER_TO_WORKER
        # HMAC(S, ...) keyed once: every frame's MAC continues a copy (the same digest as ``_mac``, without
        # deriving the keyed pads again per frame)
        self._keyed = hmac.new(self._key, digestmod=hashlib.sha256)
        self._sent = 0
        self._read = 0

    def _frame_mac(self, direction: bytes, seq: int, body: bytes) -> bytes:
        h = self._keyed.copy()
        h.update(direction + seq.to_bytes(8, "big"))
        h.update(body)
        return h.digest()

    def seal(self, message: Message) -> bytes:
        body = pack(message)
        mac = self._frame_mac(self._out, self._sent, body)
        self._sent += 1
        return _frame(mac, body)

    def open(self, mac: bytes, body: bytes) -> Message:
        expected = self._frame_mac(self._in, self._read, body)
        if not hmac.compare_digest(mac, expected):
            raise ProtocolError(f"frame {self._read} not authenticated")
        self._read += 1
        return decode(body)

    async def read(self, reader: asyncio.StreamReader) -> Message:
        """Read, verify and decode the next frame (``read_frame``'s errors, ``ProtocolError`` for a bad MAC
        or a malformed body)."""
        mac, body = await read_frame(reader)
        return self.open(mac, body)


class Outbox:
    """The sending half of one authenticated stream, at either end: each message sent is sealed by ``session``
    at once and written to ``writer`` with the others sent within ``COALESCE`` of the first one not yet
    written, in one write, in the order sent ("Coalescing" above). ``flush`` writes them at once.

    Invariants: frames reach the stream in the order they were sealed, or not at all; nothing is written to
    a stream that is closing, or once ``discard`` was called (the stream is over: the leader's link discards
    it when the stream breaks, the worker when its connection ends), not even by a flush that was due; both
    states are final, so a frame dropped unwritten is never followed by a written one; at most one flush is
    scheduled at a time."""

    def __init__(self, writer: asyncio.StreamWriter, session: Session) -> None:
        self.writer = writer
        self.session = session
        self._frames: list[bytes] = []  # sealed, in order, not yet written
        self._queued = 0  # their bytes
        self._due: asyncio.TimerHandle | None = None  # the scheduled flush, while frames wait
        self._discarded = False

    def send(self, message: Message) -> None:
        if self._discarded or self.writer.is_closing():
            return
        frame = self.session.seal(message)
        if self._due is None:
            self._due = asyncio.get_running_loop().call_later(COALESCE, self.flush)
        self._frames.append(frame)
        self._queued += len(frame)

    def flush(self) -> None:
        """Write the frames sent so far, now."""
        if self._due is not None:
            self._due.cancel()
            self._due = None
        frames, self._frames, self._queued = self._frames, [], 0
        if frames and not self._discarded and not self.writer.is_closing():
            self.writer.write(b"".join(frames))

    def discard(self) -> None:
        """Drop the frames not yet written and write nothing more: the stream is gone."""
        self._discarded = True
        self.flush()

    def buffered(self) -> int:
        """Bytes sent and not yet taken by the peer's socket: waiting here or in the transport's buffer."""
        transport = self.writer.transport
        return self._queued + (transport.get_write_buffer_size() if transport is not None else 0)

    def above_high_water(self) -> bool:
        """Flush, then say whether the transport's buffer is above its high-water mark (the peer reads too
        slowly)."""
        self.flush()
        if self.writer.is_closing():
            return False
        _, high = self.writer.transport.get_write_buffer_limits()
        return bool(self.writer.transport.get_write_buffer_size() > high)

    async def drain(self, timeout: float) -> None:
        """Flush, then wait until the transport's buffer is below its high-water mark; ``TimeoutError`` if
        the peer has not read enough within ``timeout`` s."""
        self.flush()
        async with asyncio.timeout(timeout):
            await self.writer.drain()
