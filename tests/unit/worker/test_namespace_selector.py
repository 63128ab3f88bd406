"""namespaceSelector in pod (anti-)affinity terms, as kube-scheduler's InterPodAffinity reads it: the term's
namespaces plus those whose labels the selector matches; the counts follow Namespace label changes."""

from __future__ import annotations

from common.records import NodeName
from tests.builders import make_node, make_pod
from tests.unit.worker.helpers import engine_over, place
from worker.engine import Engine

HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
TEAM_A = {"matchLabels": {"team": "a"}}


def two_nodes() -> Engine:
    engine = engine_over(
        [make_node("n0").label(ZONE, "a").record(), make_node("n1").label(ZONE, "b").record()]
    )
    engine.cache.upsert_namespace("red", {"team": "a"})
    engine.cache.upsert_namespace("blue", {"team": "b"})
    engine.cache.upsert_namespace("mine", {})
    return engine


def test_required_anti_affinity_counts_pods_of_the_selected_namespaces_only() -> None:
    engine = two_nodes()
    engine.cache.upsert_pod(make_pod("r", "red").label("app", "db").on("n0").record())
    engine.cache.upsert_pod(make_pod("b", "blue").label("app", "db").on("n1").record())
    pod = make_pod("p", "mine").pod_affinity(HOST, {"app": "db"}, anti=True, namespace_selector=TEAM_A)
    assert engine.schedule(pod.record()).node == "n1"  # the blue pod is not selected
    # names and selector together: blue named, red selected -> nowhere
    both = make_pod("q", "mine").pod_affinity(
        HOST, {"app": "db"}, anti=True, namespace_selector=TEAM_A, namespaces=["blue"]
    )
    d = engine.schedule(both.record())
    assert d.node is None and "didn't match pod anti-affinity rules" in d.message


def test_a_namespace_relabelled_moves_its_pods_in_and_out_of_the_counts() -> None:
    engine = two_nodes()
    engine.cache.upsert_pod(make_pod("b", "blue").label("app", "db").on("n1").record())
    near = make_pod("p", "mine").pod_affinity(ZONE, {"app": "db"}, namespace_selector=TEAM_A).record()
    d = engine.schedule(near)
    assert d.node is None and "didn't match pod affinity rules" in d.message
    engine.cache.upsert_namespace("blue", {"team": "a"})
    assert engine.schedule(near).node == "n1"
    engine.cache.upsert_namespace("blue", None)  # deleted: a namespace without an object is not selected
    assert engine.schedule(near).node is None
    engine.cache.upsert_namespace("blue", {"team": "a", "x": "y"})
    assert engine.schedule(near).node == "n1"


def test_a_namespace_relabelled_wakes_pods_waiting_for_affinity() -> None:
    engine = two_nodes()
    engine.cache.upsert_pod(make_pod("b", "blue").label("app", "db").on("n1").record())
    near = make_pod("p", "mine").pod_affinity(ZONE, {"app": "db"}, namespace_selector=TEAM_A).record()
    engine.schedule(near)  # makes the tracker
    assert engine.cache.upsert_namespace("blue", {"team": "a"}) is True
    assert engine.cache.upsert_namespace("blue", {"team": "a"}) is False  # no change
    assert engine.cache.upsert_namespace("red", {"team": "b"}) is False  # no pod there


def test_an_empty_namespace_selector_selects_every_namespace() -> None:
    engine = two_nodes()
    engine.cache.upsert_pod(make_pod("b", "blue").label("app", "db").on("n1").record())
    pod = make_pod("p", "mine").pod_affinity(ZONE, {"app": "db"}, namespace_selector={})
    assert engine.schedule(pod.record()).node == "n1"


def test_symmetric_rule_uses_the_incoming_pods_namespace_labels() -> None:
    engine = two_nodes()
    guard = make_pod("g", "blue").label("app", "guard")
    guard.pod_affinity(HOST, {"app": "web"}, anti=True, namespace_selector=TEAM_A)
    engine.cache.upsert_pod(guard.on("n0").record())
    red_web = make_pod("w", "red").label("app", "web").record()
    assert engine.schedule(red_web).node == "n1"
    for i in range(3):
        assert place(engine, make_pod(f"m{i}", "mine").label("app", "web").req(cpu="1").record()) is not None
    # the incoming pod's namespace relabelled: the guard's term now selects it
    engine.cache.upsert_namespace("mine", {"team": "a"})
    assert engine.schedule(make_pod("late", "mine").label("app", "web").record()).node == "n1"


def test_existing_pods_preferred_terms_with_a_namespace_selector_score() -> None:
    engine = two_nodes()
    fan = make_pod("f", "blue").label("app", "fan")
    fan.spec["affinity"] = {
        "podAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "labelSelector": {"matchLabels": {"app": "web"}},
                        "topologyKey": ZONE,
                        "namespaceSelector": TEAM_A,
                    },
                }
            ]
        }
    }
    engine.cache.upsert_pod(fan.on("n1").record())
    # n0 is fuller (MostAllocated would prefer it) only by a little; the preferred term wins for red pods
    engine.cache.upsert_pod(make_pod("filler", "blue").req(cpu="4").on("n0").record())
    assert engine.schedule(make_pod("w", "red").label("app", "web").req(cpu="1").record()).node == NodeName(
        "n1"
    )
    assert engine.schedule(make_pod("w", "mine").label("app", "web").req(cpu="1").record()).node == NodeName(
        "n0"
    )


def test_incoming_pods_preferred_anti_affinity_with_a_namespace_selector_scores() -> None:
    engine = two_nodes()
    engine.cache.upsert_pod(make_pod("noisy", "red").label("app", "noisy").on("n0").record())
    engine.cache.upsert_pod(make_pod("filler", "blue").req(cpu="4").on("n0").record())
    pod = make_pod("p", "mine").req(cpu="1")
    pod.spec["affinity"] = {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "labelSelector": {"matchLabels": {"app": "noisy"}},
                        "topologyKey": HOST,
                        "namespaceSelector": TEAM_A,
                    },
                }
            ]
        }
    }
    assert engine.schedule(pod.record()).node == "n1"
    engine.cache.upsert_namespace("red", {"team": "b"})
    assert engine.schedule(pod.record()).node == "n0"


def test_an_incoming_selector_satisfied_by_no_labels_selects_every_namespace_as_kube_does() -> None:
    # kube-scheduler v1.36 keeps such a selector on the incoming pod's term and matches it against no labels
    engine = two_nodes()
    engine.cache.upsert_pod(make_pod("r", "red").label("app", "db").on("n0").record())
    no_team = {"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}
    anti = make_pod("p", "mine").pod_affinity(HOST, {"app": "db"}, anti=True, namespace_selector=no_team)
    assert engine.schedule(anti.record()).node == "n1"  # red has a team, yet its pod counts
    # a placed pod's such term is matched with the incoming pod's own Namespace labels
    guard = make_pod("g", "blue").label("app", "guard")
    guard.pod_affinity(HOST, {"app": "web"}, anti=True, namespace_selector=no_team)
    engine.cache.upsert_pod(guard.on("n1").record())
    n1 = engine.cache.nodes[NodeName("n1")]
    assert engine.filter_all(make_pod("w", "red").label("app", "web").record(), n1) is None
    assert engine.filter_all(make_pod("w", "mine").label("app", "web").record(), n1) is not None
