"""Which pod fields the engine honours, and the refusal of pods that use one it does not.

A scheduler that silently ignores a rule the user wrote (an anti-affinity, a spread constraint, a volume that
pins the pod to a zone) binds pods where that rule forbids them. So every field of a PodSpec (API v1.36) is
classified here, against what kube-scheduler's default plugins read:

- ``SUPPORTED``: the engine implements it as kube-scheduler does (resources, node selector and node affinity,
  tolerations, host ports, scheduling gates, priority order, ...);
- ``IRRELEVANT``: no kube-scheduler plugin reads it to filter nodes (images, env, probes, DNS, security
  context, ...), so ignoring it changes no placement;
- ``REFUSED``: it constrains placement and the engine does not implement it yet. A pod that uses it is
  reported unschedulable, naming the field and pointing to another scheduler, and is never bound.

Inter-pod rules (pod affinity and anti-affinity, topology spread) are ``SUPPORTED`` by a standalone worker and
under a coordinator alike: a worker holds every node and pod of the cluster (its candidates are its own
nodes), and the coordinator dispatches pods whose rules span nodes through "the topology lane" (see
``coordinator.dispatch.lane`` and docs/architecture.md), so a worker never decides such a pod on a view that
lacks a placement the rule depends on.

Fields that hold several kinds of things are looked into: ``affinity`` (node affinity, pod affinity and
anti-affinity are supported, ``namespaces`` and ``namespaceSelector`` included: the worker watches Namespace
objects), ``volumes`` (per volume source, ``VOLUME_SOURCES``), the containers
(``resources.claims``, ``restartPolicyRules``), pod-level ``resources`` (``claims``) and ``hostUsers``.

Invariants:
- A PodSpec key or volume source that is not in these tables is refused, not ignored: a field added by a newer
  API server may constrain placement, and we cannot know that it does not.
- An empty value (``null``, ``[]``, ``{}``, ``""``) uses nothing: ``topologySpreadConstraints: []`` is accepted.
- ``unsupported`` never raises, whatever the JSON holds; a malformed value is left to the parser
  (``common.records``), which reports it as an invalid spec.

What stays outside this table, because it is not a field of the incoming pod: the symmetric side of inter-pod
anti-affinity (a pod already running with a required anti-affinity against the incoming pod's labels), which
every worker honours (``worker.topology``; across shards through the topology lane), and kube-scheduler's
default spread constraints for a pod stating none (``worker.plugins.spread``): by default kube's System
defaults (hostname maxSkew 3, zone maxSkew 5, ScheduleAnyway: a score only), with the selector built from the
Services, ReplicationControllers, ReplicaSets and StatefulSets selecting the pod (``worker.workloads``), as
kube-scheduler applies them; configurable as its PodTopologySpreadArgs (``defaultingType: List``; an empty
list applies none).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

SUPPORTED: Final = "supported"
IRRELEVANT: Final = "irrelevant"
REFUSED: Final = "refused"
#: looked into: the verdict depends on what the field holds (see the module docstring)
INSPECTED: Final = "inspected"

PRODUCT = "agent-scheduler"
REMEDY = "use the default scheduler (spec.schedulerName) for this pod"


@dataclass(frozen=True, slots=True)
class Field:
    """One placement-relevant decision: where the field is, its status, and why."""

    path: str
    status: str
    why: str


def _f(path: str, status: str, why: str) -> Field:
    return Field(path, status, why)


#: Every key of a v1.36 PodSpec.
SPEC_FIELDS: Final[dict[str, Field]] = {
    f.path.removeprefix("spec."): f
    for f in (
        # --- supported: the engine implements them as kube-scheduler's plugins do ---
        _f("spec.nodeSelector", SUPPORTED, "NodeAffinity filter"),
        _f("spec.tolerations", SUPPORTED, "TaintToleration filter and score, NodeUnschedulable"),
        _f("spec.schedulingGates", SUPPORTED, "SchedulingGates: a gated pod waits, it is never tried"),
        _f(
            "spec.priority",
            SUPPORTED,
            "PrioritySort: queue order; DefaultPreemption (worker/preemption.py), standalone and across shards "
            "(each shard proposes its best candidate, the leader picks, the owning worker preempts)",
        ),
        _f(
            "spec.priorityClassName",
            SUPPORTED,
            "resolved into spec.priority by the Priority admission plugin",
        ),
        _f("spec.overhead", SUPPORTED, "NodeResourcesFit: added to the pod's requests"),
        _f(
            "spec.runtimeClassName",
            SUPPORTED,
            "the RuntimeClass admission plugin copies its scheduling rules into nodeSelector and tolerations and "
            "its overhead into spec.overhead; kube-scheduler does not read the field itself",
        ),
        _f("spec.schedulerName", SUPPORTED, "selects the pods this scheduler places"),
        _f(
            "spec.nodeName",
            SUPPORTED,
            "a pod with spec.nodeName is already placed: it is never scheduled and its requests count on that "
            "node, as in kube-scheduler (whose queue holds only pods without a node)",
        ),
        _f(
            "spec.topologySpreadConstraints",
            SUPPORTED,
            "PodTopologySpread filter (DoNotSchedule) and score (ScheduleAnyway)",
        ),
        # --- inspected: partly supported ---
        _f(
            "spec.affinity",
            INSPECTED,
            "nodeAffinity, podAffinity and podAntiAffinity supported (namespaces and namespaceSelector "
            "included)",
        ),
        _f("spec.volumes", INSPECTED, "per volume source: see VOLUME_SOURCES"),
        _f(
            "spec.containers",
            INSPECTED,
            "resources.requests and ports[].hostPort supported (NodeResourcesFit, NodePorts); resources.claims "
            "(DRA) and restartPolicyRules with RestartAllContainers (NodeDeclaredFeatures) refused; image scores "
            "only (ImageLocality); the rest (env, probes, ...) is irrelevant",
        ),
        _f(
            "spec.initContainers",
            INSPECTED,
            "as spec.containers; sidecars (restartPolicy Always) add their requests and host ports",
        ),
        _f(
            "spec.resources",
            INSPECTED,
            "pod-level requests supported (NodeResourcesFit); claims (DRA) refused",
        ),
        _f(
            "spec.hostUsers",
            INSPECTED,
            "irrelevant, except false together with hostNetwork: kube-scheduler's NodeDeclaredFeatures then "
            "requires nodes declaring UserNamespacesHostNetworkSupport, which the engine does not check",
        ),
        # --- refused: they constrain placement and the engine does not implement them yet ---
        _f("spec.resourceClaims", REFUSED, "DynamicResources (DRA): devices are allocated while scheduling"),
        _f(
            "spec.schedulingGroup",
            REFUSED,
            "GangScheduling: the pods of a group are placed together or not at all",
        ),
        # --- irrelevant for placement: no default kube-scheduler plugin filters on them ---
        _f(
            "spec.ephemeralContainers", IRRELEVANT, "added to running pods; no requests are reserved for them"
        ),
        _f("spec.restartPolicy", IRRELEVANT, "kubelet"),
        _f("spec.terminationGracePeriodSeconds", IRRELEVANT, "kubelet"),
        _f("spec.activeDeadlineSeconds", IRRELEVANT, "kubelet"),
        _f("spec.dnsPolicy", IRRELEVANT, "kubelet"),
        _f("spec.dnsConfig", IRRELEVANT, "kubelet"),
        _f("spec.serviceAccountName", IRRELEVANT, "admission and kubelet"),
        _f("spec.serviceAccount", IRRELEVANT, "deprecated alias of serviceAccountName"),
        _f("spec.automountServiceAccountToken", IRRELEVANT, "admission and kubelet"),
        _f(
            "spec.hostNetwork",
            IRRELEVANT,
            "its effect on placement is through host ports, which the API server defaults from the container "
            "ports and NodePorts checks (supported); see spec.hostUsers for the one combination refused",
        ),
        _f("spec.hostPID", IRRELEVANT, "kubelet"),
        _f("spec.hostIPC", IRRELEVANT, "kubelet"),
        _f("spec.shareProcessNamespace", IRRELEVANT, "kubelet"),
        _f("spec.securityContext", IRRELEVANT, "kubelet and admission; no scheduler plugin reads it"),
        _f("spec.imagePullSecrets", IRRELEVANT, "kubelet"),
        _f("spec.hostname", IRRELEVANT, "DNS"),
        _f("spec.subdomain", IRRELEVANT, "DNS"),
        _f("spec.hostnameOverride", IRRELEVANT, "kubelet"),
        _f("spec.setHostnameAsFQDN", IRRELEVANT, "kubelet"),
        _f("spec.hostAliases", IRRELEVANT, "kubelet"),
        _f("spec.readinessGates", IRRELEVANT, "pod readiness, after placement"),
        _f("spec.enableServiceLinks", IRRELEVANT, "kubelet"),
        _f(
            "spec.os",
            IRRELEVANT,
            "validation and kubelet admission; kube-scheduler does not filter on it (a pod pins its OS with a "
            "kubernetes.io/os node selector, which is supported)",
        ),
        _f(
            "spec.preemptionPolicy",
            SUPPORTED,
            "DefaultPreemption: a pod with Never does not preempt (standalone and under a coordinator)",
        ),
    )
}

#: Every source of a v1.36 Volume, against kube-scheduler's VolumeBinding, VolumeZone, NodeVolumeLimits and
#: VolumeRestrictions plugins. ``name`` is not a source.
VOLUME_SOURCES: Final[dict[str, Field]] = {
    f.path.removeprefix("spec.volumes[]."): f
    for f in (
        _f("spec.volumes[].emptyDir", IRRELEVANT, "node-local scratch space"),
        _f("spec.volumes[].configMap", IRRELEVANT, "projected from the API by the kubelet"),
        _f("spec.volumes[].secret", IRRELEVANT, "projected from the API by the kubelet"),
        _f("spec.volumes[].downwardAPI", IRRELEVANT, "projected from the API by the kubelet"),
        _f("spec.volumes[].projected", IRRELEVANT, "projected from the API by the kubelet"),
        _f("spec.volumes[].hostPath", IRRELEVANT, "no scheduler plugin reads it"),
        _f("spec.volumes[].image", IRRELEVANT, "an OCI image pulled by the kubelet"),
        _f("spec.volumes[].gitRepo", IRRELEVANT, "deprecated; cloned by the kubelet"),
        _f(
            "spec.volumes[].csi",
            IRRELEVANT,
            "inline CSI ephemeral volume: served by the node's driver; NodeVolumeLimits counts only PVC, "
            "ephemeral and migratable in-tree volumes",
        ),
        _f("spec.volumes[].nfs", IRRELEVANT, "network mount; no scheduler plugin reads it"),
        _f("spec.volumes[].cephfs", IRRELEVANT, "network mount; no scheduler plugin reads it"),
        _f("spec.volumes[].glusterfs", IRRELEVANT, "network mount; no scheduler plugin reads it"),
        _f("spec.volumes[].flexVolume", IRRELEVANT, "node driver; no scheduler plugin reads it"),
        _f("spec.volumes[].fc", IRRELEVANT, "no scheduler plugin reads it"),
        _f("spec.volumes[].flocker", IRRELEVANT, "no scheduler plugin reads it"),
        _f("spec.volumes[].quobyte", IRRELEVANT, "no scheduler plugin reads it"),
        _f("spec.volumes[].scaleIO", IRRELEVANT, "no scheduler plugin reads it"),
        _f("spec.volumes[].storageos", IRRELEVANT, "no scheduler plugin reads it"),
        _f("spec.volumes[].photonPersistentDisk", IRRELEVANT, "no scheduler plugin reads it"),
        _f(
            "spec.volumes[].persistentVolumeClaim",
            SUPPORTED,
            "VolumeBinding (claim missing, unbound Immediate, bound PV's node affinity, WaitForFirstConsumer "
            "static binding and provisioning), VolumeZone, NodeVolumeLimits (CSINode counts), "
            "VolumeRestrictions (ReadWriteOncePod): worker.plugins.volumes",
        ),
        _f(
            "spec.volumes[].ephemeral",
            SUPPORTED,
            "a generic ephemeral volume is a PVC (<pod>-<volume>, owned by the pod): as persistentVolumeClaim",
        ),
        _f(
            "spec.volumes[].gcePersistentDisk",
            REFUSED,
            "VolumeRestrictions (disk conflicts), NodeVolumeLimits",
        ),
        _f(
            "spec.volumes[].awsElasticBlockStore",
            REFUSED,
            "VolumeRestrictions (disk conflicts), NodeVolumeLimits",
        ),
        _f("spec.volumes[].rbd", REFUSED, "VolumeRestrictions (image conflicts)"),
        _f("spec.volumes[].iscsi", REFUSED, "VolumeRestrictions (IQN conflicts)"),
        _f(
            "spec.volumes[].azureDisk",
            REFUSED,
            "NodeVolumeLimits (migrated to CSI, counted against attach limits)",
        ),
        _f(
            "spec.volumes[].azureFile",
            REFUSED,
            "NodeVolumeLimits (migrated to CSI, counted against attach limits)",
        ),
        _f(
            "spec.volumes[].cinder",
            REFUSED,
            "NodeVolumeLimits (migrated to CSI, counted against attach limits)",
        ),
        _f(
            "spec.volumes[].vsphereVolume",
            REFUSED,
            "NodeVolumeLimits (migrated to CSI, counted against attach limits)",
        ),
        _f(
            "spec.volumes[].portworxVolume",
            REFUSED,
            "NodeVolumeLimits (migrated to CSI, counted against attach limits)",
        ),
    )
}

#: Inside ``spec.affinity``.
AFFINITY_FIELDS: Final[dict[str, Field]] = {
    f.path.removeprefix("spec.affinity."): f
    for f in (
        _f("spec.affinity.nodeAffinity", SUPPORTED, "NodeAffinity filter (required) and score (preferred)"),
        _f(
            "spec.affinity.podAffinity",
            SUPPORTED,
            "InterPodAffinity filter (required) and score (preferred)",
        ),
        _f(
            "spec.affinity.podAntiAffinity",
            SUPPORTED,
            "InterPodAffinity filter (required) and score (preferred)",
        ),
    )
}

#: Inside a container (app or init); the container fields not listed here are irrelevant for placement.
CONTAINER_FIELDS: Final[dict[str, Field]] = {
    f.path.removeprefix("spec.containers[]."): f
    for f in (
        _f("spec.containers[].resources.requests", SUPPORTED, "NodeResourcesFit"),
        _f("spec.containers[].ports", SUPPORTED, "NodePorts (hostPort, hostIP, protocol)"),
        _f("spec.containers[].resources.claims", REFUSED, "DynamicResources (DRA)"),
        _f(
            "spec.containers[].restartPolicyRules",
            INSPECTED,
            "a rule with action RestartAllContainers needs nodes declaring that feature (NodeDeclaredFeatures); "
            "other rules are irrelevant",
        ),
    )
}

RESTART_ALL_CONTAINERS = "RestartAllContainers"


def _empty(value: Any) -> bool:
    return value is None or value == "" or (isinstance(value, (list, dict)) and not value)


def _affinity(spec: Mapping[str, Any], value: Any) -> list[str]:
    if not isinstance(value, dict):
        return []
    found: list[str] = []
    for key, part in value.items():
        known = AFFINITY_FIELDS.get(key)
        if known is not None and known.status == SUPPORTED:
            continue
        # pod (anti-)affinity with no terms at all constrains nothing
        if isinstance(part, dict) and not any(not _empty(v) for v in part.values()):
            continue
        if not _empty(part):
            found.append(f"spec.affinity.{key}")
    return found


def _volumes(spec: Mapping[str, Any], value: Any) -> list[str]:
    if not isinstance(value, list):
        return []
    found: list[str] = []
    for i, volume in enumerate(value):
        if not isinstance(volume, dict):
            continue
        name = volume.get("name")
        for key, source in volume.items():
            if key == "name" or source is None:
                continue
            known = VOLUME_SOURCES.get(key)
            if known is None or known.status == REFUSED:
                found.append(f'spec.volumes[{i}].{key} (volume "{name}")')
    return found


def _containers(where: str) -> Callable[[Mapping[str, Any], Any], list[str]]:
    def check(spec: Mapping[str, Any], value: Any) -> list[str]:
        if not isinstance(value, list):
            return []
        found: list[str] = []
        for i, container in enumerate(value):
            if not isinstance(container, dict):
                continue
            resources = container.get("resources")
            if isinstance(resources, dict) and not _empty(resources.get("claims")):
                found.append(f"spec.{where}[{i}].resources.claims")
            rules = container.get("restartPolicyRules")
            if isinstance(rules, list) and any(
                isinstance(r, dict) and r.get("action") == RESTART_ALL_CONTAINERS for r in rules
            ):
                found.append(f"spec.{where}[{i}].restartPolicyRules (action {RESTART_ALL_CONTAINERS})")
        return found

    return check


def _resources(spec: Mapping[str, Any], value: Any) -> list[str]:
    if isinstance(value, dict) and not _empty(value.get("claims")):
        return ["spec.resources.claims"]
    return []


def _host_users(spec: Mapping[str, Any], value: Any) -> list[str]:
    if value is False and spec.get("hostNetwork") is True:
        return ["spec.hostUsers: false with spec.hostNetwork: true"]
    return []


_CHECKS: Final[dict[str, Callable[[Mapping[str, Any], Any], list[str]]]] = {
    "affinity": _affinity,
    "volumes": _volumes,
    "containers": _containers("containers"),
    "initContainers": _containers("initContainers"),
    "resources": _resources,
    "hostUsers": _host_users,
}


def unsupported_fields(spec: Mapping[str, Any]) -> list[str]:
    """The fields of ``spec`` (a PodSpec as raw JSON) that constrain placement in a way the engine does not
    implement, each as a path (``spec.volumes[0].persistentVolumeClaim (volume 'data')``); empty when none."""
    found: list[str] = []
    for key, value in spec.items():
        known = SPEC_FIELDS.get(key)
        if known is None:
            if not _empty(value):
                found.append(f"spec.{key}")
        elif known.status == REFUSED:
            if not _empty(value):
                found.append(known.path)
        elif known.status == INSPECTED:
            found.extend(_CHECKS[key](spec, value))
    return found


def _named(fields: list[str]) -> str:
    return fields[0] if len(fields) == 1 else ", ".join(fields[:-1]) + " and " + fields[-1]


def refusal_message(fields: list[str]) -> str:
    """What the pod's PodScheduled condition and FailedScheduling event say."""
    return f"pod uses {_named(fields)}, which {PRODUCT} does not support yet; {REMEDY}"


def unsupported(pod: Mapping[str, Any]) -> str | None:
    """The refusal message for a Pod object (raw JSON) that uses a field the engine does not implement, or
    None when the engine honours every placement rule the pod states. Never raises."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return None
    fields = unsupported_fields(spec)
    return refusal_message(fields) if fields else None
