"""The cache's assume/confirm/forget/expire state machine and its accounting invariant."""

import pytest

from common.records import NodeName
from tests.builders import make_node, make_pod
from worker.cache import Cache


def cache_with(*nodes: str) -> Cache:
    c = Cache(assume_ttl=30)
    for n in nodes:
        c.upsert_node(make_node(n, cpu="4").record())
    return c


def test_assume_then_watch_confirms() -> None:
    c = cache_with("n")
    pod = make_pod("a").req(cpu="1").record()
    c.assume(pod, NodeName("n"))
    assert c.nodes[NodeName("n")].requested.milli_cpu == 1000
    c.upsert_pod(make_pod("a").req(cpu="1").on("n").record())
    assert not c.is_assumed(pod.key)
    assert c.nodes[NodeName("n")].requested.milli_cpu == 1000  # counted once


def test_forget_returns_capacity() -> None:
    c = cache_with("n")
    pod = make_pod("a").req(cpu="1").record()
    c.assume(pod, NodeName("n"))
    c.forget(pod.key)
    assert c.nodes[NodeName("n")].requested.milli_cpu == 0


def test_assume_twice_is_refused() -> None:
    c = cache_with("n")
    pod = make_pod("a").record()
    c.assume(pod, NodeName("n"))
    with pytest.raises(ValueError):
        c.assume(pod, NodeName("n"))


def test_unconfirmed_assumption_expires_after_ttl() -> None:
    c = cache_with("n")
    pod = make_pod("a").req(cpu="1").record()
    c.assume(pod, NodeName("n"))
    assert c.cleanup_expired(1e9) == []  # binding still in flight: no TTL yet
    c.finish_binding(pod.key, 100.0)
    assert c.cleanup_expired(129.0) == []
    assert c.cleanup_expired(130.0) == [pod.key]
    assert c.nodes[NodeName("n")].requested.milli_cpu == 0


def test_bound_elsewhere_moves_the_accounting() -> None:
    c = cache_with("n", "m")
    c.assume(make_pod("a").req(cpu="1").record(), NodeName("n"))
    c.upsert_pod(make_pod("a").req(cpu="1").on("m").record())
    assert c.nodes[NodeName("n")].requested.milli_cpu == 0
    assert c.nodes[NodeName("m")].requested.milli_cpu == 1000


def test_duplicate_watch_events_count_once_and_terminal_pods_free() -> None:
    c = cache_with("n")
    for _ in range(3):
        c.upsert_pod(make_pod("a").req(cpu="1").on("n").record())
    assert c.nodes[NodeName("n")].requested.milli_cpu == 1000
    done = make_pod("a").req(cpu="1").on("n").json()
    done["status"]["phase"] = "Succeeded"
    from common.records import pod_from_json

    assert c.upsert_pod(pod_from_json(done)) is True
    assert c.nodes[NodeName("n")].requested.milli_cpu == 0


def test_pods_on_unknown_nodes_are_kept_until_the_node_appears() -> None:
    c = cache_with()
    c.upsert_pod(make_pod("a").req(cpu="1").on("late").record())
    assert len(c.index) == 0
    c.upsert_node(make_node("late", cpu="4").record())
    assert c.nodes[NodeName("late")].requested.milli_cpu == 1000 and len(c.index) == 1


def test_relist_drops_vanished_pods_but_keeps_assumptions() -> None:
    c = cache_with("n")
    c.upsert_pod(make_pod("gone").req(cpu="1").on("n").record())
    c.assume(make_pod("mine").req(cpu="1").record(), NodeName("n"))
    c.replace_pods([])
    assert set(c.nodes[NodeName("n")].pods) == {make_pod("mine").record().key}
