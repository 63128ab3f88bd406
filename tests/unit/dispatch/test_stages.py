"""Per-stage latency on the leader (``common.metrics`` stages ``dispatched`` and ``result``), on the
dispatcher's own clock: observed once per pod, when its RESULT bound arrives."""

from __future__ import annotations

from prometheus_client import REGISTRY

from common.metrics import STAGE_METRIC
from tests.builders import PodBuilder
from tests.unit.dispatch.fakes import Rig


def stage(name: str) -> tuple[float, float]:
    count = REGISTRY.get_sample_value(f"{STAGE_METRIC}_count", {"stage": name}) or 0.0
    total = REGISTRY.get_sample_value(f"{STAGE_METRIC}_sum", {"stage": name}) or 0.0
    return count, total


async def test_seen_to_dispatched_and_dispatched_to_result(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    dispatched, result = stage("dispatched"), stage("result")
    rig.d.observe(PodBuilder("a").req(cpu="500m").obj)
    rig.clock.advance(2.0)  # no worker yet: waits in the leader
    w1.up().summary()
    rig.rescan()
    rig.step()
    [sent] = w1.dispatches()
    rig.clock.advance(0.5)
    w1.ack(sent.id)
    assert stage("dispatched") == dispatched  # nothing before the RESULT
    w1.bound(sent.id)
    count, total = stage("dispatched")
    assert (count - dispatched[0], round(total - dispatched[1], 9)) == (1, 2.0)
    count, total = stage("result")
    assert (count - result[0], round(total - result[1], 9)) == (1, 0.5)


async def test_a_no_observes_nothing(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary()
    before = stage("result")
    rig.d.observe(PodBuilder("a").req(cpu="500m").obj)
    rig.step()
    [sent] = w1.dispatches()
    w1.unschedulable(sent.id, nodes=4, reasons={"Insufficient cpu": 4})
    assert stage("result") == before
