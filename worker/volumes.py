"""What the worker knows of storage: PersistentVolumeClaims, PersistentVolumes, StorageClasses and CSINodes,
and the volume decisions kube-scheduler's VolumeBinding plugin makes from them (its binder's
``GetPodVolumeClaims``, ``FindPodVolumes`` and ``AssumePodVolumes``).

The records are parsed here, not in ``common.records``: only the worker reads them. The store is written only
by the watches (``worker.feeds``) and by the worker's own assumptions (``assume`` / ``revert``), exactly as
the cache is for pods.

Semantics (kube-scheduler v1.36, ``pkg/scheduler/framework/plugins/volumebinding``):
- a claim is *bound* when it names a volume and carries ``pv.kubernetes.io/bind-completed``; an unbound claim
  is *delayed* when its StorageClass exists with ``volumeBindingMode: WaitForFirstConsumer``, else it is
  *immediate* (no class, a missing class, Immediate) and the pod waits for the PV controller;
- per node: a bound claim's PV must exist and its node affinity match the node; a delayed claim already
  annotated ``volume.kubernetes.io/selected-node`` fits only that node; the others are matched to an
  available PV (``find_matching_volume``: class, size, access modes, volume mode, selector, node affinity,
  smallest first, claims in ascending size, no PV twice), and what has no PV is provisioned when its class
  has a provisioner (not ``kubernetes.io/no-provisioner``) whose ``allowedTopologies`` admit the node.

Invariants:
- ``version`` grows on every change (watched or assumed), so a memo keyed on it is never stale.
- ``wakes``: a watched change can help only pods with a claim it concerns (kube-scheduler's queueing hints
  for the volume plugins narrow the same way); a pod without claims is never woken by storage.
- An assumed PV (claimRef set by us, not yet seen from the API) is never offered to another claim; an assumed
  provisioning is seen as the claim's ``selected-node`` annotation. ``revert`` undoes both; a watched update
  of the object replaces the assumption (the API's view wins).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from common.quantity import parse_units
from common.records import LabelSelector, PodRecord, Requirement, SelectorTerm

ANN_BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
ANN_BOUND_BY_CONTROLLER = "pv.kubernetes.io/bound-by-controller"
ANN_SELECTED_NODE = "volume.kubernetes.io/selected-node"
BETA_CLASS_ANNOTATION = "volume.beta.kubernetes.io/storage-class"
NO_PROVISIONER = "kubernetes.io/no-provisioner"
WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"
READ_WRITE_ONCE_POD = "ReadWriteOncePod"
# ours, on a ReadWriteOncePod claim: "namespace/name/uid" of the pod last given it (see ``VolumePlan.exclusive``)
ANN_RWOP_HOLDER = "agent-scheduler.io/read-write-once-pod"

# kube-scheduler's VolumeBinding reasons (binder.go)
REASON_BIND_CONFLICT = "node(s) didn't find available persistent volumes to bind"
REASON_NODE_CONFLICT = "node(s) had volume node affinity conflict"
REASON_PV_NOT_EXIST = "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)"
REASON_UNBOUND_IMMEDIATE = "pod has unbound immediate PersistentVolumeClaims"


@dataclass(frozen=True, slots=True)
class Claim:
    namespace: str
    name: str
    uid: str
    resource_version: str
    storage_class: str  # "" when none (spec.storageClassName, else the beta annotation)
    volume_name: str
    phase: str
    access_modes: tuple[str, ...]
    request: int  # bytes of spec.resources.requests.storage
    selector: LabelSelector | None
    volume_mode: str
    annotations: dict[str, str]
    owners: tuple[str, ...]  # uids of the controller owner references
    deleting: bool

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def bound(self) -> bool:
        return bool(self.volume_name) and ANN_BIND_COMPLETED in self.annotations

    @property
    def selected_node(self) -> str | None:
        return self.annotations.get(ANN_SELECTED_NODE)


@dataclass(frozen=True, slots=True)
class Volume:
    name: str
    resource_version: str
    storage_class: str
    access_modes: tuple[str, ...]
    capacity: int
    claim_ref: tuple[str, str, str] | None  # (namespace, name, uid)
    phase: str
    node_affinity: tuple[SelectorTerm, ...] | None  # required terms; None when the PV has none
    labels: dict[str, str]
    csi_driver: str
    csi_handle: str
    volume_mode: str
    deleting: bool

    def bound_to(self, claim: Claim) -> bool:
        ref = self.claim_ref
        return (
            ref is not None
            and ref[0] == claim.namespace
            and ref[1] == claim.name
            and (not ref[2] or ref[2] == claim.uid)
        )

    def fits_node(self, node: str, labels: dict[str, str]) -> bool:
        terms = self.node_affinity
        return terms is None or any(t.matches(node, labels) for t in terms)


@dataclass(frozen=True, slots=True)
class StorageClass:
    name: str
    provisioner: str
    binding_mode: str
    # allowedTopologies: terms of (key, values) requirements; empty admits every node
    allowed_topologies: tuple[tuple[tuple[str, frozenset[str]], ...], ...]

    def admits(self, labels: dict[str, str]) -> bool:
        if not self.allowed_topologies:
            return True
        return any(all(labels.get(k) in vs for k, vs in term) for term in self.allowed_topologies)


@dataclass(frozen=True, slots=True)
class CSINode:
    name: str
    limits: dict[str, int]  # driver -> allocatable.count, for drivers that report one


def _modes(raw: Any) -> tuple[str, ...]:
    return tuple(str(m) for m in raw or () if isinstance(m, str))


def _selector(raw: Any) -> LabelSelector | None:
    if not isinstance(raw, dict):
        return None
    reqs = [Requirement(str(k), "In", (str(v),)) for k, v in (raw.get("matchLabels") or {}).items()]
    for item in raw.get("matchExpressions") or ():
        if isinstance(item, dict):
            values = tuple(str(v) for v in item.get("values") or ())
            reqs.append(Requirement(str(item.get("key", "")), str(item.get("operator", "")), values))
    return LabelSelector(tuple(reqs))


def _bytes(raw: Any) -> int:
    try:
        return parse_units(raw) if raw is not None else 0
    except (ValueError, TypeError, ArithmeticError):
        return 0


def claim_from_json(obj: dict[str, Any]) -> Claim:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    annotations = dict(meta.get("annotations") or {})
    cls = spec.get("storageClassName")
    if cls is None:
        cls = annotations.get(BETA_CLASS_ANNOTATION, "")
    requests = (spec.get("resources") or {}).get("requests") or {}
    owners = tuple(
        str(o.get("uid", ""))
        for o in meta.get("ownerReferences") or ()
        if isinstance(o, dict) and o.get("controller")
    )
    return Claim(
        namespace=meta.get("namespace") or "default",
        name=meta.get("name") or "",
        uid=meta.get("uid") or "",
        resource_version=meta.get("resourceVersion") or "",
        storage_class=str(cls or ""),
        volume_name=spec.get("volumeName") or "",
        phase=(obj.get("status") or {}).get("phase") or "Pending",
        access_modes=_modes(spec.get("accessModes")),
        request=_bytes(requests.get("storage")),
        selector=_selector(spec.get("selector")),
        volume_mode=spec.get("volumeMode") or "Filesystem",
        annotations=annotations,
        owners=owners,
        deleting=bool(meta.get("deletionTimestamp")),
    )


def _node_affinity(spec: dict[str, Any]) -> tuple[SelectorTerm, ...] | None:
    required = ((spec.get("nodeAffinity") or {}).get("required")) or None
    if not isinstance(required, dict):
        return None
    terms: list[SelectorTerm] = []
    for raw in required.get("nodeSelectorTerms") or ():
        if not isinstance(raw, dict):
            continue
        parts: list[tuple[Requirement, ...]] = []
        for key in ("matchExpressions", "matchFields"):
            reqs = tuple(
                Requirement(
                    str(r.get("key", "")),
                    str(r.get("operator", "")),
                    tuple(str(v) for v in r.get("values") or ()),
                )
                for r in raw.get(key) or ()
                if isinstance(r, dict)
            )
            parts.append(reqs)
        terms.append(SelectorTerm(parts[0], parts[1]))
    return tuple(terms)


def volume_from_json(obj: dict[str, Any]) -> Volume:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    annotations = meta.get("annotations") or {}
    cls = spec.get("storageClassName")
    if cls is None:
        cls = annotations.get(BETA_CLASS_ANNOTATION, "")
    ref = spec.get("claimRef")
    csi = spec.get("csi") or {}
    return Volume(
        name=meta.get("name") or "",
        resource_version=meta.get("resourceVersion") or "",
        storage_class=str(cls or ""),
        access_modes=_modes(spec.get("accessModes")),
        capacity=_bytes((spec.get("capacity") or {}).get("storage")),
        claim_ref=(
            (ref.get("namespace") or "", ref.get("name") or "", ref.get("uid") or "")
            if isinstance(ref, dict)
            else None
        ),
        phase=(obj.get("status") or {}).get("phase") or "Pending",
        node_affinity=_node_affinity(spec),
        labels=dict(meta.get("labels") or {}),
        csi_driver=str(csi.get("driver") or ""),
        csi_handle=str(csi.get("volumeHandle") or ""),
        volume_mode=spec.get("volumeMode") or "Filesystem",
        deleting=bool(meta.get("deletionTimestamp")),
    )


def class_from_json(obj: dict[str, Any]) -> StorageClass:
    terms: list[tuple[tuple[str, frozenset[str]], ...]] = []
    for t in obj.get("allowedTopologies") or ():
        if isinstance(t, dict):
            terms.append(
                tuple(
                    (str(e.get("key", "")), frozenset(str(v) for v in e.get("values") or ()))
                    for e in t.get("matchLabelExpressions") or ()
                    if isinstance(e, dict)
                )
            )
    return StorageClass(
        name=(obj.get("metadata") or {}).get("name") or "",
        provisioner=str(obj.get("provisioner") or ""),
        binding_mode=str(obj.get("volumeBindingMode") or "Immediate"),
        allowed_topologies=tuple(terms),
    )


def csinode_from_json(obj: dict[str, Any]) -> CSINode:
    limits: dict[str, int] = {}
    for d in (obj.get("spec") or {}).get("drivers") or ():
        count = (d.get("allocatable") or {}).get("count") if isinstance(d, dict) else None
        if isinstance(count, int):
            limits[str(d.get("name", ""))] = count
    return CSINode(name=(obj.get("metadata") or {}).get("name") or "", limits=limits)


@dataclass(slots=True)
class PodClaims:
    """kube's PodVolumeClaims: the pod's claims sorted by binding state, or why the pod cannot be placed."""

    error: str | None = None
    bound: list[Claim] = field(default_factory=list)
    delayed: list[Claim] = field(default_factory=list)
    immediate: list[Claim] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class VolumePlan:
    """What placing the pod on ``node`` needs done to its claims (kube's PodVolumes)."""

    node: str
    static: tuple[tuple[Claim, Volume], ...] = ()  # claim -> the available PV it gets
    provision: tuple[Claim, ...] = ()  # claims to annotate with the selected node
    waits: tuple[str, ...] = ()  # keys of the delayed claims that must be bound before the pod is
    # ReadWriteOncePod claims: taken for the pod (``ANN_RWOP_HOLDER``) under their resourceVersion before it
    # is bound, so two workers cannot both place a user of one (each sees only its own in-flight decisions)
    exclusive: tuple[Claim, ...] = ()

    @property
    def all_bound(self) -> bool:
        return not self.waits

    @property
    def nothing_to_do(self) -> bool:
        return not self.waits and not self.exclusive


def claim_name(pod_name: str, volume: str, ephemeral: bool, claim: str) -> str:
    """The claim a pod volume uses: its ``claimName``, or ``<pod>-<volume>`` for a generic ephemeral one."""
    return f"{pod_name}-{volume}" if ephemeral else claim


class VolumeStore:
    def __init__(self) -> None:
        self.claims: dict[str, Claim] = {}
        self.volumes: dict[str, Volume] = {}
        self.classes: dict[str, StorageClass] = {}
        self.csinodes: dict[str, CSINode] = {}
        self.version = 0
        self._waiters: list[asyncio.Future[None]] = []

    # ----- written by the watches and by assumptions -----------------------------------------------------

    def _changed(self) -> None:
        self.version += 1
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def wait_change(self, timeout: float) -> None:
        """Return at the next change of the store, or after ``timeout`` seconds."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(fut, timeout)

    def upsert(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "claims":
            c = claim_from_json(obj)
            self.claims[c.key] = c
        elif kind == "volumes":
            v = volume_from_json(obj)
            self.volumes[v.name] = v
        elif kind == "classes":
            s = class_from_json(obj)
            self.classes[s.name] = s
        else:
            n = csinode_from_json(obj)
            self.csinodes[n.name] = n
        self._changed()

    def remove(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        name = meta.get("name") or ""
        if kind == "claims":
            self.claims.pop(f"{meta.get('namespace') or 'default'}/{name}", None)
        elif kind == "volumes":
            self.volumes.pop(name, None)
        elif kind == "classes":
            self.classes.pop(name, None)
        else:
            self.csinodes.pop(name, None)
        self._changed()

    def replace(self, kind: str, objects: Iterable[dict[str, Any]]) -> None:
        if kind == "claims":
            self.claims = {c.key: c for c in map(claim_from_json, objects)}
        elif kind == "volumes":
            self.volumes = {v.name: v for v in map(volume_from_json, objects)}
        elif kind == "classes":
            self.classes = {s.name: s for s in map(class_from_json, objects)}
        else:
            self.csinodes = {n.name: n for n in map(csinode_from_json, objects)}
        self._changed()

    def assume(self, plan: VolumePlan) -> None:
        """kube's AssumePodVolumes: the PVs taken and the claims annotated, before the API says so."""
        for claim, pv in plan.static:
            self.volumes[pv.name] = replace(pv, claim_ref=(claim.namespace, claim.name, claim.uid))
        for claim in plan.provision:
            self.claims[claim.key] = replace(
                claim, annotations={**claim.annotations, ANN_SELECTED_NODE: plan.node}
            )
        self._changed()

    def revert(self, plan: VolumePlan) -> None:
        """Undo ``assume`` where the store still holds our assumption (a watched update replaced it else)."""
        for _, pv in plan.static:
            now = self.volumes.get(pv.name)
            if now is not None and now.resource_version == pv.resource_version:
                self.volumes[pv.name] = pv
        for claim in plan.provision:
            now_c = self.claims.get(claim.key)
            if now_c is not None and now_c.resource_version == claim.resource_version:
                self.claims[claim.key] = claim
        self._changed()

    def wakes(self, kind: str, obj: dict[str, Any]) -> Callable[[PodRecord], bool]:
        """Which waiting pods the watched change of ``obj`` (of ``kind``, already applied here) may help:
        - a claim: the pods using it;
        - a PV: the pods using the claim it is bound to or a claim naming it; one bound to none (new, or
          released) may be matched to any unbound claim of its class: the pods with a claim of that class too;
        - a StorageClass (binding mode, provisioner, allowed topologies): the pods with a claim of that class;
        - a CSINode (attach limits): every pod with a claim."""
        meta = obj.get("metadata") or {}
        if kind == "claims":
            namespace, name = meta.get("namespace") or "default", meta.get("name") or ""
            return lambda pod: pod.namespace == namespace and name in self._claim_names(pod)
        if kind == "volumes":
            pv = volume_from_json(obj)
            if pv.claim_ref is not None:
                return self._using(lambda c: c.volume_name == pv.name, claim_ref=pv.claim_ref)
            return self._using(lambda c: c.volume_name == pv.name or c.storage_class == pv.storage_class)
        if kind == "classes":
            name = meta.get("name") or ""
            return self._using(lambda c: c.storage_class == name)
        return lambda pod: bool(pod.claims)

    def _claim_names(self, pod: PodRecord) -> list[str]:
        return [claim_name(pod.name, v, ephemeral, c) for v, ephemeral, c in pod.claims]

    def _using(
        self, concerns: Callable[[Claim], bool], *, claim_ref: tuple[str, str, str] | None = None
    ) -> Callable[[PodRecord], bool]:
        """The pods with a claim ``concerns`` says yes to, or (``claim_ref``) using that claim even where the
        store does not hold it (yet)."""

        def helps(pod: PodRecord) -> bool:
            for name in self._claim_names(pod):
                if claim_ref is not None and (pod.namespace, name) == (claim_ref[0], claim_ref[1]):
                    return True
                claim = self.claims.get(f"{pod.namespace}/{name}")
                if claim is not None and concerns(claim):
                    return True
            return False

        return helps

    # ----- reads ------------------------------------------------------------------------------------------

    def pod_claims(
        self, namespace: str, pod_name: str, pod_uid: str, volumes: Iterable[tuple[str, bool, str]]
    ) -> PodClaims:
        """kube's podHasPVCs + GetPodVolumeClaims. ``volumes``: (volume name, ephemeral, claimName)."""
        out = PodClaims()
        for volume, ephemeral, claim_ref in volumes:
            name = claim_name(pod_name, volume, ephemeral, claim_ref)
            claim = self.claims.get(f"{namespace}/{name}")
            if claim is None:
                out.error = (
                    f'waiting for ephemeral volume controller to create the persistentvolumeclaim "{name}"'
                    if ephemeral
                    else f'persistentvolumeclaim "{name}" not found'
                )
                return out
            if claim.phase == "Lost":
                out.error = f'persistentvolumeclaim "{name}" bound to non-existent persistentvolume "{claim.volume_name}"'
                return out
            if claim.deleting:
                out.error = f'persistentvolumeclaim "{name}" is being deleted'
                return out
            if ephemeral and pod_uid not in claim.owners:
                out.error = f"PVC {namespace}/{name} was not created for pod {namespace}/{pod_name} (pod is not owner)"
                return out
            if claim.bound:
                out.bound.append(claim)
                continue
            cls = self.classes.get(claim.storage_class) if claim.storage_class else None
            if cls is not None and cls.binding_mode == WAIT_FOR_FIRST_CONSUMER:
                out.delayed.append(claim)
            else:
                out.immediate.append(claim)
        return out

    def find_matching_volume(
        self, claim: Claim, node: str, labels: dict[str, str], excluded: set[str]
    ) -> Volume | None:
        """kube's pvutil.FindMatchingVolume on the scheduler's path (a node, delayed binding): the PV
        already bound to the claim if it fits the node, else the smallest available PV that matches."""
        best: Volume | None = None
        for pv in self.volumes.values():
            if pv.name in excluded or pv.storage_class != claim.storage_class:
                continue
            if pv.claim_ref is not None and not pv.bound_to(claim):
                continue
            if pv.capacity < claim.request or pv.volume_mode != claim.volume_mode or pv.deleting:
                continue
            fits = pv.fits_node(node, labels)
            if pv.bound_to(claim):
                return pv if fits else None
            if pv.phase != "Available" or pv.claim_ref is not None:
                continue
            if claim.selector is not None and not claim.selector.matches(pv.labels):
                continue
            if not fits or not all(m in pv.access_modes for m in claim.access_modes):
                continue
            if best is None or pv.capacity < best.capacity:
                best = pv
        return best

    def find_pod_volumes(
        self, claims: PodClaims, node: str, labels: dict[str, str]
    ) -> tuple[VolumePlan | None, tuple[str, ...]]:
        """kube's FindPodVolumes for one node: the plan, or the reasons the node cannot take the claims."""
        bound_ok = found = unbound_ok = True
        for claim in claims.bound:
            pv = self.volumes.get(claim.volume_name)
            if pv is None:
                found = False
                break
            if not pv.fits_node(node, labels):
                bound_ok = False
                break
        static: list[tuple[Claim, Volume]] = []
        provision: list[Claim] = []
        # as kube's binder: the unbound claims are looked at even when a bound one failed (both reasons count)
        if claims.delayed:
            to_match: list[Claim] = []
            for claim in claims.delayed:
                selected = claim.selected_node
                if selected is not None:
                    if selected != node:
                        unbound_ok = False
                        break
                    provision.append(claim)
                else:
                    to_match.append(claim)
            if unbound_ok:
                chosen: set[str] = set()
                for claim in sorted(to_match, key=lambda c: c.request):
                    pv = self.find_matching_volume(claim, node, labels, chosen)
                    if pv is None:
                        provision.append(claim)
                    else:
                        chosen.add(pv.name)
                        static.append((claim, pv))
                for claim in provision:
                    cls = self.classes.get(claim.storage_class)
                    if cls is None or cls.provisioner in ("", NO_PROVISIONER) or not cls.admits(labels):
                        unbound_ok = False
                        break
        reasons: list[str] = []
        if not bound_ok:
            reasons.append(REASON_NODE_CONFLICT)
        if not unbound_ok:
            reasons.append(REASON_BIND_CONFLICT)
        if not found:
            reasons.append(REASON_PV_NOT_EXIST)
        if reasons:
            return None, tuple(reasons)
        plan = VolumePlan(
            node,
            tuple(static),
            tuple(c for c in provision if c.selected_node is None),
            tuple(c.key for c in claims.delayed),
            tuple(c for c in (*claims.bound, *claims.delayed) if READ_WRITE_ONCE_POD in c.access_modes),
        )
        return plan, ()
