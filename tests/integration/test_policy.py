"""The shard policy ConfigMap and NodeShard interop on the real local cluster (issue 5).

Each test runs its own coordinator and workers (``agent-scheduler`` subprocesses, stopped by PID) with a scheduler
name and etcd prefix of its own (the cluster's etcd), manages a few nodes it labelled itself, and reads the outcome
from the API server (NodeShards, Events, pods) and from etcd (``agent-scheduler status``).

Covered: Volcano's own example ConfigMaps are accepted and NodeShards appear; the built-in default and the label
pool without a ConfigMap; an edit (ConfigMap or node label) moves nodes within one sync, measured; many kinds of
invalid ConfigMap (hostile ones too: an alias bomb, 20,000-deep nesting, a 5,000-digit integer) are each rejected
with a short Warning event naming the problem while the old policy stays and the coordinator lives on; a deleted
ConfigMap keeps the last policy; and under agent load, with a batch-scheduler stand-in speaking the NodeShard
protocol and the policy moving nodes, no pod is ever bound on a node outside its scheduler's published share.

Measured times are printed and recorded as test properties; only generous timeouts (hang guards) are asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from common.etcd.kv import connect
from common.kube import KubeClient, NotFound
from coordinator.nodeshards import REASON_APPLIED, REASON_INVALID
from coordinator.nodeshards.policy import PolicyConfigError, parse_configmap
from coordinator.workershards.assignment import AssignmentConfig
from scale.cluster import Cluster
from tests.integration.policy_rig import (
    ROOT,
    BatchStandIn,
    Entry,
    Recorder,
    Rig,
    ensure_crd,
    eventually,
    service_account_kubeconfig,
    small_pod,
)
from tests.integration.support import all_bound, create_pods, wait_for

pytestmark = pytest.mark.integration

FIXTURES = ROOT / "tests" / "unit" / "nodeshards" / "policy"
HANG = 60.0  # a guard against hanging, never a speed requirement


@pytest.fixture
async def rig(cluster: Cluster, kube: KubeClient, namespace: str, tmp_path: Path) -> AsyncIterator[Rig]:
    await ensure_crd(kube)
    handle = Rig(cluster, kube, namespace, tmp_path)
    try:
        yield handle
    finally:
        failures = await handle.close()
        assert not failures, "\n".join(failures)


def policy(rig: Rig, *, agent_max: int, period: str = "2s", settings: str | None = None) -> dict[str, str]:
    """Agent first (warm nodes first, then by name, at most ``agent_max``), the batch shard takes the rest."""
    sharding = f"""\
schedulerConfigs:
  - name: {rig.scheduler_name}
    type: agent
    policies:
      - {{name: warmup, weight: 5, arguments: {{warmupLabel: {rig.warm_label}, warmupLabelValue: "true"}}}}
      - {{name: node-limit, arguments: {{minNodes: 1, maxNodes: {agent_max}}}}}
  - name: {rig.batch_name}
    type: volcano
    policies:
      - {{name: node-limit, arguments: {{maxNodes: 100}}}}
shardSyncPeriod: "{period}"
enableNodeEventTrigger: true
"""
    data = {"sharding.yaml": sharding}
    if settings is not None:
        data["agent-scheduler.yaml"] = settings
    return data


async def settled(rig: Rig, agent_nodes: set[str], *, timeout: float = HANG) -> None:
    """Wait until the agent shard desires exactly ``agent_nodes``, publishes exactly them as in use, the batch
    shard desires the rest of the managed nodes, and the workers hold exactly them with nothing being revoked."""
    rest = set(rig.nodes) - agent_nodes

    async def check() -> bool:
        agent, batch = await rig.shard(rig.scheduler_name), await rig.shard(rig.batch_name)
        if agent is None or batch is None:
            return False
        if (
            agent.nodes_desired != agent_nodes
            or agent.nodes_in_use != agent_nodes
            or batch.nodes_desired != rest
        ):
            return False
        workers = (await rig.status())["workers"].values()
        held = sum(w.get("nodes", 0) for w in workers)
        return held == len(agent_nodes) and all(w.get("revoking", 0) == 0 for w in workers)

    await eventually(check, timeout, f"agent shard settled on {sorted(agent_nodes)}")


async def start(rig: Rig, workers: int = 1) -> None:
    rig.coordinator()
    for i in range(workers):
        rig.worker(f"w{i}")


# ---- Volcano's formats, defaults ----


@pytest.mark.parametrize("fixture", ["volcano_example_configmap.yaml", "volcano_user_guide_configmap.yaml"])
async def test_volcano_example_configmap_is_accepted_and_nodeshards_appear(
    rig: Rig, kube: KubeClient, namespace: str, fixture: str
) -> None:
    nodes = await rig.manage(8)
    busy = nodes[:2]  # at 75 % CPU requested: inside the agent band (0.7-1.0), outside volcano's (0-0.69)
    for node in busy:
        obj = await kube.get(f"/api/v1/nodes/{node}")
        alloc_milli = int(obj["status"]["allocatable"]["cpu"]) * 1000
        pod = small_pod(
            f"load-{node}", scheduler="default-scheduler", kind="load", cpu=f"{alloc_milli * 3 // 4}m"
        )
        pod["spec"]["nodeName"] = node
        await kube.post(f"/api/v1/namespaces/{namespace}/pods", pod)
    await rig.forget_shards({"agent-scheduler", "volcano"})  # the names Volcano's examples use
    data = yaml.safe_load((FIXTURES / fixture).read_text())["data"]
    version = await rig.put_configmap(data)
    await start(rig)

    async def agent_published() -> Any:
        shard = await rig.shard("agent-scheduler")
        return shard is not None and shard.nodes_in_use == set(busy) and shard

    agent = await eventually(agent_published, HANG, "agent-scheduler NodeShard with the busy nodes in use")
    assert agent.nodes_desired == set(busy)
    volcano = await rig.shard("volcano")
    assert volcano is not None and volcano.nodes_desired == set(nodes) - set(busy)
    assert agent.last_update_time is not None

    applied = await eventually(lambda: rig.events(REASON_APPLIED), HANG, "ShardingPolicyApplied event")
    assert f"resourceVersion {version}" in applied[0]["message"]
    assert applied[0]["type"] == "Normal" and applied[0]["involvedObject"]["kind"] == "ConfigMap"

    record = await eventually(rig.record, HANG, "policy record")
    assert record["mode"] == "policy"
    assert record["version"] == parse_configmap(data).version
    assert record["origin"] == f"configmap {namespace}/{rig.configmap}@{version}"
    assert record["agent_shard"] == "agent-scheduler" and record["nodeshards"]
    status = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent_scheduler.cli",
        "status",
        f"--etcd-endpoints={rig.etcd}",
        f"--etcd-prefix={rig.prefix}",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(status.communicate(), HANG)
    assert status.returncode == 0
    shown = out.decode()
    assert f"policy {record['version']}" in shown, shown
    assert "agent-scheduler [agent]" in shown and "volcano [volcano]" in shown, shown


async def test_explicit_flag_without_configmap_applies_volcano_defaults(rig: Rig) -> None:
    nodes = await rig.manage(4)
    await rig.forget_shards({"agent-scheduler", "volcano"})  # default_policy()'s names
    await start(rig)  # --policy-configmap is given, the ConfigMap does not exist
    record = await eventually(rig.record, HANG, "policy record")
    assert record["mode"] == "policy" and record["origin"] == "built-in default"
    assert not record["configmap_present"]

    async def volcano_desired() -> bool:
        shard = await rig.shard("volcano")
        return shard is not None and shard.nodes_desired == set(nodes)

    await eventually(volcano_desired, HANG, "idle nodes desired by volcano (default band 0-0.6)")
    agent = await rig.shard("agent-scheduler")
    assert agent is not None and agent.nodes_desired == set()  # idle nodes are outside the agent band 0.7-1.0


async def test_without_configmap_and_flag_keeps_the_label_pool(rig: Rig) -> None:
    nodes = await rig.manage(4)
    rig.coordinator(policy_flags=False)
    rig.worker("w0")

    async def all_held() -> bool:
        workers = (await rig.status())["workers"].values()
        held: int = sum(w.get("nodes", 0) for w in workers)
        return held == len(nodes)

    await eventually(all_held, HANG, "the label pool granted")
    record = await eventually(rig.record, HANG, "policy record")
    assert (
        record["mode"] == "label-pool" and record["configmap"] == "volcano-system/volcano-sharding-configmap"
    )


async def test_rbac_manifest_is_enough_for_coordinator_and_worker(
    rig: Rig, kube: KubeClient, cluster: Cluster, namespace: str
) -> None:
    created = await service_account_kubeconfig(
        kube, cluster, namespace, rig.tmp / "sa.kubeconfig", configmap=rig.configmap
    )
    try:
        rig.kubeconfig = rig.tmp / "sa.kubeconfig"
        n = await rig.manage(4)
        await rig.forget_shards({rig.scheduler_name, rig.batch_name})
        await rig.put_configmap(policy(rig, agent_max=2))
        await start(rig)
        await settled(rig, {n[0], n[1]})  # NodeShards created, spec and status written, nodes granted
        pods = [small_pod(f"agent-{i}", scheduler=rig.scheduler_name, kind="agent") for i in range(10)]
        await create_pods(kube, namespace, pods)
        bound = await wait_for(kube, namespace, all_bound(10), timeout=HANG, what="agent pods bound")
        assert {p["spec"]["nodeName"] for p in bound} <= {n[0], n[1]}
        version = await rig.put_configmap({"sharding.yaml": "schedulerConfigs: [\n"})
        await eventually(
            lambda: _event_for(rig, REASON_INVALID, version),
            HANG,
            "Warning event recorded by the service account",
        )
        for proc in rig.procs.values():
            text = proc.log_path.read_text()
            # An API error reads "403 Forbidden: ..." (``common.kube.ApiError``); a bare "403" may be a
            # resourceVersion or an epoch.
            assert not re.search(r"\b403( \w+)?:", text) and "Forbidden" not in text, proc.tail()
    finally:
        for path in created:
            with contextlib.suppress(NotFound):
                await kube.delete(path)


async def _event_for(rig: Rig, reason: str, version: int) -> list[dict[str, Any]]:
    return [e for e in await rig.events(reason) if f"resourceVersion {version}" in e["message"]]


# ---- hot reload ----


async def test_policy_edit_moves_nodes_within_one_sync(rig: Rig, record_property: Any) -> None:
    n = await rig.manage(8)
    for node in (n[5], n[6]):
        await rig.label(node, rig.warm_label, "true")
    await rig.forget_shards({rig.scheduler_name, rig.batch_name})
    await rig.put_configmap(policy(rig, agent_max=4))
    await start(rig)
    await settled(rig, {n[5], n[6], n[0], n[1]})

    timings: dict[str, float] = {}
    t0 = time.monotonic()
    await rig.put_configmap(policy(rig, agent_max=2))  # shrink: n0, n1 go to the batch shard
    await settled(rig, {n[5], n[6]})
    timings["configmap edit maxNodes 4->2"] = time.monotonic() - t0

    t0 = time.monotonic()
    await rig.label(n[2], rig.warm_label, "true")  # warmth moves n5 -> n2: a node event, no ConfigMap edit
    await rig.label(n[5], rig.warm_label, None)
    await settled(rig, {n[2], n[6]})
    timings["node label warm n5->n2"] = time.monotonic() - t0

    t0 = time.monotonic()
    await rig.put_configmap(policy(rig, agent_max=5))  # grow: three nodes come back from the batch shard
    await settled(rig, {n[2], n[6], n[0], n[1], n[3]})
    timings["configmap edit maxNodes 2->5"] = time.monotonic() - t0

    for what, seconds in timings.items():
        record_property(what, round(seconds, 3))
        print(f"edit -> settled, {what}: {seconds:.2f} s (shardSyncPeriod 2s)")
    record = await rig.record()
    assert record["desired"] == {rig.scheduler_name: 5, rig.batch_name: 3}


_ALIAS_BOMB_KEY = "".join(
    [
        f"l0: &l0 [{', '.join(['lol'] * 9)}]\n",
        *(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 9)),
        "? *l8\n: x\n",
    ]
)
"""A few hundred bytes whose key, expanded and shown with ``repr``, would exhaust memory."""


def _invalid_cases(rig: Rig) -> list[tuple[str, dict[str, str], tuple[str, ...]]]:
    """(kind, ConfigMap data, fragments the Warning event must contain)."""
    good = policy(rig, agent_max=3)["sharding.yaml"]
    agent = rig.scheduler_name

    def edit(old: str, new: str) -> dict[str, str]:
        assert old in good, old
        return {"sharding.yaml": good.replace(old, new, 1)}

    return [
        (
            "yaml syntax",
            {"sharding.yaml": "schedulerConfigs: [\n  - name: a\n"},
            ("sharding.yaml", "invalid YAML"),
        ),
        (
            "duplicate YAML key",
            {"sharding.yaml": good + 'shardSyncPeriod: "5s"\n'},
            ("duplicate key 'shardSyncPeriod'",),
        ),
        ("missing sharding.yaml", {"other": "x"}, ("sharding.yaml", "key missing")),
        (
            "unknown policy",
            edit("{name: node-limit, arguments: {maxNodes: 100}}", "{name: binpack}"),
            ("schedulerConfigs[1].policies[0].name", "unknown policy 'binpack'"),
        ),
        (
            "wrong type",
            edit("weight: 5", 'weight: "high"'),
            ("schedulerConfigs[0].policies[0].weight", "must be an integer, got string"),
        ),
        (
            "negative weight",
            edit("weight: 5", "weight: -1"),
            ("schedulerConfigs[0].policies[0].weight", "must be >= 0"),
        ),
        (
            "min > max (nodes)",
            edit("minNodes: 1, maxNodes: 3", "minNodes: 4, maxNodes: 3"),
            ("schedulerConfigs[0].policies[1].arguments.minNodes", "must be <= maxNodes"),
        ),
        (
            "min > max (utilisation)",
            edit(
                "{name: node-limit, arguments: {maxNodes: 100}}",
                "{name: allocation-rate, arguments: {minCPUUtil: 0.8, maxCPUUtil: 0.5}}",
            ),
            ("schedulerConfigs[1].policies[0].arguments.minCPUUtil", "must be <= maxCPUUtil"),
        ),
        (
            "missing agent entry",
            edit("type: agent", "type: volcano"),
            ("schedulerConfigs", 'no scheduler of type "agent"'),
        ),
        (
            "duplicate scheduler names",
            edit(f"name: {rig.batch_name}", f"name: {agent}"),
            ("schedulerConfigs[1].name", f"duplicate scheduler name '{agent}'"),
        ),
        (
            "bad sync period",
            edit('shardSyncPeriod: "2s"', 'shardSyncPeriod: "soon"'),
            ("shardSyncPeriod", "invalid duration"),
        ),
        (
            "unknown argument (typo)",
            edit("maxNodes: 100}", "maxNodez: 100}"),
            ("schedulerConfigs[1].policies[0].arguments.maxNodez", "unknown field"),
        ),
        (
            "invalid own settings",
            {**policy(rig, agent_max=3), "agent-scheduler.yaml": "rebalance: {startSkew: 0}\n"},
            ("agent-scheduler.yaml", "rebalance.startSkew", "must be > 0"),
        ),
        (
            "YAML alias bomb as a mapping key",
            {"sharding.yaml": good + _ALIAS_BOMB_KEY},
            ("sharding.yaml", "not allowed in the policy"),
        ),
        (
            "20,000-deep nesting (block)",
            {"sharding.yaml": good + "extra:\n  " + "- " * 20_000 + "x\n"},
            ("sharding.yaml", "nested deeper than 32 levels"),
        ),
        (
            "20,000-deep nesting (flow)",
            {"sharding.yaml": good + "extra: " + "[" * 20_000 + "]" * 20_000 + "\n"},
            ("sharding.yaml", "nest"),
        ),
        (
            "5,000-digit integer",
            edit("maxNodes: 3", "maxNodes: " + "9" * 5000),
            ("sharding.yaml", "longer than 1024"),
        ),
        (
            "no agent entry for this scheduler",
            {
                "sharding.yaml": good.replace(f"name: {agent}", "name: other-a", 1).replace(
                    f"name: {rig.batch_name}\n    type: volcano", "name: other-b\n    type: agent", 1
                )
            },
            ("schedulerConfigs", f"none named '{agent}'"),
        ),
    ]


async def test_invalid_configmaps_are_rejected_with_an_event_and_the_old_policy_stays(rig: Rig) -> None:
    n = await rig.manage(6)
    await rig.forget_shards({rig.scheduler_name, rig.batch_name})
    await rig.put_configmap(policy(rig, agent_max=3))
    await start(rig)
    await settled(rig, {n[0], n[1], n[2]})
    good = (await rig.record())["version"]
    cases = _invalid_cases(rig)
    assert len({kind for kind, _, _ in cases}) >= 10
    for kind, data, fragments in cases:
        try:
            parse_configmap(data)
        except PolicyConfigError:
            pass
        else:  # only the check that depends on which scheduler we are is not the pure parser's
            assert kind == "no agent entry for this scheduler", f"{kind}: the pure parser accepts it"
        version = await rig.put_configmap(data)

        async def rejected(version: int = version) -> Any:
            found = [
                e for e in await rig.events(REASON_INVALID) if f"resourceVersion {version})" in e["message"]
            ]
            return found and found[0]

        event = await eventually(rejected, HANG, f"Warning event for {kind}")
        assert event["type"] == "Warning" and event["involvedObject"]["name"] == rig.configmap
        for fragment in fragments:
            assert fragment in event["message"], (kind, event["message"])
        assert f"keeping policy {good}" in event["message"]

        async def noted(version: int = version) -> Any:
            record = await rig.record()
            return f"resourceVersion {version}:" in record["last_rejected"] and record

        record = await eventually(noted, HANG, f"rejection of {kind} in status")
        assert record["version"] == good, kind
        agent = await rig.shard(rig.scheduler_name)
        assert agent is not None and agent.nodes_desired == {n[0], n[1], n[2]}, kind
        assert len(event["message"]) < 1024, (kind, len(event["message"]))
        assert rig.procs["coordinator"].alive(), (kind, rig.procs["coordinator"].tail())
    log = rig.procs["coordinator"].log_path.read_text()
    rejections = [line for line in log.splitlines() if " rejected (resourceVersion " in line]
    assert rejections and max(map(len, rejections)) < 2048  # no value is ever printed whole
    assert log.count(f"sharding ConfigMap {rig.namespace}/{rig.configmap} rejected") == len(cases)
    # and a valid edit is applied again
    await rig.put_configmap(policy(rig, agent_max=2))
    await settled(rig, {n[0], n[1]})
    assert (await rig.record())["last_rejected"] == ""
    before = await rig.record()
    # Sections that left the ConfigMap (an older manifest) are ignored with a warning, never rejected.
    legacy = "lease: {ttlSeconds: 15}\ndispatch: {candidatesPerPod: 3}\nrebalance: {skewThreshold: 1.25}\n"
    version = await rig.put_configmap({**policy(rig, agent_max=2), "agent-scheduler.yaml": legacy})

    async def accepted() -> Any:
        record = await rig.record()
        return record["origin"].endswith(f"@{version}") and record

    record = await eventually(accepted, HANG, "the legacy settings accepted")
    assert record["last_rejected"] == "" and record["version"] == before["version"]
    assert "warnings: 3" in record["summary"], record["summary"]
    assert record["rebalance"] == AssignmentConfig().describe()
    # The rebalance settings reach the worker-shard assignment on a hot reload.
    tuned = AssignmentConfig(skew_threshold=0.5, settle_skew=0.2, max_moves_per_round=4)
    rebalance = "rebalance: {startSkew: 0.5, stopSkew: 0.2, maxNodeMovesPerRound: 4}\n"
    await rig.put_configmap({**policy(rig, agent_max=2), "agent-scheduler.yaml": rebalance})

    async def in_force() -> Any:
        record = await rig.record()
        return record["rebalance"] == tuned.describe() and record

    record = await eventually(in_force, HANG, "the rebalance settings in force")
    assert tuned.describe() in record["summary"] and record["version"] != before["version"]


async def test_deleted_configmap_keeps_the_last_policy(rig: Rig, kube: KubeClient) -> None:
    n = await rig.manage(6)
    await rig.forget_shards({rig.scheduler_name, rig.batch_name})
    await rig.put_configmap(policy(rig, agent_max=2))
    await start(rig)
    await settled(rig, {n[0], n[1]})
    before = await rig.record()
    await rig.delete_configmap()

    async def gone() -> Any:
        record = await rig.record()
        return not record["configmap_present"] and record

    after = await eventually(gone, HANG, "the deletion noticed")
    assert after["version"] == before["version"] and after["mode"] == "policy"
    assert "deleted; keeping policy" in rig.procs["coordinator"].log_path.read_text()
    agent = await rig.shard(rig.scheduler_name)
    assert agent is not None and agent.nodes_desired == {n[0], n[1]}
    # the kept policy still drives the pools: warming n4 brings it into the agent shard (max 2, warm first)
    await rig.label(n[4], rig.warm_label, "true")
    await settled(rig, {n[4], n[0]})


# ---- coexistence with a batch scheduler ----


async def _agent_load(kube: KubeClient, namespace: str, scheduler: str, stop: asyncio.Event) -> int:
    """Agent pods through our scheduler: a few every half second, each deleted a few seconds after binding."""
    created, index = 0, 0
    path = f"/api/v1/namespaces/{namespace}/pods"
    bound_at: dict[str, float] = {}
    while not stop.is_set():
        for _ in range(4):
            await kube.post(path, small_pod(f"agent-{index:05d}", scheduler=scheduler, kind="agent", cpu="2"))
            index += 1
            created += 1
        pods = (await kube.get(path, {"labelSelector": "e2e-kind=agent"}))["items"]
        now = time.monotonic()
        for p in pods:
            if p["spec"].get("nodeName"):
                bound_at.setdefault(p["metadata"]["name"], now)
        for name, since in list(bound_at.items()):
            if now - since > 3.0:
                with contextlib.suppress(NotFound):
                    await kube.delete(f"{path}/{name}", {"gracePeriodSeconds": "0"})
                del bound_at[name]
        await asyncio.sleep(0.5)
    return created


def audit(timeline: list[Entry], agent: str, batch: str) -> dict[str, Any]:
    """Replay the timeline in resourceVersion order and check the handoff at every point:

    - every binding falls inside its scheduler's published share and outside the other's;
    - published shares never overlap, and what agent workers hold (granted or still revoking, in etcd) is always
      inside the agent share and outside the batch share: a node moves release-then-acquire.
    """
    published: dict[str, frozenset[str]] = {agent: frozenset(), batch: frozenset()}
    held: dict[str, frozenset[str]] = {}
    owner_of = {"agent": agent, "batch": batch}
    violations: list[str] = []
    handoff_breaks: list[str] = []
    ever: dict[str, set[str]] = {agent: set(), batch: set()}
    kinds_on: dict[str, set[str]] = defaultdict(set)
    binds = {"agent": 0, "batch": 0}
    for e in timeline:
        if e.kind in ("shard", "held"):
            if e.kind == "shard":
                published[e.name] = e.nodes
                ever[e.name] |= e.nodes
            else:
                held[e.name] = e.nodes
            both = published[agent] & published[batch]
            if both:
                handoff_breaks.append(f"rv {e.rv}: {sorted(both)} published by both")
            workers = frozenset().union(*held.values())
            if workers - published[agent]:
                handoff_breaks.append(
                    f"rv {e.rv}: {sorted(workers - published[agent])} held by workers, not published"
                )
            if workers & published[batch]:
                handoff_breaks.append(
                    f"rv {e.rv}: {sorted(workers & published[batch])} held by workers, batch publishes"
                )
            continue
        if e.pod_kind not in owner_of:
            continue
        binds[e.pod_kind] += 1
        kinds_on[e.node].add(e.pod_kind)
        mine, other = owner_of[e.pod_kind], owner_of["batch" if e.pod_kind == "agent" else "agent"]
        if e.node not in published[mine] or e.node in published[other]:
            violations.append(
                f"rv {e.rv}: {e.pod_kind} pod {e.name} bound on {e.node}; "
                f"{mine} publishes {e.node in published[mine]}, {other} publishes {e.node in published[other]}"
            )
    moved = ever[agent] & ever[batch]
    shared = {node for node, kinds in kinds_on.items() if len(kinds) > 1}
    return {
        "violations": violations,
        "handoff_breaks": handoff_breaks,
        "moved": moved,
        "shared_outside_moves": shared - moved,
        "nodes_with_both": shared,
        "binds": binds,
    }


@pytest.mark.slow
async def test_agent_and_batch_pods_never_share_a_node_outside_the_handoff(
    rig: Rig, kube: KubeClient, namespace: str, record_property: Any
) -> None:
    n = await rig.manage(10)
    for node in (n[7], n[8]):
        await rig.label(node, rig.warm_label, "true")
    agent_name, batch_name = rig.scheduler_name, rig.batch_name
    await rig.forget_shards({agent_name, batch_name})
    await rig.put_configmap(policy(rig, agent_max=3))
    await start(rig, workers=2)
    await settled(rig, {n[7], n[8], n[0]})

    etcd = await connect([rig.etcd])
    recorder = Recorder(kube, namespace, {agent_name, batch_name}, etcd, rig.prefix)
    await recorder.start()
    batch = BatchStandIn(kube, namespace, batch_name, agent_name)
    stop = asyncio.Event()
    batch_task = asyncio.create_task(batch.run())
    load_task = asyncio.create_task(_agent_load(kube, namespace, agent_name, stop))
    try:
        await asyncio.sleep(4)
        edits: list[tuple[str, Any]] = [
            ("maxNodes 3->5", lambda: rig.put_configmap(policy(rig, agent_max=5))),
            ("warm n7->n3", lambda: _move_warmth(rig, n[7], n[3])),
            ("maxNodes 5->2", lambda: rig.put_configmap(policy(rig, agent_max=2))),
            ("maxNodes 2->4", lambda: rig.put_configmap(policy(rig, agent_max=4))),
            ("warm n8->n5", lambda: _move_warmth(rig, n[8], n[5])),
        ]
        for _, apply in edits:
            await apply()
            await asyncio.sleep(6)
            assert not batch_task.done() and not load_task.done()
    finally:
        stop.set()
        created = await asyncio.wait_for(load_task, HANG)
        batch_task.cancel()
        await asyncio.gather(batch_task, return_exceptions=True)
    try:
        await recorder.fence(rig, agent_name)
    finally:
        await recorder.stop()
        await etcd.close()

    result = audit(recorder.timeline(), agent_name, batch_name)
    summary = (
        f"{created} agent pods created, binds {result['binds']}, batch waves {batch.waves} "
        f"({batch.deleted_pending} withdrawn unplaced), moved nodes {sorted(result['moved'])}, "
        f"nodes that ran both kinds {sorted(result['nodes_with_both'])}, watch relists {recorder.relists}"
    )
    print(summary)
    record_property("handoff", summary)
    assert recorder.relists == 0, "a watch lost history; the audit would be incomplete"
    assert result["violations"] == [], result["violations"][:10]
    assert result["handoff_breaks"] == [], result["handoff_breaks"][:10]
    assert result["shared_outside_moves"] == set()
    assert result["binds"]["agent"] > 0 and result["binds"]["batch"] > 0, summary
    assert len(result["moved"]) >= 2, summary  # the policy really moved nodes between the two schedulers


async def _move_warmth(rig: Rig, old: str, new: str) -> None:
    await rig.label(new, rig.warm_label, "true")
    await rig.label(old, rig.warm_label, None)


async def test_an_empty_agent_pool_says_why(
    rig: Rig, kube: KubeClient, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No node carries the agent node selector's label: the leader posts an ``AgentPoolEmpty`` Warning on its
    own Pod (downward-API environment) naming the selector, stays Ready with the reason in its ``/readyz`` body,
    and a worker granted nothing says so in its own ``/readyz`` body; the leader's metrics say the same, and
    follow when a node joins the pool."""
    monkeypatch.setenv("POD_NAME", "coordinator-0")
    monkeypatch.setenv("POD_NAMESPACE", namespace)
    rig.coordinator(policy_flags=False)  # the label pool; no node has been labelled
    worker = rig.worker("w0")

    async def warned() -> list[dict[str, Any]]:
        return [
            e for e in await rig.events("AgentPoolEmpty") if e["involvedObject"]["name"] == "coordinator-0"
        ]

    (event, *_) = await eventually(warned, HANG, "AgentPoolEmpty event on the coordinator's pod")
    assert event["type"] == "Warning" and event["involvedObject"]["kind"] == "Pod"
    assert f"no node matches the agent node selector '{rig.managed_label}=true'" in event["message"]

    async def readyz(address: str) -> tuple[int, str]:
        async with aiohttp.ClientSession() as s, s.get(f"http://{address}/readyz") as r:
            return r.status, await r.text()

    leader = (await rig.status())["leader_address"]
    status, text = await readyz(leader)
    assert status == 200 and text.startswith("ok: leading; the agent pool is empty: no node matches"), text
    found = await eventually(
        lambda: asyncio.to_thread(
            lambda: re.search(r"metrics on \['([^']+)'\]", worker.log_path.read_text())
        ),
        HANG,
        "the worker's metrics address",
    )
    assert found is not None

    async def worker_says() -> str | None:
        status, text = await readyz(found.group(1))
        return text if status == 200 and "owns no nodes" in text else None

    await eventually(worker_says, HANG, "the worker's /readyz saying it owns no nodes")

    async def scrape() -> str:
        async with aiohttp.ClientSession() as s, s.get(f"http://{leader}/metrics") as r:
            assert r.status == 200
            return await r.text()

    text = await scrape()
    assert "agent_scheduler_coordinator_is_leader 1.0" in text
    assert "agent_scheduler_agent_pool_nodes 0.0" in text
    assert re.search(r"^agent_scheduler_coordinator_leader_term [1-9]", text, re.M)
    # A node joins the pool: the gauges follow and the worker's note goes away.
    (node,) = await rig.manage(1)

    async def granted() -> bool:
        text = await scrape()
        return (
            "agent_scheduler_agent_pool_nodes 1.0" in text
            and 'agent_scheduler_coordinator_worker_nodes{worker="w0"} 1.0' in text
        )

    await eventually(granted, HANG, f"{node} in the pool and granted to w0")

    async def plain_ok() -> bool:
        return await readyz(leader) == (200, "ok") and await readyz(found.group(1)) == (200, "ok")

    await eventually(plain_ok, HANG, "the leader's and the worker's /readyz without a note")
