"""Compact pod and node records parsed from the API server's raw JSON.

Typed client models are too slow for the scheduling path (the kubernetes client's pydantic models take
about four times as long as ``json.loads`` to deserialise a list of pods), so watches hand raw dicts to
``pod_from_json`` / ``node_from_json``, which keep only what scheduling needs.

Invariants:
- Parsing never raises for bad content. A pod whose spec cannot be understood (malformed quantity, unknown
  affinity operator, ...) gets ``parse_error`` set and is reported unschedulable with that reason; so does a
  pod not yet placed that uses a field the engine does not implement (``common.support``: the message names
  the field). A node with missing or malformed allocatable is treated as having no capacity
  (``allocatable_error`` says why).
- Records are immutable after parsing (the cache replaces them, it never edits them), so they can be shared
  between the cache, the queue and the engine without copies.
- ``Resources`` values are integers: CPU in millicores, everything else in whole units.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, NewType

from common.quantity import QuantityError, parse_milli, parse_units
from common.support import unsupported

NodeName = NewType("NodeName", str)
PodKey = NewType("PodKey", str)  # "namespace/name"

CPU = "cpu"
MEMORY = "memory"
EPHEMERAL_STORAGE = "ephemeral-storage"
PODS = "pods"
GPU = "nvidia.com/gpu"

# kube-scheduler scores pods without requests as if they asked for this much (non-zero defaults), so that
# a node does not look empty when it runs many request-less pods.
DEFAULT_MILLI_CPU_FOR_SCORING = 100
DEFAULT_MEMORY_FOR_SCORING = 200 * 1024 * 1024

NODE_SELECTOR_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
TAINT_EFFECTS = frozenset({"NoSchedule", "PreferNoSchedule", "NoExecute"})


@dataclass(slots=True)
class Resources:
    """A resource vector. Mutable only inside the cache's bookkeeping; records hold their own instances."""

    milli_cpu: int = 0
    memory: int = 0
    ephemeral_storage: int = 0
    pods: int = 0
    scalar: dict[str, int] = field(default_factory=dict)

    def add(self, other: Resources) -> None:
        self.milli_cpu += other.milli_cpu
        self.memory += other.memory
        self.ephemeral_storage += other.ephemeral_storage
        self.pods += other.pods
        for name, value in other.scalar.items():
            self.scalar[name] = self.scalar.get(name, 0) + value

    def sub(self, other: Resources) -> None:
        self.milli_cpu -= other.milli_cpu
        self.memory -= other.memory
        self.ephemeral_storage -= other.ephemeral_storage
        self.pods -= other.pods
        for name, value in other.scalar.items():
            left = self.scalar.get(name, 0) - value
            if left:
                self.scalar[name] = left
            else:
                self.scalar.pop(name, None)

    def max_with(self, other: Resources) -> None:
        self.milli_cpu = max(self.milli_cpu, other.milli_cpu)
        self.memory = max(self.memory, other.memory)
        self.ephemeral_storage = max(self.ephemeral_storage, other.ephemeral_storage)
        for name, value in other.scalar.items():
            self.scalar[name] = max(self.scalar.get(name, 0), value)

    def copy(self) -> Resources:
        return Resources(self.milli_cpu, self.memory, self.ephemeral_storage, self.pods, dict(self.scalar))

    def get(self, name: str) -> int:
        if name == CPU:
            return self.milli_cpu
        if name == MEMORY:
            return self.memory
        if name == EPHEMERAL_STORAGE:
            return self.ephemeral_storage
        if name == PODS:
            return self.pods
        return self.scalar.get(name, 0)


def resources_from_list(raw: Any) -> Resources:
    """Parse a ResourceList (``{"cpu": "100m", ...}``). Raises QuantityError on a malformed value."""
    res = Resources()
    if not raw:
        return res
    if not isinstance(raw, dict):
        raise QuantityError(f"resource list must be a mapping, got {type(raw).__name__}")
    for name, value in raw.items():
        if name == CPU:
            res.milli_cpu = parse_milli(value)
        elif name == MEMORY:
            res.memory = parse_units(value)
        elif name == EPHEMERAL_STORAGE:
            res.ephemeral_storage = parse_units(value)
        elif name == PODS:
            res.pods = parse_units(value)
        else:
            amount = parse_units(value)
            if amount:
                res.scalar[str(name)] = amount
        if res.get(str(name)) < 0:
            raise QuantityError(f"negative quantity for {name}: {value!r}")
    return res


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str
    operator: str  # "Equal" or "Exists"
    value: str
    effect: str  # "" tolerates every effect

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.key == "" and self.operator == "Exists":
            return True  # an empty key with Exists tolerates everything
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...]

    def matches(self, labels: dict[str, str]) -> bool:
        op = self.operator
        if op == "In":
            return labels.get(self.key) in self.values
        if op == "NotIn":
            return labels.get(self.key) not in self.values
        if op == "Exists":
            return self.key in labels
        if op == "DoesNotExist":
            return self.key not in labels
        have = labels.get(self.key)
        left = _int64(have) if have is not None else None
        right = _int64(self.values[0])
        if left is None or right is None:
            return False  # a non-integer label never satisfies Gt/Lt, as in kube-scheduler
        return left > right if op == "Gt" else left < right


_INT64 = re.compile(r"[+-]?[0-9]+")


def _int64(text: str) -> int | None:
    """``text`` as Go's ``strconv.ParseInt(text, 10, 64)`` reads it (kube-scheduler's Gt/Lt), else None.
    Stricter than ``int()``: no underscores ("1_0" is a valid label value), no spaces, no non-ASCII digits."""
    if not _INT64.fullmatch(text):
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None


@dataclass(frozen=True, slots=True)
class SelectorTerm:
    """One nodeSelectorTerm: every expression and every field must match. An empty term matches nothing."""

    expressions: tuple[Requirement, ...]
    fields: tuple[Requirement, ...]

    def matches(self, name: str, labels: dict[str, str]) -> bool:
        if not self.expressions and not self.fields:
            return False
        for req in self.expressions:
            if not req.matches(labels):
                return False
        return all(req.matches({"metadata.name": name}) for req in self.fields)


@dataclass(frozen=True, slots=True)
class HostPort:
    protocol: str
    port: int
    host_ip: str

    def conflicts(self, other: HostPort) -> bool:
        if self.port != other.port or self.protocol != other.protocol:
            return False
        # As kube-scheduler's HostPortInfo: no hostIP or "0.0.0.0" takes the port on every address; any other
        # address (also "::") only on itself.
        wildcard = ("", "0.0.0.0")
        return self.host_ip in wildcard or other.host_ip in wildcard or self.host_ip == other.host_ip


@dataclass(frozen=True, slots=True)
class PodRecord:
    """What the scheduler knows of one pod. ``signature`` groups pods with identical placement rules."""

    key: PodKey
    namespace: str
    name: str
    uid: str
    resource_version: str
    scheduler_name: str
    node_name: str
    phase: str
    priority: int
    labels: dict[str, str]
    annotations: dict[str, str]
    requests: Resources
    host_ports: tuple[HostPort, ...]
    node_selector: tuple[tuple[str, str], ...]
    required_terms: tuple[SelectorTerm, ...] | None
    preferred_terms: tuple[tuple[int, SelectorTerm], ...]
    tolerations: tuple[Toleration, ...]
    scheduling_gates: tuple[str, ...]
    deleting: bool
    parse_error: str | None
    signature: tuple[Any, ...]

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def gated(self) -> bool:
        return bool(self.scheduling_gates)


@dataclass(frozen=True, slots=True)
class NodeRecord:
    name: NodeName
    uid: str
    resource_version: str
    labels: dict[str, str]
    taints: tuple[Taint, ...]
    unschedulable: bool
    ready: bool
    allocatable: Resources
    allocatable_error: str | None
    # Only what filters and the static-feasibility cache depend on; capacity changes do not alter it.
    static_key: tuple[Any, ...]


def _requirements(raw: Any, where: str) -> tuple[Requirement, ...]:
    out: list[Requirement] = []
    for item in raw or ():
        if not isinstance(item, dict):
            raise ValueError(f"{where}: requirement must be an object")
        op = item.get("operator", "")
        key = item.get("key", "")
        values = tuple(str(v) for v in (item.get("values") or ()))
        if op not in NODE_SELECTOR_OPERATORS:
            raise ValueError(f"{where}: invalid operator {op!r} for key {key!r}")
        if op in ("In", "NotIn") and not values:
            raise ValueError(f"{where}: operator {op} for key {key!r} needs values")
        if op in ("Exists", "DoesNotExist") and values:
            raise ValueError(f"{where}: operator {op} for key {key!r} takes no values")
        if op in ("Gt", "Lt"):
            if len(values) != 1:
                raise ValueError(f"{where}: operator {op} for key {key!r} needs exactly one value")
            if _int64(values[0]) is None:
                raise ValueError(f"{where}: operator {op} for key {key!r} needs an integer value")
        out.append(Requirement(str(key), op, values))
    return tuple(out)


def _term(raw: Any, where: str) -> SelectorTerm:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: term must be an object")
    fields = _requirements(raw.get("matchFields"), where + ".matchFields")
    for req in fields:
        if req.key != "metadata.name" or req.operator not in ("In", "NotIn"):
            raise ValueError(f"{where}.matchFields: only metadata.name with In/NotIn is supported")
    return SelectorTerm(_requirements(raw.get("matchExpressions"), where + ".matchExpressions"), fields)


def _required_terms(raw: Any) -> tuple[SelectorTerm, ...]:
    """The required terms as kube-scheduler reads them: a term that does not parse (the API server accepts
    ``Gt`` with a value like "abc") matches no node, but the other terms still count. Only when no term
    parses is the pod itself invalid (it then fits no node either way)."""
    terms: list[SelectorTerm] = []
    error: ValueError | None = None
    for i, t in enumerate(raw):
        try:
            terms.append(_term(t, f"requiredDuringScheduling.nodeSelectorTerms[{i}]"))
        except ValueError as e:
            error = error or e
    if error is not None and not terms:
        raise error
    return tuple(terms)


def _apply_pod_level(total: Resources, raw: Any) -> None:
    """Pod-level requests override the containers' sum for the resources kube-scheduler takes from them."""
    if not raw:
        return
    if not isinstance(raw, dict):
        raise QuantityError(f"resource list must be a mapping, got {type(raw).__name__}")
    chosen = {k: v for k, v in raw.items() if k in (CPU, MEMORY) or str(k).startswith("hugepages-")}
    level = resources_from_list(chosen)
    if CPU in chosen:
        total.milli_cpu = level.milli_cpu
    if MEMORY in chosen:
        total.memory = level.memory
    for name in chosen:
        if name not in (CPU, MEMORY):
            total.scalar.pop(name, None)
            if level.scalar.get(name):
                total.scalar[name] = level.scalar[name]


def _effective_requests(spec: dict[str, Any]) -> Resources:
    """Requests as kube-scheduler counts them: app containers summed, restartable (sidecar) init containers
    added to them, other init containers as the max of each with the sidecars started before it, plus the
    pod overhead. Pod-level requests (``spec.resources``) replace that sum for the resources they name (cpu,
    memory, hugepages). Every pod also takes one pod slot."""
    total = Resources()
    for c in spec.get("containers") or ():
        total.add(resources_from_list((c.get("resources") or {}).get("requests")))
    sidecars = Resources()
    init_peak = Resources()
    for c in spec.get("initContainers") or ():
        req = resources_from_list((c.get("resources") or {}).get("requests"))
        if c.get("restartPolicy") == "Always":
            total.add(req)
            sidecars.add(req)
            init_peak.max_with(sidecars)
        else:
            with_sidecars = req.copy()
            with_sidecars.add(sidecars)
            init_peak.max_with(with_sidecars)
    total.max_with(init_peak)
    _apply_pod_level(total, (spec.get("resources") or {}).get("requests"))
    total.add(resources_from_list(spec.get("overhead")))
    total.pods = 1
    return total


def _empty_pod_fields() -> dict[str, Any]:
    return {
        "requests": Resources(pods=1),
        "host_ports": (),
        "node_selector": (),
        "required_terms": None,
        "preferred_terms": (),
        "tolerations": (),
    }


def _placement_fields(spec: dict[str, Any]) -> dict[str, Any]:
    requests = _effective_requests(spec)
    ports: list[HostPort] = []
    # As kube-scheduler: app containers and sidecars (restartable init containers) hold their host ports while
    # the pod runs; plain init containers have exited by then, so their ports are not counted.
    sidecars = [c for c in spec.get("initContainers") or () if c.get("restartPolicy") == "Always"]
    for c in list(spec.get("containers") or ()) + sidecars:
        for p in c.get("ports") or ():
            hp = p.get("hostPort")
            if hp:
                ports.append(HostPort(p.get("protocol") or "TCP", int(hp), p.get("hostIP") or ""))
    selector = spec.get("nodeSelector") or {}
    if not isinstance(selector, dict):
        raise ValueError("spec.nodeSelector must be a mapping")
    node_affinity = ((spec.get("affinity") or {}).get("nodeAffinity")) or {}
    required_raw = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    required: tuple[SelectorTerm, ...] | None = None
    if required_raw is not None:
        required = _required_terms(required_raw.get("nodeSelectorTerms") or ())
    preferred: list[tuple[int, SelectorTerm]] = []
    for i, p in enumerate(node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or ()):
        weight = int(p.get("weight", 0))
        if not 1 <= weight <= 100:
            raise ValueError(f"preferredDuringScheduling[{i}]: weight {weight} not in 1..100")
        preferred.append((weight, _term(p.get("preference") or {}, f"preferredDuringScheduling[{i}]")))
    tolerations: list[Toleration] = []
    for t in spec.get("tolerations") or ():
        op = t.get("operator") or "Equal"
        if op not in ("Equal", "Exists"):
            raise ValueError(f"toleration for key {t.get('key')!r}: invalid operator {op!r}")
        effect = t.get("effect") or ""
        if effect and effect not in TAINT_EFFECTS:
            raise ValueError(f"toleration for key {t.get('key')!r}: invalid effect {effect!r}")
        tolerations.append(Toleration(t.get("key") or "", op, t.get("value") or "", effect))
    return {
        "requests": requests,
        "host_ports": tuple(ports),
        "node_selector": tuple(sorted((str(k), str(v)) for k, v in selector.items())),
        "required_terms": required,
        "preferred_terms": tuple(preferred),
        "tolerations": tuple(tolerations),
    }


def pod_from_json(obj: dict[str, Any]) -> PodRecord:
    """Parse a Pod object. Never raises for bad spec content: see ``PodRecord.parse_error``."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    namespace = meta.get("namespace") or "default"
    name = meta.get("name") or ""
    error: str | None = None
    try:
        fields = _placement_fields(spec)
    except (QuantityError, ValueError, TypeError, AttributeError) as e:
        error = f"invalid pod spec: {e}"
        fields = _empty_pod_fields()
    if not spec.get("nodeName"):  # a placed pod is not ours to refuse; its requests still count
        error = unsupported(obj) or error
    gates = tuple(g.get("name", "") for g in spec.get("schedulingGates") or () if isinstance(g, dict))
    signature = (
        fields["node_selector"],
        fields["required_terms"],
        fields["tolerations"],
        fields["host_ports"],
        tuple(sorted(fields["requests"].scalar)),
    )
    priority = spec.get("priority")
    return PodRecord(
        key=PodKey(f"{namespace}/{name}"),
        namespace=namespace,
        name=name,
        uid=meta.get("uid") or "",
        resource_version=meta.get("resourceVersion") or "",
        scheduler_name=spec.get("schedulerName") or "default-scheduler",
        node_name=spec.get("nodeName") or "",
        phase=status.get("phase") or "Pending",
        priority=priority if isinstance(priority, int) else 0,
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        host_ports=fields["host_ports"],
        requests=fields["requests"],
        node_selector=fields["node_selector"],
        required_terms=fields["required_terms"],
        preferred_terms=fields["preferred_terms"],
        tolerations=fields["tolerations"],
        scheduling_gates=gates,
        deleting=bool(meta.get("deletionTimestamp")),
        parse_error=error,
        signature=signature,
    )


def node_from_json(obj: dict[str, Any]) -> NodeRecord:
    """Parse a Node object. A node with missing or malformed allocatable gets zero capacity."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    error: str | None = None
    raw_alloc = status.get("allocatable")
    try:
        if not raw_alloc:
            raise QuantityError("node reports no allocatable resources")
        allocatable = resources_from_list(raw_alloc)
    except QuantityError as e:
        error = str(e)
        allocatable = Resources()
    taints = tuple(
        Taint(t.get("key") or "", t.get("value") or "", t.get("effect") or "")
        for t in spec.get("taints") or ()
        if isinstance(t, dict)
    )
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()
    )
    labels = dict(meta.get("labels") or {})
    unschedulable = bool(spec.get("unschedulable"))
    return NodeRecord(
        name=NodeName(meta.get("name") or ""),
        uid=meta.get("uid") or "",
        resource_version=meta.get("resourceVersion") or "",
        labels=labels,
        taints=taints,
        unschedulable=unschedulable,
        ready=ready,
        allocatable=allocatable,
        allocatable_error=error,
        static_key=(tuple(sorted(labels.items())), taints, unschedulable, ready),
    )
