"""The values stored under the etcd keys of ``common.etcd.keys``: dataclasses with a JSON encoding.

JSON rather than msgpack because these records are small and rare next to pod traffic, and an operator
debugging a stuck handoff can read them with ``etcdctl get --prefix /agent-scheduler``.

Invariants:
- ``decode(encode(x)) == x`` for every record.
- ``decode`` accepts only what ``encode`` could have produced (right types, non-negative counters, valid
  ids and addresses, version 1) and raises ``RecordError`` otherwise. Callers treat a malformed record
  as absent and fail closed: a worker that cannot read its assignment owns nothing.
- In a ``ShardAssignment`` the granted and revoking sets are disjoint: a node being revoked is no longer
  usable by the worker, but is still *held* by it until the leader sees the release acknowledgement.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Self

from common.etcd.keys import WorkerId, worker_id
from common.records import NodeName

SCHEMA_VERSION = 1


class RecordError(ValueError):
    """Raised by ``decode`` when a stored value is not a well-formed record of the expected kind."""


def _dumps(kind: str, body: dict[str, Any]) -> bytes:
    return json.dumps(
        {"v": SCHEMA_VERSION, "kind": kind, **body}, separators=(",", ":"), sort_keys=True
    ).encode()


class _Fields:
    """Typed access to a decoded JSON object; every failure names the record kind and the field."""

    def __init__(self, kind: str, raw: bytes) -> None:
        self.kind = kind
        try:
            obj = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise RecordError(f"{kind}: not JSON: {e}") from e
        if not isinstance(obj, dict):
            raise RecordError(f"{kind}: want a JSON object, got {type(obj).__name__}")
        self.obj: dict[str, Any] = obj
        if obj.get("v") != SCHEMA_VERSION:
            raise RecordError(f"{kind}: unsupported schema version {obj.get('v')!r}")
        if obj.get("kind") != kind:
            raise RecordError(f"{kind}: record is a {obj.get('kind')!r}")

    def _get(self, name: str) -> Any:
        if name not in self.obj:
            raise RecordError(f"{self.kind}: missing field {name!r}")
        return self.obj[name]

    def fail(self, name: str, why: str) -> RecordError:
        return RecordError(f"{self.kind}: field {name!r} {why}")

    def string(self, name: str) -> str:
        value = self._get(name)
        if not isinstance(value, str):
            raise self.fail(name, "must be a string")
        return value

    def integer(self, name: str, default: int | None = None) -> int:
        """``default`` makes the field optional: a record written before the field existed still decodes."""
        if default is not None and name not in self.obj:
            return default
        value = self._get(name)
        # bool is an int subclass; a true/false here is a writer bug, not a count.
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise self.fail(name, "must be a non-negative integer")
        return value

    def number(self, name: str) -> float:
        value = self._get(name)
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not math.isfinite(value)
            or value < 0
        ):
            raise self.fail(name, "must be a finite non-negative number")
        return float(value)

    def worker(self, name: str) -> WorkerId:
        try:
            return worker_id(self.string(name))
        except ValueError as e:
            raise self.fail(name, str(e)) from e

    def address(self, name: str) -> str:
        value = self.string(name)
        try:
            return check_address(value)
        except ValueError as e:
            raise self.fail(name, str(e)) from e

    def nodes(self, name: str) -> frozenset[NodeName]:
        value = self._get(name)
        if not isinstance(value, list) or not all(isinstance(n, str) and n for n in value):
            raise self.fail(name, "must be a list of non-empty node names")
        return frozenset(NodeName(n) for n in value)


def check_address(address: str) -> str:
    """Validate ``host:port`` (``[v6]:port`` for IPv6); returns it unchanged or raises ``ValueError``."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"want host:port, got {address!r}")
    return address


def _names(nodes: frozenset[NodeName]) -> list[str]:
    return sorted(nodes)


@dataclass(frozen=True, slots=True)
class WorkerCapacity:
    """What a worker says about its own size, for the leader's balancing."""

    weight: float = 1.0  # relative share of the pool this worker should carry; 2.0 = twice the nodes
    max_binds_per_second: float = 0.0  # the worker's own estimate; 0 = unknown


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """Membership: one per live worker, under the worker's lease."""

    worker_id: WorkerId
    address: str  # host:port where the worker accepts dispatched pods
    capacity: WorkerCapacity = field(default_factory=WorkerCapacity)
    started_at: float = 0.0  # wall-clock seconds, for humans and for spotting restarts

    def __post_init__(self) -> None:
        worker_id(self.worker_id)
        check_address(self.address)
        if not self.capacity.weight > 0:
            raise ValueError(f"capacity weight must be positive, got {self.capacity.weight}")

    def encode(self) -> bytes:
        return _dumps(
            "worker",
            {
                "worker_id": self.worker_id,
                "address": self.address,
                "weight": self.capacity.weight,
                "max_binds_per_second": self.capacity.max_binds_per_second,
                "started_at": self.started_at,
            },
        )

    @classmethod
    def decode(cls, raw: bytes) -> Self:
        f = _Fields("worker", raw)
        weight = f.number("weight")
        if weight == 0:
            raise f.fail("weight", "must be positive")
        capacity = WorkerCapacity(weight=weight, max_binds_per_second=f.number("max_binds_per_second"))
        return cls(f.worker("worker_id"), f.address("address"), capacity, f.number("started_at"))


@dataclass(frozen=True, slots=True)
class LoadReport:
    """A worker's recent load, for load-aware balancing: written when it changed and at least every 30 s
    (``worker.coordinated``)."""

    pending_pods: int = 0
    free_milli_cpu: int = 0  # summed over the worker's nodes
    free_memory: int = 0  # bytes, summed over the worker's nodes
    binds_per_second: float = 0.0
    process_cpu: float = 0.0  # CPU seconds per second used by the worker process; 1.0 = one core busy
    reported_at: float = 0.0  # wall-clock seconds
    # granted nodes the worker places pods on now: fewer than granted while it catches up on newly granted
    # nodes, 0 while it is fenced or draining (optional in the record: a worker of an earlier release omits it)
    usable_nodes: int = 0

    def encode(self) -> bytes:
        return _dumps(
            "load",
            {
                "pending_pods": self.pending_pods,
                "free_milli_cpu": self.free_milli_cpu,
                "free_memory": self.free_memory,
                "binds_per_second": self.binds_per_second,
                "process_cpu": self.process_cpu,
                "reported_at": self.reported_at,
                "usable_nodes": self.usable_nodes,
            },
        )

    @classmethod
    def decode(cls, raw: bytes) -> Self:
        f = _Fields("load", raw)
        return cls(
            pending_pods=f.integer("pending_pods"),
            free_milli_cpu=f.integer("free_milli_cpu"),
            free_memory=f.integer("free_memory"),
            binds_per_second=f.number("binds_per_second"),
            process_cpu=f.number("process_cpu"),
            reported_at=f.number("reported_at"),
            usable_nodes=f.integer("usable_nodes", default=0),
        )


@dataclass(frozen=True, slots=True)
class ShardAssignment:
    """The leader's word to one worker incarnation (identified by its lease) about which nodes it holds.

    ``granted`` nodes are usable. ``revoking`` nodes must stop being used at once; the worker acknowledges
    with a ``ReleaseAck`` whose epoch is at least ``epoch``, after which the leader may grant them elsewhere.
    A worker ignores an assignment made for another lease: that was a previous incarnation's.
    """

    worker_id: WorkerId
    lease_id: int
    epoch: int
    granted: frozenset[NodeName] = frozenset()
    revoking: frozenset[NodeName] = frozenset()

    def __post_init__(self) -> None:
        if self.granted & self.revoking:
            raise ValueError(f"nodes both granted and revoking: {sorted(self.granted & self.revoking)[:5]}")

    @property
    def held(self) -> frozenset[NodeName]:
        """Nodes nobody else may be granted: the usable ones and the ones not yet released."""
        return self.granted | self.revoking

    def encode(self) -> bytes:
        return _dumps(
            "assignment",
            {
                "worker_id": self.worker_id,
                "lease_id": self.lease_id,
                "epoch": self.epoch,
                "granted": _names(self.granted),
                "revoking": _names(self.revoking),
            },
        )

    @classmethod
    def decode(cls, raw: bytes) -> Self:
        f = _Fields("assignment", raw)
        granted, revoking = f.nodes("granted"), f.nodes("revoking")
        if granted & revoking:
            raise f.fail("revoking", "overlaps granted")
        return cls(f.worker("worker_id"), f.integer("lease_id"), f.integer("epoch"), granted, revoking)


@dataclass(frozen=True, slots=True)
class ReleaseAck:
    """A worker's statement: under lease ``lease_id``, every node that was revoking in my assignment of
    ``epoch`` (or of any earlier epoch) is released; I no longer use it and have nothing in flight on it.

    Written after the release hook returned for those nodes. ``released`` names the nodes of the latest
    release; the leader relies on lease and epoch, and on ``released`` only to see that a worker which
    revoked its own lease had released every node it was granted (a graceful leave needs no grant delay).
    """

    worker_id: WorkerId
    lease_id: int
    epoch: int
    released: frozenset[NodeName] = frozenset()

    def encode(self) -> bytes:
        return _dumps(
            "ack",
            {
                "worker_id": self.worker_id,
                "lease_id": self.lease_id,
                "epoch": self.epoch,
                "released": _names(self.released),
            },
        )

    @classmethod
    def decode(cls, raw: bytes) -> Self:
        f = _Fields("ack", raw)
        return cls(f.worker("worker_id"), f.integer("lease_id"), f.integer("epoch"), f.nodes("released"))


@dataclass(frozen=True, slots=True)
class LeaderRecord:
    """A coordinator candidate; the value of its election key, so anyone can see who leads."""

    candidate_id: str
    address: str = ""  # host:port of the leader's status endpoint; empty when it has none
    started_at: float = 0.0

    def __post_init__(self) -> None:
        if not self.candidate_id:
            raise ValueError("candidate id must not be empty")
        if self.address:
            check_address(self.address)

    def encode(self) -> bytes:
        body = {"candidate_id": self.candidate_id, "address": self.address, "started_at": self.started_at}
        return _dumps("leader", body)

    @classmethod
    def decode(cls, raw: bytes) -> Self:
        f = _Fields("leader", raw)
        candidate, address = f.string("candidate_id"), f.string("address")
        if not candidate:
            raise f.fail("candidate_id", "must not be empty")
        if address:
            address = f.address("address")
        return cls(candidate, address, f.number("started_at"))


@dataclass(frozen=True, slots=True)
class ShardMapMeta:
    """The shard map's header: its epoch (bumped by every leader write) and who wrote it last."""

    epoch: int
    leader_id: str
    updated_at: float = 0.0

    def encode(self) -> bytes:
        body = {"epoch": self.epoch, "leader_id": self.leader_id, "updated_at": self.updated_at}
        return _dumps("shardmap", body)

    @classmethod
    def decode(cls, raw: bytes) -> Self:
        f = _Fields("shardmap", raw)
        return cls(f.integer("epoch"), f.string("leader_id"), f.number("updated_at"))
