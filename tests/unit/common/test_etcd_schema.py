"""Encodings of the etcd records and the key layout: round trips, and rejection of malformed values."""

from __future__ import annotations

import dataclasses
import json

import pytest

from common.etcd.keys import KeyFamily, KeyLayout, WorkerId, worker_id
from common.etcd.schema import (
    LeaderRecord,
    LoadReport,
    RecordError,
    ReleaseAck,
    ShardAssignment,
    ShardMapMeta,
    WorkerCapacity,
    WorkerRecord,
)
from common.records import NodeName

W = WorkerId("worker-1")
Record = WorkerRecord | LoadReport | ShardAssignment | ReleaseAck | LeaderRecord | ShardMapMeta

RECORDS: list[Record] = [
    WorkerRecord(W, "10.0.0.1:8080", WorkerCapacity(2.0, 500.0), 1700000000.5),
    WorkerRecord(W, "[::1]:9000"),
    LoadReport(3, 4000, 1 << 30, 120.5, 0.75, 1700000000.0, usable_nodes=250),
    ShardAssignment(W, 0x1234, 7, frozenset({NodeName("n1"), NodeName("n2")}), frozenset({NodeName("n3")})),
    ShardAssignment(W, 1, 0),
    ReleaseAck(W, 0x1234, 7, frozenset({NodeName("n3")})),
    LeaderRecord("coordinator-0", "127.0.0.1:9100", 5.0),
    LeaderRecord("coordinator-1"),
    ShardMapMeta(42, "coordinator-0", 1.0),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_round_trip(record: Record) -> None:
    raw = record.encode()
    assert type(record).decode(raw) == record
    json.loads(raw)  # readable with etcdctl


def _mutate(record: Record, **changes: object) -> bytes:
    obj = json.loads(record.encode())
    for key, value in changes.items():
        if value is ...:
            del obj[key]
        else:
            obj[key] = value
    return json.dumps(obj).encode()


@pytest.mark.parametrize(
    ("record", "changes", "message"),
    [
        (RECORDS[0], {"address": "no-port"}, "address"),
        (RECORDS[0], {"address": "host:70000"}, "address"),
        (RECORDS[0], {"worker_id": "a/b"}, "worker_id"),
        (RECORDS[0], {"weight": 0}, "weight"),
        (RECORDS[0], {"started_at": ...}, "missing"),
        (RECORDS[2], {"pending_pods": -1}, "pending_pods"),
        (RECORDS[2], {"pending_pods": True}, "pending_pods"),
        (RECORDS[2], {"process_cpu": "high"}, "process_cpu"),
        (RECORDS[2], {"usable_nodes": -1}, "usable_nodes"),
        (RECORDS[3], {"granted": "n1"}, "granted"),
        (RECORDS[3], {"granted": ["n1", ""]}, "granted"),
        (RECORDS[3], {"revoking": ["n1"]}, "overlaps"),
        (RECORDS[3], {"epoch": 1.5}, "epoch"),
        (RECORDS[3], {"kind": "ack"}, "record is a"),
        (RECORDS[3], {"v": 2}, "version"),
        (RECORDS[6], {"candidate_id": ""}, "candidate_id"),
    ],
)
def test_malformed_values_are_rejected_with_a_clear_error(
    record: Record, changes: dict[str, object], message: str
) -> None:
    with pytest.raises(RecordError, match=message):
        type(record).decode(_mutate(record, **changes))


def test_a_load_report_without_usable_nodes_decodes_as_none_usable() -> None:
    """A worker of an earlier release writes no ``usable_nodes``: its report still counts for balancing."""
    original = RECORDS[2]
    assert isinstance(original, LoadReport)
    assert LoadReport.decode(_mutate(original, usable_nodes=...)) == dataclasses.replace(
        original, usable_nodes=0
    )


@pytest.mark.parametrize("raw", [b"", b"\xff\xfe", b"[]", b"null", b"{}"])
def test_garbage_is_rejected(raw: bytes) -> None:
    with pytest.raises(RecordError):
        ShardAssignment.decode(raw)


def test_constructors_validate() -> None:
    with pytest.raises(ValueError, match="both granted and revoking"):
        ShardAssignment(W, 1, 1, frozenset({NodeName("x")}), frozenset({NodeName("x")}))
    with pytest.raises(ValueError):
        WorkerRecord(W, "nowhere")
    with pytest.raises(ValueError):
        worker_id("")
    with pytest.raises(ValueError):
        worker_id("-leading")


def test_key_layout() -> None:
    keys = KeyLayout("/sched/test")
    assert keys.member(W) == "/sched/test/workers/worker-1"
    assert keys.assignment(W) == "/sched/test/assign/worker-1"
    assert keys.election(255) == "/sched/test/election/00000000000000ff"
    assert keys.parse(keys.member(W)) == (KeyFamily.MEMBER, "worker-1")
    assert keys.parse(keys.load(W)) == (KeyFamily.LOAD, "worker-1")
    assert keys.parse(keys.ack(W)) == (KeyFamily.ACK, "worker-1")
    assert keys.parse(keys.election(1)) == (KeyFamily.ELECTION, "0000000000000001")
    assert keys.parse(keys.shardmap) == (KeyFamily.SHARDMAP, "")
    assert keys.parse("/sched/test/unknown/x") is None
    assert keys.parse("/sched/test/workers/a/b") is None
    assert keys.parse("/other/workers/a") is None
    assert KeyLayout().root == "/agent-scheduler/"
    for bad in ("", "no-slash", "/trailing/", "/a//b"):
        with pytest.raises(ValueError):
            KeyLayout(bad)
