"""The volume filters (VolumeRestrictions, NodeVolumeLimits, VolumeBinding, VolumeZone) with kube-scheduler's
verdicts and messages, and the volume store's claim-to-PV matching and assumptions."""

from __future__ import annotations

from typing import Any

from common.records import NodeName, PodRecord, pod_from_json
from tests.builders import make_node, make_pod
from tests.unit.worker.helpers import engine_over
from worker.engine import Engine
from worker.framework import Code
from worker.volumes import ANN_BIND_COMPLETED, ANN_SELECTED_NODE

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"


def claim(
    name: str,
    *,
    cls: str | None = "wffc",
    size: str = "1Gi",
    modes: tuple[str, ...] = ("ReadWriteOnce",),
    volume: str = "",
    annotations: dict[str, str] | None = None,
    owner: str = "",
    selector: dict[str, Any] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "default",
        "uid": f"uid-{name}",
        "resourceVersion": "10",
        "annotations": dict(annotations or {}),
    }
    if volume:
        meta["annotations"][ANN_BIND_COMPLETED] = "yes"
    if owner:
        meta["ownerReferences"] = [
            {"uid": owner, "controller": True, "kind": "Pod", "name": "p", "apiVersion": "v1"}
        ]
    spec: dict[str, Any] = {"accessModes": list(modes), "resources": {"requests": {"storage": size}}}
    if cls is not None:
        spec["storageClassName"] = cls
    if volume:
        spec["volumeName"] = volume
    if selector is not None:
        spec["selector"] = selector
    return {"metadata": meta, "spec": spec, "status": {"phase": "Bound" if volume else "Pending"}}


def pv(
    name: str,
    *,
    cls: str = "wffc",
    size: str = "1Gi",
    modes: tuple[str, ...] = ("ReadWriteOnce",),
    zone: str | None = None,
    labels: dict[str, str] | None = None,
    bound_to: str = "",
    csi: tuple[str, str] | None = None,
    affinity_zone: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "storageClassName": cls,
        "capacity": {"storage": size},
        "accessModes": list(modes),
    }
    if affinity_zone is not None:
        spec["nodeAffinity"] = {
            "required": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": ZONE, "operator": "In", "values": [affinity_zone]}]}
                ]
            }
        }
    if bound_to:
        spec["claimRef"] = {"namespace": "default", "name": bound_to, "uid": f"uid-{bound_to}"}
    if csi is not None:
        spec["csi"] = {"driver": csi[0], "volumeHandle": csi[1]}
    meta_labels = dict(labels or {})
    if zone is not None:
        meta_labels[ZONE] = zone
    return {
        "metadata": {"name": name, "resourceVersion": "5", "labels": meta_labels},
        "spec": spec,
        "status": {"phase": "Bound" if bound_to else "Available"},
    }


def storage_class(
    name: str, *, provisioner: str = "test.example/p", wffc: bool = True, zones: list[str] | None = None
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": name},
        "provisioner": provisioner,
        "volumeBindingMode": "WaitForFirstConsumer" if wffc else "Immediate",
    }
    if zones is not None:
        obj["allowedTopologies"] = [{"matchLabelExpressions": [{"key": ZONE, "values": zones}]}]
    return obj


def with_claims(*claims: str, name: str = "p", node: str = "") -> PodRecord:
    b = make_pod(name).req(cpu="100m")
    b.spec["volumes"] = [
        {"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}} for i, c in enumerate(claims)
    ]
    if node:
        b.on(node)
    return b.record()


def zones(*names: str) -> Engine:
    engine = engine_over([make_node(f"n{i}").label(ZONE, z).record() for i, z in enumerate(names)])
    store = engine.cache.volumes
    store.upsert("classes", storage_class("wffc"))
    store.upsert("classes", storage_class("local", provisioner="kubernetes.io/no-provisioner"))
    store.upsert("classes", storage_class("immediate", wffc=False))
    return engine


def verdicts(engine: Engine, pod: PodRecord) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name, info in sorted(engine.cache.nodes.items()):
        st = engine.filter_all(pod, info)
        out[name] = None if st is None else "; ".join(st.reasons)
    return out


# ----- PreFilter verdicts --------------------------------------------------------------------------------------


def test_missing_claim_keeps_the_pod_pending_with_kubes_reason() -> None:
    engine = zones("a", "b")
    d = engine.schedule(with_claims("absent"))
    assert d.node is None and d.code == Code.UNRESOLVABLE
    assert d.message == '0/2 nodes are available: persistentvolumeclaim "absent" not found.'


def test_unbound_immediate_claim_keeps_the_pod_pending() -> None:
    engine = zones("a")
    engine.cache.volumes.upsert("claims", claim("data", cls="immediate"))
    d = engine.schedule(with_claims("data"))
    assert d.message == "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims."
    # no class at all, or a class that does not exist: Immediate too
    engine.cache.volumes.upsert("claims", claim("data", cls=None))
    assert "unbound immediate" in engine.schedule(with_claims("data")).message
    engine.cache.volumes.upsert("claims", claim("data", cls="nowhere"))
    assert "unbound immediate" in engine.schedule(with_claims("data")).message


def test_claim_being_deleted_or_lost() -> None:
    engine = zones("a")
    obj = claim("data", volume="pv-1")
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    engine.cache.volumes.upsert("claims", obj)
    assert 'persistentvolumeclaim "data" is being deleted' in engine.schedule(with_claims("data")).message
    lost = claim("data", volume="pv-1")
    lost["status"]["phase"] = "Lost"
    engine.cache.volumes.upsert("claims", lost)
    assert (
        'persistentvolumeclaim "data" bound to non-existent persistentvolume "pv-1"'
        in engine.schedule(with_claims("data")).message
    )


def test_generic_ephemeral_volume_waits_for_its_claim_and_must_own_it() -> None:
    engine = zones("a")
    b = make_pod("p").req(cpu="100m")
    b.spec["volumes"] = [{"name": "ws", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]
    obj = b.json()
    obj["metadata"]["uid"] = "pod-uid"
    pod = pod_from_json(obj)
    assert pod.claims == (("ws", True, ""),)
    d = engine.schedule(pod)
    assert 'waiting for ephemeral volume controller to create the persistentvolumeclaim "p-ws"' in d.message
    engine.cache.volumes.upsert("claims", claim("p-ws", owner="someone-else"))
    assert "(pod is not owner)" in engine.schedule(pod).message
    engine.cache.volumes.upsert("claims", claim("p-ws", owner="pod-uid"))
    assert engine.schedule(pod).node is not None


def test_bound_claim_whose_pv_is_missing_gets_volume_zones_reason() -> None:
    engine = zones("a")
    engine.cache.volumes.upsert("claims", claim("data", volume="gone"))
    d = engine.schedule(with_claims("data"))
    assert d.message == '0/1 nodes are available: persistentvolume "gone" not found.'


# ----- bound claims: PV node affinity and VolumeZone ------------------------------------------------------------


def test_bound_pv_node_affinity_is_a_filter() -> None:
    engine = zones("a", "b", "c")
    store = engine.cache.volumes
    store.upsert("claims", claim("data", volume="pv-b"))
    store.upsert("volumes", pv("pv-b", bound_to="data", affinity_zone="b"))
    pod = with_claims("data")
    assert engine.schedule(pod).node == "n1"
    v = verdicts(engine, pod)
    assert v["n0"] == v["n2"] == "node(s) had volume node affinity conflict"
    assert v["n1"] is None


def test_volume_zone_matches_pv_zone_labels_including_multi_zone_and_beta() -> None:
    engine = engine_over(
        [
            make_node("n0").label(ZONE, "a").record(),
            make_node("n1").label(ZONE, "b").record(),
            make_node("n2").label(ZONE, "c").record(),
            make_node("n3").record(),  # no zone label at all: VolumeZone does not constrain it
            make_node("n4").label("failure-domain.beta.kubernetes.io/zone", "a").record(),
        ]
    )
    store = engine.cache.volumes
    store.upsert("claims", claim("data", volume="pv"))
    store.upsert("volumes", pv("pv", bound_to="data", zone="a__b"))
    v = verdicts(engine, with_claims("data"))
    assert v == {
        "n0": None,
        "n1": None,
        "n2": "node(s) had no available volume zone",
        "n3": None,
        "n4": "node(s) had no available volume zone",  # a GA label on the PV is not matched to a beta one
    }
    store.upsert("volumes", pv("pv", bound_to="data", labels={"failure-domain.beta.kubernetes.io/zone": "c"}))
    v = verdicts(engine, with_claims("data"))
    assert v["n2"] is None and v["n3"] is None  # a beta label on the PV matches the node's GA one
    assert v["n0"] == v["n4"] == "node(s) had no available volume zone"


# ----- WaitForFirstConsumer -------------------------------------------------------------------------------------


def test_wffc_static_binding_picks_the_smallest_matching_pv_that_fits_the_node() -> None:
    engine = zones("a", "b")
    store = engine.cache.volumes
    store.upsert("claims", claim("data", cls="local", size="5Gi"))
    store.upsert("volumes", pv("small", cls="local", size="1Gi", affinity_zone="a"))  # too small
    store.upsert("volumes", pv("big", cls="local", size="50Gi", affinity_zone="b"))
    store.upsert("volumes", pv("right", cls="local", size="10Gi", affinity_zone="b"))
    store.upsert("volumes", pv("rwx", cls="local", size="5Gi", modes=("ReadWriteMany",), affinity_zone="b"))
    pod = with_claims("data")
    v = verdicts(engine, pod)
    assert v["n0"] == "node(s) didn't find available persistent volumes to bind"
    d = engine.schedule(pod)
    assert d.node == "n1"
    plan = engine.volume_plan(pod, NodeName("n1"))
    assert plan is not None and [p.name for _, p in plan.static] == ["right"]
    assert plan.waits == ("default/data",) and not plan.provision


def test_wffc_selector_and_assumed_pv_is_not_offered_twice() -> None:
    engine = zones("a")
    store = engine.cache.volumes
    store.upsert("claims", claim("one", cls="local", selector={"matchLabels": {"tier": "fast"}}))
    store.upsert("claims", claim("two", cls="local"))
    store.upsert("volumes", pv("slow", cls="local", labels={"tier": "slow"}))
    store.upsert("volumes", pv("fast", cls="local", labels={"tier": "fast"}))
    first = with_claims("one", name="p1")
    engine.schedule(first)
    plan = engine.volume_plan(first, NodeName("n0"))
    assert plan is not None and [p.name for _, p in plan.static] == ["fast"]
    # "two" could take either: after "one" took "fast" (assumed), only "slow" is left, then nothing
    store.assume(plan)
    second = with_claims("two", name="p2")
    assert engine.schedule(second).node == "n0"
    plan2 = engine.volume_plan(second, NodeName("n0"))
    assert plan2 is not None and [p.name for _, p in plan2.static] == ["slow"]
    store.assume(plan2)
    store.upsert("claims", claim("three", cls="local"))
    d = engine.schedule(with_claims("three", name="p3"))
    assert d.node is None and "didn't find available persistent volumes to bind" in d.message
    store.revert(plan2)
    assert engine.schedule(with_claims("three", name="p3")).node == "n0"


def test_wffc_dynamic_provisioning_respects_allowed_topologies_and_no_provisioner() -> None:
    engine = zones("a", "b")
    store = engine.cache.volumes
    store.upsert("classes", storage_class("zonal", zones=["b"]))
    store.upsert("claims", claim("data", cls="zonal"))
    pod = with_claims("data")
    assert verdicts(engine, pod) == {
        "n0": "node(s) didn't find available persistent volumes to bind",
        "n1": None,
    }
    assert engine.schedule(pod).node == "n1"
    plan = engine.volume_plan(pod, NodeName("n1"))
    assert plan is not None and [c.name for c in plan.provision] == ["data"] and not plan.static
    store.assume(plan)
    assert store.claims["default/data"].selected_node == "n1"
    # a class that cannot provision and no PV: nowhere
    store.upsert("claims", claim("local", cls="local"))
    d = engine.schedule(with_claims("local", name="q"))
    assert d.node is None and d.code == Code.UNRESOLVABLE
    assert d.message == "0/2 nodes are available: 2 node(s) didn't find available persistent volumes to bind."


def test_selected_node_annotation_pins_the_claim_to_that_node() -> None:
    engine = zones("a", "b", "c")
    engine.cache.volumes.upsert("claims", claim("data", annotations={ANN_SELECTED_NODE: "n2"}))
    pod = with_claims("data")
    assert engine.schedule(pod).node == "n2"
    plan = engine.volume_plan(pod, NodeName("n2"))
    assert plan is not None and not plan.provision and plan.waits == ("default/data",)


def test_all_bound_claims_need_no_volume_work() -> None:
    engine = zones("a")
    store = engine.cache.volumes
    store.upsert("claims", claim("data", volume="pv"))
    store.upsert("volumes", pv("pv", bound_to="data"))
    pod = with_claims("data")
    assert engine.schedule(pod).node == "n0"
    plan = engine.volume_plan(pod, NodeName("n0"))
    assert plan is not None and plan.all_bound


# ----- NodeVolumeLimits and VolumeRestrictions ------------------------------------------------------------------


def _csinode(node: str, driver: str, count: int) -> dict[str, Any]:
    return {
        "metadata": {"name": node},
        "spec": {"drivers": [{"name": driver, "nodeID": node, "allocatable": {"count": count}}]},
    }


def test_csi_attach_limit_counts_unique_volumes_on_the_node() -> None:
    engine = zones("a", "b")
    store = engine.cache.volumes
    store.upsert("csinodes", _csinode("n0", "csi.example", 1))
    for name in ("x", "y"):
        store.upsert("claims", claim(name, volume=f"pv-{name}"))
        store.upsert("volumes", pv(f"pv-{name}", bound_to=name, csi=("csi.example", f"h-{name}")))
    engine.cache.upsert_pod(with_claims("x", name="holder", node="n0"))
    v = verdicts(engine, with_claims("y", name="new"))
    assert v == {"n0": "node(s) exceed max volume count", "n1": None}
    # the same volume again is attached once: it fits
    assert verdicts(engine, with_claims("x", name="again"))["n0"] is None


def test_read_write_once_pod_claim_in_use_keeps_others_off_every_node() -> None:
    engine = zones("a", "b")
    store = engine.cache.volumes
    store.upsert("claims", claim("solo", volume="pv", modes=("ReadWriteOncePod",)))
    store.upsert("volumes", pv("pv", bound_to="solo", modes=("ReadWriteOncePod",)))
    first = with_claims("solo", name="first")
    assert engine.schedule(first).node is not None
    engine.cache.assume(first, NodeName("n0"))
    d = engine.schedule(with_claims("solo", name="second"))
    assert d.node is None and d.code == Code.UNSCHEDULABLE
    assert d.message == (
        "0/2 nodes are available: 2 node has pod using PersistentVolumeClaim with the same name and "
        "ReadWriteOncePod access mode."
    )
    engine.cache.forget(first.key)
    assert engine.schedule(with_claims("solo", name="second")).node is not None


def test_bound_and_unbound_failures_are_both_reasons() -> None:
    engine = zones("a", "b")
    store = engine.cache.volumes
    store.upsert("claims", claim("bound", volume="pv-b"))
    store.upsert("volumes", pv("pv-b", bound_to="bound", affinity_zone="b"))
    store.upsert("claims", claim("unbound", cls="local"))
    assert verdicts(engine, with_claims("bound", "unbound"))["n0"] == (
        "node(s) had volume node affinity conflict; node(s) didn't find available persistent volumes to bind"
    )


# ----- which waiting pods a storage event wakes --------------------------------------------------------------


def test_a_storage_event_wakes_only_the_pods_with_a_claim_it_concerns() -> None:
    from worker.cache import Cache
    from worker.feeds import StorageFeed
    from worker.queue import SchedulingQueue

    cache = Cache()
    store = cache.volumes
    store.upsert("claims", claim("ca"))  # class wffc
    store.upsert("claims", claim("cb", cls="local"))
    ephemeral = make_pod("e").req(cpu="100m")
    ephemeral.spec["volumes"] = [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {}}}]
    pods = [
        with_claims("ca", name="a"),
        with_claims("cb", name="b"),
        ephemeral.record(),  # its claim is "e-scratch", not created yet
        make_pod("plain").req(cpu="100m").record(),
    ]

    def waiting() -> SchedulingQueue:
        queue = SchedulingQueue(lambda: 0.0)
        for p in pods:
            queue.add(p)
            qp = queue.pop_nowait()
            assert qp is not None
            queue.done(qp, scheduled=False)
        assert all(queue.where(p.key) == "unschedulable" for p in pods)
        return queue

    def woken(kind: str, obj: dict[str, Any], deleted: bool = False) -> list[str]:
        queue = waiting()
        StorageFeed(kind, cache, queue).event("DELETED" if deleted else "MODIFIED", obj)
        return [p.name for p in pods if queue.where(p.key) != "unschedulable"]

    assert woken("claims", claim("ca", volume="pv-a")) == ["a"]
    assert woken("claims", claim("e-scratch", owner="uid-e")) == ["e"]  # the ephemeral volume's claim
    assert woken("claims", claim("ca"), deleted=True) == ["a"]
    store.upsert("claims", claim("ca"))
    assert woken("claims", {**claim("other"), "metadata": {"name": "ca", "namespace": "elsewhere"}}) == []
    # a PV bound to a claim: that claim's pods; an available one: the pods with a claim of its class
    assert woken("volumes", pv("pv-b", cls="local", bound_to="cb")) == ["b"]
    assert woken("volumes", pv("pv-free", cls="wffc")) == ["a", "e"]  # e-scratch is of class wffc too
    assert woken("volumes", pv("pv-other", cls="gold")) == []
    # a claim naming a PV of another class (pre-bound by the user): that PV's events concern it
    store.upsert("claims", claim("cb", cls="local", volume="pv-named"))
    assert woken("volumes", pv("pv-named", cls="gold")) == ["b"]
    store.upsert("claims", claim("cb", cls="local"))
    assert woken("classes", storage_class("local", provisioner="kubernetes.io/no-provisioner")) == ["b"]
    assert woken("classes", storage_class("gold")) == []
    # attach limits: every pod with a claim (the ephemeral one too: its claim may come)
    assert woken("csinodes", _csinode("n0", "csi.example", 4)) == ["a", "b", "e"]
    # a relist may change anything: every pod
    queue = waiting()
    StorageFeed("claims", cache, queue).replace([claim("ca"), claim("cb", cls="local")])
    assert all(queue.where(p.key) != "unschedulable" for p in pods)
