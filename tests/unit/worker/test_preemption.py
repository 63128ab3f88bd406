"""Preemption in the standalone engine (worker.preemption): victims, reprieve, budgets, the choice of node,
eligibility, nominations and the kube-scheduler-shaped messages."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any, cast

import pytest

from common.kube import ApiError, KubeClient, ServerError
from common.records import NodeName, PodKey, PodRecord
from tests.builders import make_node, make_pod
from tests.unit.worker.helpers import engine_over
from worker.budgets import Budgets, budget_from_json
from worker.engine import Decision, Engine
from worker.preemption import (
    Candidate,
    Evaluator,
    Executor,
    Preemption,
    Summary,
    pick,
)

HOST = "kubernetes.io/hostname"
NOW = 1_900_000_000.0


def running(
    name: str, node: str, cpu: str, priority: int, started: str = "2026-01-01T00:00:00Z"
) -> PodRecord:
    return make_pod(name).req(cpu=cpu).priority(priority).on(node).started(started).record()


def setup(
    nodes: dict[str, str], pods: list[PodRecord], budgets: Budgets | None = None
) -> tuple[Engine, Evaluator]:
    engine = engine_over([make_node(n, cpu=cpu).record() for n, cpu in nodes.items()])
    for p in pods:
        engine.cache.upsert_pod(p)
    ev = Evaluator(engine.cache, engine, budgets or Budgets(), rng=random.Random(0), wall=lambda: NOW)
    return engine, ev


def names(c: Candidate | None) -> list[str]:
    assert c is not None
    return [p.name for p in c.victims]


def fingerprint(engine: Engine) -> Any:
    cache = engine.cache
    return (
        {
            n: (
                dict(i.requested.__dict__) if hasattr(i.requested, "__dict__") else repr(i.requested),
                sorted(i.pods),
            )
            for n, i in cache.nodes.items()
        },
        {
            k: (dict(t.nodes), {key: dict(d) for key, d in t.domains.items()})
            for k, t in cache.topology.trackers.items()
        },
        len(cache.index),
    )


def test_minimal_victims_reprieve_most_important_first() -> None:
    pods = [running("low1", "n0", "1", 1), running("low2", "n0", "1", 2), running("mid", "n0", "2", 3)]
    engine, ev = setup({"n0": "4"}, pods)
    pod = make_pod("hi").req(cpu="2").priority(10).record()
    assert engine.schedule(pod).node is None
    v = ev.evaluate(pod)
    assert v.message == ""
    assert names(v.candidate) == ["low2", "low1"]  # "mid" reprieved: it is the most important
    assert v.candidate is not None and v.candidate.pdb_violations == 0


def test_dry_run_leaves_the_cache_exactly_as_it_was() -> None:
    pods = [
        make_pod("a").req(cpu="1").priority(1).label("app", "x").on("n0").record(),
        make_pod("b").req(cpu="1").priority(1).label("app", "x").on("n1").record(),
    ]
    engine, ev = setup({"n0": "1", "n1": "1"}, pods)
    spread = make_pod("s").req(cpu="1").priority(5).label("app", "x").spread(HOST, {"app": "x"}).record()
    ev.evaluate(spread)  # the first dry run may start counting for the spread selector (no count changes)
    before = fingerprint(engine)
    generation = engine.cache.generation
    ev.evaluate(spread)
    assert fingerprint(engine) == before
    tracker = next(iter(engine.cache.topology.trackers.values()))
    assert tracker.nodes == {"n0": 1, "n1": 1}
    assert engine.cache.generation == generation


def test_equal_or_higher_priority_pods_are_never_victims() -> None:
    engine, ev = setup({"n0": "2"}, [running("same", "n0", "2", 10)])
    pod = make_pod("p").req(cpu="1").priority(10).record()
    d = engine.schedule(pod)
    v = ev.evaluate(pod)
    assert v.candidate is None
    assert v.message == "0/1 nodes are available: 1 No preemption victims found for incoming pod."
    assert d.message == "0/1 nodes are available: 1 Insufficient cpu."


def test_unresolvable_nodes_are_not_helpful() -> None:
    engine = engine_over(
        [make_node("n0", cpu="1").record(), make_node("n1", cpu="1").taint("k", "v").record()]
    )
    engine.cache.upsert_pod(running("low", "n0", "1", 0))
    engine.cache.upsert_pod(running("low2", "n1", "1", 0))
    ev = Evaluator(engine.cache, engine, Budgets(), rng=random.Random(0), wall=lambda: NOW)
    big = make_pod("big").req(cpu="2").priority(9).record()  # more than any node has: unresolvable
    v = ev.evaluate(big)
    assert v.message == "0/2 nodes are available: 2 Preemption is not helpful for scheduling."
    small = make_pod("small").req(cpu="1").priority(9).record()
    v = ev.evaluate(small)
    assert v.candidate is not None and v.candidate.node == "n0"


def test_node_choice_lowest_highest_victim_priority() -> None:
    pods = [running("a", "n0", "2", 5), running("b", "n1", "1", 3), running("c", "n1", "1", 3)]
    _, ev = setup({"n0": "2", "n1": "2"}, pods)
    v = ev.evaluate(make_pod("p").req(cpu="2").priority(10).record())
    assert v.candidate is not None and v.candidate.node == "n1"


def test_node_choice_smallest_priority_sum_then_fewest_victims() -> None:
    pods = [
        running("a", "n0", "1", 3),
        running("b", "n0", "1", 3),
        running("c", "n1", "1", 3),
        running("d", "n1", "1", 1),
    ]
    _, ev = setup({"n0": "2", "n1": "2"}, pods)
    v = ev.evaluate(make_pod("p").req(cpu="2").priority(10).record())
    assert v.candidate is not None and v.candidate.node == "n1"  # sum 3+1 < 3+3
    pods = [running("a", "n0", "1", 3), running("b", "n0", "1", 3), running("c", "n1", "2", 3)]
    _, ev = setup({"n0": "2", "n1": "2"}, pods)
    v = ev.evaluate(make_pod("p").req(cpu="2").priority(10).record())
    assert v.candidate is not None and v.candidate.node == "n1"  # one victim, not two... sum decides first
    assert names(v.candidate) == ["c"]


def test_node_choice_latest_start_time() -> None:
    pods = [
        running("old", "n0", "2", 3, "2026-01-01T00:00:00Z"),
        running("new", "n1", "2", 3, "2026-01-02T00:00:00Z"),
    ]
    _, ev = setup({"n0": "2", "n1": "2"}, pods)
    v = ev.evaluate(make_pod("p").req(cpu="2").priority(10).record())
    assert v.candidate is not None and v.candidate.node == "n1"


def test_pick_order_of_criteria() -> None:
    def s(node: str, *rank: float) -> Summary:
        pdb, high, total, n, start = rank
        return Summary(NodeName(node), int(pdb), int(high), int(total), int(n), start)

    assert pick([s("a", 1, 0, 0, 1, 0), s("b", 0, 9, 9, 9, 0)]) == 1
    assert pick([s("a", 0, 5, 0, 1, 0), s("b", 0, 4, 9, 9, 0)]) == 1
    assert pick([s("a", 0, 4, 9, 1, 0), s("b", 0, 4, 8, 9, 0)]) == 1
    assert pick([s("a", 0, 4, 8, 2, 0), s("b", 0, 4, 8, 1, 0)]) == 1
    assert pick([s("a", 0, 4, 8, 1, 5), s("b", 0, 4, 8, 1, 6)]) == 1
    assert pick([s("a", 0, 4, 8, 1, 5), s("b", 0, 4, 8, 1, 5)]) == 0


def pdb(name: str, labels: dict[str, str], allowed: int, disrupted: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"selector": {"matchLabels": labels}},
        "status": {
            "disruptionsAllowed": allowed,
            "disruptedPods": {p: "2026-01-01T00:00:00Z" for p in disrupted},
        },
    }


def test_budgets_split_in_order_and_disrupted_pods_use_no_allowance() -> None:
    b = Budgets()
    b.replace([pdb("one", {"app": "db"}, 1, ("c",))])
    pods = [make_pod(n).label("app", "db").record() for n in ("a", "b", "c")] + [make_pod("d").record()]
    violating, fine = b.split(pods)
    assert [p.name for p in violating] == ["b"]
    assert [p.name for p in fine] == ["a", "c", "d"]
    assert budget_from_json({"metadata": {"name": "x"}, "spec": {"selector": {}}}).selector is None


def test_budget_violations_steer_the_node_choice_and_are_reprieved_first() -> None:
    pods = [
        make_pod("guarded").req(cpu="2").priority(1).label("app", "db").on("n0").record(),
        make_pod("free").req(cpu="2").priority(3).on("n1").record(),
    ]
    b = Budgets()
    b.replace([pdb("db", {"app": "db"}, 0)])
    _, ev = setup({"n0": "2", "n1": "2"}, pods, b)
    v = ev.evaluate(make_pod("p").req(cpu="2").priority(10).record())
    # n0's victim has the lower priority, but evicting it violates the budget
    assert v.candidate is not None and v.candidate.node == "n1" and v.candidate.pdb_violations == 0


def test_only_a_budget_violating_candidate_is_still_taken() -> None:
    pods = [make_pod("guarded").req(cpu="2").priority(1).label("app", "db").on("n0").record()]
    b = Budgets()
    b.replace([pdb("db", {"app": "db"}, 0)])
    _, ev = setup({"n0": "2"}, pods, b)
    v = ev.evaluate(make_pod("p").req(cpu="2").priority(10).record())
    assert v.candidate is not None and v.candidate.pdb_violations == 1


def test_preemption_policy_never_and_terminating_victims_on_the_nominated_node() -> None:
    engine, ev = setup({"n0": "2"}, [running("low", "n0", "2", 1)])
    never = make_pod("n").req(cpu="2").priority(10).never_preempt().record()
    assert ev.evaluate(never).message == "not eligible due to preemptionPolicy=Never."
    engine.cache.upsert_pod(make_pod("low").req(cpu="2").priority(1).on("n0").preempted().record())
    waiting = make_pod("w").req(cpu="2").priority(10).nominated("n0").record()
    assert ev.evaluate(waiting).message == "not eligible due to a terminating pod on the nominated node."
    # without the nomination the same pod may preempt again (the terminating pod is still a victim)
    fresh = make_pod("w2").req(cpu="2").priority(10).record()
    assert ev.evaluate(fresh).candidate is not None


def test_victim_with_anti_affinity_against_the_preemptor_is_removed_by_the_dry_run() -> None:
    blocker = (
        make_pod("blocker")
        .req(cpu="100m")
        .priority(1)
        .label("app", "b")
        .pod_affinity(HOST, {"app": "p"}, anti=True)
        .on("n0")
        .record()
    )
    engine, ev = setup({"n0": "4"}, [blocker])
    pod = make_pod("p").req(cpu="1").priority(10).label("app", "p").record()
    d = engine.schedule(pod)
    assert "existing pods anti-affinity" in d.message
    v = ev.evaluate(pod)
    assert names(v.candidate) == ["blocker"]


def test_spread_counts_see_the_victims_removed() -> None:
    # two zones-by-hostname nodes; n0 holds two matching low pods; maxSkew 1 forbids a third there
    pods = [
        make_pod(f"x{i}").req(cpu="1").priority(1).label("app", "x").on("n0").record() for i in range(2)
    ] + [make_pod("y").req(cpu="4").priority(50).label("app", "x").on("n1").record()]
    engine, ev = setup({"n0": "4", "n1": "4"}, pods)
    pod = make_pod("p").req(cpu="1").priority(10).label("app", "x").spread(HOST, {"app": "x"}).record()
    d = engine.schedule(pod)
    assert d.node is None
    v = ev.evaluate(pod)
    # one victim suffices on n0: counts become n0=1, n1=1, and the pod's own +1 gives skew 1
    assert v.candidate is not None and v.candidate.node == "n0" and len(v.candidate.victims) == 1


def test_host_port_victim() -> None:
    holder = make_pod("holder").priority(1).host_port(8080).on("n0").record()
    engine, ev = setup({"n0": "4"}, [holder])
    pod = make_pod("p").priority(10).host_port(8080).record()
    assert engine.schedule(pod).node is None
    assert names(ev.evaluate(pod).candidate) == ["holder"]


class Recorder:
    def __init__(self) -> None:
        self.activated: list[PodKey] = []


def preemption_over(engine: Engine, ev: Evaluator) -> Preemption:
    rec = Recorder()
    executor = Executor(
        cast(KubeClient, None),
        component="agent-scheduler",
        instance="t",
        done=rec.activated.append,
        not_evicted=ev.not_evicted,
        gone=lambda pod: None,
        budget=lambda node: 30.0,
    )
    return Preemption(engine.cache, ev, executor)


def test_post_filter_nominates_reserves_and_composes_messages() -> None:
    engine, ev = setup(
        {"n0": "2", "n1": "1"}, [running("low", "n0", "2", 1), running("other", "n1", "1", 100)]
    )
    pre = preemption_over(engine, ev)
    pod = make_pod("hi").req(cpu="2").priority(10).record()
    d = engine.schedule(pod)
    out = pre.post_filter(pod, d)
    assert out.message == d.message == "0/2 nodes are available: 2 Insufficient cpu."
    assert engine.cache.nominated_node[pod.key] == "n0"
    assert pre.busy(pod.key)
    # the victim goes: a lower-priority pod may not take the room, the preemptor (or a higher one) may
    engine.cache.remove_pod(PodKey("default/low"))
    lower = make_pod("lower").req(cpu="1").priority(5).record()
    assert engine.schedule(lower).node is None
    # equal priority leaves the room too (kube-scheduler adds nominated pods of priority >= the pod's)
    assert engine.schedule(make_pod("peer").req(cpu="1").priority(10).record()).node is None
    assert engine.schedule(make_pod("higher").req(cpu="1").priority(11).record()).node == "n0"
    assert engine.schedule(pod).node == "n0"  # its nominated node first
    engine.cache.assume(pod, NodeName("n0"))
    assert pod.key not in engine.cache.nominated_node


def test_post_filter_message_suffixes() -> None:
    engine, ev = setup(
        {"n0": "1", "n1": "1", "n2": "1"}, [running(f"p{i}", f"n{i}", "1", 50) for i in range(3)]
    )
    pre = preemption_over(engine, ev)
    pod = make_pod("x").req(cpu="1").priority(10).record()
    out = pre.post_filter(pod, engine.schedule(pod))
    assert out.message == (
        "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available: "
        "3 No preemption victims found for incoming pod."
    )
    never = make_pod("y").req(cpu="1").priority(100).never_preempt().record()
    out = pre.post_filter(never, engine.schedule(never))
    assert out.message == (
        "0/3 nodes are available: 3 Insufficient cpu. preemption: not eligible due to preemptionPolicy=Never."
    )


def test_nominated_pod_from_the_watch_reserves_room() -> None:
    engine, _ = setup({"n0": "2"}, [])
    nominated = make_pod("nom").req(cpu="2").priority(10).nominated("n0").record()
    engine.cache.nominate(nominated, NodeName("n0"))
    assert engine.schedule(make_pod("low").req(cpu="1").priority(1).record()).node is None
    d: Decision = engine.schedule(make_pod("high").req(cpu="1").priority(20).record())
    assert d.node == "n0"


def test_lower_nominations_on_the_chosen_node_are_cleared() -> None:
    engine, ev = setup({"n0": "2"}, [running("low", "n0", "2", 1)])
    small = make_pod("small").req(cpu="1").priority(5).record()
    engine.cache.nominate(small, NodeName("n0"))
    pre = preemption_over(engine, ev)
    pod = make_pod("hi").req(cpu="2").priority(10).record()
    pre.post_filter(pod, engine.schedule(pod))
    assert small.key not in engine.cache.nominated_node
    assert engine.cache.nominated_node[pod.key] == "n0"


def test_hopeless_verdicts_are_kept_until_a_possible_victim_arrives() -> None:
    engine, ev = setup({"n0": "1", "n1": "1"}, [running("a", "n0", "1", 50), running("b", "n1", "1", 50)])
    first = make_pod("x").req(cpu="1").priority(10).record()
    assert ev.evaluate(first).candidate is None
    runs = ev.dry_runs
    again = make_pod("y").req(cpu="1").priority(10).record()
    assert ev.evaluate(again).message == ev.evaluate(first).message
    assert ev.dry_runs == runs  # the burst's second pod did not scan again
    engine.cache.remove_pod(PodKey("default/b"))
    engine.cache.upsert_pod(running("c", "n1", "1", 1))
    assert ev.evaluate(again).candidate is not None


def test_attempts_and_victims_metrics() -> None:
    from common import metrics

    engine, ev = setup({"n0": "2"}, [running("low", "n0", "2", 1)])
    pre = preemption_over(engine, ev)
    before = metrics.preemption_attempts._value.get()
    pod = make_pod("hi").req(cpu="2").priority(10).record()
    pre.post_filter(pod, engine.schedule(pod))
    never = make_pod("nv").req(cpu="2").priority(10).never_preempt().record()
    pre.post_filter(never, engine.schedule(never))
    assert metrics.preemption_attempts._value.get() == before + 2


class _NoReports:
    def forget(self, key: PodKey) -> None:
        pass


def test_feed_nominations_follow_the_watch() -> None:
    from common.wellknown import DEFAULT_SCHEDULER_NAME
    from worker.cache import Cache
    from worker.feeds import PodFeed
    from worker.queue import SchedulingQueue

    cache = Cache()
    feed = PodFeed(
        cache,
        SchedulingQueue(lambda: 0.0),
        cast(Any, _NoReports()),
        scheduler_name=DEFAULT_SCHEDULER_NAME,
        watch_pending=False,  # under a coordinator too: a nomination left by another worker is honoured
    )
    feed.event("ADDED", make_pod("p").req(cpu="1").priority(5).nominated("n0").json())
    assert cache.nominated_node[PodKey("default/p")] == "n0"
    feed.event("MODIFIED", make_pod("p").req(cpu="1").priority(5).json())  # our patch not seen yet: kept
    assert cache.nominated_node[PodKey("default/p")] == "n0"
    feed.event("MODIFIED", make_pod("p").req(cpu="1").priority(5).on("n0").json())
    assert PodKey("default/p") not in cache.nominated_node
    feed.event("ADDED", make_pod("q").req(cpu="1").nominated("n1").json())
    feed.replace([])  # a relist without it: gone
    assert not cache.nominated
    feed.event("ADDED", make_pod("r").req(cpu="1").nominated("n1").json())
    feed.event("DELETED", make_pod("r").req(cpu="1").nominated("n1").json())
    assert not cache.nominated


# ----- under a coordinator: propose, then carry out only where the leader chose -----------------------------


def test_propose_reports_the_shards_best_candidate_and_touches_nothing() -> None:
    engine, ev = setup({"n0": "2", "n1": "2"}, [running("low", "n0", "2", 1), running("mid", "n1", "2", 5)])
    pre = preemption_over(engine, ev)
    pod = make_pod("hi").req(cpu="2").priority(10).record()
    before = fingerprint(engine)
    d = pre.propose(pod, engine.schedule(pod))
    assert d.node is None and d.preemption is not None
    assert d.preemption.node == "n0" and d.preemption.victims == 1
    assert d.preemption.highest_priority == 1 and d.preemption.priority_sum == 1 + 2**31
    assert d.preemption.pdb_violations == 0 and d.preemption.earliest_start < NOW
    assert pod.key not in engine.cache.nominated_node and not pre.busy(pod.key)
    assert fingerprint(engine) == before
    assert pre.executor._work.empty()


def test_propose_without_a_candidate_says_why() -> None:
    engine, ev = setup({"n0": "1"}, [running("peer", "n0", "1", 10)])
    pre = preemption_over(engine, ev)
    pod = make_pod("hi").req(cpu="1").priority(10).record()
    d = pre.propose(pod, engine.schedule(pod))
    assert d.preemption is None
    assert d.message.endswith(
        "preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
    )


def chosen_node_taken() -> tuple[Engine, Preemption, PodRecord]:
    """The leader chose n0 for the pod's preemption, but n0's victim is gone meanwhile and a pod the preemptor
    may not evict took its place; n1 still has one."""
    engine, ev = setup({"n0": "2", "n1": "2"}, [running("low", "n0", "2", 1), running("low2", "n1", "2", 2)])
    engine.cache.remove_pod(PodKey("default/low"))
    engine.cache.upsert_pod(running("peer", "n0", "2", 10))
    return engine, preemption_over(engine, ev), make_pod("hi").req(cpu="2").priority(10).record()


def test_carry_out_rechecks_the_chosen_node() -> None:
    engine, pre, pod = chosen_node_taken()
    d = pre.carry_out(pod, NodeName("n0"), engine.schedule(pod))
    assert d is not None and d.preemption is not None and d.preemption.node == "n1"  # a fresh candidate
    assert pod.key not in engine.cache.nominated_node and not pre.busy(pod.key)
    # still valid: carried out there, as standalone
    assert pre.carry_out(pod, NodeName("n1"), engine.schedule(pod)) is None
    assert engine.cache.nominated_node[pod.key] == "n1" and pre.busy(pod.key)


def test_carry_out_counts_one_attempt_whichever_way_it_ends() -> None:
    from common import metrics

    engine, pre, pod = chosen_node_taken()
    before = metrics.preemption_attempts._value.get()
    # the re-check on n0 fails and a fresh candidate is proposed: still one post-filter call
    d = pre.carry_out(pod, NodeName("n0"), engine.schedule(pod))
    assert d is not None and d.preemption is not None
    assert metrics.preemption_attempts._value.get() == before + 1
    # carried out on n1
    assert pre.carry_out(pod, NodeName("n1"), engine.schedule(pod)) is None
    assert metrics.preemption_attempts._value.get() == before + 2
    # a node this worker does not know: straight to a proposal, counted once
    pre.carry_out(make_pod("other").req(cpu="2").priority(10).record(), NodeName("gone"), d)
    assert metrics.preemption_attempts._value.get() == before + 3


def test_carry_out_never_touches_a_node_this_worker_does_not_own() -> None:
    nodes = [make_node(n, cpu="2").record() for n in ("mine", "theirs")]
    engine = engine_over(nodes, owned={"mine"})
    engine.cache.upsert_pod(running("low", "theirs", "2", 1))
    engine.cache.upsert_pod(running("peer", "mine", "2", 10))
    ev = Evaluator(engine.cache, engine, Budgets(), rng=random.Random(0), wall=lambda: NOW)
    pre = preemption_over(engine, ev)
    pod = make_pod("hi").req(cpu="2").priority(10).record()
    d = pre.carry_out(pod, NodeName("theirs"), engine.schedule(pod))
    assert d is not None and d.preemption is None
    assert pod.key not in engine.cache.nominated_node and not pre.busy(pod.key)


def test_summary_on_the_wire_ranks_as_the_summary() -> None:
    a = Summary(NodeName("a"), 0, 5, 2 * (5 + 2**31), 2, 10.0)
    b = Summary(NodeName("b"), 0, 5, 2 * (5 + 2**31), 2, 20.0)
    assert a.wire().rank() == a.rank() and (b.wire().rank() < a.wire().rank()) == (b.rank() < a.rank())


def two_nominated_to_one_node() -> tuple[Engine, Evaluator, Preemption, PodRecord, PodRecord]:
    """n0 holds a and b (a started first); p preempts b, whose deletion the watch shows; then q, of p's priority,
    preempts there too: p's nomination holds b's room, so q's victims are a and b."""
    a = running("a", "n0", "1", 1, started="2026-01-01T00:00:00Z")
    b = running("b", "n0", "1", 1, started="2026-01-02T00:00:00Z")
    engine, ev = setup({"n0": "2"}, [a, b])
    pre = preemption_over(engine, ev)
    p = make_pod("p").req(cpu="1").priority(10).record()
    pre.post_filter(p, engine.schedule(p))
    assert engine.cache.nominated_node[p.key] == "n0"
    engine.cache.upsert_pod(make_pod("b").req(cpu="1").priority(1).on("n0").preempted().record())
    q = make_pod("q").req(cpu="1").priority(10).record()
    verdict = ev.evaluate(q)
    assert names(verdict.candidate) == ["a", "b"]
    pre.post_filter(q, engine.schedule(q))
    assert engine.cache.nominated_node[q.key] == "n0"
    return engine, ev, pre, p, q


def test_a_victim_chosen_here_counts_as_terminating_before_the_watch_shows_it() -> None:
    engine, ev, pre, p, _ = two_nominated_to_one_node()
    # p's victim b and q's a (b, already terminating by then, was not added again; the set forgets it later)
    assert set(ev.evicting) == {PodKey("default/a"), PodKey("default/b")}
    # b is gone; a's deletion is not seen yet. q's nomination holds b's room, so p does not fit; it waits for a
    # (being evicted for q) instead of preempting again
    engine.cache.remove_pod(PodKey("default/b"))
    assert engine.schedule(p).node is None
    queued = pre.executor._work.qsize()
    out = pre.post_filter(p, engine.schedule(p))
    assert out.message.endswith("preemption: not eligible due to a terminating pod on the nominated node.")
    assert pre.executor._work.qsize() == queued and engine.cache.nominated_node[p.key] == "n0"
    # a goes: both fit
    engine.cache.remove_pod(PodKey("default/a"))
    assert engine.schedule(p).node == "n0"


def test_a_victim_whose_eviction_failed_stops_counting() -> None:
    engine, ev, _, p, _ = two_nominated_to_one_node()
    engine.cache.remove_pod(PodKey("default/b"))
    a = engine.cache.placed(PodKey("default/a"))
    assert a is not None
    ev.not_evicted(a)
    assert PodKey("default/a") not in ev.evicting
    assert ev.ineligible(p) is None  # a stays: p may preempt again
    assert names(ev.evaluate(p).candidate) == ["a"]


def test_the_evicting_set_forgets_victims_the_watch_caught_up_on(monkeypatch: Any) -> None:
    import worker.preemption as preemption_module

    monkeypatch.setattr(preemption_module, "EVICTING_PRUNE", 4)
    pods = [make_pod(f"v{i}").req(cpu="1").priority(1).on("n0").uid(f"u{i}").record() for i in range(6)]
    engine, ev = setup({"n0": "8"}, pods)
    ev.evicted(pods[:3])
    engine.cache.upsert_pod(make_pod("v0").req(cpu="1").priority(1).on("n0").uid("u0").preempted().record())
    engine.cache.remove_pod(PodKey("default/v1"))
    assert len(ev.evicting) == 3  # below the bound: nothing pruned yet
    ev.evicted(pods[3:4])  # the bound: v0 (deleting) and v1 (gone) are dropped
    assert set(ev.evicting) == {PodKey("default/v2"), PodKey("default/v3")}
    ev.evicted(pods[4:])  # the next prune waits until the set has doubled
    assert len(ev.evicting) == 4


def test_a_victim_recreated_under_the_same_name_is_not_being_evicted() -> None:
    old = make_pod("web-0").req(cpu="2").priority(1).on("n0").uid("old").record()
    engine, ev = setup({"n0": "2"}, [old])
    ev.evicted([old])
    engine.cache.remove_pod(old.key)
    new = make_pod("web-0").req(cpu="2").priority(1).on("n0").uid("new").record()
    engine.cache.upsert_pod(new)
    p = make_pod("p").req(cpu="2").priority(10).nominated("n0").record()
    assert ev.ineligible(p) is None  # the pod on n0 now is not the one evicted
    assert names(ev.evaluate(p).candidate) == ["web-0"]
    ev.not_evicted(new)  # an answer about another pod of that name changes nothing
    assert ev.evicting == {old.key: ("old", 1)}


def test_a_victim_chosen_twice_counts_until_both_evictions_are_settled() -> None:
    v = make_pod("v").req(cpu="2").priority(1).on("n0").uid("u").record()
    _, ev = setup({"n0": "2"}, [v])
    p = make_pod("p").req(cpu="2").priority(10).nominated("n0").record()
    ev.evicted([v])
    ev.evicted([v])  # a second preemptor chose it before the watch showed it deleting
    ev.not_evicted(v)  # one of the two evictions failed
    assert ev.ineligible(p) is not None  # the other is still under way
    ev.not_evicted(v)
    assert ev.ineligible(p) is None


class _Api:
    """What ``Executor`` calls of ``KubeClient``: a victim named in ``refuse`` cannot be deleted (a 500), one
    named in ``gone`` no longer exists; a status PATCH answers with ``answer`` (the preemptor as the API server
    holds it; None: 404)."""

    def __init__(self, refuse: set[str], gone: set[str], answer: dict[str, Any] | None = None) -> None:
        self.refuse = refuse
        self.gone = gone
        self.deleted: list[str] = []
        self.answer = answer if answer is not None else {"metadata": {"uid": ""}, "spec": {}}
        self.preemptor_gone = False
        self.writes: list[tuple[str, str, float | None]] = []  # (method, path, timeout) of every write
        self.hold: asyncio.Event | None = None  # when set, a DELETE waits for it
        self.deleting = asyncio.Event()  # a DELETE has been sent

    async def patch(self, path: str, body: Any, *, kind: str = "merge", timeout: float | None = None) -> Any:
        from common.kube import NotFound

        self.writes.append(("PATCH", path, timeout))
        if self.preemptor_gone:
            raise NotFound(404, "not found")
        return self.answer

    async def post(
        self, path: str, body: Any, params: dict[str, str] | None = None, *, timeout: float | None = None
    ) -> Any:
        self.writes.append(("POST", path, timeout))
        return {}

    async def delete(
        self, path: str, params: dict[str, str] | None = None, *, timeout: float | None = None
    ) -> Any:
        from common.kube import NotFound

        self.writes.append(("DELETE", path, timeout))
        self.deleting.set()
        if self.hold is not None:
            await self.hold.wait()

        name = path.rsplit("/", 1)[1]
        if name in self.refuse:
            raise ServerError(500, "etcd timeout")
        if name in self.gone:
            raise NotFound(404, "not found")
        self.deleted.append(name)
        return {}


def executor_over(
    api: _Api,
    *,
    not_evicted: Callable[[PodRecord], None] = lambda v: None,
    gone: Callable[[PodRecord], None] = lambda pod: None,
    budget: Callable[[NodeName], float] = lambda node: 30.0,
    unanswered_hold: float = 5.0,
) -> Executor:
    return Executor(
        cast(KubeClient, api),
        component="c",
        instance="t",
        done=lambda key: None,
        not_evicted=not_evicted,
        gone=gone,
        budget=budget,
        unanswered_hold=unanswered_hold,
    )


async def test_a_preemption_on_a_node_no_longer_usable_writes_nothing() -> None:
    """Fenced as a binding: a worker whose node was revoked, or whose lease's fencing deadline is too close,
    neither nominates onto it nor evicts from it (the node may be another worker's by now)."""
    api = _Api(refuse=set(), gone=set())
    dropped: list[PodRecord] = []
    executor = executor_over(api, not_evicted=dropped.append, budget=lambda node: 0.0)
    victims = tuple(running(f"v{i}", "n0", "1", 1) for i in range(2))
    preemptor = make_pod("p").req(cpu="2").priority(10).record()
    await executor._carry_out(preemptor, Candidate(NodeName("n0"), victims, 0), [])
    assert api.writes == [] and executor.fenced == 1 and executor.abandoned == 0
    assert sorted(v.key for v in dropped) == [PodKey("default/v0"), PodKey("default/v1")]


async def test_each_preemption_write_is_fenced_and_carries_its_budget_as_deadline() -> None:
    """The budget is read before every write (the nomination, each victim's condition, each delete) and sent
    as the write's deadline; once it runs out, nothing more is sent."""
    api = _Api(refuse=set(), gone=set())
    budgets = iter([2.0, 1.5, 0.01])  # the nomination, the victim's condition, then too little for its delete
    dropped: list[PodRecord] = []
    executor = executor_over(api, not_evicted=dropped.append, budget=lambda node: next(budgets))
    victim = running("v0", "n0", "2", 1)
    preemptor = make_pod("p").req(cpu="2").priority(10).record()
    await executor._carry_out(preemptor, Candidate(NodeName("n0"), (victim,), 0), [])
    assert [(method, timeout) for method, _, timeout in api.writes] == [("PATCH", 2.0), ("PATCH", 1.5)]
    assert api.deleted == [] and executor.fenced == 1 and [v.key for v in dropped] == [victim.key]


async def test_an_unanswered_eviction_holds_the_node_as_an_unanswered_binding_does() -> None:
    """A delete answered with a 5xx (or none) may still be applied: the node stays counted in flight for
    ``unanswered_hold``, so its release is not acknowledged before the delete can no longer land."""
    api = _Api(refuse={"v0"}, gone=set())
    executor = executor_over(api, unanswered_hold=0.2)
    preemptor = make_pod("p").req(cpu="2").priority(10).record()
    with pytest.raises(ApiError):
        await executor._carry_out(preemptor, Candidate(NodeName("n0"), (running("v0", "n0", "2", 1),), 0), [])
    assert executor._in_flight.count(NodeName("n0")) == 1  # the carry-out ended; the unanswered delete holds
    await asyncio.wait_for(executor.drain({NodeName("n0")}), 1)
    assert executor._in_flight.count() == 0


async def test_a_write_slower_than_its_budget_raises_and_holds_the_node() -> None:
    """The budget is the write's deadline here too (the rate limit's wait included): past it the write is given
    up as unanswered (it may still land), an ``ApiError`` for the executor's loop, and the node held."""
    api = _Api(refuse=set(), gone=set())
    api.hold = asyncio.Event()  # the delete never answers
    executor = executor_over(api, budget=lambda node: 0.1, unanswered_hold=30.0)
    preemptor = make_pod("p").req(cpu="2").priority(10).record()
    carry_out = executor._carry_out(
        preemptor, Candidate(NodeName("n0"), (running("v0", "n0", "2", 1),), 0), []
    )
    with pytest.raises(ServerError):
        await asyncio.wait_for(carry_out, 5)  # a TimeoutError here: the write had no deadline
    assert executor._in_flight.count(NodeName("n0")) == 1 and api.deleted == []


async def test_a_victim_already_gone_does_not_hold_the_node() -> None:
    api = _Api(refuse=set(), gone={"v0"})
    executor = executor_over(api, unanswered_hold=30.0)
    preemptor = make_pod("p").req(cpu="2").priority(10).record()
    await executor._carry_out(preemptor, Candidate(NodeName("n0"), (running("v0", "n0", "2", 1),), 0), [])
    assert executor._in_flight.count() == 0  # a 404 is an answer: nothing can land later


async def test_clearing_lower_nominations_stops_when_the_node_is_fenced() -> None:
    api = _Api(refuse=set(), gone=set())
    budgets = iter([2.0, 0.0])  # the preemptor's nomination, then nothing left for the first clear
    executor = executor_over(api, budget=lambda node: next(budgets, 0.0))
    lower = [make_pod(f"l{i}").priority(1).nominated("n0").record() for i in range(2)]
    preemptor = make_pod("p").req(cpu="2").priority(10).record()
    await executor._carry_out(preemptor, Candidate(NodeName("n0"), (running("v0", "n0", "2", 1),), 0), lower)
    assert [path for _, path, _ in api.writes] == ["/api/v1/namespaces/default/pods/p/status"]
    assert api.deleted == [] and executor.fenced == 2  # the clear, then the victim's condition


async def test_a_node_release_waits_for_the_preemption_writes_under_way_on_it() -> None:
    api = _Api(refuse=set(), gone=set())
    api.hold = asyncio.Event()
    executor = executor_over(api)
    preemptor = make_pod("p").req(cpu="2").priority(10).record()
    carrying = asyncio.create_task(
        executor._carry_out(preemptor, Candidate(NodeName("n0"), (running("v0", "n0", "2", 1),), 0), [])
    )
    await asyncio.wait_for(api.deleting.wait(), 1)
    await asyncio.wait_for(executor.drain({NodeName("n1")}), 1)  # another node: nothing to wait for
    release = asyncio.create_task(executor.drain({NodeName("n0")}))
    await asyncio.sleep(0.01)
    assert not release.done()  # the delete to n0 is still under way
    api.hold.set()
    await asyncio.wait_for(release, 1)
    await carrying
    assert api.deleted == ["v0"]


async def test_the_executor_reports_every_victim_it_did_not_evict() -> None:
    api = _Api(refuse={"v1"}, gone={"v2"})
    dropped: list[PodRecord] = []
    executor = executor_over(api, not_evicted=dropped.append)
    victims = tuple(running(f"v{i}", "n0", "1", 1) for i in range(3))
    preemptor = make_pod("p").req(cpu="3").priority(10).record()
    try:
        await executor._carry_out(preemptor, Candidate(NodeName("n0"), victims, 0), [])
    except Exception as e:  # the refused delete is raised after the others were tried
        assert "etcd timeout" in str(e)
    else:
        raise AssertionError("the refused delete was not raised")
    assert api.deleted == ["v0"]
    assert sorted(v.key for v in dropped) == [PodKey("default/v1"), PodKey("default/v2")]


@pytest.mark.parametrize(
    "answer",
    [
        None,  # deleted: the nomination's PATCH is a 404
        {"metadata": {"uid": "another"}, "spec": {}},  # recreated under the same name
        {"metadata": {"uid": "u-p"}, "spec": {"nodeName": "n1"}},  # already bound
    ],
)
async def test_no_victim_is_evicted_for_a_preemptor_that_is_gone(answer: dict[str, Any] | None) -> None:
    """A DISPATCH can reach a worker after its pod watch showed the pod deleted: carrying out its preemption
    would evict pods for nothing."""
    api = _Api(refuse=set(), gone=set(), answer=answer)
    api.preemptor_gone = answer is None
    dropped: list[PodRecord] = []
    gone: list[PodKey] = []
    executor = executor_over(api, not_evicted=dropped.append, gone=lambda pod: gone.append(pod.key))
    victims = tuple(running(f"v{i}", "n0", "1", 1) for i in range(2))
    preemptor = make_pod("p").req(cpu="2").priority(10).uid("u-p").record()
    await executor._carry_out(preemptor, Candidate(NodeName("n0"), victims, 0), [])
    assert api.deleted == [] and executor.abandoned == 1
    assert sorted(v.key for v in dropped) == [PodKey("default/v0"), PodKey("default/v1")]
    assert gone == [PodKey("default/p")]


async def test_the_preemptor_itself_unbound_lets_the_evictions_go_ahead() -> None:
    api = _Api(refuse=set(), gone=set(), answer={"metadata": {"uid": "u-p"}, "spec": {}})
    executor = executor_over(api)
    victims = tuple(running(f"v{i}", "n0", "1", 1) for i in range(2))
    preemptor = make_pod("p").req(cpu="2").priority(10).uid("u-p").record()
    await executor._carry_out(preemptor, Candidate(NodeName("n0"), victims, 0), [])
    assert api.deleted == ["v0", "v1"] and executor.abandoned == 0


def proposed_then_taken(other_priority: int) -> tuple[Engine, Preemption, PodRecord, NodeName, NodeName]:
    """Two nodes with one low pod each; the shard proposes one of them for ``hi``, and before the leader's
    choice comes back, a pod ``hi`` may not evict takes that node's room."""
    engine, ev = setup(
        {"n0": "2", "n1": "2"}, [running("low0", "n0", "2", 1), running("low1", "n1", "2", other_priority)]
    )
    pre = preemption_over(engine, ev)
    pod = make_pod("hi").req(cpu="2").priority(10).record()
    d = pre.propose(pod, engine.schedule(pod))
    assert d.preemption is not None
    chosen = NodeName(d.preemption.node)
    other = NodeName("n1" if chosen == "n0" else "n0")
    victim = next(iter(engine.cache.nodes[chosen].pods))
    engine.cache.remove_pod(victim)
    engine.cache.upsert_pod(running("peer", chosen, "2", 10))
    return engine, pre, pod, chosen, other


def test_carry_out_takes_a_fresh_candidate_as_good_as_the_chosen_proposal_at_once() -> None:
    engine, pre, pod, chosen, other = proposed_then_taken(other_priority=1)
    assert pre.carry_out(pod, chosen, engine.schedule(pod)) is None  # no round trip to the leader
    assert engine.cache.nominated_node[pod.key] == other and pre.busy(pod.key)
    assert pod.key not in pre.proposed


def test_carry_out_hands_a_worse_fresh_candidate_back_to_the_leader() -> None:
    engine, pre, pod, chosen, other = proposed_then_taken(other_priority=2)
    assert chosen == "n0"  # low0's priority 1 ranks before low1's 2
    d = pre.carry_out(pod, chosen, engine.schedule(pod))
    # another shard's proposal may be better than n1's: the leader chooses
    assert d is not None and d.preemption is not None and d.preemption.node == other
    assert pod.key not in engine.cache.nominated_node and not pre.busy(pod.key)
    assert pre.proposed[pod.key].node == other
