"""Small builders for pod and node objects, as the API server would send them:
``make_pod("a").req(cpu="100m").toleration("dedicated", "batch").obj`` or ``.record()``."""

from __future__ import annotations

import copy
from typing import Any

from common.records import NodeRecord, PodRecord, node_from_json, pod_from_json
from common.wellknown import DEFAULT_SCHEDULER_NAME


class PodBuilder:
    def __init__(self, name: str, namespace: str = "default") -> None:
        self.obj: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {}},
            "spec": {
                "schedulerName": DEFAULT_SCHEDULER_NAME,
                "containers": [{"name": "main", "image": "agent:latest", "resources": {"requests": {}}}],
            },
        }

    @property
    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.obj["spec"]
        return spec

    def image(self, image: str, container: int = 0) -> PodBuilder:
        self.spec["containers"][container]["image"] = image
        return self

    def req(self, **resources: str) -> PodBuilder:
        reqs = self.spec["containers"][0]["resources"]["requests"]
        for name, value in resources.items():
            reqs[name.replace("_", "-") if name != "nvidia_gpu" else "nvidia.com/gpu"] = value
        return self

    def scheduler(self, name: str) -> PodBuilder:
        self.spec["schedulerName"] = name
        return self

    def label(self, key: str, value: str) -> PodBuilder:
        self.obj["metadata"]["labels"][key] = value
        return self

    def priority(self, value: int) -> PodBuilder:
        self.spec["priority"] = value
        return self

    def node_selector(self, **labels: str) -> PodBuilder:
        self.spec.setdefault("nodeSelector", {}).update(labels)
        return self

    def toleration(
        self, key: str, value: str = "", *, operator: str = "Equal", effect: str = ""
    ) -> PodBuilder:
        t: dict[str, Any] = {"key": key, "operator": operator}
        if value:
            t["value"] = value
        if effect:
            t["effect"] = effect
        self.spec.setdefault("tolerations", []).append(t)
        return self

    def required(
        self, *terms: list[dict[str, Any]], fields: list[dict[str, Any]] | None = None
    ) -> PodBuilder:
        out = [{"matchExpressions": exprs} for exprs in terms]
        if fields:
            out.append({"matchFields": fields})
        self.spec.setdefault("affinity", {})["nodeAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": out}
        }
        return self

    def preferred(self, weight: int, exprs: list[dict[str, Any]]) -> PodBuilder:
        na = self.spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
        na.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append(
            {"weight": weight, "preference": {"matchExpressions": exprs}}
        )
        return self

    def host_port(self, port: int, protocol: str = "TCP") -> PodBuilder:
        self.spec["containers"][0].setdefault("ports", []).append(
            {"containerPort": port, "hostPort": port, "protocol": protocol}
        )
        return self

    def init_container(self, restart_always: bool = False, **resources: str) -> PodBuilder:
        c: dict[str, Any] = {"name": f"init{len(self.spec.get('initContainers', []))}", "image": "init"}
        c["resources"] = {"requests": dict(resources)}
        if restart_always:
            c["restartPolicy"] = "Always"
        self.spec.setdefault("initContainers", []).append(c)
        return self

    def pod_affinity(
        self,
        key: str,
        selector: dict[str, str] | None = None,
        *,
        anti: bool = False,
        weight: int = 0,
        expressions: list[dict[str, Any]] | None = None,
        namespaces: list[str] | None = None,
        namespace_selector: dict[str, Any] | None = None,
        match_label_keys: list[str] | None = None,
        mismatch_label_keys: list[str] | None = None,
    ) -> PodBuilder:
        """A pod (anti-)affinity term on topology key ``key``; required unless ``weight`` is given."""
        term: dict[str, Any] = {"topologyKey": key, "labelSelector": {}}
        if selector is not None:
            term["labelSelector"]["matchLabels"] = dict(selector)
        if expressions is not None:
            term["labelSelector"]["matchExpressions"] = expressions
        if namespaces is not None:
            term["namespaces"] = namespaces
        if namespace_selector is not None:
            term["namespaceSelector"] = namespace_selector
        if match_label_keys is not None:
            term["matchLabelKeys"] = match_label_keys
        if mismatch_label_keys is not None:
            term["mismatchLabelKeys"] = mismatch_label_keys
        block = self.spec.setdefault("affinity", {}).setdefault(
            "podAntiAffinity" if anti else "podAffinity", {}
        )
        if weight:
            block.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append(
                {"weight": weight, "podAffinityTerm": term}
            )
        else:
            block.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(term)
        return self

    def spread(
        self,
        key: str,
        selector: dict[str, str] | None,
        *,
        max_skew: int = 1,
        hard: bool = True,
        min_domains: int | None = None,
        node_affinity_policy: str | None = None,
        node_taints_policy: str | None = None,
        match_label_keys: list[str] | None = None,
    ) -> PodBuilder:
        """A topologySpreadConstraint; ``selector`` None leaves the labelSelector out (it matches no pod)."""
        c: dict[str, Any] = {
            "maxSkew": max_skew,
            "topologyKey": key,
            "whenUnsatisfiable": "DoNotSchedule" if hard else "ScheduleAnyway",
        }
        if selector is not None:
            c["labelSelector"] = {"matchLabels": dict(selector)}
        if min_domains is not None:
            c["minDomains"] = min_domains
        if node_affinity_policy is not None:
            c["nodeAffinityPolicy"] = node_affinity_policy
        if node_taints_policy is not None:
            c["nodeTaintsPolicy"] = node_taints_policy
        if match_label_keys is not None:
            c["matchLabelKeys"] = match_label_keys
        self.spec.setdefault("topologySpreadConstraints", []).append(c)
        return self

    def uid(self, uid: str) -> PodBuilder:
        self.obj["metadata"]["uid"] = uid
        return self

    def deleting(self) -> PodBuilder:
        self.obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return self

    def gate(self, name: str) -> PodBuilder:
        self.spec.setdefault("schedulingGates", []).append({"name": name})
        return self

    def owned_by(self, kind: str, name: str, api_version: str = "apps/v1", uid: str = "") -> PodBuilder:
        """A controller owner reference (as a ReplicaSet or StatefulSet sets on its pods)."""
        ref = {
            "apiVersion": api_version,
            "kind": kind,
            "name": name,
            "uid": uid or f"uid-{kind}-{name}",
            "controller": True,
        }
        self.obj["metadata"].setdefault("ownerReferences", []).append(ref)
        return self

    def on(self, node: str) -> PodBuilder:
        self.spec["nodeName"] = node
        self.obj["status"] = {"phase": "Running"}
        return self

    def started(self, stamp: str) -> PodBuilder:
        """``status.startTime`` (RFC 3339); call after ``on``."""
        self.obj.setdefault("status", {})["startTime"] = stamp
        return self

    def never_preempt(self) -> PodBuilder:
        self.spec["preemptionPolicy"] = "Never"
        return self

    def nominated(self, node: str) -> PodBuilder:
        self.obj.setdefault("status", {})["nominatedNodeName"] = node
        return self

    def preempted(self) -> PodBuilder:
        """Terminating because a scheduler preempted it (deletionTimestamp and the DisruptionTarget condition)."""
        self.deleting()
        self.obj.setdefault("status", {}).setdefault("conditions", []).append(
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
        )
        return self

    def json(self) -> dict[str, Any]:
        return copy.deepcopy(self.obj)

    def record(self) -> PodRecord:
        return pod_from_json(self.obj)


class NodeBuilder:
    def __init__(self, name: str, cpu: str = "32", memory: str = "128Gi", pods: str = "110") -> None:
        self.obj: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {},
            "status": {
                "allocatable": {"cpu": cpu, "memory": memory, "pods": pods, "ephemeral-storage": "100Gi"},
                "capacity": {"cpu": cpu, "memory": memory, "pods": pods, "ephemeral-storage": "100Gi"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }

    def label(self, key: str, value: str) -> NodeBuilder:
        self.obj["metadata"]["labels"][key] = value
        return self

    def taint(self, key: str, value: str = "", effect: str = "NoSchedule") -> NodeBuilder:
        self.obj["spec"].setdefault("taints", []).append({"key": key, "value": value, "effect": effect})
        return self

    def extended(self, name: str, amount: str) -> NodeBuilder:
        self.obj["status"]["allocatable"][name] = amount
        return self

    def image(self, size: int, *names: str) -> NodeBuilder:
        """One entry of ``status.images`` (a kubelet lists the largest first; callers keep that order)."""
        self.obj["status"].setdefault("images", []).append({"names": list(names), "sizeBytes": size})
        return self

    def cordon(self) -> NodeBuilder:
        self.obj["spec"]["unschedulable"] = True
        return self

    def not_ready(self) -> NodeBuilder:
        self.obj["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
        return self

    def json(self) -> dict[str, Any]:
        return copy.deepcopy(self.obj)

    def record(self) -> NodeRecord:
        return node_from_json(self.obj)


def make_pod(name: str, namespace: str = "default") -> PodBuilder:
    return PodBuilder(name, namespace)


def make_node(name: str, cpu: str = "32", memory: str = "128Gi", pods: str = "110") -> NodeBuilder:
    return NodeBuilder(name, cpu, memory, pods)
