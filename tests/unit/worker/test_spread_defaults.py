"""kube-scheduler's default topology spread constraints for pods that state none: the System defaults
(hostname maxSkew 3, zone maxSkew 5, ScheduleAnyway) or a configured List, with the selector deduced from the
Services and controllers selecting the pod (helper.DefaultSelector)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent_scheduler import cli
from agent_scheduler.config import API_VERSION, ConfigError
from common.records import NodeName, NodeRecord
from tests.builders import PodBuilder, make_node, make_pod
from tests.unit.worker.helpers import place
from worker.cache import Cache
from worker.engine import Engine
from worker.plugins import spread_defaults
from worker.scheduler import build_engine
from worker.settings import WorkerSettings
from worker.workloads import REPLICA_SET, REPLICATION_CONTROLLER, SERVICE, STATEFUL_SET, WorkloadSelectors

ZONE = "topology.kubernetes.io/zone"


def engine_with(
    nodes: list[NodeRecord], *, defaulting: str = "System", constraints: list[dict[str, Any]] | None = None
) -> Engine:
    settings = WorkerSettings()
    settings.scheduling.spread_defaulting = defaulting
    settings.scheduling.spread_default_constraints = constraints or []
    cache = Cache(session_label=settings.scheduling.session_label)
    for n in nodes:
        cache.upsert_node(n)
    return build_engine(settings, cache)


def obj(name: str, selector: Any, namespace: str = "default") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"selector": selector}}


def web(name: str, namespace: str = "default") -> PodBuilder:
    return make_pod(name, namespace).label("app", "web").req(cpu="100m").owned_by("ReplicaSet", "web")


def zoned_nodes() -> list[NodeRecord]:
    return [make_node(f"n{i}").label(ZONE, z).record() for i, z in enumerate("aab")]


# ----- DefaultSelector ----------------------------------------------------------------------------------------


def test_default_selector_merges_services_and_the_controllers_selector() -> None:
    w = WorkloadSelectors()
    pod = web("p").label("tier", "front").record()
    assert w.default_selector(pod) is None  # nothing selects it: no default constraint
    w.upsert(SERVICE, obj("svc", {"tier": "front"}))
    w.upsert(SERVICE, obj("other-ns", {"app": "web"}, namespace="elsewhere"))
    w.upsert(SERVICE, obj("not-matching", {"app": "db"}))
    w.upsert(SERVICE, obj("null", None))  # a null selector selects nothing
    w.upsert(
        REPLICA_SET, obj("web", {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]})
    )
    sel = w.default_selector(pod)
    assert sel is not None
    assert [(r.key, r.operator, r.values) for r in sel.requirements] == [
        ("tier", "In", ("front",)),
        ("app", "In", ("web",)),
    ]
    version = w.version
    w.upsert(
        REPLICA_SET, obj("web", {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]})
    )
    assert w.version == version  # unchanged object: no new version
    w.remove(SERVICE, "default", "svc")
    sel = w.default_selector(pod)
    assert sel is not None and [r.key for r in sel.requirements] == ["app"]
    w.replace(REPLICA_SET, [])
    assert w.default_selector(pod) is None


def test_the_controller_is_found_by_owner_reference_kind_and_api_version() -> None:
    w = WorkloadSelectors()
    w.upsert(REPLICATION_CONTROLLER, obj("rc", {"app": "web"}))
    w.upsert(STATEFUL_SET, obj("ss", {"matchLabels": {"app": "web"}}))
    rc_pod = make_pod("a").label("app", "web").owned_by("ReplicationController", "rc", api_version="v1")
    assert w.default_selector(rc_pod.record()) is not None
    ss_pod = make_pod("b").label("app", "web").owned_by("StatefulSet", "ss")
    assert w.default_selector(ss_pod.record()) is not None
    wrong_group = make_pod("c").label("app", "web").owned_by("StatefulSet", "ss", api_version="apps/v1beta1")
    assert w.default_selector(wrong_group.record()) is None
    job = make_pod("d").label("app", "web").owned_by("Job", "ss", api_version="batch/v1")
    assert w.default_selector(job.record()) is None
    assert w.statistics() == {"services": 0, "controllers": 2}


# ----- scoring ------------------------------------------------------------------------------------------------


def test_system_defaults_spread_a_replica_sets_pods_over_hosts_and_zones() -> None:
    engine = engine_with(zoned_nodes())
    engine.cache.workloads.upsert(REPLICA_SET, obj("web", {"matchLabels": {"app": "web"}}))
    placed = [place(engine, web(f"p{i}").record()) for i in range(3)]
    assert sorted(n for n in placed if n) == ["n0", "n1", "n2"]
    # without the ReplicaSet (nothing selects the pods) they binpack onto one node
    plain = engine_with(zoned_nodes())
    placed = [place(plain, web(f"p{i}").record()) for i in range(3)]
    assert len(set(placed)) == 1


def test_a_pod_with_its_own_constraints_gets_no_defaults() -> None:
    engine = engine_with(zoned_nodes())
    engine.cache.workloads.upsert(REPLICA_SET, obj("web", {"matchLabels": {"app": "web"}}))
    # its own (ScheduleAnyway on a key no node has) replaces the defaults: nothing spreads the pods
    placed = [
        place(engine, web(f"p{i}").spread("rack", {"app": "web"}, hard=False).record()) for i in range(3)
    ]
    assert len(set(placed)) == 1


def test_an_empty_list_turns_defaults_off() -> None:
    engine = engine_with(zoned_nodes(), defaulting="List", constraints=[])
    engine.cache.workloads.upsert(REPLICA_SET, obj("web", {"matchLabels": {"app": "web"}}))
    placed = [place(engine, web(f"p{i}").record()) for i in range(3)]
    assert len(set(placed)) == 1


def test_a_listed_do_not_schedule_default_filters() -> None:
    zone_once = {"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule"}
    engine = engine_with(zoned_nodes(), defaulting="List", constraints=[zone_once])
    engine.cache.workloads.upsert(SERVICE, obj("svc", {"app": "web"}))
    placed = [place(engine, web(f"p{i}").record()) for i in range(4)]
    zones = [engine.cache.nodes[NodeName(n)].node.labels[ZONE] for n in placed if n]
    assert sorted(zones) == ["a", "a", "b", "b"]
    # another namespace: the service does not select it, no constraint
    other = [place(engine, web(f"o{i}", "other").record()) for i in range(3)]
    assert len(set(other)) == 1


def test_system_defaults_still_score_nodes_without_a_zone_label() -> None:
    nodes = [make_node("zoned").label(ZONE, "a").record(), make_node("bare").record()]
    engine = engine_with(nodes)
    engine.cache.workloads.upsert(REPLICA_SET, obj("web", {"matchLabels": {"app": "web"}}))
    engine.cache.upsert_pod(web("old").on("zoned").record())
    # the zoneless node competes on its hostname count (0 < 1): it wins
    assert engine.schedule(web("new").record()).node == "bare"
    # a List with the same constraints requires every key: the zoneless node scores 0 and loses
    same = [
        {"maxSkew": 3, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"},
        {"maxSkew": 5, "topologyKey": ZONE, "whenUnsatisfiable": "ScheduleAnyway"},
    ]
    listed = engine_with(nodes, defaulting="List", constraints=same)
    listed.cache.workloads.upsert(REPLICA_SET, obj("web", {"matchLabels": {"app": "web"}}))
    listed.cache.upsert_pod(web("old").on("zoned").record())
    assert listed.schedule(web("new").record()).node == "zoned"


# ----- configuration ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"defaultingType": "Sometimes"}, "defaultingType: 'Sometimes' is not one of System, List"),
        (
            {"defaultingType": "System", "defaultConstraints": [{"maxSkew": 1}]},
            "defaultingType: System cannot be used when defaultConstraints are not empty",
        ),
        (
            {
                "defaultingType": "List",
                "defaultConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": ZONE,
                        "whenUnsatisfiable": "ScheduleAnyway",
                        "labelSelector": {"matchLabels": {"a": "b"}},
                    }
                ],
            },
            "defaultConstraints[0].labelSelector: must not be set",
        ),
        (
            {"defaultingType": "List", "defaultConstraints": [{"maxSkew": 0, "topologyKey": ZONE}]},
            "defaultConstraints[0].maxSkew",
        ),
        (
            {
                "defaultingType": "List",
                "defaultConstraints": [
                    {"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "ScheduleAnyway"},
                    {"maxSkew": 2, "topologyKey": ZONE, "whenUnsatisfiable": "ScheduleAnyway"},
                ],
            },
            "defaultConstraints[1]: duplicate",
        ),
    ],
)
def test_invalid_arguments_are_refused_as_kube_scheduler_refuses_them(
    args: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        spread_defaults(args)


def test_the_config_file_sets_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "worker.yaml"
    path.write_text(
        f"apiVersion: {API_VERSION}\nkind: WorkerConfiguration\n"
        "podTopologySpread:\n  defaultingType: List\n  defaultConstraints:\n"
        f"  - {{maxSkew: 1, topologyKey: {ZONE}, whenUnsatisfiable: ScheduleAnyway}}\n"
    )
    parser = cli._build_parser("worker")
    argv = ["worker", "--config", str(path)]
    args = cli._apply_config(parser, parser.parse_args(argv), argv)
    assert args.spread_defaulting == "List"
    assert args.spread_default_constraints == [
        {"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "ScheduleAnyway"}
    ]
    plain = cli._build_parser("worker").parse_args(["worker"])
    assert (plain.spread_defaulting, plain.spread_default_constraints) == ("System", [])
    path.write_text(
        f"apiVersion: {API_VERSION}\nkind: WorkerConfiguration\npodTopologySpread: {{defaultingType: Some}}\n"
    )
    with pytest.raises(ConfigError, match=r"podTopologySpread.defaultingType: .Some. is not one of"):
        cli._apply_config(parser, parser.parse_args(argv), argv)
