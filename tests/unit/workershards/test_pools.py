"""The agent node pool: ``NodeTable``, ``LabelPool`` and ``PolicyPool`` behind the ``PoolSource`` seam."""

from __future__ import annotations

import random
from typing import Any

import pytest

from common.records import NodeName, NodeRecord, node_from_json
from coordinator.workershards import pools
from coordinator.workershards.pools import LabelPool, NodeTable, PolicyPool, pool_weights
from tests.unit.nodeshards.helpers import node_obj


def test_node_table_reports_only_changes_the_policy_reads() -> None:
    table, calls = NodeTable(), []
    table.listeners.append(lambda: calls.append(1))
    table.replace([node_obj("n1", "4")])
    assert table.nodes[NodeName("n1")].allocatable_milli_cpu == 4000 and len(calls) == 1
    table.event("MODIFIED", node_obj("n1", "4", heartbeat="t1"))  # a heartbeat
    assert len(calls) == 1
    table.event("MODIFIED", node_obj("n1", "4", {"warm": "true"}))
    table.event("DELETED", node_obj("n1", "4"))
    assert len(calls) == 3 and not table.nodes


def test_node_table_parses_a_heartbeat_only_when_its_allocatable_or_labels_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parsed: list[str] = []

    def counted(obj: dict[str, Any]) -> NodeRecord:
        parsed.append(obj["metadata"]["name"])
        return node_from_json(obj)

    monkeypatch.setattr(pools, "node_from_json", counted)
    table = NodeTable()
    table.replace([node_obj("n1", "4"), node_obj("n2", "8")])
    parsed.clear()
    for beat in range(5):
        table.event("MODIFIED", node_obj("n1", "4", heartbeat=f"t{beat + 1}"))
    assert parsed == []  # status heartbeats: compared, not parsed
    table.event("MODIFIED", node_obj("n1", "4", {"warm": "true"}))
    table.event("MODIFIED", node_obj("n2", "6"))
    assert parsed == ["n1", "n2"]
    assert table.nodes[NodeName("n1")].labels == {"warm": "true"}
    assert table.nodes[NodeName("n2")].allocatable_milli_cpu == 6000


def test_node_table_agrees_with_a_full_parse_of_every_event() -> None:
    """Random events over a few nodes (heartbeats, label and allocatable changes, malformed and missing
    allocatable, deletions, relists): the table's facts and its change reports are those of parsing every
    event in full."""
    rng = random.Random(7)
    cpus: list[Any] = ["4", "8", "500m", "bad", "-1", None]
    label_sets: list[dict[str, str] | None] = [None, {}, {"warm": "true"}, {"zone": "a", "warm": "true"}]

    def obj(name: str) -> dict[str, Any]:
        o = node_obj(name, "1", rng.choice(label_sets), heartbeat=str(rng.random()))
        cpu = rng.choice(cpus)
        if cpu is None:
            del o["status"]["allocatable"]
        else:
            o["status"]["allocatable"]["cpu"] = cpu
        return o

    table, calls = NodeTable(), []
    table.listeners.append(lambda: calls.append(1))
    full: dict[NodeName, pools.NodeFacts] = {}
    changes = 0
    names = ["n1", "n2", "n3"]
    for step in range(3000):
        if step % 500 == 0:
            objects = [obj(n) for n in names if rng.random() < 0.8]
            table.replace(objects)
            fresh = dict(NodeTable._facts(o) for o in objects)
            changes += fresh != full
            full = fresh
        else:
            o, kind = obj(rng.choice(names)), rng.choice(["MODIFIED"] * 8 + ["ADDED", "DELETED"])
            name, facts = NodeTable._facts(o)
            if kind == "DELETED":
                changes += full.pop(name, None) is not None
            elif full.get(name) != facts:
                full[name] = facts
                changes += 1
            table.event(kind, o)
        assert table.nodes == full and len(calls) == changes, step
        assert set(table._parsed) == set(full), step  # nothing kept of a deleted node
    assert changes > 100


def test_label_pool_weighs_nodes_by_cores_and_reports_only_pool_changes() -> None:
    pool = LabelPool(None, "pool=agent")  # type: ignore[arg-type]  # no I/O: the reflector is never run
    assert pool.reflector.params == {"labelSelector": "pool=agent"}
    calls: list[int] = []
    pool.listeners.append(lambda: calls.append(1))
    assert pool() == {}  # before the first list: empty, which grants nothing
    handler = pool.reflector.handler
    handler.replace([node_obj("n1", "4"), node_obj("n2", "500m")])
    assert pool() == {NodeName("n1"): 4.0, NodeName("n2"): 1.0} and len(calls) == 1  # at least one core
    handler.event("MODIFIED", node_obj("n1", "4", {"warm": "true"}))  # labels: not the pool's business
    assert len(calls) == 1
    handler.event("MODIFIED", node_obj("n1", "8"))
    handler.event("DELETED", node_obj("n2", "500m"))
    assert pool() == {NodeName("n1"): 8.0} and len(calls) == 3


def test_label_pool_and_policy_pool_weigh_a_node_alike() -> None:
    table = NodeTable()
    table.replace([node_obj("n1", "2500m"), node_obj("n2", "100m")])
    label = LabelPool(None)  # type: ignore[arg-type]
    label.reflector.handler.replace([node_obj("n1", "2500m"), node_obj("n2", "100m")])
    chosen = PolicyPool()
    assert chosen.set(pool_weights(table.nodes, [NodeName("n1"), NodeName("n2"), NodeName("gone")]))
    assert dict(chosen()) == dict(label()) == {NodeName("n1"): 2.5, NodeName("n2"): 1.0}
    assert not chosen.set({NodeName("n1"): 2.5, NodeName("n2"): 1.0})  # unchanged: no notification
