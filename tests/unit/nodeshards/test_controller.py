"""The shard policy at run time, without a cluster: ConfigMap judging, the usage tables, the NodeShard store, and
the controller's claim -> confirm -> offer handoff against fake API objects."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from common.etcd.keys import KeyLayout
from common.nodeshard import COLLECTION_PATH, object_path, status_path
from common.records import NodeName
from coordinator.policy import PolicyConfigError, default_policy, parse_configmap
from coordinator.sharding import (
    REASON_APPLIED,
    REASON_INVALID,
    PolicyPool,
    PolicyRecord,
    PolicyRecordError,
    PolicySource,
    ShardingController,
    ShardingOptions,
    agent_entry,
)
from coordinator.sharding.nodeshards import NodeShardStore
from coordinator.sharding.usage import NodeTable, RequestTable, views

SHARDING = """\
schedulerConfigs:
  - name: agent
    type: agent
    policies:
      - {name: warmup, weight: 5}
      - {name: node-limit, arguments: {maxNodes: %d}}
  - name: batch
    type: volcano
    policies:
      - {name: node-limit, arguments: {maxNodes: 100}}
shardSyncPeriod: "2s"
"""


def ns(*names: str) -> frozenset[NodeName]:
    return frozenset(NodeName(n) for n in names)


def configmap(data: dict[str, str] | None, rv: str, name: str = "cm") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv, "uid": "u1"}, "data": data}


@dataclass
class Emitted:
    events: list[tuple[str, str, str]] = field(default_factory=list)

    def emit(self, ref: Any, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))


def source(*, use_default: bool = False, scheduler: str = "agent") -> tuple[PolicySource, Emitted, list[int]]:
    emitted, calls = Emitted(), []
    src = PolicySource("ns", "cm", scheduler_name=scheduler, use_default=use_default, events=emitted)  # type: ignore[arg-type]
    src.listeners.append(lambda: calls.append(1))
    return src, emitted, calls


# ---- PolicySource ----


def test_valid_configmap_is_applied_with_a_normal_event() -> None:
    src, emitted, calls = source()
    assert src.current is None  # no flag: no policy until a ConfigMap is seen
    src.replace([configmap({"sharding.yaml": SHARDING % 3}, "10")])
    assert src.current == parse_configmap({"sharding.yaml": SHARDING % 3})
    assert src.agent is not None and src.agent.name == "agent"
    assert src.origin == "configmap ns/cm@10" and src.present
    assert [e[:2] for e in emitted.events] == [("Normal", REASON_APPLIED)]
    assert calls


def test_invalid_configmap_keeps_the_policy_and_warns_with_the_field() -> None:
    src, emitted, _ = source()
    src.event("ADDED", configmap({"sharding.yaml": SHARDING % 3}, "10"))
    good = src.current
    src.event("MODIFIED", configmap({"sharding.yaml": SHARDING % -1}, "11"))
    assert src.current is good
    kind, reason, message = emitted.events[-1]
    assert (kind, reason) == ("Warning", REASON_INVALID)
    assert "resourceVersion 11" in message
    assert "schedulerConfigs[0].policies[1].arguments.maxNodes" in message and "must be > 0" in message
    assert good is not None and f"keeping policy {good.version}" in message
    assert src.last_verdict is not None and not src.last_verdict.accepted


def test_a_version_is_judged_once() -> None:
    src, emitted, _ = source()
    bad = configmap({"sharding.yaml": "x: ["}, "12")
    src.event("ADDED", bad)
    src.replace([bad])  # a relist replays it
    assert len(emitted.events) == 1


def test_unchanged_policy_in_a_new_version_emits_nothing() -> None:
    src, emitted, _ = source()
    src.event("ADDED", configmap({"sharding.yaml": SHARDING % 3}, "10"))
    src.event("MODIFIED", configmap({"sharding.yaml": "# a comment\n" + SHARDING % 3}, "13"))
    assert len(emitted.events) == 1
    assert src.origin == "configmap ns/cm@13"


def test_deletion_keeps_the_last_policy() -> None:
    src, _, calls = source()
    src.event("ADDED", configmap({"sharding.yaml": SHARDING % 3}, "10"))
    good = src.current
    src.event("DELETED", configmap({"sharding.yaml": SHARDING % 3}, "14"))
    assert src.current is good and not src.present
    src.replace([])  # a relist without it
    assert src.current is good
    assert len(calls) >= 2


def test_other_configmaps_are_ignored() -> None:
    src, emitted, _ = source()
    src.event("ADDED", configmap({"sharding.yaml": "x: ["}, "10", name="other"))
    assert emitted.events == [] and not src.present


def test_explicit_flag_starts_from_volcano_defaults() -> None:
    src, _, _ = source(use_default=True, scheduler="whatever")
    assert src.current is default_policy()
    assert src.agent is not None and src.agent.name == "agent-scheduler"  # the only agent entry
    assert src.origin == "built-in default"


def test_agent_entry_by_name_or_only_one() -> None:
    two = parse_configmap(two_data())
    assert agent_entry(two, "b").name == "b"
    with pytest.raises(PolicyConfigError, match="none named 'c'"):
        agent_entry(two, "c")
    src, emitted, _ = source(scheduler="c")
    src.event("ADDED", configmap(two_data(), "20"))
    assert src.current is None and emitted.events[-1][1] == REASON_INVALID


def two_data() -> dict[str, str]:
    return {
        "sharding.yaml": "schedulerConfigs:\n- {name: a, type: agent, policies: [{name: warmup}]}\n"
        "- {name: b, type: agent, policies: [{name: warmup}]}\n"
    }


# ---- usage tables ----


def node_obj(
    name: str, cpu: str, labels: dict[str, str] | None = None, heartbeat: str = "t0"
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}, "resourceVersion": heartbeat},
        "status": {
            "allocatable": {"cpu": cpu, "memory": "1Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": heartbeat}],
        },
    }


def pod_obj(uid: str, node: str, cpu: str, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": uid, "namespace": "x", "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
        "status": {"phase": phase},
    }


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


def test_request_table_sums_live_bound_pods_per_node() -> None:
    table = RequestTable()
    table.replace([pod_obj("a", "n1", "500m"), pod_obj("b", "n1", "1")])
    assert table.requested(NodeName("n1")) == 1500
    table.event("MODIFIED", pod_obj("a", "n1", "500m", phase="Succeeded"))
    assert table.requested(NodeName("n1")) == 1000
    table.event("DELETED", pod_obj("b", "n1", "1"))
    assert table.requested(NodeName("n1")) == 0 and len(table) == 0
    table.event("ADDED", pod_obj("c", "n2", "250m"))
    nodes = NodeTable()
    nodes.replace([node_obj("n2", "1")])
    (view,) = views(nodes.nodes, table, {NodeName("n2"): "agent"})
    assert view.util_pct == 25 and view.holder == "agent"


# ---- PolicyRecord ----


def test_policy_record_round_trip() -> None:
    rec = PolicyRecord(mode="policy", version="abc", desired={"agent": 2})
    assert PolicyRecord.decode(rec.encode()) == rec
    with pytest.raises(PolicyRecordError):
        PolicyRecord.decode(b"[1]")


# ---- the handoff, against a fake API server ----


class FakeApi:
    """Enough of ``KubeClient`` for ``NodeShardStore``: NodeShards in a dict, every write logged."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.log: list[tuple[str, str, Any]] = []
        self.rv = 100
        self.on_write: Any = None

    def _bump(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return obj

    async def post(self, path: str, body: Any, params: Any = None) -> Any:
        self.log.append(("POST", path, body))
        obj = self._bump({**body, "metadata": dict(body["metadata"])})
        self.objects[obj["metadata"]["name"]] = obj
        return obj

    async def patch(self, path: str, body: Any, *, kind: str = "merge") -> Any:
        self.log.append(("PATCH", path, body))
        name = path.removeprefix(COLLECTION_PATH + "/").removesuffix("/status")
        obj = self.objects[name]
        for key in ("spec", "status"):
            if key in body:
                obj[key] = {**(obj.get(key) or {}), **body[key]}
        if self.on_write is not None:
            self.on_write(path, body)
        return self._bump(obj)

    async def get(self, path: str, params: Any = None) -> Any:
        assert path == COLLECTION_PATH
        self.log.append(("GET", path, None))
        return {"items": list(self.objects.values()), "metadata": {"resourceVersion": str(self.rv)}}

    def set_in_use(self, name: str, nodes: list[str]) -> None:
        self.objects[name].setdefault("status", {})["nodesInUse"] = nodes
        self._bump(self.objects[name])


def controller(api: FakeApi, held: Any) -> ShardingController:
    term = SimpleNamespace(active=True, record=SimpleNamespace(candidate_id="c"), lost=asyncio.Event())
    ctl = ShardingController(
        api,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        term,  # type: ignore[arg-type]
        ShardingOptions(configmap="cm", namespace="ns", scheduler_name="agent"),
        pool=PolicyPool(),
        held=held,
        keys=KeyLayout("/t"),
    )
    ctl.shards.available = True
    ctl.nodes.replace(
        [node_obj(f"n{i}", "8", {"node.volcano.sh/warmup": "true"} if i < 2 else None) for i in range(5)]
    )
    ctl.source.event("ADDED", configmap({"sharding.yaml": SHARDING % 3}, "1"))
    return ctl


async def one_pass(ctl: ShardingController) -> None:
    policy, agent = ctl.source.current, ctl.source.agent
    assert policy is not None and agent is not None
    if ctl._due(policy):
        ctl._evaluate(policy)
    await ctl._write_specs(policy)
    await ctl._hand_over(agent.name)


async def test_claim_is_published_before_any_node_is_offered() -> None:
    api = FakeApi()
    held: frozenset[NodeName] = frozenset()
    ctl = controller(api, lambda: held)
    offered_when_claimed: list[frozenset[NodeName]] = []
    api.on_write = lambda path, body: (
        offered_when_claimed.append(ctl.pool.nodes()) if path.endswith("/status") else None
    )
    await one_pass(ctl)
    assert ctl.desired("agent") == ns("n0", "n1", "n2")
    assert ctl.pool.nodes() == ns("n0", "n1", "n2")
    assert offered_when_claimed == [frozenset()]  # the pool was empty while the claim was written
    assert api.objects["agent"]["status"]["nodesInUse"] == ["n0", "n1", "n2"]
    methods = [(m, p) for m, p, _ in api.log]
    assert methods.index(("GET", COLLECTION_PATH)) > methods.index(("PATCH", status_path("agent")))


async def test_nodes_another_shard_uses_wait_and_released_nodes_stay_published_until_free() -> None:
    api = FakeApi()
    held: set[NodeName] = set()
    ctl = controller(api, lambda: frozenset(held))
    await one_pass(ctl)  # creates both shards
    api.set_in_use("batch", ["n2"])  # the batch side still uses n2
    ctl.shards.replace(list(api.objects.values()))
    await one_pass(ctl)
    assert ctl.pool.nodes() == ns("n0", "n1")
    assert api.objects["agent"]["status"]["nodesToAdd"] == ["n2"]
    held.update(ns("n0", "n1"))  # workers hold what they were granted
    # maxNodes 3 -> 1: n1 leaves the pool at once, but stays published while a worker holds it
    ctl.source.event("MODIFIED", configmap({"sharding.yaml": SHARDING % 1}, "2"))
    await one_pass(ctl)
    assert ctl.pool.nodes() == ns("n0")
    assert api.objects["agent"]["status"]["nodesInUse"] == ["n0", "n1"]
    assert api.objects["agent"]["status"]["nodesToRemove"] == ["n1"]
    held.discard(NodeName("n1"))  # released
    await one_pass(ctl)
    assert api.objects["agent"]["status"]["nodesInUse"] == ["n0"]


async def test_a_claim_racing_ours_is_caught_by_the_confirming_read() -> None:
    api = FakeApi()
    ctl = controller(api, frozenset)
    await one_pass(ctl)
    ctl.pool.set({})
    # the batch side claims n0 just as we publish our claim: our watch cache has not seen it
    api.on_write = lambda path, body: (
        api.set_in_use("batch", ["n0"]) if path == status_path("agent") else None
    )
    api.objects["agent"]["status"]["nodesInUse"] = []
    ctl.shards.replace(list(api.objects.values()))
    await one_pass(ctl)
    assert NodeName("n0") not in ctl.pool.nodes()
    assert ctl.pool.nodes() == ns("n1", "n2")


async def test_before_the_shard_map_has_listed_nothing_published_is_withdrawn() -> None:
    api = FakeApi()
    ctl = controller(api, lambda: None)
    await one_pass(ctl)
    api.set_in_use("agent", ["n0", "n1", "n2", "n4"])  # a previous term's claim, n4 perhaps still held
    ctl.shards.replace(list(api.objects.values()))
    await one_pass(ctl)
    assert api.objects["agent"]["status"]["nodesInUse"] == ["n0", "n1", "n2", "n4"]
    assert ctl.pool.nodes() == ns("n0", "n1", "n2")


async def test_spec_written_for_every_scheduler_and_only_when_changed() -> None:
    api = FakeApi()
    ctl = controller(api, frozenset)
    await one_pass(ctl)
    assert api.objects["batch"]["spec"]["nodesDesired"] == ["n3", "n4"]
    writes = len(api.log)
    await ctl._write_specs(ctl.source.current)  # type: ignore[arg-type]
    assert len(api.log) == writes
    assert sorted(b["metadata"]["name"] for m, _, b in api.log if m == "POST") == ["agent", "batch"]
    ctl.source.event("MODIFIED", configmap({"sharding.yaml": SHARDING % 2}, "2"))
    await one_pass(ctl)
    assert ("PATCH", object_path("agent")) in [(m, p) for m, p, _ in api.log]


def test_nodeshard_store_holders_follow_config_order() -> None:
    store = NodeShardStore(None)  # type: ignore[arg-type]
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    store.replace(
        [
            {"metadata": {"name": "a", "resourceVersion": "1"}, "spec": {"nodesDesired": ["x", "y"]}},
            {
                "metadata": {"name": "b", "resourceVersion": "2"},
                "spec": {"nodesDesired": ["y"]},
                "status": {"nodesInUse": ["y"], "lastUpdateTime": now},
            },
        ]
    )
    assert store.holders(["b", "a"]) == {NodeName("y"): "b", NodeName("x"): "a"}
    assert store.in_use_except("a") == ns("y") and store.in_use_except("b") == frozenset()
