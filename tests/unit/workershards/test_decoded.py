"""The shard map's cache of decoded etcd records against decoding every time: random writes, rewrites,
malformed values and deletions under a few keys, and every read gives what ``decode`` of the key's current
bytes gives (the same record, or ``RecordError``)."""

from __future__ import annotations

import random

import pytest

from common.etcd.keys import WorkerId
from common.etcd.kv import KeyValue
from common.etcd.schema import LoadReport, RecordError, ReleaseAck, ShardAssignment
from common.records import NodeName
from coordinator.workershards.shardmap import _Decoded


def value(rng: random.Random, kind: type[ShardAssignment | ReleaseAck | LoadReport]) -> bytes:
    if rng.random() < 0.1:
        return b'{"kind": "assignment", "granted": 7}'  # malformed for every kind
    if kind is ShardAssignment:
        nodes = [NodeName(f"n{i}") for i in rng.sample(range(20), rng.randrange(0, 6))]
        cut = rng.randrange(0, len(nodes) + 1)
        return ShardAssignment(
            WorkerId("w1"),
            rng.randrange(1, 4),
            rng.randrange(1, 9),
            frozenset(nodes[:cut]),
            frozenset(nodes[cut:]),
        ).encode()
    if kind is ReleaseAck:
        return ReleaseAck(WorkerId("w1"), rng.randrange(1, 4), rng.randrange(1, 9)).encode()
    return LoadReport(
        pending_pods=rng.randrange(5),
        free_milli_cpu=rng.randrange(5) * 1000,
        free_memory=0,
        binds_per_second=0.0,
        process_cpu=0.0,
        reported_at=float(rng.randrange(3)),
    ).encode()


def _get(cache: _Decoded, kv: KeyValue, kind: type[ShardAssignment | ReleaseAck | LoadReport]) -> object:
    """``cache.get`` for one of the three kinds (its type variable takes one kind at a time, not a union)."""
    if kind is ShardAssignment:
        return cache.get(kv, ShardAssignment)
    if kind is ReleaseAck:
        return cache.get(kv, ReleaseAck)
    return cache.get(kv, LoadReport)


def test_every_read_is_the_decode_of_the_current_bytes() -> None:
    rng = random.Random(14)
    kinds: list[type[ShardAssignment | ReleaseAck | LoadReport]] = [ShardAssignment, ReleaseAck, LoadReport]
    cache = _Decoded()
    items: dict[str, KeyValue] = {}
    revision = 0
    for _ in range(4000):
        key = f"k{rng.randrange(6)}"
        kind = kinds[int(key[1:]) % 3]
        action = rng.random()
        if action < 0.3:
            revision += 1
            items[key] = KeyValue(key, value(rng, kind), 1, revision, 0)
        elif action < 0.35:
            items.pop(key, None)
            cache.keep_only(items)
        elif key in items:
            kv = items[key]
            try:
                expected: object = kind.decode(kv.value)
            except RecordError as e:
                expected = e
            if isinstance(expected, RecordError):
                with pytest.raises(RecordError):
                    _get(cache, kv, kind)
            else:
                assert _get(cache, kv, kind) == expected
