"""The agent node pool: ``NodeTable``, ``LabelPool`` and ``PolicyPool`` behind the ``PoolSource`` seam."""

from __future__ import annotations

from common.records import NodeName
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
