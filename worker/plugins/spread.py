"""PodTopologySpread, as kube-scheduler defines it (node inclusion policies enabled, as in v1.36).

Filter (``DoNotSchedule`` constraints): a node without a constraint's topology key is rejected (unresolvable);
otherwise the pods matching the constraint's selector in the pod's namespace in the node's domain, plus one if
the pod matches its own selector, minus the global minimum, must not exceed ``maxSkew``. The domains and counts
are those of the eligible nodes: nodes carrying every hard constraint's key and passing the constraint's
``nodeAffinityPolicy`` (Honor, the default: the pod's nodeSelector and required node affinity) and
``nodeTaintsPolicy`` (Honor: no untolerated NoSchedule/NoExecute taint; Ignore is the default). The global
minimum is the smallest count over the eligible domains, or 0 when there are fewer of them than
``minDomains``. Terminating pods are not counted.

Score (``ScheduleAnyway`` constraints): kube-scheduler's PodTopologySpread score: per node, for each constraint
whose key it has, the matching pods in its domain (on the node itself for ``kubernetes.io/hostname``) times
log(number of domains among the candidates + 2), plus ``maxSkew - 1``; nodes lacking a key score 0; the rest
are normalized so fewer matching pods score higher.

Default constraints (kube-scheduler's ``PodTopologySpreadArgs``): a pod that states no constraint gets the
configured defaults, with the selector deduced from the Services and controllers selecting it
(``worker.workloads``); a pod that no such object selects gets none. ``defaultingType: System`` (the default)
is kube-scheduler's: hostname maxSkew 3 and zone maxSkew 5, ScheduleAnyway, and, as there, nodes lacking one
of these keys are still scored on the keys they have (a node without a zone label competes on its hostname
count; the zone's domain count then includes the unlabelled nodes as one domain, as kube's counts do).
``defaultingType: List`` uses ``defaultConstraints`` as given (each without a selector; DoNotSchedule ones
filter too); an empty list turns defaults off.

Counts come from the cache's trackers (``worker.topology``). Which nodes are eligible depends only on the
nodes and the pod's node rules, so it is computed once per (node rules, policies, keys) and kept until a node
is added, removed or relabelled; when every node with the key is eligible, the tracker's per-domain counts are
used directly, otherwise the tracker's per-node counts are summed over the eligible nodes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from common.records import LabelSelector, NodeName, PodRecord, SpreadConstraint, spread_constraint_from_json
from worker.framework import Status
from worker.nodeinfo import NodeInfo
from worker.plugins.affinity import _verdict as node_affinity_verdict
from worker.plugins.taints import tolerated

if TYPE_CHECKING:
    from worker.cache import Cache

HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
SYSTEM = "System"
LIST = "List"
_ANY = LabelSelector(())  # replaced by the pod's default selector
SYSTEM_DEFAULTS = (
    SpreadConstraint(3, HOSTNAME, False, _ANY, 1, True, False),
    SpreadConstraint(5, ZONE, False, _ANY, 1, True, False),
)


@dataclass(frozen=True, slots=True)
class SpreadDefaults:
    """The default constraints of pods that state none; ``system``: kube's System defaulting."""

    constraints: tuple[SpreadConstraint, ...] = SYSTEM_DEFAULTS
    system: bool = True


def spread_defaults(args: Mapping[str, Any]) -> SpreadDefaults:
    """``PodTopologySpreadArgs`` (``defaultingType``, ``defaultConstraints``) validated as kube-scheduler does;
    raises ValueError naming the field."""
    kind = args.get("defaultingType") or SYSTEM
    raw = args.get("defaultConstraints") or []
    if kind not in (SYSTEM, LIST):
        raise ValueError(f"defaultingType: {kind!r} is not one of System, List")
    if not isinstance(raw, list):
        raise ValueError("defaultConstraints: expected a list")
    if kind == SYSTEM:
        if raw:
            raise ValueError("defaultingType: System cannot be used when defaultConstraints are not empty")
        return SpreadDefaults()
    constraints: list[SpreadConstraint] = []
    seen: set[tuple[str, bool]] = set()
    for i, item in enumerate(raw):
        where = f"defaultConstraints[{i}]"
        if isinstance(item, dict):
            for forbidden in ("labelSelector", "matchLabelKeys"):
                if item.get(forbidden):
                    raise ValueError(f"{where}.{forbidden}: must not be set: it is deduced for each pod")
        c = spread_constraint_from_json(item, where)
        if (c.topology_key, c.hard) in seen:
            raise ValueError(f"{where}: duplicate topologyKey and whenUnsatisfiable")
        seen.add((c.topology_key, c.hard))
        constraints.append(replace(c, selector=_ANY))
    return SpreadDefaults(tuple(constraints), system=False)


SKEW = Status.unschedulable("node(s) didn't match pod topology spread constraints")
MISSING_LABEL = Status.unresolvable(
    "node(s) didn't match pod topology spread constraints (missing required label)"
)
_MEMO_LIMIT = 1024

Counts = dict[str, int]


class _Eligible:
    __slots__ = ("complete", "domains", "nodes")

    def __init__(self, nodes: frozenset[NodeName], domains: frozenset[str], complete: bool) -> None:
        self.nodes = nodes
        self.domains = domains
        self.complete = complete  # every known node with the key is eligible


class _Spread:
    """Shared by the filter and the score: eligible nodes and per-domain counts for one constraint."""

    def __init__(self, defaults: SpreadDefaults) -> None:
        self.cache: Cache | None = None
        self.defaults = defaults
        self._memo: dict[tuple[Any, ...], tuple[int, _Eligible]] = {}
        # (pod, workloads version, its default constraints): the last pod's, computed once per decision
        self._defaulted: tuple[PodRecord | None, int, tuple[SpreadConstraint, ...]] = (None, -1, ())

    def attach(self, cache: Cache) -> None:
        self.cache = cache

    def constraints(self, pod: PodRecord) -> tuple[tuple[SpreadConstraint, ...], bool]:
        """The pod's constraints, else the defaults with its default selector (none when nothing selects
        it); and whether they are kube's system defaults."""
        rules = pod.inter_pod
        if rules is not None and rules.spread:
            return rules.spread, False
        if not self.defaults.constraints:
            return (), False
        assert self.cache is not None, "PodTopologySpread used without a cache"
        workloads = self.cache.workloads
        if pod.controller is None and pod.namespace not in workloads.services:
            return (), False  # nothing can select the pod (the common agent pod): no default constraint
        last, version, constraints = self._defaulted
        if last is not pod or version != workloads.version:
            selector = workloads.default_selector(pod)
            constraints = (
                ()
                if selector is None
                else tuple(replace(c, selector=selector) for c in self.defaults.constraints)
            )
            self._defaulted = (pod, workloads.version, constraints)
        return constraints, self.defaults.system

    def eligible(self, pod: PodRecord, keys: tuple[str, ...], c: SpreadConstraint) -> _Eligible:
        assert self.cache is not None, "PodTopologySpread used without a cache"
        cache = self.cache
        memo_key = (
            keys,
            c.topology_key,
            (pod.node_selector, pod.required_terms) if c.honor_affinity else None,
            pod.tolerations if c.honor_taints else None,
        )
        version = cache.topology.node_version
        entry = self._memo.get(memo_key)
        if entry is not None and entry[0] == version:
            return entry[1]
        nodes: list[NodeName] = []
        domains: set[str] = set()
        complete = True
        key = c.topology_key
        for name in cache.known:
            info = cache.nodes[name]
            labels = info.node.labels
            value = labels.get(key)
            if value is None:
                continue
            if (
                any(k not in labels for k in keys)
                or (c.honor_affinity and node_affinity_verdict(pod, info) is not None)
                or (
                    c.honor_taints
                    and any(
                        t.effect in ("NoSchedule", "NoExecute") and not tolerated(t, pod.tolerations)
                        for t in info.node.taints
                    )
                )
            ):
                complete = False
                continue
            nodes.append(name)
            domains.add(value)
        result = _Eligible(frozenset(nodes), frozenset(domains), complete)
        if len(self._memo) >= _MEMO_LIMIT:
            self._memo.clear()
        self._memo[memo_key] = (version, result)
        return result

    def counts(self, pod: PodRecord, keys: tuple[str, ...], c: SpreadConstraint) -> tuple[Counts, int, int]:
        """(matching pods per eligible domain with any, the number of eligible domains, the global minimum
        before minDomains) for constraint ``c``; domains absent from the mapping hold no matching pod."""
        assert self.cache is not None
        cache = self.cache
        tracker = cache.topology.tracker(((frozenset((pod.namespace,)), c.selector, None),), live_only=True)
        eligible = self.eligible(pod, keys, c)
        key = c.topology_key
        if eligible.complete:
            counts = tracker.counts(key, cache.nodes)
        else:
            counts = {}
            for name, n in tracker.nodes.items():
                if name in eligible.nodes:
                    value = cache.nodes[name].node.labels[key]
                    counts[value] = counts.get(value, 0) + n
        domains = len(eligible.domains)
        low = 0 if len(counts) < domains else min(counts.values(), default=0)
        return counts, domains, low


class PodTopologySpreadFilter(_Spread):
    name = "PodTopologySpread"
    static = False

    def __init__(self, defaults: SpreadDefaults) -> None:
        super().__init__(defaults)
        self._pod: PodRecord | None = None
        self._version: tuple[int, int] = (-1, -1)
        # default constraints that filter (List defaulting with DoNotSchedule ones)
        self._hard_defaults = any(c.hard for c in defaults.constraints)
        # (key, counts, global minimum, maxSkew, self match) per hard constraint
        self._state: list[tuple[str, Counts, int, int, int]] = []

    def _prepare(self, pod: PodRecord) -> list[tuple[str, Counts, int, int, int]]:
        assert self.cache is not None, "PodTopologySpread used without a cache"
        version = (self.cache.topology.version, self.cache.workloads.version)
        if pod is self._pod and version == self._version:
            return self._state
        state: list[tuple[str, Counts, int, int, int]] = []
        hard = [c for c in self.constraints(pod)[0] if c.hard]
        keys = tuple(sorted({c.topology_key for c in hard}))
        for c in hard:
            counts, domains, low = self.counts(pod, keys, c)
            if domains < c.min_domains:
                low = 0
            state.append((c.topology_key, counts, low, c.max_skew, int(c.selector.matches(pod.labels))))
        self._pod, self._version, self._state = pod, version, state
        return state

    def applies(self, pod: PodRecord) -> bool:
        rules = pod.inter_pod
        if rules is not None and rules.spread:
            return any(c.hard for c in rules.spread)
        return self._hard_defaults and any(c.hard for c in self.constraints(pod)[0])

    def node_pods(self, pod: PodRecord) -> bool:
        # the pod's hard constraints, its own or the configured defaults a Service or controller gives it
        return self.applies(pod)

    def filter(self, pod: PodRecord, node: NodeInfo) -> Status | None:
        labels = node.node.labels
        for key, counts, low, max_skew, self_match in self._prepare(pod):
            value = labels.get(key)
            if value is None:
                return MISSING_LABEL
            if counts.get(value, 0) + self_match - low > max_skew:
                return SKEW
        return None


class PodTopologySpreadScore(_Spread):
    name = "PodTopologySpreadScore"

    def applies(self, pod: PodRecord) -> bool:
        return any(not c.hard for c in self.constraints(pod)[0])

    def scores(self, pod: PodRecord, nodes: list[NodeInfo]) -> list[float]:
        constraints, system = self.constraints(pod)
        soft = [c for c in constraints if not c.hard]
        if system:
            # kube's requireAllTopologies is off for system defaults: no node is left unscored for lacking
            # a key, and a domain's counts need only that constraint's own key on a node
            keys: tuple[str, ...] = ()
            scored = [True] * len(nodes)
        else:
            keys = tuple(sorted({c.topology_key for c in soft}))
            scored = [all(k in info.node.labels for k in keys) for info in nodes]
        totals = [0.0] * len(nodes)
        assert self.cache is not None, "PodTopologySpread used without a cache"
        for c in soft:
            key = c.topology_key
            counts: Counts = {}
            tracker = None
            if key == HOSTNAME:
                # per node, whatever the inclusion policies, as kube-scheduler's Score counts it
                size = sum(scored)
                tracker = self.cache.topology.tracker(
                    ((frozenset((pod.namespace,)), c.selector, None),), live_only=True
                )
            else:
                # a scored node without the key is the domain "" in kube's count of domains
                size = len(
                    {info.node.labels.get(key, "") for info, ok in zip(nodes, scored, strict=True) if ok}
                )
                counts = self.counts(pod, keys, c)[0]
            weight = math.log(size + 2)
            for i, info in enumerate(nodes):
                value = info.node.labels.get(key)
                if not scored[i] or value is None:
                    continue
                if tracker is not None:
                    n = tracker.nodes.get(NodeName(info.node.name), 0)
                else:
                    n = counts.get(value, 0)
                totals[i] += n * weight + (c.max_skew - 1)
        raw = [round(t) for t in totals]
        valid = [r for r, ok in zip(raw, scored, strict=True) if ok]
        if not valid:
            return [0.0] * len(nodes)
        low, high = min(valid), max(valid)
        out: list[float] = []
        for r, ok in zip(raw, scored, strict=True):
            if not ok:
                out.append(0.0)
            elif high == 0:
                out.append(100.0)
            else:
                out.append(float(100 * (high + low - r) // high))
        return out


def pod_topology_spread_filter(args: Mapping[str, Any]) -> PodTopologySpreadFilter:
    return PodTopologySpreadFilter(spread_defaults(args))


def pod_topology_spread_score(args: Mapping[str, Any]) -> PodTopologySpreadScore:
    return PodTopologySpreadScore(spread_defaults(args))
