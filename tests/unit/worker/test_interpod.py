"""Inter-pod rules in the standalone engine: pod affinity and anti-affinity (InterPodAffinity) and topology
spread (PodTopologySpread), with kube-scheduler's semantics, and the cache's incremental per-domain counts."""

from __future__ import annotations

import random

from common.records import LabelSelector, NodeName, PodKey, PodRecord, Requirement
from tests.builders import make_node, make_pod
from tests.unit.worker.helpers import engine_over, place
from worker.cache import Cache
from worker.engine import Engine
from worker.topology import matches

HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


def zoned(*zones: str, cpu: str = "32") -> Engine:
    """One node per zone name given, named n0, n1, ... (a zone may repeat)."""
    return engine_over([make_node(f"n{i}", cpu=cpu).label(ZONE, z).record() for i, z in enumerate(zones)])


def zone_of(engine: Engine, node: str | None) -> str | None:
    return None if node is None else engine.cache.nodes[NodeName(node)].node.labels.get(ZONE)


def bind(engine: Engine, pod: PodRecord) -> None:
    """A pod placed by anyone (a watch event for a bound pod)."""
    engine.cache.upsert_pod(pod)


# ----- the three examples -------------------------------------------------------------------------------------


def test_anti_affinity_on_hostname_three_pods_two_nodes_third_unschedulable() -> None:
    engine = engine_over([make_node("n0").record(), make_node("n1").record()])
    placed = []
    for i in range(3):
        pod = make_pod(f"p{i}").req(cpu="100m").label("app", "a").pod_affinity(HOST, {"app": "a"}, anti=True)
        placed.append(place(engine, pod.record()))
    assert sorted(n for n in placed[:2] if n) == ["n0", "n1"]
    assert placed[2] is None
    d = engine.schedule(make_pod("p3").label("app", "a").pod_affinity(HOST, {"app": "a"}, anti=True).record())
    assert "didn't match pod anti-affinity rules" in d.message


def test_zone_spread_max_skew_one_over_three_zones_uses_every_zone() -> None:
    engine = zoned("a", "b", "c")
    zones = []
    for i in range(3):
        pod = make_pod(f"p{i}").req(cpu="100m").label("app", "s").spread(ZONE, {"app": "s"})
        zones.append(zone_of(engine, place(engine, pod.record())))
    assert sorted(z for z in zones if z) == ["a", "b", "c"]


def test_required_affinity_to_an_absent_label_stays_pending_unless_self_matching() -> None:
    engine = zoned("a", "b")
    lonely = make_pod("lonely").label("app", "x").pod_affinity(ZONE, {"app": "db"}).record()
    d = engine.schedule(lonely)
    assert d.node is None and "didn't match pod affinity rules" in d.message
    first = make_pod("first").label("app", "db").pod_affinity(ZONE, {"app": "db"}).record()
    node = place(engine, first)
    assert node is not None
    # now the group exists: both follow it into its zone
    for pod in (lonely, make_pod("second").label("app", "db").pod_affinity(ZONE, {"app": "db"}).record()):
        assert zone_of(engine, place(engine, pod)) == zone_of(engine, node)


# ----- InterPodAffinity ---------------------------------------------------------------------------------------


def test_existing_pods_anti_affinity_keeps_a_matching_pod_out_symmetric_rule() -> None:
    engine = zoned("a", "b")
    guard = make_pod("guard").label("app", "g").pod_affinity(ZONE, {"app": "web"}, anti=True).on("n0")
    bind(engine, guard.record())
    for i in range(3):
        assert place(engine, make_pod(f"web{i}").label("app", "web").record()) == "n1"
    # a pod the term does not select may go anywhere
    engine.cache.upsert_node(make_node("n1").label(ZONE, "a").record())
    d = engine.schedule(make_pod("web9").label("app", "web").record())
    assert d.node is None and "existing pods anti-affinity" in d.message
    assert place(engine, make_pod("other").label("app", "other").record()) is not None


def test_anti_affinity_counts_only_the_terms_namespaces() -> None:
    engine = engine_over([make_node("n0").record()])
    bind(engine, make_pod("x", namespace="b").label("app", "a").on("n0").record())
    mine = make_pod("p", namespace="a").label("app", "a").pod_affinity(HOST, {"app": "a"}, anti=True)
    assert engine.schedule(mine.record()).node == "n0"  # only namespace a by default
    listed = make_pod("q", namespace="a").pod_affinity(HOST, {"app": "a"}, anti=True, namespaces=["b"])
    assert engine.schedule(listed.record()).node is None
    everywhere = make_pod("r", namespace="c").pod_affinity(
        HOST, {"app": "a"}, anti=True, namespace_selector={}
    )
    assert engine.schedule(everywhere.record()).node is None


def test_match_label_keys_and_mismatch_label_keys() -> None:
    engine = engine_over([make_node("n0").record(), make_node("n1").record()])
    bind(engine, make_pod("old").label("app", "a").label("version", "1").on("n0").record())
    # anti-affinity only against the same version
    v2 = make_pod("v2").label("app", "a").label("version", "2")
    v2.pod_affinity(HOST, {"app": "a"}, anti=True, match_label_keys=["version"])
    v1 = make_pod("v1").label("app", "a").label("version", "1")
    v1.pod_affinity(HOST, {"app": "a"}, anti=True, match_label_keys=["version"])
    # v2 may share n0 (another version); v1 may not
    engine_n0 = engine.schedule(v1.record())
    assert engine_n0.node == "n1"
    bind(engine, make_pod("fill").label("app", "a").label("version", "1").on("n1").record())
    assert engine.schedule(v1.record()).node is None
    assert engine.schedule(v2.record()).node is not None
    # mismatchLabelKeys: keep away from other tenants' pods
    t = make_pod("t").label("tenant", "x")
    t.pod_affinity(
        HOST,
        None,
        anti=True,
        expressions=[{"key": "tenant", "operator": "Exists"}],
        mismatch_label_keys=["tenant"],
    )
    engine2 = engine_over([make_node("m0").record(), make_node("m1").record()])
    bind(engine2, make_pod("y").label("tenant", "y").on("m0").record())
    bind(engine2, make_pod("x").label("tenant", "x").on("m1").record())
    assert engine2.schedule(t.record()).node == "m1"


def test_affinity_needs_every_topology_key_and_anti_affinity_does_not() -> None:
    engine = engine_over([make_node("keyless").record(), make_node("zoned").label(ZONE, "a").record()])
    bind(engine, make_pod("db").label("app", "db").on("zoned").record())
    follower = make_pod("f").pod_affinity(ZONE, {"app": "db"}).record()
    assert [engine.filter_all(follower, i) is None for i in engine.cache.nodes.values()] == [False, True]
    avoider = make_pod("v").pod_affinity(ZONE, {"app": "db"}, anti=True).record()
    assert [engine.filter_all(avoider, i) is None for i in engine.cache.nodes.values()] == [True, False]


def test_affinity_counts_pods_matching_every_term() -> None:
    engine = zoned("a", "b")
    bind(engine, make_pod("x").label("app", "db").on("n0").record())
    bind(engine, make_pod("y").label("tier", "gold").on("n1").record())
    pod = make_pod("p").pod_affinity(ZONE, {"app": "db"}).pod_affinity(ZONE, {"tier": "gold"}).record()
    # no pod matches both terms, and this pod does not match them itself: nowhere
    assert engine.schedule(pod).node is None
    bind(engine, make_pod("z").label("app", "db").label("tier", "gold").on("n1").record())
    assert engine.schedule(pod).node == "n1"


def test_terminating_pods_count_for_affinity_but_not_for_spread() -> None:
    engine = zoned("a", "b")
    bind(engine, make_pod("old").label("app", "s").on("n0").deleting().record())
    anti = make_pod("p").label("app", "s").pod_affinity(ZONE, {"app": "s"}, anti=True).record()
    assert engine.schedule(anti).node == "n1"
    spread = make_pod("q").label("app", "s").spread(ZONE, {"app": "s"}).record()
    # zone a holds only a terminating pod: both zones count 0, both are feasible
    assert [engine.filter_all(spread, i) is None for i in engine.cache.nodes.values()] == [True, True]


def test_preferred_terms_and_placed_pods_terms_score() -> None:
    engine = zoned("a", "b", cpu="4")
    bind(engine, make_pod("db").label("app", "db").on("n1").record())
    near = make_pod("near").pod_affinity(ZONE, {"app": "db"}, weight=50).record()
    assert engine.schedule(near).node == "n1"
    far = make_pod("far").pod_affinity(ZONE, {"app": "db"}, anti=True, weight=50).record()
    assert engine.schedule(far).node == "n0"
    # a placed pod's preferred affinity to "web" pulls web pods next to it
    engine2 = zoned("a", "b", cpu="4")
    bind(engine2, make_pod("cache").pod_affinity(ZONE, {"app": "web"}, weight=100).on("n1").record())
    assert engine2.schedule(make_pod("web").label("app", "web").record()).node == "n1"


# ----- PodTopologySpread --------------------------------------------------------------------------------------


def test_min_domains_treats_the_global_minimum_as_zero() -> None:
    engine = zoned("a", "b")
    placed = []
    for i in range(3):
        pod = make_pod(f"p{i}").label("app", "s").spread(ZONE, {"app": "s"}, min_domains=3)
        placed.append(place(engine, pod.record()))
    assert placed[0] is not None and placed[1] is not None and placed[2] is None


def test_node_affinity_policy_honor_and_ignore() -> None:
    def run(policy: str) -> list[str | None]:
        engine = engine_over(
            [
                make_node("x").label(ZONE, "a").label("pool", "x").record(),
                make_node("y").label(ZONE, "b").label("pool", "y").record(),
            ]
        )
        out: list[str | None] = []
        for i in range(2):
            pod = make_pod(f"p{i}").label("app", "s").node_selector(pool="x")
            pod.spread(ZONE, {"app": "s"}, node_affinity_policy=policy)
            out.append(place(engine, pod.record()))
        return out

    assert run("Honor") == ["x", "x"]  # zone b is not eligible: only zone a counts
    assert run("Ignore") == ["x", None]  # zone b counts with 0 pods: skew 2 in zone a


def test_node_taints_policy_honor_and_ignore() -> None:
    def run(policy: str | None) -> list[str | None]:
        engine = engine_over(
            [make_node("x").label(ZONE, "a").record(), make_node("y").label(ZONE, "b").taint("t").record()]
        )
        out: list[str | None] = []
        for i in range(2):
            pod = make_pod(f"p{i}").label("app", "s").spread(ZONE, {"app": "s"}, node_taints_policy=policy)
            out.append(place(engine, pod.record()))
        return out

    assert run("Honor") == ["x", "x"]
    assert run(None) == ["x", None]  # Ignore is the default: the tainted zone counts


def test_spread_rejects_nodes_without_the_key_as_unresolvable() -> None:
    engine = engine_over([make_node("n0").record()])
    d = engine.schedule(make_pod("p").spread(ZONE, {"app": "s"}).record())
    assert d.node is None and "missing required label" in d.message


def test_match_label_keys_in_spread_and_self_match() -> None:
    engine = zoned("a", "b")
    # a pod not matching its own selector adds nothing to the skew
    bind(engine, make_pod("x").label("app", "s").on("n0").record())
    other = make_pod("o").label("app", "t").spread(ZONE, {"app": "s"}).record()
    assert [engine.filter_all(other, i) is None for i in engine.cache.nodes.values()] == [True, True]
    mine = make_pod("m").label("app", "s").spread(ZONE, {"app": "s"}).record()
    assert [engine.filter_all(mine, i) is None for i in engine.cache.nodes.values()] == [False, True]
    # matchLabelKeys: only pods of the same revision count
    rev = (
        make_pod("r").label("app", "s").label("rev", "2").spread(ZONE, {"app": "s"}, match_label_keys=["rev"])
    )
    assert [engine.filter_all(rev.record(), i) is None for i in engine.cache.nodes.values()] == [True, True]


def test_schedule_anyway_prefers_the_emptier_zone() -> None:
    engine = zoned("a", "b", cpu="4")
    for i in range(3):
        bind(engine, make_pod(f"x{i}").label("app", "s").on("n1").record())
    pod = make_pod("p").label("app", "s").spread(ZONE, {"app": "s"}, hard=False).record()
    assert engine.schedule(pod).node == "n0"


def test_assumed_pods_count_and_forgetting_gives_the_domain_back() -> None:
    engine = engine_over([make_node("n0").record()])
    first = make_pod("a").label("app", "a").pod_affinity(HOST, {"app": "a"}, anti=True).record()
    assert place(engine, first) == "n0"
    second = make_pod("b").label("app", "a").pod_affinity(HOST, {"app": "a"}, anti=True).record()
    assert engine.schedule(second).node is None
    engine.cache.forget(first.key)
    assert engine.schedule(second).node == "n0"


def test_plain_pods_run_no_inter_pod_filter() -> None:
    engine = zoned("a")
    plain = make_pod("p").req(cpu="100m").record()
    assert not any(f.applies(plain) for f in engine._sometimes)
    assert {f.name for f in engine._sometimes} == {
        "InterPodAffinity",
        "PodTopologySpread",
        "VolumeRestrictions",
        "NodeVolumeLimits",
        "VolumeBinding",
        "VolumeZone",
    }


def test_a_pod_matching_a_waiting_affinity_is_an_event_that_may_help() -> None:
    engine = zoned("a")
    waiting = make_pod("w").pod_affinity(ZONE, {"app": "db"}).record()
    assert engine.schedule(waiting).node is None
    assert engine.cache.upsert_pod(make_pod("db").label("app", "db").on("n0").record()) is True
    assert engine.cache.upsert_pod(make_pod("web").label("app", "web").on("n0").record()) is False
    assert engine.schedule(waiting).node == "n0"


# ----- the incremental counts equal a recount -----------------------------------------------------------------


def test_incremental_counts_equal_a_recount_through_random_changes() -> None:
    rng = random.Random(7)
    cache = Cache()
    zones = ["a", "b", "c"]
    for i in range(6):
        cache.upsert_node(make_node(f"n{i}").label(ZONE, rng.choice(zones)).record())
    selectors = [{"app": "a"}, {"app": "b"}, {"tier": "x"}]
    spaces = ["default", "t1", "t2"]
    team_a = _selector({"team": "a"})
    parts = [
        (frozenset({"default"}), None),
        (frozenset({"t2"}), team_a),  # t2, or any namespace labelled team=a
        (frozenset(), team_a),
    ]
    trackers = [
        cache.topology.tracker(((names, _selector(s), by_label),), live_only=live)
        for s in selectors
        for live in (True, False)
        for names, by_label in parts
    ]
    # a conjunction: both parts must match (a pod's required affinity terms together)
    trackers.append(
        cache.topology.tracker(
            ((frozenset(), team_a, _selector({"tier": "x"})), (frozenset({"t1"}), _selector({}), None)),
            live_only=False,
        )
    )
    for t in trackers:
        t.counts(ZONE, cache.nodes)
        t.counts(HOST, cache.nodes)
    live: dict[PodKey, PodRecord] = {}
    for step in range(400):
        r = rng.random()
        if r < 0.5:
            pod = make_pod(f"p{step}", rng.choice(spaces)).label(
                rng.choice(["app", "tier"]), rng.choice(["a", "b", "x"])
            )
            if rng.random() < 0.2:
                pod.deleting()
            if rng.random() < 0.3:
                pod.pod_affinity(ZONE, {"app": "a"}, anti=True)
            rec = pod.on(f"n{rng.randrange(6)}").record()
            if rng.random() < 0.5:
                cache.upsert_pod(rec)
            else:
                cache.assume(
                    make_pod(rec.name, rec.namespace).label(*next(iter(rec.labels.items()))).record(),
                    NodeName(rec.node_name),
                )
            live[rec.key] = rec
        elif r < 0.7 and live:
            removed = rng.choice(sorted(live))
            cache.remove_pod(removed)
            del live[removed]
        elif r < 0.85:
            # a Namespace created, relabelled or deleted: the pods there count or stop counting
            space = rng.choice(spaces)
            labels = rng.choice([None, {}, {"team": "a"}, {"team": "b"}, {"team": "a", "tier": "x"}])
            cache.upsert_namespace(space, labels)
        else:
            name = f"n{rng.randrange(6)}"
            node = make_node(name)
            if rng.random() < 0.8:
                node.label(ZONE, rng.choice(zones))
            cache.upsert_node(node.record())
        for t in trackers:
            for key in (ZONE, HOST):
                expect: dict[str, int] = {}
                for info in cache.nodes.values():
                    value = info.node.labels.get(key)
                    n = sum(
                        1
                        for p in info.pods.values()
                        if not (t.live_only and p.deleting)
                        and matches(t.match, p, cache.topology.namespace_labels.get(p.namespace))
                    )
                    if value is not None and n:
                        expect[value] = expect.get(value, 0) + n
                assert t.domains[key] == expect, (step, key)
        anti_expect: dict[str, int] = {}
        for info in cache.nodes.values():
            value = info.node.labels.get(ZONE)
            for p in info.pods.values():
                if value is not None and p.inter_pod is not None and p.inter_pod.anti_affinity:
                    anti_expect[value] = anti_expect.get(value, 0) + 1
        got: dict[str, int] = {}
        for g in cache.topology.anti_groups.values():  # one group per (term, namespace): summed
            for v, c in g.domains.items():
                got[v] = got.get(v, 0) + c
        assert got == anti_expect, step


def _selector(labels: dict[str, str]) -> LabelSelector:
    return LabelSelector(tuple(Requirement(k, "In", (v,)) for k, v in labels.items()))


# ----- parsing ------------------------------------------------------------------------------------------------


def test_malformed_inter_pod_rules_are_parse_errors_naming_the_field() -> None:
    bad_skew = make_pod("a").spread(ZONE, {"app": "s"}, max_skew=0).record()
    assert bad_skew.parse_error is not None and "maxSkew" in bad_skew.parse_error
    no_key = make_pod("b").pod_affinity("", {"app": "s"}).record()
    assert no_key.parse_error is not None and "topologyKey" in no_key.parse_error
    bad_op = make_pod("c").pod_affinity(
        HOST, None, expressions=[{"key": "k", "operator": "Gt", "values": ["1"]}]
    )
    record = bad_op.record()
    assert record.parse_error is not None and "invalid operator" in record.parse_error
    many = make_pod("d")
    for i in range(65):
        many.pod_affinity(HOST, {"app": str(i)}, anti=True)
    record = many.record()
    assert record.parse_error is not None and "limit of 64" in record.parse_error


def test_a_null_label_selector_matches_no_pod_and_an_empty_one_every_pod() -> None:
    engine = engine_over([make_node("n0").record()])
    bind(engine, make_pod("x").label("app", "a").on("n0").record())
    null = make_pod("p").pod_affinity(HOST, None, anti=True)
    del null.spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0][
        "labelSelector"
    ]
    assert engine.schedule(null.record()).node == "n0"
    empty = make_pod("q").pod_affinity(HOST, None, anti=True).record()
    assert engine.schedule(empty).node is None


def test_the_label_selector_requirements_of_all_inter_pod_rules_are_bounded_together() -> None:
    many = make_pod("m")
    exprs = [{"key": f"k{i}", "operator": "Exists"} for i in range(50)]
    for _ in range(3):
        many.pod_affinity(HOST, None, anti=True, expressions=exprs)
    record = many.record()
    assert record.parse_error is not None and "label selector requirements" in record.parse_error
