"""The leader's side of a refusal: a pod using a placement field the engine does not support is reported at
once with the field named, and never dispatched to a worker (not even after the retry period)."""

from __future__ import annotations

from common.records import PodKey
from coordinator.dispatch import UNSCHEDULABLE_RETRY
from tests.builders import PodBuilder
from tests.unit.dispatch.fakes import Rig


async def test_a_refused_pod_is_reported_at_once_and_never_dispatched(rig: Rig) -> None:
    (w1,) = rig.workers("w1")
    w1.up().summary()
    refused = PodBuilder("claims").req(cpu="100m")
    refused.spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "gpu-claim"}]
    rig.d.observe(refused.obj)
    rig.d.observe(PodBuilder("plain").req(cpu="100m").obj)
    [(reported, message)] = rig.reporter.verdicts
    assert reported == PodKey("default/claims")
    assert message.startswith("pod uses spec.resourceClaims, which agent-scheduler does not support yet")
    rig.clock.advance(UNSCHEDULABLE_RETRY * 2)
    assert rig.d.retry_parked(force=True) == 0
    rig.rescan()
    rig.step()
    assert w1.ids_for("claims") == [] and len(w1.ids_for("plain")) == 1


async def test_a_pod_with_inter_pod_rules_is_dispatched(rig: Rig) -> None:
    """Refused until the topology lane existed; now it goes out, through the lane."""
    (w1,) = rig.workers("w1")
    w1.up().summary()
    rig.d.observe(PodBuilder("spread").req(cpu="100m").spread("topology.kubernetes.io/zone", {"a": "b"}).obj)
    rig.step()
    assert rig.reporter.verdicts == [] and len(w1.ids_for("spread")) == 1
