"""The volume filters, as kube-scheduler v1.36 defines them: VolumeRestrictions (ReadWriteOncePod),
NodeVolumeLimits (CSI attach limits from CSINode), VolumeBinding and VolumeZone.

Each applies only to pods with claim-backed volumes (``PodRecord.claims``), so plain pods pay nothing. Some
of kube's checks are PreFilter checks (a verdict for the pod, not per node); they are ``prefilter(pod)`` here,
which the engine runs before walking candidates, and ``filter`` repeats them so every node's verdict (the
explanations, the audits) agrees. The per-pod state is computed once per (pod, storage version).

kube-scheduler's PreFilter order, and so which reason a pod with several problems gets: VolumeRestrictions
(``persistentvolumeclaim "X" not found``), VolumeBinding (claim lost or being deleted, ephemeral claim not
yet created or not the pod's, ``pod has unbound immediate PersistentVolumeClaims``), VolumeZone (a bound
claim's PV missing). Per node, in filter order: ReadWriteOncePod conflict (Unschedulable), attach limits
(Unschedulable), VolumeBinding (UnschedulableAndUnresolvable: PV node affinity, no PV to bind or class that
cannot provision here, PV missing), VolumeZone (UnschedulableAndUnresolvable).

``VolumeBinding.plan(pod, node)`` gives the scheduler what placing the pod on the chosen node needs done to
its claims (``worker.volumes.VolumePlan``); the binder carries it out before binding the pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from common.records import NodeName, PodRecord
from worker.framework import Status
from worker.nodeinfo import NodeInfo
from worker.volumes import (
    READ_WRITE_ONCE_POD,
    REASON_UNBOUND_IMMEDIATE,
    PodClaims,
    VolumePlan,
    VolumeStore,
    claim_name,
)

if TYPE_CHECKING:
    from worker.cache import Cache

RWOP_CONFLICT = Status.unschedulable(
    "node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod access mode"
)
MAX_VOLUME_COUNT = Status.unschedulable("node(s) exceed max volume count")
ZONE_CONFLICT = Status.unresolvable("node(s) had no available volume zone")

# VolumeZone's topology labels, GA and beta
ZONE = "topology.kubernetes.io/zone"
REGION = "topology.kubernetes.io/region"
BETA_ZONE = "failure-domain.beta.kubernetes.io/zone"
BETA_REGION = "failure-domain.beta.kubernetes.io/region"
TOPOLOGY_LABELS = (BETA_ZONE, BETA_REGION, ZONE, REGION)
TO_GA = {BETA_ZONE: ZONE, BETA_REGION: REGION}


class _VolumePlugin:
    name = ""
    static = False

    def __init__(self) -> None:
        self.cache: Cache | None = None

    def attach(self, cache: Cache) -> None:
        self.cache = cache

    @property
    def store(self) -> VolumeStore:
        assert self.cache is not None, f"{self.name} used without a cache"
        return self.cache.volumes

    def applies(self, pod: PodRecord) -> bool:
        return bool(pod.claims)


class VolumeRestrictions(_VolumePlugin):
    """ReadWriteOncePod: a claim with that access mode used by any placed pod (any node) keeps others off."""

    name = "VolumeRestrictions"

    def prefilter(self, pod: PodRecord) -> Status | None:
        for _, ephemeral, claim in pod.claims:
            if not ephemeral and f"{pod.namespace}/{claim}" not in self.store.claims:
                return Status.unresolvable(f'persistentvolumeclaim "{claim}" not found')
        return None

    def node_pods(self, pod: PodRecord) -> bool:
        return bool(pod.claims)  # the claims' other users; a pod without claims passes every node

    def filter(self, pod: PodRecord, node: NodeInfo) -> Status | None:
        if not pod.claims:
            return None
        status = self.prefilter(pod)
        if status is not None:
            return status
        assert self.cache is not None
        for _, ephemeral, claim in pod.claims:
            if ephemeral:
                continue
            ref = f"{pod.namespace}/{claim}"
            c = self.store.claims.get(ref)
            if c is None or READ_WRITE_ONCE_POD not in c.access_modes:
                continue
            users = self.cache.claim_users.get(ref, 0)
            if pod.key in self.cache.pod_node:
                users -= 1  # the pod itself (an explanation after it was assumed)
            if users > 0:
                return RWOP_CONFLICT
        return None


class NodeVolumeLimits(_VolumePlugin):
    """CSI attach limits: the node's CSINode ``allocatable.count`` per driver bounds the unique volumes of
    that driver used by its pods (bound and assumed) plus the incoming pod's new ones."""

    name = "NodeVolumeLimits"

    def _unique(self, pod: PodRecord, into: dict[str, str]) -> None:
        store = self.store
        for volume, ephemeral, ref in pod.claims:
            name = claim_name(pod.name, volume, ephemeral, ref)
            claim = store.claims.get(f"{pod.namespace}/{name}")
            if claim is None:
                continue
            pv = store.volumes.get(claim.volume_name) if claim.volume_name else None
            if pv is not None:
                driver, handle = pv.csi_driver, pv.csi_handle
            else:
                # not bound yet (or its PV not seen): the class's provisioner, one volume per claim
                cls = store.classes.get(claim.storage_class) if claim.storage_class else None
                if cls is None:
                    continue
                driver, handle = cls.provisioner, f"unbound-{pod.namespace}/{name}"
            if driver and handle:
                into[f"{driver}/{handle}"] = driver

    def node_pods(self, pod: PodRecord) -> bool:
        return bool(pod.claims)  # the volumes of the node's pods; a pod without claims passes every node

    def filter(self, pod: PodRecord, node: NodeInfo) -> Status | None:
        if not pod.claims:
            return None
        csinode = self.store.csinodes.get(node.node.name)
        if csinode is None or not csinode.limits:
            return None
        new: dict[str, str] = {}
        self._unique(pod, new)
        if not new:
            return None
        attached: dict[str, str] = {}
        for other in node.pods.values():
            if other.claims and other.key != pod.key:
                self._unique(other, attached)
        used: dict[str, int] = {}
        for unique, driver in attached.items():
            new.pop(unique, None)  # one volume used by several pods is attached once
            used[driver] = used.get(driver, 0) + 1
        wanted: dict[str, int] = {}
        for driver in new.values():
            wanted[driver] = wanted.get(driver, 0) + 1
        for driver, count in wanted.items():
            limit = csinode.limits.get(driver)
            if limit is not None and used.get(driver, 0) + count > limit:
                return MAX_VOLUME_COUNT
        return None


class VolumeBinding(_VolumePlugin):
    name = "VolumeBinding"

    def __init__(self) -> None:
        super().__init__()
        self._pod: PodRecord | None = None
        self._version = -1
        self._claims = PodClaims()
        self._plans: dict[str, VolumePlan] = {}

    def node_pods(self, pod: PodRecord) -> bool:
        # a pod without claims passes every node; with claims, counted as depending on the pods (whose
        # claims took PVs) rather than proven not to
        return bool(pod.claims)

    def _prepare(self, pod: PodRecord) -> PodClaims:
        store = self.store
        if pod is not self._pod or store.version != self._version:
            self._claims = store.pod_claims(pod.namespace, pod.name, pod.uid, pod.claims)
            self._pod, self._version, self._plans = pod, store.version, {}
        return self._claims

    def prefilter(self, pod: PodRecord) -> Status | None:
        claims = self._prepare(pod)
        if claims.error is not None:
            return Status.unresolvable(claims.error)
        if claims.immediate:
            return Status.unresolvable(REASON_UNBOUND_IMMEDIATE)
        return None

    def filter(self, pod: PodRecord, node: NodeInfo) -> Status | None:
        if not pod.claims:
            return None
        status = self.prefilter(pod)
        if status is not None:
            return status
        name = node.node.name
        plan, reasons = self.store.find_pod_volumes(self._claims, name, node.node.labels)
        if reasons:
            return Status.unresolvable(*reasons)
        assert plan is not None
        self._plans[name] = plan
        return None

    def plan(self, pod: PodRecord, node: str) -> VolumePlan | None:
        """The volume work for placing ``pod`` on ``node`` (found by ``filter`` in this decision); None when
        the pod has no claims."""
        if not pod.claims:
            return None
        self._prepare(pod)
        plan = self._plans.get(node)
        if plan is None:
            info = self.cache.nodes.get(NodeName(node)) if self.cache is not None else None
            labels = info.node.labels if info is not None else {}
            plan, _ = self.store.find_pod_volumes(self._claims, node, labels)
        return plan


class VolumeZone(_VolumePlugin):
    """A bound claim's PV zone/region labels (values split on ``__``) must match the node's, for nodes that
    carry any zone or region label; a beta label on the PV also matches the node's GA label."""

    name = "VolumeZone"

    def __init__(self) -> None:
        super().__init__()
        self._pod: PodRecord | None = None
        self._version = -1
        self._state: tuple[Status | None, list[tuple[str, frozenset[str]]]] = (None, [])

    def node_pods(self, pod: PodRecord) -> bool:
        # a pod without claims passes every node; with claims, counted as depending on the pods (whose
        # claims took PVs) rather than proven not to
        return bool(pod.claims)

    def _prepare(self, pod: PodRecord) -> tuple[Status | None, list[tuple[str, frozenset[str]]]]:
        store = self.store
        if pod is self._pod and store.version == self._version:
            return self._state
        topologies: list[tuple[str, frozenset[str]]] = []
        error: Status | None = None
        for volume, ephemeral, ref in pod.claims:
            name = claim_name(pod.name, volume, ephemeral, ref)
            claim = store.claims.get(f"{pod.namespace}/{name}")
            if claim is None:
                error = Status.unresolvable(f'persistentvolumeclaim "{name}" not found')
                break
            if not claim.volume_name:
                # unbound: VolumeBinding decides (a delayed claim is skipped; any other already failed there)
                continue
            pv = store.volumes.get(claim.volume_name)
            if pv is None:
                error = Status.unresolvable(f'persistentvolume "{claim.volume_name}" not found')
                break
            for key in TOPOLOGY_LABELS:
                value = pv.labels.get(key)
                if value is not None:
                    topologies.append((key, frozenset(value.split("__"))))
        self._pod, self._version, self._state = pod, store.version, (error, topologies)
        return self._state

    def prefilter(self, pod: PodRecord) -> Status | None:
        return self._prepare(pod)[0]

    def filter(self, pod: PodRecord, node: NodeInfo) -> Status | None:
        if not pod.claims:
            return None
        error, topologies = self._prepare(pod)
        if error is not None:
            return error
        if not topologies:
            return None
        labels = node.node.labels
        if not any(key in labels for key in TOPOLOGY_LABELS):
            return None
        for key, values in topologies:
            value = labels.get(key)
            if value is None:
                value = labels.get(TO_GA.get(key, key))
            if value is None or value not in values:
                return ZONE_CONFLICT
        return None


def volume_restrictions(args: Mapping[str, Any]) -> VolumeRestrictions:
    return VolumeRestrictions()


def node_volume_limits(args: Mapping[str, Any]) -> NodeVolumeLimits:
    return NodeVolumeLimits()


def volume_binding(args: Mapping[str, Any]) -> VolumeBinding:
    return VolumeBinding()


def volume_zone(args: Mapping[str, Any]) -> VolumeZone:
    return VolumeZone()
