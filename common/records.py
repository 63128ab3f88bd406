"""Compact pod and node records parsed from the API server's raw JSON.

Typed client models are too slow for the scheduling path (the kubernetes client's pydantic models take
about four times as long as ``json.loads`` to deserialise a list of pods), so watches hand raw dicts to
``pod_from_json`` / ``node_from_json``, which keep only what scheduling needs.

Invariants:
- Parsing never raises for bad content, whatever it is (malformed, huge or overflowing quantities, wrong types,
  absurd sizes), and costs time linear in the object's size. A pod whose spec cannot be understood (malformed
  or out-of-range quantity, unknown affinity operator, ...) gets ``parse_error`` set, naming the field, and is
  reported unschedulable with that reason; so does a pod not yet placed that uses a field the engine does not
  implement (``common.support``: the message names the field). A node
  with missing or malformed allocatable is treated as having no capacity (``allocatable_error`` says why).
  Quantities must fit int64 (``common.quantity``).
- A pod's placement rules are bounded (``MAX_TOLERATIONS``, ``MAX_SELECTOR_TERMS``, ``MAX_REQUIREMENTS``,
  ``MAX_VALUES``, ``MAX_HOST_PORTS``, ``MAX_POD_TERMS`` for the inter-pod terms and spread constraints); a pod
  beyond one is a parse error naming the field and the limit. The filters run these rules against every node of
  a shard in one synchronous step, so the limits bound what one pod can cost the event loop (which also keeps the worker's lease alive). kube-apiserver sets no such limits;
  these are far above real pods (a handful of tolerations and terms) and above what controllers generate.
- Records are immutable after parsing (the cache replaces them, it never edits them), so they can be shared
  between the cache, the queue and the engine without copies.
- ``Resources`` values are integers: CPU in millicores, everything else in whole units.
- A node's ``status.images`` is kept as ``NodeImages`` (names and sizes only), capped as a kubelet reports
  them (``MAX_NODE_IMAGES`` images of ``MAX_IMAGE_NAMES`` names each; a kubelet lists the largest first) and
  interned: names are ``sys.intern``-ed and equal lists are one shared object, so 5,000 nodes pulled alike
  cost one list, and an unchanged list on a status update is the same object (the cache's image counts skip
  it by identity). A pod not yet placed keeps its containers' images (init containers first), normalized as
  kube-scheduler's ImageLocality normalizes them; placed pods keep none.
- Memory (a worker holds a record of every placed pod in the cluster): strings that repeat across pods and nodes
  (namespace, scheduler, node, phase, label keys and values) are interned, and a pod's tolerations and
  signature, which most pods share with many others, are shared immutable objects (``shared``, bounded by
  ``SHARED_LIMIT`` distinct values so hostile input cannot grow it). Equal values compare and hash as before:
  nothing depends on identity.
- Re-parsing is skipped where nothing it reads changed (``pod_from_json(obj, previous)``): every pod event
  re-sends the whole object, and after its creation the events of a pod's life change only its
  ``spec.nodeName`` (the binding) and its status or annotations (running, conditions). A record carries
  ``spec_digest``, a 128-bit BLAKE2b digest of the JSON of everything the spec-derived fields are computed from
  (the namespace and the spec but its ``nodeName``), and ``generation`` (``metadata.generation``). Given the
  pod's previous record with the same uid and either the same non-zero generation or the same digest, the
  spec-derived fields are taken from it and only the metadata and status fields (and the node name and the
  labels, with what depends on them, and the controller from the owner references) are read again, each
  compared with the previous value, so the result equals a full parse and is ``previous`` itself when
  nothing changed. The generation stands for the spec because kube-apiserver bumps it on every change of a
  pod's spec (since 1.33; measured on 1.36.3: 1 at creation, +1 for each update of tolerations, a gated pod's
  node selector, scheduling gates, an image, ``activeDeadlineSeconds``, an in-place resize, ephemeral
  containers, and for a graceful or immediate delete; unchanged by the binding, which sets only
  ``spec.nodeName``, and by label, annotation, owner reference and status updates). An object without a
  generation (an older API server) falls back to the digest.
- A full parse takes the spec-derived fields (placement fields, their error, the refusal of an unsupported
  field and the images of a pod not yet placed, gates, priority, claims, scheduler name) of an earlier parse of
  the same digest and placement (``_SPEC_PARTS``, at most ``SPEC_PARTS_LIMIT`` entries): pods of one template
  share one spec, so most full parses parse only metadata and status. The inter-pod terms also read the pod's
  labels and are parsed for each pod.
- ``pod_update(obj, previous)`` is ``pod_from_json`` for a placed pod's events, except that it returns
  ``previous`` itself when only fields of ``UNREAD_WHEN_PLACED`` changed (resourceVersion, annotations, a
  phase that is not terminal before or after): no reader of a placed pod's record reads them (the worker
  reads its phase only as ``terminal``), so such a record is current in everything read. A field added to
  ``PodRecord`` is read unless it is listed there.
"""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, NewType

import orjson

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

# Limits on one pod's placement rules: see the module docstring. Tolerations are matched through an index
# (``TolerationIndex``) and In/NotIn values through sets, so neither count multiplies the per-node cost; the
# affinity requirements are evaluated per node, so their total is the tighter bound.
MAX_TOLERATIONS = 1000
MAX_SELECTOR_TERMS = 100  # required nodeSelectorTerms, and preferred terms, each
# matchExpressions plus matchFields over all required terms, and over all preferred terms
MAX_REQUIREMENTS = 128
MAX_VALUES = 10_000  # values over all of the pod's requirements
MAX_HOST_PORTS = 256  # host ports over all containers

# kubelet's defaults: --node-status-max-images=50 (largest first) and at most 5 names per image
MAX_NODE_IMAGES = 50
MAX_IMAGE_NAMES = 5
MAX_POD_IMAGES = 256  # containers whose images one pod record keeps (a pod has a handful)
# Distinct values ``shared`` keeps; beyond it, new values are returned as they are (still correct, not shared).
SHARED_LIMIT = 16384
_SHARED: dict[Any, Any] = {}


def shared(value: Any) -> Any:
    """The one kept object equal to ``value`` (hashable, immutable): pods with the same tolerations or placement
    signature then hold one tuple instead of one each."""
    found = _SHARED.get(value)
    if found is not None:
        return found
    if len(_SHARED) < SHARED_LIMIT:
        _SHARED[value] = value
    return value


def _intern(value: Any) -> Any:
    return sys.intern(value) if type(value) is str else value


def _interned(labels: dict[Any, Any]) -> dict[Any, Any]:
    """``labels`` with str keys and values interned: label keys and most values repeat across objects."""
    return {_intern(k): _intern(v) for k, v in labels.items()}


MAX_POD_TERMS = 64  # inter-pod (anti-)affinity terms plus topology spread constraints
LABEL_SELECTOR_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})
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


def resources_from_list(raw: Any, where: str = "") -> Resources:
    """Parse a ResourceList (``{"cpu": "100m", ...}``). Raises QuantityError on a malformed or out-of-range
    value, naming the field (``where`` is the list's path, e.g. ``spec.containers[0].resources.requests``)."""
    res = Resources()
    if not raw:
        return res
    prefix = f"{where}: " if where else ""
    if not isinstance(raw, dict):
        raise QuantityError(f"{prefix}resource list must be a mapping, got {type(raw).__name__}")
    for name, value in raw.items():
        field_name = f"{where}.{name}" if where else str(name)
        try:
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
        except QuantityError as e:
            raise QuantityError(f"{field_name}: {e}") from None
        if res.get(str(name)) < 0:
            raise QuantityError(f"{field_name}: negative quantity {value!r}")
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


class TolerationIndex:
    """A pod's tolerations arranged so that ``tolerates(taint)`` costs the same for 1 or 1,000 tolerations:
    the answer of ``any(t.tolerates(taint) for t in tolerations)`` from three set lookups."""

    __slots__ = ("_equal", "_exists", "_wildcard")

    def __init__(self, tolerations: tuple[Toleration, ...]) -> None:
        self._wildcard: set[str] = set()  # effects tolerated for every key ("" = every effect)
        self._exists: set[tuple[str, str]] = set()  # (key, effect) tolerated with any value
        self._equal: set[tuple[str, str, str]] = set()  # (key, value, effect)
        for t in tolerations:
            if t.operator == "Exists":
                if t.key == "":
                    self._wildcard.add(t.effect)
                else:
                    self._exists.add((t.key, t.effect))
            else:
                self._equal.add((t.key, t.value, t.effect))

    def tolerates(self, taint: Taint) -> bool:
        for effect in ("", taint.effect):
            if (
                effect in self._wildcard
                or (taint.key, effect) in self._exists
                or (taint.key, taint.value, effect) in self._equal
            ):
                return True
        return False


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...]
    # The values as a set, so In/NotIn cost one lookup however many values there are.
    value_set: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "value_set", frozenset(self.values))

    def matches(self, labels: dict[str, str]) -> bool:
        op = self.operator
        if op == "In":
            return labels.get(self.key) in self.value_set
        if op == "NotIn":
            return labels.get(self.key) not in self.value_set
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


_INT64 = re.compile(r"[+-]?[0-9]+", re.ASCII)


def _int64(text: str) -> int | None:
    """``text`` as Go's ``strconv.ParseInt(text, 10, 64)`` reads it (kube-scheduler's Gt/Lt), else None.
    Stricter than ``int()``: no underscores ("1_0" is a valid label value), no spaces, no non-ASCII digits."""
    if not _INT64.fullmatch(text):
        return None
    if len(text.lstrip("+-").lstrip("0")) > 19:
        return None  # out of range, and never converted (int() refuses over 4,300 digits)
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
class LabelSelector:
    """A metav1.LabelSelector: every requirement must match. A null selector (``nothing``) matches no pod,
    an empty one every pod, as ``metav1.LabelSelectorAsSelector`` makes them."""

    requirements: tuple[Requirement, ...]
    nothing: bool = False

    def matches(self, labels: dict[str, str]) -> bool:
        if self.nothing:
            return False
        return all(req.matches(labels) for req in self.requirements)


@dataclass(frozen=True, slots=True)
class PodTerm:
    """One pod (anti-)affinity term, with ``matchLabelKeys``/``mismatchLabelKeys`` merged into the selector.
    ``namespaces`` None means every namespace (an empty ``namespaceSelector``); otherwise a pod's namespace
    must be in ``namespaces`` or, when ``namespace_selector`` is set (a non-empty ``namespaceSelector``), carry
    labels it matches (kube-scheduler's ``AffinityTerm.Matches``)."""

    namespaces: frozenset[str] | None
    selector: LabelSelector
    topology_key: str
    namespace_selector: LabelSelector | None = None

    def matches(
        self, namespace: str, labels: dict[str, str], ns_labels: dict[str, str] | None = None
    ) -> bool:
        """``ns_labels``: the labels of the pod's Namespace object, None when it is not known (a
        ``namespace_selector`` then selects it only if it matches no labels at all)."""
        ns = self.namespaces
        if ns is not None and namespace not in ns:
            sel = self.namespace_selector
            if sel is None or not sel.matches(ns_labels or {}):
                return False
        return self.selector.matches(labels)


@dataclass(frozen=True, slots=True)
class SpreadConstraint:
    """One topologySpreadConstraint, ``matchLabelKeys`` merged into the selector, defaults applied."""

    max_skew: int
    topology_key: str
    hard: bool  # whenUnsatisfiable: DoNotSchedule
    selector: LabelSelector
    min_domains: int
    honor_affinity: bool  # nodeAffinityPolicy: Honor (the default)
    honor_taints: bool  # nodeTaintsPolicy: Honor (default Ignore)


@dataclass(frozen=True, slots=True)
class InterPod:
    """A pod's inter-pod rules: pod (anti-)affinity terms and topology spread constraints."""

    affinity: tuple[PodTerm, ...] = ()
    anti_affinity: tuple[PodTerm, ...] = ()
    preferred_affinity: tuple[tuple[int, PodTerm], ...] = ()
    preferred_anti_affinity: tuple[tuple[int, PodTerm], ...] = ()
    spread: tuple[SpreadConstraint, ...] = ()


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
    # pod (anti-)affinity and topology spread; None when the pod states none
    inter_pod: InterPod | None = None
    # preemption (worker.preemption): status.nominatedNodeName; spec.preemptionPolicy Never; status.startTime
    # (epoch seconds, None before the kubelet starts it); a DisruptionTarget=True condition of reason
    # PreemptionByScheduler (the pod is being preempted by a scheduler)
    nominated_node: str = ""
    preempt_never: bool = False
    start_time: float | None = None
    preempted: bool = False
    # normalized images of the init containers and containers, for ImageLocality; () once placed
    images: tuple[str, ...] = ()
    # the controller owner reference (apiVersion, kind, name), for kube's default spread selector
    controller: tuple[str, str, str] | None = None
    # volumes backed by a claim, as (volume name, generic ephemeral?, claimName): read by worker.volumes
    claims: tuple[tuple[str, bool, str], ...] = ()
    # digest of what every field above except the metadata/status ones and ``controller`` is computed from
    # (``pod_from_json``); b"" when it could not be computed (then no later parse reuses this record)
    spec_digest: bytes = b""
    # metadata.generation (0 when absent): the API server bumps it on every change of the spec
    generation: int = 0

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def gated(self) -> bool:
        return bool(self.scheduling_gates)


_POD_FIELDS = tuple(f.name for f in fields(PodRecord))


@dataclass(frozen=True, slots=True)
class NodeImages:
    """A node's images: ``names[i]`` is one name of an image of ``sizes[i]`` bytes. Names are unique per node
    (the first listing wins) and interned; membership is a C-level scan of ``names``, cheaper in memory than
    a set at the sizes kubelets report."""

    names: tuple[str, ...] = ()
    sizes: tuple[int, ...] = ()


NO_IMAGES = NodeImages()


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
    # status.images; scores only, so not part of static_key
    images: NodeImages = NO_IMAGES


# equal image lists -> one shared object; cleared when it grows past the bound (sharing is an optimisation)
_INTERNED_IMAGES: dict[tuple[tuple[str, ...], tuple[int, ...]], NodeImages] = {}
_INTERNED_IMAGES_MAX = 8192


def node_images(raw: Any) -> NodeImages:
    """``status.images`` as ``NodeImages``; malformed entries are skipped, never an error (a node's images
    only ever change a score)."""
    if not isinstance(raw, list) or not raw:
        return NO_IMAGES
    names: list[str] = []
    sizes: list[int] = []
    seen: set[str] = set()
    for image in raw[:MAX_NODE_IMAGES]:
        if not isinstance(image, dict):
            continue
        size = image.get("sizeBytes")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            size = 0
        size = min(size, 2**63 - 1)
        image_names = image.get("names")
        if not isinstance(image_names, list):
            continue
        for name in image_names[:MAX_IMAGE_NAMES]:
            if isinstance(name, str) and name and name not in seen:
                seen.add(name)
                names.append(sys.intern(name))
                sizes.append(size)
    if not names:
        return NO_IMAGES
    key = (tuple(names), tuple(sizes))
    shared = _INTERNED_IMAGES.get(key)
    if shared is None:
        if len(_INTERNED_IMAGES) >= _INTERNED_IMAGES_MAX:
            _INTERNED_IMAGES.clear()
        shared = _INTERNED_IMAGES[key] = NodeImages(*key)
    return shared


def normalized_image(name: str) -> str:
    """The name a node's status lists an image under, as kube-scheduler's ImageLocality derives it from a
    container's ``image``: ``:latest`` appended when the reference has no tag after its last path part."""
    if name.rfind(":") <= name.rfind("/"):
        name += ":latest"
    return sys.intern(name)


def _pod_images(spec: dict[str, Any]) -> tuple[str, ...]:
    out: list[str] = []
    for part in ("initContainers", "containers"):
        containers = spec.get(part)
        if not isinstance(containers, list):
            continue
        for c in containers:
            if len(out) == MAX_POD_IMAGES:
                return tuple(out)
            image = c.get("image") if isinstance(c, dict) else None
            out.append(normalized_image(image if isinstance(image, str) else ""))
    return tuple(out)


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


def _sized(raw: Any, where: str, limit: int, what: str) -> list[Any]:
    """``raw`` as a list (None is empty) of at most ``limit`` items; else a ValueError naming the field."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError(f"{where} must be a list, got {type(raw).__name__}")
    if len(raw) > limit:
        raise ValueError(f"{where}: {len(raw)} {what} exceed this scheduler's limit of {limit}")
    return raw


def _check_requirements(terms: list[Any], where: str) -> int:
    """Refuse ``terms`` (raw selector terms) whose requirements together exceed ``MAX_REQUIREMENTS``; return
    how many values they carry. Malformed parts are left for ``_term`` to report."""
    count = values = 0
    for term in terms:
        if not isinstance(term, dict):
            continue
        for part in ("matchExpressions", "matchFields"):
            reqs = term.get(part)
            if isinstance(reqs, list):
                count += len(reqs)
                values += sum(
                    len(r["values"])
                    for r in reqs
                    if isinstance(r, dict) and isinstance(r.get("values"), list)
                )
    if count > MAX_REQUIREMENTS:
        raise ValueError(
            f"{where}: {count} match expressions and fields exceed this scheduler's limit of {MAX_REQUIREMENTS}"
        )
    return values


def _required_terms(raw: Any, where: str) -> tuple[SelectorTerm, ...]:
    """The required terms as kube-scheduler reads them: a term that does not parse (the API server accepts
    ``Gt`` with a value like "abc") matches no node, but the other terms still count. Only when no term
    parses is the pod itself invalid (it then fits no node either way)."""
    terms: list[SelectorTerm] = []
    error: ValueError | None = None
    for i, t in enumerate(raw):
        try:
            terms.append(_term(t, f"{where}[{i}]"))
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
        raise QuantityError(
            f"spec.resources.requests: resource list must be a mapping, got {type(raw).__name__}"
        )
    chosen = {k: v for k, v in raw.items() if k in (CPU, MEMORY) or str(k).startswith("hugepages-")}
    level = resources_from_list(chosen, "spec.resources.requests")
    if CPU in chosen:
        total.milli_cpu = level.milli_cpu
    if MEMORY in chosen:
        total.memory = level.memory
    for name in chosen:
        if name not in (CPU, MEMORY):
            total.scalar.pop(name, None)
            if level.scalar.get(name):
                total.scalar[name] = level.scalar[name]


def _requests(container: Any, where: str) -> Resources:
    return resources_from_list(
        (container.get("resources") or {}).get("requests"), where + ".resources.requests"
    )


def _effective_requests(spec: dict[str, Any]) -> Resources:
    """Requests as kube-scheduler counts them: app containers summed, restartable (sidecar) init containers
    added to them, other init containers as the max of each with the sidecars started before it, plus the
    pod overhead. Pod-level requests (``spec.resources``) replace that sum for the resources they name (cpu,
    memory, hugepages). Every pod also takes one pod slot."""
    total = Resources()
    for i, c in enumerate(spec.get("containers") or ()):
        total.add(_requests(c, f"spec.containers[{i}]"))
    sidecars = Resources()
    init_peak = Resources()
    for i, c in enumerate(spec.get("initContainers") or ()):
        req = _requests(c, f"spec.initContainers[{i}]")
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
    total.add(resources_from_list(spec.get("overhead"), "spec.overhead"))
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


_REQUIRED = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
_PREFERRED = "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution"


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
                if len(ports) == MAX_HOST_PORTS:
                    raise ValueError(
                        f"spec.containers[*].ports: more than {MAX_HOST_PORTS} host ports exceed this scheduler's limit"
                    )
                port = int(hp)
                if not 0 < port < 65536:
                    raise ValueError(f"spec.containers[*].ports: host port {port} is not in 1..65535")
                ports.append(HostPort(str(p.get("protocol") or "TCP"), port, str(p.get("hostIP") or "")))
    selector = spec.get("nodeSelector") or {}
    if not isinstance(selector, dict):
        raise ValueError("spec.nodeSelector must be a mapping")
    node_affinity = ((spec.get("affinity") or {}).get("nodeAffinity")) or {}
    required_raw = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    preferred_raw = _sized(
        node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution"),
        _PREFERRED,
        MAX_SELECTOR_TERMS,
        "terms",
    )
    values = _check_requirements(
        [p.get("preference") for p in preferred_raw if isinstance(p, dict)], _PREFERRED
    )
    terms_raw: list[Any] = []
    if required_raw is not None:
        terms_raw = _sized(required_raw.get("nodeSelectorTerms"), _REQUIRED, MAX_SELECTOR_TERMS, "terms")
        values += _check_requirements(terms_raw, _REQUIRED)
    if values > MAX_VALUES:
        raise ValueError(
            f"spec.affinity.nodeAffinity: {values} values exceed this scheduler's limit of {MAX_VALUES}"
        )
    required = _required_terms(terms_raw, _REQUIRED) if required_raw is not None else None
    preferred: list[tuple[int, SelectorTerm]] = []
    for i, p in enumerate(preferred_raw):
        weight = int(p.get("weight", 0))
        if not 1 <= weight <= 100:
            raise ValueError(f"{_PREFERRED}[{i}]: weight {weight} not in 1..100")
        preferred.append((weight, _term(p.get("preference") or {}, f"{_PREFERRED}[{i}].preference")))
    tolerations: list[Toleration] = []
    for t in _sized(spec.get("tolerations"), "spec.tolerations", MAX_TOLERATIONS, "tolerations"):
        op = t.get("operator") or "Equal"
        if op not in ("Equal", "Exists"):
            raise ValueError(
                f"spec.tolerations: toleration for key {t.get('key')!r}: invalid operator {op!r}"
            )
        effect = t.get("effect") or ""
        if effect and effect not in TAINT_EFFECTS:
            raise ValueError(
                f"spec.tolerations: toleration for key {t.get('key')!r}: invalid effect {effect!r}"
            )
        tolerations.append(Toleration(str(t.get("key") or ""), op, str(t.get("value") or ""), effect))
    return {
        "requests": requests,
        "host_ports": tuple(ports),
        "node_selector": tuple(sorted((str(k), str(v)) for k, v in selector.items())),
        "required_terms": required,
        "preferred_terms": tuple(preferred),
        "tolerations": shared(tuple(tolerations)),
    }


def _label_selector(raw: Any, where: str) -> LabelSelector:
    if raw is None:
        return LabelSelector((), nothing=True)
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be an object")
    reqs: list[Requirement] = []
    labels = raw.get("matchLabels") or {}
    if not isinstance(labels, dict):
        raise ValueError(f"{where}.matchLabels must be a mapping")
    for k, v in labels.items():
        reqs.append(Requirement(str(k), "In", (str(v),)))
    exprs = _sized(raw.get("matchExpressions"), where + ".matchExpressions", MAX_REQUIREMENTS, "expressions")
    for item in exprs:
        if not isinstance(item, dict):
            raise ValueError(f"{where}.matchExpressions: requirement must be an object")
        op = item.get("operator", "")
        key = str(item.get("key", ""))
        values = tuple(str(v) for v in (item.get("values") or ()))
        if op not in LABEL_SELECTOR_OPERATORS:
            raise ValueError(f"{where}.matchExpressions: invalid operator {op!r} for key {key!r}")
        if op in ("In", "NotIn") and not values:
            raise ValueError(f"{where}.matchExpressions: operator {op} for key {key!r} needs values")
        if op in ("Exists", "DoesNotExist") and values:
            raise ValueError(f"{where}.matchExpressions: operator {op} for key {key!r} takes no values")
        reqs.append(Requirement(key, op, values))
    return LabelSelector(tuple(reqs))


def spread_constraint_from_json(raw: Any, where: str) -> SpreadConstraint:
    """One topologySpreadConstraint outside a pod (a configured default); raises ValueError when malformed."""
    return _spread(raw, where, {})


def label_selector_from_json(raw: Any, where: str) -> LabelSelector:
    """A metav1.LabelSelector (of a ReplicaSet, a StatefulSet, ...); raises ValueError when malformed."""
    return _label_selector(raw, where)


def _merge_keys(selector: LabelSelector, labels: dict[str, Any], keys: Any, op: str) -> LabelSelector:
    """``matchLabelKeys`` (``In``) or ``mismatchLabelKeys`` (``NotIn``): for each key the pod carries, a
    requirement on the pod's own value, ANDed into the selector (as the API server and kube-scheduler do)."""
    extra = [Requirement(str(k), op, (str(labels[k]),)) for k in keys or () if k in labels]
    if not extra or selector.nothing:
        return selector
    return LabelSelector(selector.requirements + tuple(extra))


def _pod_term(raw: Any, where: str, namespace: str, labels: dict[str, Any]) -> PodTerm:
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be an object")
    key = raw.get("topologyKey")
    if not isinstance(key, str) or not key:
        raise ValueError(f"{where}.topologyKey must be a non-empty string")
    selector = _label_selector(raw.get("labelSelector"), where + ".labelSelector")
    selector = _merge_keys(selector, labels, raw.get("matchLabelKeys"), "In")
    selector = _merge_keys(selector, labels, raw.get("mismatchLabelKeys"), "NotIn")
    names = frozenset(str(n) for n in raw.get("namespaces") or ())
    ns_selector = raw.get("namespaceSelector")
    namespaces: frozenset[str] | None
    if ns_selector is None:
        namespaces = names or frozenset({namespace})
    elif (
        isinstance(ns_selector, dict)
        and not ns_selector.get("matchLabels")
        and not ns_selector.get("matchExpressions")
    ):
        namespaces = None  # an empty namespaceSelector selects every namespace
    else:
        # namespaces selected by their labels: matched against the Namespace objects the worker watches
        # (``worker.topology``), in addition to the explicit names
        return PodTerm(names, selector, key, _label_selector(ns_selector, where + ".namespaceSelector"))
    return PodTerm(namespaces, selector, key)


_POD_AFFINITY = "spec.affinity.podAffinity"
_POD_ANTI_AFFINITY = "spec.affinity.podAntiAffinity"
_REQ = "requiredDuringSchedulingIgnoredDuringExecution"
_PREF = "preferredDuringSchedulingIgnoredDuringExecution"


def _inter_pod(spec: dict[str, Any], namespace: str, labels: dict[str, Any]) -> InterPod | None:
    affinity = spec.get("affinity") or {}
    if not isinstance(affinity, dict):
        raise ValueError("spec.affinity must be an object")
    if not (
        affinity.get("podAffinity")
        or affinity.get("podAntiAffinity")
        or spec.get("topologySpreadConstraints")
    ):
        return None  # most pods: no inter-pod rule
    parts: dict[str, Any] = {}
    count = 0
    for name, where in (("podAffinity", _POD_AFFINITY), ("podAntiAffinity", _POD_ANTI_AFFINITY)):
        block = affinity.get(name) or {}
        if not isinstance(block, dict):
            raise ValueError(f"{where} must be an object")
        required = _sized(block.get(_REQ), f"{where}.{_REQ}", MAX_POD_TERMS, "terms")
        preferred = _sized(block.get(_PREF), f"{where}.{_PREF}", MAX_POD_TERMS, "terms")
        count += len(required) + len(preferred)
        terms = tuple(_pod_term(t, f"{where}.{_REQ}[{i}]", namespace, labels) for i, t in enumerate(required))
        weighted: list[tuple[int, PodTerm]] = []
        for i, p in enumerate(preferred):
            if not isinstance(p, dict):
                raise ValueError(f"{where}.{_PREF}[{i}] must be an object")
            weight = p.get("weight")
            if not isinstance(weight, int) or not 1 <= weight <= 100:
                raise ValueError(f"{where}.{_PREF}[{i}]: weight {weight!r} not in 1..100")
            term = _pod_term(
                p.get("podAffinityTerm"), f"{where}.{_PREF}[{i}].podAffinityTerm", namespace, labels
            )
            weighted.append((weight, term))
        prefix = "" if name == "podAffinity" else "anti_"
        parts[f"{prefix}affinity"] = terms
        parts[f"preferred_{prefix}affinity"] = tuple(weighted)
    raw_spread = _sized(
        spec.get("topologySpreadConstraints"), "spec.topologySpreadConstraints", MAX_POD_TERMS, "constraints"
    )
    count += len(raw_spread)
    if count > MAX_POD_TERMS:
        raise ValueError(
            f"spec.affinity and spec.topologySpreadConstraints: {count} inter-pod terms exceed this scheduler's "
            f"limit of {MAX_POD_TERMS}"
        )
    parts["spread"] = tuple(
        _spread(c, f"spec.topologySpreadConstraints[{i}]", labels) for i, c in enumerate(raw_spread)
    )
    if not count:
        return None
    rules = InterPod(**parts)
    selectors = [t.selector for t in (*rules.affinity, *rules.anti_affinity)]
    selectors += [t.selector for _, t in (*rules.preferred_affinity, *rules.preferred_anti_affinity)]
    selectors += [c.selector for c in rules.spread]
    requirements = sum(len(sel.requirements) for sel in selectors)
    if requirements > MAX_REQUIREMENTS:
        raise ValueError(
            f"spec.affinity and spec.topologySpreadConstraints: {requirements} label selector requirements exceed "
            f"this scheduler's limit of {MAX_REQUIREMENTS}"
        )
    return rules


def _spread(raw: Any, where: str, labels: dict[str, Any]) -> SpreadConstraint:
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be an object")
    skew = raw.get("maxSkew")
    if not isinstance(skew, int) or isinstance(skew, bool) or skew < 1:
        raise ValueError(f"{where}.maxSkew must be an integer of at least 1")
    key = raw.get("topologyKey")
    if not isinstance(key, str) or not key:
        raise ValueError(f"{where}.topologyKey must be a non-empty string")
    when = raw.get("whenUnsatisfiable")
    if when not in ("DoNotSchedule", "ScheduleAnyway"):
        raise ValueError(f"{where}.whenUnsatisfiable must be DoNotSchedule or ScheduleAnyway")
    min_domains = raw.get("minDomains")
    if min_domains is None:
        min_domains = 1
    elif not isinstance(min_domains, int) or isinstance(min_domains, bool) or min_domains < 1:
        raise ValueError(f"{where}.minDomains must be an integer of at least 1")
    policies = []
    for field_name, default in (("nodeAffinityPolicy", "Honor"), ("nodeTaintsPolicy", "Ignore")):
        value = raw.get(field_name) or default
        if value not in ("Honor", "Ignore"):
            raise ValueError(f"{where}.{field_name} must be Honor or Ignore")
        policies.append(value == "Honor")
    selector = _label_selector(raw.get("labelSelector"), where + ".labelSelector")
    selector = _merge_keys(selector, labels, raw.get("matchLabelKeys"), "In")
    return SpreadConstraint(
        max_skew=skew,
        topology_key=key,
        hard=when == "DoNotSchedule",
        selector=selector,
        min_domains=min_domains,
        honor_affinity=policies[0],
        honor_taints=policies[1],
    )


def _claims(spec: dict[str, Any]) -> tuple[tuple[str, bool, str], ...]:
    """The pod's volumes backed by a PersistentVolumeClaim: (volume name, generic ephemeral?, claimName)."""
    out: list[tuple[str, bool, str]] = []
    for v in spec.get("volumes") or ():
        if not isinstance(v, dict):
            continue
        pvc = v.get("persistentVolumeClaim")
        if isinstance(pvc, dict):
            out.append((str(v.get("name") or ""), False, str(pvc.get("claimName") or "")))
        elif v.get("ephemeral") is not None:
            out.append((str(v.get("name") or ""), True, ""))
    return tuple(out)


def spec_digest(meta: dict[str, Any], spec: dict[str, Any]) -> bytes:
    """The digest of what a pod record's spec-derived fields are read from, ``spec.nodeName`` aside (see the
    module docstring); b"" for content JSON cannot hold."""
    if "nodeName" in spec:
        spec = {k: v for k, v in spec.items() if k != "nodeName"}
    try:
        raw = orjson.dumps((meta.get("namespace"), spec))
    except TypeError:  # orjson.JSONEncodeError: not JSON (a dispatched pod is checked, a watched one is JSON)
        return b""
    return hashlib.blake2b(raw, digest_size=16).digest()


def _generation(meta: dict[str, Any]) -> int:
    value = meta.get("generation")
    return value if type(value) is int and value > 0 else 0


def _preempted(status: dict[str, Any]) -> bool:
    return any(
        isinstance(c, dict)
        and c.get("type") == "DisruptionTarget"
        and c.get("status") == "True"
        and c.get("reason") == "PreemptionByScheduler"
        for c in status.get("conditions") or ()
    )


def _status_fields(meta: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """The fields of a pod record read from its metadata (besides labels and owners) and status."""
    return {
        "uid": meta.get("uid") or "",
        "resource_version": meta.get("resourceVersion") or "",
        "phase": _intern(status.get("phase") or "Pending"),
        "annotations": dict(meta.get("annotations") or {}),
        "deleting": bool(meta.get("deletionTimestamp")),
        "nominated_node": str(status.get("nominatedNodeName") or ""),
        "start_time": _start_time(status.get("startTime")),
        "preempted": _preempted(status),
        "generation": _generation(meta),
    }


# Fields of a placed pod's record that nothing reads (the worker reads a placed pod's phase only as
# ``terminal``): ``pod_update`` keeps the previous record when an event changes no other field.
UNREAD_WHEN_PLACED = frozenset({"resource_version", "annotations", "phase"})

_TERMINAL = ("Succeeded", "Failed")


def _reparse(
    previous: PodRecord,
    meta: dict[str, Any],
    spec: dict[str, Any],
    status: dict[str, Any],
    *,
    keep: bool = False,
) -> PodRecord | None:
    """``previous`` brought up to date with an object of the same uid and spec digest, or None when only a
    full parse can say what the record is. Each field is compared with ``previous`` and only those that
    differ are replaced (no new record when none does). ``keep``: return ``previous`` itself when only
    fields of ``UNREAD_WHEN_PLACED`` changed and the pod was and stays placed and not terminal."""
    changes: dict[str, Any] = {}
    node = spec.get("nodeName") or ""
    if node != previous.node_name:
        if previous.node_name or previous.parse_error is not None or not isinstance(node, str):
            return None
        # the binding: a placed pod keeps no images and is not refused for unsupported fields, and without
        # a parse error before, the spec's own rules parsed cleanly
        changes["node_name"] = _intern(node)
        changes["images"] = ()
    raw_labels = meta.get("labels") or {}
    if raw_labels != previous.labels:
        # Labels are read by the pod's inter-pod terms (matchLabelKeys) only; the API server adds the node's
        # topology labels at the binding.
        if previous.parse_error is not None:
            return None
        try:
            labels = _interned(dict(raw_labels))
            inter_pod = _inter_pod(spec, previous.namespace, labels)
        except (ValueError, TypeError, AttributeError, ArithmeticError, RecursionError):
            return None  # the full parse says how
        changes["labels"] = labels
        changes["inter_pod"] = inter_pod
    controller = _controller(meta)
    if controller != previous.controller:
        changes["controller"] = controller
    # ``_status_fields`` read again, each compared in place: this runs for every event of every pod, and a
    # dict of them (with its annotations copy) per event cost a third more on a status-only event
    deleting = bool(meta.get("deletionTimestamp"))
    if deleting != previous.deleting:
        changes["deleting"] = deleting
    nominated = str(status.get("nominatedNodeName") or "")
    if nominated != previous.nominated_node:
        changes["nominated_node"] = nominated
    start_time = _start_time(status.get("startTime"))
    if start_time != previous.start_time:
        changes["start_time"] = start_time
    preempted = _preempted(status)
    if preempted != previous.preempted:
        changes["preempted"] = preempted
    generation = _generation(meta)
    if generation != previous.generation:
        changes["generation"] = generation
    phase = status.get("phase") or "Pending"
    if phase != previous.phase:
        changes["phase"] = _intern(phase)
    version = meta.get("resourceVersion") or ""
    if version != previous.resource_version:
        changes["resource_version"] = version
    raw_annotations = meta.get("annotations") or {}
    if raw_annotations != previous.annotations:
        changes["annotations"] = dict(raw_annotations)
    if not changes:
        return previous
    if (
        keep
        and previous.node_name
        and previous.phase not in _TERMINAL
        and phase not in _TERMINAL
        and all(name in UNREAD_WHEN_PLACED for name in changes)
    ):
        return previous  # nothing a reader of a placed pod reads changed
    return _rebuilt(previous, changes)


def _rebuilt(previous: PodRecord, changes: dict[str, Any]) -> PodRecord:
    """``dataclasses.replace(previous, **changes)``, at a fraction of its cost (positional, no keyword dict)."""
    return PodRecord(*[changes[n] if n in changes else getattr(previous, n) for n in _POD_FIELDS])


def pod_key(obj: dict[str, Any]) -> PodKey:
    """The key ``pod_from_json`` gives the record of ``obj``."""
    meta = obj.get("metadata") or {}
    return PodKey(f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}")


def _reused(
    previous: PodRecord, meta: dict[str, Any], spec: dict[str, Any], status: dict[str, Any], *, keep: bool
) -> tuple[PodRecord | None, bytes | None]:
    """``_reparse`` when ``previous`` is of the same pod and spec, else None; and the digest of the spec when
    it had to be computed (None when the generation vouched for it, or the uid differs)."""
    if previous.uid != (meta.get("uid") or ""):
        return None, None
    generation = meta.get("generation")
    if (
        type(generation) is int
        and generation > 0
        and generation == previous.generation
        and previous.spec_digest
    ):
        # The same generation is the same spec (the API server bumps it on every change of the spec; the
        # binding, which sets only spec.nodeName, leaves it): no digest needed.
        return _reparse(previous, meta, spec, status, keep=keep), None
    digest = spec_digest(meta, spec)
    if digest and digest == previous.spec_digest:
        return _reparse(previous, meta, spec, status, keep=keep), digest
    return None, digest


def pod_update(obj: dict[str, Any], previous: PodRecord) -> PodRecord:
    """``pod_from_json(obj, previous)``, except that ``previous`` itself is returned when ``previous`` is a
    placed pod's record and ``obj`` changes none of its fields but those of ``UNREAD_WHEN_PLACED`` (the pod
    still placed on the same node, not terminal): the record stays current in every field a reader of a placed
    pod reads. Such events (a kubelet's or kwok's status updates after the pod started, annotations) then
    cost a few dictionary lookups and comparisons."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    reused, _ = _reused(previous, meta, spec, status, keep=True)
    return reused if reused is not None else pod_from_json(obj)


def pod_from_json(obj: dict[str, Any], previous: PodRecord | None = None) -> PodRecord:
    """Parse a Pod object. Never raises for bad spec content: see ``PodRecord.parse_error``.

    ``previous``: this pod's last record, if the caller keeps one. When its uid and ``spec_digest`` match, its
    spec-derived fields are reused and only the metadata and status fields are read (the same result)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    digest: bytes | None = None
    if previous is not None:
        reused, digest = _reused(previous, meta, spec, status, keep=False)
        if reused is not None:
            return reused
    if digest is None:
        digest = spec_digest(meta, spec)
    namespace = meta.get("namespace") or "default"
    name = meta.get("name") or ""
    labels = _interned(dict(meta.get("labels") or {}))
    placed = bool(spec.get("nodeName"))
    parts = _SPEC_PARTS.get((digest, placed)) if digest else None
    if parts is None:
        parts = _spec_parts(obj, spec, placed)
        if digest:
            if len(_SPEC_PARTS) >= SPEC_PARTS_LIMIT:
                _SPEC_PARTS.clear()
            _SPEC_PARTS[(digest, placed)] = parts
    error = parts.error
    fields = parts.fields
    signature = parts.signature
    inter_pod: InterPod | None = None
    if error is None:
        try:
            inter_pod = _inter_pod(spec, namespace, labels)
        except (ValueError, TypeError, AttributeError, ArithmeticError, RecursionError) as e:
            error = f"invalid pod spec: {e}"
            fields, signature = _EMPTY_FIELDS, _EMPTY_SIGNATURE
    if not placed:  # a placed pod is not ours to refuse; its requests still count
        error = parts.refusal or error
    return PodRecord(
        key=PodKey(f"{namespace}/{name}"),
        namespace=_intern(namespace),
        name=name,
        scheduler_name=parts.scheduler_name,
        node_name=_intern(spec.get("nodeName") or ""),
        priority=parts.priority,
        labels=labels,
        host_ports=fields["host_ports"],
        requests=fields["requests"],
        node_selector=fields["node_selector"],
        required_terms=fields["required_terms"],
        preferred_terms=fields["preferred_terms"],
        tolerations=fields["tolerations"],
        scheduling_gates=parts.gates,
        parse_error=error,
        signature=signature,
        inter_pod=inter_pod,
        preempt_never=parts.preempt_never,
        images=parts.images,
        controller=_controller(meta),
        claims=parts.claims,
        spec_digest=digest,
        **_status_fields(meta, status),
    )


@dataclass(frozen=True, slots=True)
class _SpecParts:
    """What a pod record takes from ``(namespace, spec)`` alone (the spec's ``nodeName`` only as placed or
    not): the same for every pod of one spec digest, so kept per digest (``_SPEC_PARTS``). The inter-pod terms
    also read the pod's labels (``matchLabelKeys``) and are parsed per pod."""

    fields: dict[str, Any]  # the placement fields (``_placement_fields``), empty ones when they failed
    error: str | None  # why they failed
    signature: tuple[Any, ...]
    refusal: str | None  # ``common.support.unsupported``, for a pod not placed
    images: tuple[str, ...]  # for a pod not placed
    gates: tuple[str, ...]
    priority: int
    claims: tuple[tuple[str, bool, str], ...]
    scheduler_name: str
    preempt_never: bool


def _signature(fields: dict[str, Any]) -> tuple[Any, ...]:
    return shared(  # type: ignore[no-any-return]
        (
            fields["node_selector"],
            fields["required_terms"],
            fields["tolerations"],
            fields["host_ports"],
            tuple(sorted(fields["requests"].scalar)),
        )
    )


_EMPTY_FIELDS = _empty_pod_fields()
_EMPTY_SIGNATURE = _signature(_EMPTY_FIELDS)


def _spec_parts(obj: dict[str, Any], spec: dict[str, Any], placed: bool) -> _SpecParts:
    error: str | None = None
    try:
        fields = _placement_fields(spec)
        signature = _signature(fields)
    except (ValueError, TypeError, AttributeError, ArithmeticError, RecursionError) as e:
        # ValueError includes QuantityError; ArithmeticError an overflowing number (int() of an infinite float)
        error = f"invalid pod spec: {e}"
        fields, signature = _EMPTY_FIELDS, _EMPTY_SIGNATURE
    priority = spec.get("priority")
    return _SpecParts(
        fields=fields,
        error=error,
        signature=signature,
        refusal=None if placed else unsupported(obj),
        images=() if placed else _pod_images(spec),
        gates=tuple(g.get("name", "") for g in spec.get("schedulingGates") or () if isinstance(g, dict)),
        priority=priority if isinstance(priority, int) else 0,
        claims=_claims(spec),
        scheduler_name=_intern(spec.get("schedulerName") or "default-scheduler"),
        preempt_never=spec.get("preemptionPolicy") == "Never",
    )


# (spec digest, placed) -> its parts; cleared when it grows past the bound (sharing is an optimisation)
_SPEC_PARTS: dict[tuple[bytes, bool], _SpecParts] = {}
SPEC_PARTS_LIMIT = 4096


def _start_time(raw: Any) -> float | None:
    """``status.startTime`` as epoch seconds; None when absent or malformed (kube-scheduler then uses now)."""
    if not isinstance(raw, str):
        return None
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError:
        return None
    return moment.timestamp() if moment.tzinfo is not None else None


def label_selector(raw: Any, where: str) -> LabelSelector:
    """A metav1.LabelSelector (``matchLabels``, ``matchExpressions``); null matches nothing. Raises
    ``ValueError`` for a malformed one."""
    return _label_selector(raw, where)


def _controller(meta: dict[str, Any]) -> tuple[str, str, str] | None:
    """The owner reference with ``controller: true`` (metav1.GetControllerOf), if any."""
    for ref in meta.get("ownerReferences") or ():
        if isinstance(ref, dict) and ref.get("controller") is True:
            return (str(ref.get("apiVersion") or ""), str(ref.get("kind") or ""), str(ref.get("name") or ""))
    return None


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
        allocatable = resources_from_list(raw_alloc, "status.allocatable")
    except (ValueError, TypeError, ArithmeticError) as e:  # ValueError includes QuantityError
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
    labels = _interned(dict(meta.get("labels") or {}))
    unschedulable = bool(spec.get("unschedulable"))
    return NodeRecord(
        name=NodeName(_intern(meta.get("name") or "")),
        uid=meta.get("uid") or "",
        resource_version=meta.get("resourceVersion") or "",
        labels=labels,
        taints=taints,
        unschedulable=unschedulable,
        ready=ready,
        allocatable=allocatable,
        allocatable_error=error,
        # everything a static filter reads of the record (NodeReady reads the allocatable's error too)
        static_key=(tuple(sorted(labels.items())), taints, unschedulable, ready, error),
        images=node_images(status.get("images")),
    )
