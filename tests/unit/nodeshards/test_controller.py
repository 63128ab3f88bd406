"""``ShardingController`` and ``NodeShardStore`` against a fake API server: the claim -> confirm -> offer
handoff, spec writes, and the rebalance settings handed to the worker-shard assignment."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from common.etcd.keys import KeyLayout
from common.records import NodeName
from coordinator.nodeshards import ShardingController, ShardingOptions
from coordinator.nodeshards.bodies import COLLECTION_PATH, object_path, status_path
from coordinator.nodeshards.store import NodeShardStore
from coordinator.workershards.assignment import AssignmentConfig, AssignmentPolicy
from coordinator.workershards.pools import PolicyPool
from tests.unit.nodeshards.helpers import SHARDING, configmap, node_obj, ns


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


def bare_controller(
    api: FakeApi,
    held: Any = frozenset,
    assignment: AssignmentPolicy | None = None,
    *,
    use_default: bool = False,
) -> ShardingController:
    """A leader's sharding controller on ``api`` with NodeShards available, no nodes and no ConfigMap yet."""
    term = SimpleNamespace(active=True, record=SimpleNamespace(candidate_id="c"), lost=asyncio.Event())
    ctl = ShardingController(
        api,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        term,  # type: ignore[arg-type]
        ShardingOptions(configmap="cm", namespace="ns", scheduler_name="agent", use_default=use_default),
        pool=PolicyPool(),
        held=held,
        keys=KeyLayout("/t"),
        assignment=assignment or AssignmentPolicy(),
    )
    ctl.shards.available = True
    return ctl


def controller(api: FakeApi, held: Any, assignment: AssignmentPolicy | None = None) -> ShardingController:
    ctl = bare_controller(api, held, assignment)
    ctl.nodes.replace(
        [node_obj(f"n{i}", "8", {"node.volcano.sh/warmup": "true"} if i < 2 else None) for i in range(5)]
    )
    ctl.source.event("ADDED", configmap({"sharding.yaml": SHARDING % 3}, "1"))
    return ctl


async def one_pass(ctl: ShardingController) -> None:
    policy, agent = ctl.source.current, ctl.source.agent
    assert policy is not None and agent is not None
    ctl._apply_rebalance(policy)
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


async def test_the_rebalance_settings_in_force_drive_the_worker_assignment() -> None:
    assignment = AssignmentPolicy()
    ctl = controller(FakeApi(), frozenset, assignment)
    await one_pass(ctl)
    assert assignment.config == AssignmentConfig()  # no rebalance section: the assignment's defaults
    rebalance = "rebalance: {startSkew: 0.5, stopSkew: 0.2, maxNodeMovesPerRound: 4}\n"
    ctl.source.event(
        "MODIFIED", configmap({"sharding.yaml": SHARDING % 3, "agent-scheduler.yaml": rebalance}, "2")
    )
    await one_pass(ctl)
    assert assignment.config == AssignmentConfig(skew_threshold=0.5, settle_skew=0.2, max_moves_per_round=4)
    # An invalid edit changes nothing: the last good policy, and its settings, stay in force.
    ctl.source.event(
        "MODIFIED", configmap({"sharding.yaml": SHARDING % 3, "agent-scheduler.yaml": "rebalance: 1"}, "3")
    )
    await one_pass(ctl)
    assert assignment.config.skew_threshold == 0.5


async def test_an_empty_pool_is_explained_and_the_policy_configmap_is_the_event_target() -> None:
    api = FakeApi()
    ctl = controller(api, frozenset)
    ref = ctl.policy_configmap()
    assert ref is not None and (ref.kind, ref.namespace, ref.name) == ("ConfigMap", "ns", "cm")
    await one_pass(ctl)
    api.set_in_use("batch", ["n0", "n1", "n2"])  # the batch side still uses every node the agent shard gets
    ctl.shards.replace(list(api.objects.values()))
    await one_pass(ctl)
    assert not ctl.pool.nodes()
    assert "are still in use by other shards" in ctl.why_empty()
    ctl.nodes.replace([])
    assert ctl.why_empty() == "the cluster has no nodes"


async def test_volcanos_default_policy_on_idle_nodes_is_explained() -> None:
    # Volcano's default gives the agent scheduler only busy nodes: on idle ones, none. No ConfigMap: the event
    # goes elsewhere (the coordinator's Pod).
    ctl = bare_controller(FakeApi(), use_default=True)
    ctl.nodes.replace([node_obj(f"n{i}", "8") for i in range(4)])
    await one_pass(ctl)
    assert not ctl.pool.nodes() and ctl.policy_configmap() is None
    assert "the shard policy (built-in default) gives the agent shard" in ctl.why_empty()
    assert "none of the 4 nodes" in ctl.why_empty()


async def test_the_bound_pods_are_watched_only_once_a_policy_is_in_force() -> None:
    # Only a policy's evaluation reads the requests: without one the coordinator does not watch every pod.
    ctl = bare_controller(FakeApi())
    ctl.nodes.replace([node_obj(f"n{i}", "8") for i in range(4)])

    async def no_record() -> None:
        return None

    ctl._publish_record = no_record  # type: ignore[method-assign]  # etcd is not part of this test
    await ctl._pass()
    assert not ctl._watch_pods.is_set() and len(ctl.pool.nodes()) == 4  # the label pool, no pod watch
    ctl.source.event("ADDED", configmap({"sharding.yaml": SHARDING % 3}, "1"))
    passing = asyncio.create_task(ctl._pass())
    await asyncio.sleep(0.01)
    assert ctl._watch_pods.is_set() and not passing.done()  # no evaluation before the pods are listed
    ctl._pods.synced.set()  # as the reflector does after its first list
    await asyncio.wait_for(passing, 1.0)
    assert ctl._evaluated is not None


async def test_the_label_pool_is_set_again_only_when_the_nodes_change() -> None:
    ctl = bare_controller(FakeApi())

    async def no_record() -> None:
        return None

    ctl._publish_record = no_record  # type: ignore[method-assign]
    ctl.nodes.replace([node_obj(f"n{i}", "8") for i in range(4)])
    changes: list[int] = []
    ctl.pool.listeners.append(lambda: changes.append(len(ctl.pool.nodes())))
    await ctl._pass()
    await ctl._pass()
    ctl.nodes.event("DELETED", node_obj("n3", "8"))
    await ctl._pass()
    assert changes == [4, 3]


async def _switch(
    ctl: ShardingController,
    api: FakeApi,
    max_nodes: int,
    rv: str,
    settings: str = "shards: {rankHysteresis: 1.0, minResidenceSeconds: 10}\n",
) -> frozenset[NodeName]:
    """Apply a ConfigMap edit (the agent's maxNodes), run one pass, and let the store see the written specs."""
    data = {"sharding.yaml": SHARDING % max_nodes, "agent-scheduler.yaml": settings}
    ctl.source.event("MODIFIED", configmap(data, rv))
    await one_pass(ctl)
    ctl.shards.replace(list(api.objects.values()))
    return ctl.desired("agent")


async def test_a_node_that_moved_rests_for_min_residence_seconds_so_lent_nodes_rotate() -> None:
    api = FakeApi()
    ctl = bare_controller(api, frozenset)
    now = [0.0]
    ctl._clock = lambda: now[0]
    ctl.nodes.replace([node_obj(f"n{i}", "8") for i in range(6)])  # all alike: ranked by name
    moved_at: dict[NodeName, list[float]] = {}
    previous: frozenset[NodeName] | None = None
    for t, size in ((0, 3), (1, 1), (2, 3), (20, 1), (21, 3), (40, 1), (41, 3)):
        now[0] = float(t)
        desired = await _switch(ctl, api, size, str(t + 1))
        assert len(desired) == size
        if previous is not None:
            for node in desired ^ previous:
                moved_at.setdefault(node, []).append(now[0])
        previous = desired
    # The two nodes lent at t=1 are not taken back at t=2 (they rest until t=11): two others are.
    assert ctl.shards.holders(["agent", "batch"])  # the store followed the specs
    for node, times in moved_at.items():
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert all(gap >= 10 for gap in gaps), (node, times)
    assert moved_at[NodeName("n1")] == [1.0, 21.0, 40.0]  # lent, taken back 20 s later, lent again
    assert moved_at[NodeName("n3")] == [2.0, 20.0, 41.0]


async def test_without_residence_the_lent_nodes_come_straight_back() -> None:
    api = FakeApi()
    ctl = bare_controller(api, frozenset)
    ctl.nodes.replace([node_obj(f"n{i}", "8") for i in range(6)])
    data = {"sharding.yaml": SHARDING % 3, "agent-scheduler.yaml": "shards: {rankHysteresis: 1.0}\n"}
    ctl.source.event("ADDED", configmap(data, "1"))
    await one_pass(ctl)
    ctl.shards.replace(list(api.objects.values()))
    first = ctl.desired("agent")
    for max_nodes, rv in ((1, "2"), (3, "3")):
        data = {
            "sharding.yaml": SHARDING % max_nodes,
            "agent-scheduler.yaml": "shards: {rankHysteresis: 1.0}\n",
        }
        ctl.source.event("MODIFIED", configmap(data, rv))
        await one_pass(ctl)
        ctl.shards.replace(list(api.objects.values()))
    assert ctl.desired("agent") == first  # the same nodes moved out and back: what residence prevents


async def test_a_node_lent_to_batch_rests_for_its_residence_there_while_agent_nodes_go_back_sooner() -> None:
    """Waves further apart than an agent stint: the batch shard's own residence (longer than the gap between
    waves) keeps the nodes lent after one wave from being taken back before the next, while the agent's
    shorter one lets it give nodes back right after a wave."""
    api = FakeApi()
    ctl = bare_controller(api, frozenset)
    now = [0.0]
    ctl._clock = lambda: now[0]
    ctl.nodes.replace([node_obj(f"n{i}", "8") for i in range(6)])
    settings = "shards: {rankHysteresis: 1.0, minResidenceSeconds: 10, minResidenceSecondsByScheduler: {batch: 30}}\n"
    moved: dict[NodeName, list[tuple[float, str]]] = {}
    previous: frozenset[NodeName] | None = None
    for t, size in ((0, 3), (1, 1), (15, 3), (27, 1), (41, 3), (53, 1), (67, 3)):
        now[0] = float(t)
        desired = await _switch(ctl, api, size, str(t + 1), settings)
        assert len(desired) == size
        if previous is not None:
            for node in desired ^ previous:
                moved.setdefault(node, []).append((now[0], "agent" if node in desired else "batch"))
        previous = desired
    for node, history in moved.items():
        for (t0, to), (t1, _) in itertools.pairwise(history):
            assert t1 - t0 >= (30 if to == "batch" else 10), (node, history)
    assert [t for t, _ in moved[NodeName("n1")]] == [1.0, 41.0, 53.0]  # lent, rested 40 s, taken, given back
    assert [t for t, _ in moved[NodeName("n3")]] == [15.0, 27.0, 67.0]
