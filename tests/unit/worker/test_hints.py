"""Queueing hints for node events (``worker.hints``): which unschedulable pods a node added, changed or newly
usable moves, through the node feed and the scheduler's shard change; and, against the real filters, that a
pod a node event leaves in the pool could never be placed on that node."""

from __future__ import annotations

import random
from typing import Any, cast

from common.kube import Credentials, KubeClient
from common.records import NodeName, PodRecord, node_from_json, pod_from_json
from tests.builders import make_node, make_pod
from tests.unit.worker.helpers import FixedShard, engine_over
from tests.unit.worker.test_scheduler import scheduler
from worker.cache import Cache
from worker.feeds import NodeFeed
from worker.hints import NodeHints, exceeds
from worker.queue import SchedulingQueue
from worker.settings import WorkerSettings


def pool(queue: SchedulingQueue, *pods: PodRecord) -> None:
    """Put ``pods`` in the unschedulable pool, as a decision that found no node does."""
    for pod in pods:
        queue.add(pod)
        qp = queue.pop_nowait()
        assert qp is not None
        queue.done(qp, scheduled=False, message="no")
        assert queue.where(pod.key) == "unschedulable"


def moved(queue: SchedulingQueue, *pods: PodRecord) -> dict[str, bool]:
    return {p.name: queue.where(p.key) != "unschedulable" for p in pods}


def with_claim(pod: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    return pod


def feed(*, defaults: bool = False) -> tuple[SchedulingQueue, NodeFeed]:
    cache = Cache()
    queue = SchedulingQueue(lambda: 0.0)
    return queue, NodeFeed(cache, queue, NodeHints(cache, defaults=defaults))


BIG = make_pod("big").req(cpu="64").record()  # exceeds a 32-CPU node
SMALL = make_pod("small").req(cpu="1").record()
SPREAD_BIG = make_pod("spread-big").req(cpu="64").spread("zone", {"app": "a"}).record()
CLAIM_BIG = pod_from_json(with_claim(make_pod("claim-big").req(cpu="64").json()))
ANTI_BIG = make_pod("anti-big").req(cpu="64").pod_affinity("zone", {"app": "a"}, anti=True).record()
ALL = (BIG, SMALL, SPREAD_BIG, CLAIM_BIG, ANTI_BIG)


def test_exceeds_each_resource_and_a_node_that_takes_no_pod() -> None:
    node = make_node("n", cpu="4", memory="8Gi").extended("example.com/gpu", "1").record()
    assert not exceeds(make_pod("p").req(cpu="4", memory="8Gi").record(), node)
    assert exceeds(make_pod("p").req(cpu="5").record(), node)
    assert exceeds(make_pod("p").req(memory="9Gi").record(), node)
    assert exceeds(make_pod("p").req(**{"ephemeral-storage": "1Pi"}).record(), node)
    assert exceeds(make_pod("p").req(**{"example.com/gpu": "2"}).record(), node)
    assert exceeds(make_pod("p").req(**{"example.com/other": "1"}).record(), node)
    assert not exceeds(make_pod("p").req(**{"example.com/gpu": "1"}).record(), node)
    assert exceeds(make_pod("p").record(), make_node("full", pods="0").record())


def test_a_node_added_moves_only_the_pods_it_could_take_or_whose_rules_read_other_nodes() -> None:
    queue, nodes = feed()
    pool(queue, *ALL)
    nodes.event("ADDED", make_node("n1").json())  # 32 CPUs
    assert moved(queue, *ALL) == {
        "big": False,
        "small": True,
        "spread-big": True,  # a new domain changes its skew
        "claim-big": True,  # volume topology
        "anti-big": True,  # its own inter-pod rules
    }


def test_a_default_hard_spread_constraint_moves_every_pod() -> None:
    queue, nodes = feed(defaults=True)
    pool(queue, BIG)
    nodes.event("ADDED", make_node("n1").json())
    assert moved(queue, BIG) == {"big": True}


def test_a_node_changed_moves_every_pod_while_a_placed_pod_has_required_anti_affinity() -> None:
    """A node's labels carry the domain of the pods on it: relabelled, the domain a placed pod's anti-affinity
    keeps other pods out of changes, and a pod too big for this node may fit one elsewhere. (This checks the
    conservative rule, not that scenario: "big" is put in the pool by hand.)"""
    queue, nodes = feed()
    nodes.event("ADDED", make_node("n1").label("zone", "a").json())
    nodes.event("ADDED", make_node("n2", cpu="128").label("zone", "a").json())
    pool(queue, BIG)
    nodes.event("MODIFIED", make_node("n1").label("zone", "b").json())
    assert moved(queue, BIG) == {"big": False}  # nothing placed has anti-affinity: n1 alone could help
    nodes.cache.upsert_pod(
        make_pod("guard").label("app", "a").pod_affinity("zone", {"app": "a"}, anti=True).on("n1").record()
    )
    nodes.event("MODIFIED", make_node("n1").label("zone", "c").json())
    assert moved(queue, BIG) == {"big": True}


def test_a_node_added_never_needs_the_anti_affinity_rule() -> None:
    queue, nodes = feed()
    nodes.event("ADDED", make_node("n1").label("zone", "a").json())
    nodes.cache.upsert_pod(
        make_pod("guard").label("app", "a").pod_affinity("zone", {"app": "a"}, anti=True).on("n1").record()
    )
    pool(queue, BIG)
    nodes.event("ADDED", make_node("n2").label("zone", "b").json())
    assert moved(queue, BIG) == {"big": False}


def test_a_node_whose_allocatable_could_not_be_read_and_a_relist_move_every_pod() -> None:
    queue, nodes = feed()
    pool(queue, BIG)
    bad = make_node("n1").json()
    bad["status"]["allocatable"]["cpu"] = "lots"
    assert node_from_json(bad).allocatable_error is not None
    nodes.event("ADDED", bad)
    assert moved(queue, BIG) == {"big": True}
    pool(queue, SMALL)
    queue.delete(BIG.key)
    pool(queue, BIG)
    nodes.replace([make_node("n1").json()])
    assert moved(queue, BIG, SMALL) == {"big": True, "small": True}


def test_a_node_event_that_changes_nothing_a_filter_sees_moves_nothing() -> None:
    queue, nodes = feed()
    nodes.event("ADDED", make_node("n1", cpu="128").json())
    pool(queue, SMALL)
    nodes.event("MODIFIED", make_node("n1", cpu="128").json())
    assert moved(queue, SMALL) == {"small": False}


async def test_usable_nodes_added_to_the_shard_move_what_they_may_help_and_any_removed_every_pod() -> None:
    client = KubeClient(Credentials("http://127.0.0.1:9"))  # never called: no watch runs here
    shard = FixedShard(["n1"])
    sched = scheduler(client, shard=shard)
    for name in ("n1", "n2"):  # 32 CPUs each
        sched.cache.upsert_node(make_node(name).record())
    pool(sched.queue, BIG, SMALL)
    shard.set(["n1", "n2"])
    assert moved(sched.queue, BIG, SMALL) == {"big": False, "small": True}
    sched.queue.delete(SMALL.key)
    sched.cache.upsert_node(make_node("n4", cpu="128").record())
    sched.cache.upsert_node(make_node("n6").record())
    shard.set(["n1", "n2", "n4", "n6"])  # two added at once: n4 may take it, n6 not
    assert moved(sched.queue, BIG) == {"big": True}
    sched.queue.delete(BIG.key)
    pool(sched.queue, BIG)
    sched.cache.upsert_node(make_node("n5").record())
    shard.set(["n2", "n5"])  # one too small added, others removed: every pod
    assert moved(sched.queue, BIG) == {"big": True}
    sched.queue.delete(BIG.key)
    pool(sched.queue, BIG)
    # a node only pods have shown (no Node object yet): no allocatable to go by
    sched.cache.upsert_pod(make_pod("elsewhere").on("n3").record())
    assert NodeName("n3") not in sched.cache.known
    shard.set(["n2", "n5", "n3"])
    assert moved(sched.queue, BIG) == {"big": True}
    sched.queue.delete(BIG.key)
    pool(sched.queue, BIG)
    sched.cache.upsert_node(make_node("n7").record())
    shard.set(
        ["n2", "n5", "n3", "n7", "n9"]
    )  # with n7 (too small), n9, of which the cache has no record: every pod
    assert moved(sched.queue, BIG) == {"big": True}
    await client.close()


async def test_the_scheduler_tells_the_hints_of_a_default_do_not_schedule_constraint_only() -> None:
    client = KubeClient(Credentials("http://127.0.0.1:9"))
    assert scheduler(client).hints.defaults is False
    for hard, expected in ((False, False), (True, True)):
        settings = WorkerSettings()
        settings.scheduling.spread_defaulting = "List"
        settings.scheduling.spread_default_constraints = [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "DoNotSchedule" if hard else "ScheduleAnyway",
            }
        ]
        sched = scheduler(client, settings=settings)
        assert sched.hints.defaults is expected
        assert cast(NodeFeed, sched.watches.nodes.handler).hints is sched.hints  # the node feed uses the same
    await client.close()


async def test_a_nominated_pod_placed_elsewhere_frees_its_room_and_moves_every_pod() -> None:
    """ "n" is nominated to z and keeps its room there, so "p" did not fit z; a node added (y) moves "n"
    (it fits y) but not "p" (it cannot fit y). "n" placed on y leaves z's room to "p": the scheduler moves it,
    and not "q", whose priority is above "n"'s (a nomination keeps room only from pods of no higher priority)."""
    client = KubeClient(Credentials("http://127.0.0.1:9"))
    sched = scheduler(client)
    sched.cache.upsert_node(make_node("z", cpu="8", memory="2Gi").record())
    n = make_pod("n").req(cpu="1", memory="4Gi").priority(10).record()  # (it does not fit z itself)
    p = make_pod("p").req(cpu="8", memory="1Gi").record()
    q = make_pod("q").req(cpu="8", memory="1Gi").priority(20).record()  # above "n": its room never held it
    sched.cache.nominate(n, NodeName("z"))
    pool(sched.queue, n, p, q)
    sched.watches.nodes.handler.event("ADDED", make_node("y", cpu="4", memory="8Gi").json())
    assert moved(sched.queue, n, p, q) == {"n": True, "p": False, "q": False}
    clock = sched.queue.clock
    sched.queue.clock = lambda: clock() + 60.0  # its backoff served
    sched.queue.flush_backoff()
    qp = sched.queue.pop_nowait()
    assert qp is not None and qp.pod.key == n.key
    decision = sched.schedule_one(qp)
    assert decision is not None and decision.node == "y"
    assert moved(sched.queue, p, q) == {"p": True, "q": False}
    await client.close()


def test_a_pod_a_node_event_leaves_in_the_pool_never_fits_that_node() -> None:
    """Soundness against the real filters: random plain pods and nodes; whenever the hint says a node added
    cannot help a pod, the engine over that node alone, empty, finds no place for it."""
    rng = random.Random(7)
    hints = NodeHints(Cache(), defaults=False)
    checked = 0
    for i in range(400):
        node = make_node(
            f"n{i}",
            cpu=str(rng.choice([1, 2, 4, 8])),
            memory=f"{rng.choice([1, 4, 16])}Gi",
            pods=str(rng.choice([0, 1, 110])),
        )
        if rng.random() < 0.3:
            node = node.extended("example.com/gpu", str(rng.choice([1, 2])))
        req: dict[str, str] = {"cpu": f"{rng.choice([100, 1000, 3000, 9000])}m"}
        if rng.random() < 0.5:
            req["memory"] = f"{rng.choice([1, 4, 32])}Gi"
        if rng.random() < 0.3:
            req["example.com/gpu"] = str(rng.choice([1, 2, 3]))
        pod = make_pod(f"p{i}").req(**req).record()
        helps = hints.after((node.record(),), added=True)
        assert helps is not None
        if not helps(pod):
            checked += 1
            engine = engine_over([node.record()])
            assert engine.schedule(pod).node is None, (req, node.json()["status"]["allocatable"])
    assert checked > 100
