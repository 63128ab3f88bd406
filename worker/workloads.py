"""The selectors of the objects that group pods for kube-scheduler's default topology spread constraints.

kube-scheduler's PodTopologySpread gives a pod that states no ``topologySpreadConstraints`` the configured
default constraints (``defaultingType: System``: hostname maxSkew 3 and zone maxSkew 5, both ScheduleAnyway),
with one selector deduced from the objects that select the pod (its ``helper.DefaultSelector``):

- every Service of the pod's namespace with a non-null ``spec.selector`` that matches the pod's labels: their
  selectors merged into one label set;
- the pod's controller (the owner reference with ``controller: true``), when it is a ReplicationController
  (its ``spec.selector`` merged into that label set), a ReplicaSet or a StatefulSet (the requirements of its
  ``spec.selector`` added), looked up by name in the pod's namespace.

A pod none of these select gets an empty selector, hence no default constraint at all.

What is kept, to keep the memory small on clusters with many of these objects: per object only its namespace,
name and selector (never the rest of the object); ReplicaSets and StatefulSets only by name (they are found
through the pod's owner reference, not by selector). ``worker.feeds`` keeps this current from the watches,
and watches none of these kinds when no default constraint is configured (``defaultingType: List`` with an
empty list).

Invariant: ``version`` changes whenever any stored selector changes, so a default selector computed for a pod
is valid while it is unchanged.
"""

from __future__ import annotations

from typing import Any

from common.records import LabelSelector, PodRecord, Requirement, label_selector_from_json

SERVICE = "Service"
REPLICATION_CONTROLLER = "ReplicationController"
REPLICA_SET = "ReplicaSet"
STATEFUL_SET = "StatefulSet"

# (kind as in an owner reference, apiVersion of that kind) for the controllers DefaultSelector reads
CONTROLLER_KINDS = {
    REPLICATION_CONTROLLER: "v1",
    REPLICA_SET: "apps/v1",
    STATEFUL_SET: "apps/v1",
}

LabelMap = tuple[tuple[str, str], ...]


def _label_map(raw: Any) -> LabelMap | None:
    """A Service's or ReplicationController's ``spec.selector`` (a plain map); None when null or malformed."""
    if not isinstance(raw, dict):
        return None
    return tuple(sorted((str(k), str(v)) for k, v in raw.items()))


class WorkloadSelectors:
    """Selectors of Services, ReplicationControllers, ReplicaSets and StatefulSets (see the module docstring)."""

    def __init__(self) -> None:
        # namespace -> service name -> its selector (services with a null selector select nothing: not kept)
        self.services: dict[str, dict[str, LabelMap]] = {}
        # (kind, namespace, name) -> the controller's selector requirements
        self.controllers: dict[tuple[str, str, str], tuple[Requirement, ...]] = {}
        self.version = 0

    # ----- kept current by the feeds -------------------------------------------------------------------------

    def upsert(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
        spec = obj.get("spec") or {}
        raw = spec.get("selector") if isinstance(spec, dict) else None
        if kind == SERVICE:
            selector = _label_map(raw)
            services = self.services.get(namespace)
            if selector is None:
                if services is not None and services.pop(name, None) is not None:
                    self.version += 1
                    if not services:
                        del self.services[namespace]
                return
            if services is None:
                services = self.services[namespace] = {}
            if services.get(name) != selector:
                services[name] = selector
                self.version += 1
            return
        requirements: tuple[Requirement, ...] | None
        if kind == REPLICATION_CONTROLLER:
            labels = _label_map(raw)
            requirements = None if labels is None else tuple(Requirement(k, "In", (v,)) for k, v in labels)
        else:
            try:
                parsed = label_selector_from_json(raw, f"{kind} {namespace}/{name} spec.selector")
            except (ValueError, TypeError):
                parsed = None  # kube-scheduler adds nothing for a selector it cannot parse
            # a null selector is labels.Nothing(), which has no requirements to add
            requirements = None if parsed is None or parsed.nothing else parsed.requirements
        key = (kind, namespace, name)
        if requirements is None:
            self.remove(kind, namespace, name)
        elif self.controllers.get(key) != requirements:
            self.controllers[key] = requirements
            self.version += 1

    def remove(self, kind: str, namespace: str, name: str) -> None:
        if kind == SERVICE:
            services = self.services.get(namespace)
            if services is not None and services.pop(name, None) is not None:
                self.version += 1
                if not services:
                    del self.services[namespace]
        elif self.controllers.pop((kind, namespace, name), None) is not None:
            self.version += 1

    def replace(self, kind: str, objects: list[dict[str, Any]]) -> None:
        """Every object of ``kind`` (a relist): the ones not listed are gone."""
        listed = {
            (
                str((o.get("metadata") or {}).get("namespace") or "default"),
                str((o.get("metadata") or {}).get("name")),
            )
            for o in objects
        }
        if kind == SERVICE:
            stale = [(ns, n) for ns, names in self.services.items() for n in names if (ns, n) not in listed]
        else:
            stale = [(ns, n) for k, ns, n in self.controllers if k == kind and (ns, n) not in listed]
        for namespace, name in stale:
            self.remove(kind, namespace, name)
        for o in objects:
            self.upsert(kind, o)

    # ----- what decisions read -------------------------------------------------------------------------------

    def default_selector(self, pod: PodRecord) -> LabelSelector | None:
        """kube-scheduler's DefaultSelector for ``pod``; None when it is empty (no default constraint)."""
        if pod.controller is None and pod.namespace not in self.services:
            return None  # most agent pods: nothing can select them, decided without building anything
        merged: dict[str, str] = {}
        for selector in self.services.get(pod.namespace, {}).values():
            if all(pod.labels.get(k) == v for k, v in selector):
                merged.update(selector)
        extra: tuple[Requirement, ...] = ()
        owner = pod.controller
        if owner is not None:
            api_version, kind, name = owner
            if CONTROLLER_KINDS.get(kind) == api_version:
                found = self.controllers.get((kind, pod.namespace, name))
                if found is not None:
                    if kind == REPLICATION_CONTROLLER:
                        merged.update((r.key, r.values[0]) for r in found)
                    else:
                        extra = found
        requirements = tuple(Requirement(k, "In", (v,)) for k, v in sorted(merged.items())) + extra
        return LabelSelector(requirements) if requirements else None

    def statistics(self) -> dict[str, int]:
        return {
            "services": sum(len(s) for s in self.services.values()),
            "controllers": len(self.controllers),
        }
