"""The Namespace and workload-selector feeds: what a watch event does to the cache and the queue."""

from __future__ import annotations

from typing import Any

from tests.builders import make_node, make_pod
from tests.unit.worker.helpers import engine_over
from worker.feeds import NamespaceFeed, WorkloadFeed
from worker.queue import SchedulingQueue
from worker.workloads import REPLICA_SET, SERVICE

HOST = "kubernetes.io/hostname"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


def test_a_namespace_event_that_satisfies_a_waiting_pods_affinity_wakes_the_unschedulable_pods() -> None:
    engine = engine_over([make_node("n0").record()])
    clock = FakeClock()
    queue = SchedulingQueue(clock)
    feed = NamespaceFeed(engine.cache, queue)
    feed.replace([namespace("db"), namespace("web")])
    engine.cache.upsert_pod(make_pod("db", "db").label("app", "db").on("n0").record())
    waiting = make_pod("w", "web").pod_affinity(
        HOST, {"app": "db"}, namespace_selector={"matchLabels": {"t": "x"}}
    )
    queue.add(waiting.record())
    qp = queue.pop_nowait()
    assert qp is not None
    assert engine.schedule(qp.pod).node is None
    queue.done(qp, scheduled=False, message="0/1 nodes are available")
    clock.now += 60  # past any backoff
    feed.event("MODIFIED", namespace("web", t="x"))  # no pod of the selected kind there: nobody woken
    assert queue.statistics()["unschedulable"] == 1
    feed.event("MODIFIED", namespace("db", t="x"))
    assert queue.statistics()["unschedulable"] == 0
    qp = queue.pop_nowait()
    assert qp is not None and engine.schedule(qp.pod).node == "n0"
    feed.event("DELETED", namespace("db", t="x"))
    assert "db" not in engine.cache.topology.namespace_labels
    feed.replace([namespace("web")])  # a relist drops what it does not list
    assert set(engine.cache.topology.namespace_labels) == {"web"}


def test_workload_feeds_keep_only_selectors() -> None:
    engine = engine_over([make_node("n0").record()])
    services = WorkloadFeed(engine.cache, SERVICE)
    replica_sets = WorkloadFeed(engine.cache, REPLICA_SET)
    svc = {
        "metadata": {"name": "s", "namespace": "default"},
        "spec": {"selector": {"app": "web"}, "ports": []},
    }
    rs = {
        "metadata": {"name": "r", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {"spec": {"containers": []}}},
    }
    services.replace([svc])
    replica_sets.event("ADDED", rs)
    workloads = engine.cache.workloads
    assert workloads.services == {"default": {"s": (("app", "web"),)}}
    assert list(workloads.controllers) == [(REPLICA_SET, "default", "r")]
    assert engine.cache.statistics()["services"] == 1
    services.event("DELETED", svc)
    replica_sets.replace([])
    assert workloads.services == {} and workloads.controllers == {}
