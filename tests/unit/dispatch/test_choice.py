"""Worker choice and the verdict as pure functions over worker states."""

from __future__ import annotations

import random

from common import protocol
from common.records import PodKey
from coordinator.dispatch.choice import Worker, choose, pick_candidate
from coordinator.dispatch.pending import NO_CANDIDATE, PendingPod, verdict
from tests.builders import PodBuilder
from tests.unit.dispatch.fakes import GIB


class Link:
    def __init__(self, worker_id: str, connected: bool = True) -> None:
        self.worker_id = worker_id
        self.connected = connected

    def send(self, message: protocol.Message) -> None:
        raise AssertionError("choice never sends")

    def flush(self) -> bool:
        raise AssertionError("choice never sends")

    async def drain(self) -> None:
        return None

    def stop(self) -> None:
        return None


def worker(
    name: str,
    *,
    nodes: int = 2,
    max_cpu: int = 2000,
    free_cpu: int = 4000,
    syncing: int = 0,
    connected: bool = True,
    summarised: bool = True,
) -> Worker:
    capacity = protocol.Capacity(
        nodes=nodes,
        free_cpu=free_cpu,
        free_memory=8 * GIB,
        max_cpu=max_cpu,
        max_memory=4 * GIB,
        pending=0,
        syncing=syncing,
        binds_per_s=0.0,
        ts=0.0,
    )
    return Worker(name, f"{name}:1", Link(name, connected), capacity if summarised else None)


def pending(cpu: str = "1", memory: str = "1Gi") -> PendingPod:
    b = PodBuilder("a").req(cpu=cpu, memory=memory)
    return PendingPod(b.obj, b.record())


def test_fits_up_to_the_largest_free_node_inclusive() -> None:
    w = worker("w", max_cpu=2000)
    assert w.fits(pending(cpu="2").record)
    assert not w.fits(pending(cpu="2001m").record)
    assert not w.fits(pending(memory="5Gi").record)


def test_no_fit_without_nodes_summary_or_stream() -> None:
    record = pending(cpu="100m").record
    assert not worker("w", nodes=0).fits(record)
    assert not worker("w", summarised=False).fits(record)
    assert not worker("w", connected=False).fits(record)


def test_choose_skips_tried_unfit_and_full_windows() -> None:
    rng = random.Random(1)
    record = pending(cpu="1").record
    tried, small, full, free = worker("tried"), worker("small", max_cpu=500), worker("full"), worker("free")
    full.unacked.update(range(protocol.MAX_UNACKED))
    assert choose([tried, small, full, free], record, {"tried"}, rng) is free
    assert choose([tried, small, full], record, {"tried"}, rng) is None


def test_best_of_two_takes_fewer_in_flight_then_more_free_cpu() -> None:
    record = pending(cpu="1").record
    a, b = worker("a", free_cpu=8000), worker("b", free_cpu=4000)
    for seed in range(10):
        assert choose([a, b], record, set(), random.Random(seed)) is a  # tie on queue: more free CPU
    a.in_flight[1] = PodKey("default/x")
    for seed in range(10):
        assert choose([a, b], record, set(), random.Random(seed)) is b


def test_verdict_waits_for_every_live_shard() -> None:
    p = pending(cpu="1")
    workers = {"a": worker("a", nodes=2), "b": worker("b", nodes=3)}
    p.answered_no("a", protocol.Result.unschedulable(1, "", nodes=2, reasons={"x": 2}, message=""))
    assert verdict(p, workers) is None
    p.answered_no("b", protocol.Result.unschedulable(2, "", nodes=3, reasons={"x": 1, "y": 2}, message=""))
    assert verdict(p, workers) == "0/5 nodes are available: 3 x, 2 y. " + NO_CANDIDATE


def test_verdict_waits_for_a_settling_shard_that_has_not_answered() -> None:
    p = pending(cpu="1")
    p.answered_no("a", protocol.Result.unschedulable(1, "", nodes=2, reasons={"x": 2}, message=""))
    for settling in (worker("b", nodes=0, syncing=1), worker("b", summarised=False)):
        assert verdict(p, {"a": worker("a"), "b": settling}) is None
    gone = worker("b", connected=False, summarised=False)  # not connected: not settling, not live
    assert verdict(p, {"a": worker("a"), "b": gone}) == "0/2 nodes are available: 2 x. " + NO_CANDIDATE


def test_no_verdict_without_a_live_worker() -> None:
    assert verdict(pending(), {}) is None
    assert verdict(pending(), {"a": worker("a", nodes=0)}) is None


def test_pick_candidate_kube_order_ties_to_the_lowest_worker_id_and_skips_unready() -> None:

    def c(node: str, top: int, victims: int = 1, violations: int = 0) -> protocol.Candidate:
        return protocol.Candidate(node, violations, top, victims * (top + 2**31), victims, 1.0)

    workers = {wid: worker(wid) for wid in ("a", "b", "c")}
    assert pick_candidate({}, workers) is None
    chosen = pick_candidate({"c": c("n3", 1), "b": c("n2", 1), "a": c("n1", 5)}, workers)
    assert chosen is not None and chosen[0].worker_id == "b" and chosen[1].node == "n2"
    chosen = pick_candidate({"a": c("n1", 1, violations=1), "b": c("n2", 9)}, workers)
    assert chosen is not None and chosen[1].node == "n2"  # no budget violated beats a low priority
    assert pick_candidate({"gone": c("n9", 0)}, workers) is None
