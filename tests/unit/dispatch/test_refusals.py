"""The leader's side of a refusal: a pod using a placement field the engine does not support, or an inter-pod
rule only a standalone worker honours, is reported at once with the field named, and never dispatched to a
worker (not even after the retry period)."""

from __future__ import annotations

from common.records import PodKey
from coordinator.dispatch import UNSCHEDULABLE_RETRY
from tests.builders import PodBuilder
from tests.unit.dispatch.fakes import Rig


async def test_a_refused_pod_is_reported_at_once_and_never_dispatched(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary()
    refused = PodBuilder("spread").req(cpu="100m")
    refused.spec["topologySpreadConstraints"] = [
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule"}
    ]
    rig.d.observe(refused.obj)
    rig.d.observe(PodBuilder("plain").req(cpu="100m").obj)
    [(reported, message)] = rig.reporter.verdicts
    assert reported == PodKey("default/spread")
    assert message.startswith(
        "pod uses spec.topologySpreadConstraints: inter-pod rules are supported by the standalone "
        "agent-scheduler worker only so far"
    )
    rig.clock.advance(UNSCHEDULABLE_RETRY * 2)
    assert rig.d.retry_parked(force=True) == 0
    rig.rescan()
    rig.step()
    assert w1.ids_for("spread") == [] and len(w1.ids_for("plain")) == 1
