"""Per-topology-domain pod counts for the inter-pod rules (pod affinity, anti-affinity, topology spread).

kube-scheduler's InterPodAffinity and PodTopologySpread plugins build their PreFilter state by walking every
node's pods for each decision. Here the same numbers are kept current by the cache (``worker.cache`` calls
``add``/``remove`` whenever it accounts or unaccounts a pod, bound or assumed, of any scheduler, and
``relabel`` when a node's labels change), so a decision reads them instead of scanning the pods:

- a ``Tracker`` counts the pods matching one pod selector (a conjunction of (namespaces, label selector)
  parts: a spread constraint's selector in the pod's namespace, one anti-affinity term, or all of a pod's
  required affinity terms together, as kube-scheduler counts a pod for affinity only when it matches every
  term). Counts are per node and, for each topology key asked for, per domain (the node label's value; pods on
  nodes without that label are not in a domain). A tracker is made the first time a decision needs it (a walk
  over the pods carrying a label its selector requires, found through a label index kept for the label keys
  selectors were anchored on; over all pods when the selector requires none) and kept while decisions keep using it; at most ``MAX_TRACKERS`` are kept, the least
  recently used dropped first.
- a ``Group`` counts the placed pods carrying one term of their own that an incoming pod is matched against:
  required anti-affinity (the symmetric rule: an existing pod keeps a matching incoming pod out of its domain),
  and the terms kube-scheduler's InterPodAffinity score adds for existing pods (required affinity with weight
  0, which the score reads as its ``hardPodAffinityWeight``; preferred affinity and anti-affinity with their
  weights, negative for anti-affinity). Groups are always
  maintained, one per distinct (term, weight).

Namespaces: a selector part names namespaces (``None``: all) and may also select them by label (a non-empty
``namespaceSelector``), against ``namespace_labels`` (the Namespace objects, fed by ``worker.feeds``). A
Namespace created, relabelled or deleted (``set_namespace``) re-checks only the pods of that namespace against
only the trackers that select namespaces by label, and moves the ones whose verdict changed; for that, while
such a tracker is kept, the accounted pods are also indexed by namespace. Groups need nothing: which incoming
pod a placed pod's term matches is decided per decision, with the incoming pod's Namespace labels.

Trackers and groups are found for a pod through ``_LabelIndex`` (by one ``key In [values]`` requirement of
the selector, when it has one), so accounting a pod costs the selectors that could match it, not all of them.

Invariants:
- For every tracker T and node N: ``T.nodes[N]`` is the number of accounted pods on N that match T (terminating
  pods excluded when ``T.live_only``: PodTopologySpread does not count them, InterPodAffinity does); each
  ``T.domains[key][v]`` is the sum of ``T.nodes[N]`` over nodes labelled ``key=v``. The same for groups with
  the group's own topology key. Zero counts are deleted, so an empty mapping means no pod at all.
- A tracker's counts are those of ``matches`` under the current ``namespace_labels`` (a namespace without an
  object is selected by name only).
- ``version`` changes whenever any count, any node's labels or any Namespace's labels change, so per-decision state computed from these
  counts is valid exactly while it is unchanged; ``node_version`` whenever a node is added, removed or relabelled
  (the set of domains and which nodes a pod's spread counts include).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Generic, TypeVar

from common.records import LabelSelector, NodeName, PodKey, PodRecord, PodTerm
from worker.nodeinfo import NodeInfo

MAX_TRACKERS = 4096

# (namespaces, label selector, namespace selector): the pod's namespace is in ``namespaces`` (None: any) or
# its Namespace object's labels match the namespace selector (None: none selected that way)
Part = tuple[frozenset[str] | None, LabelSelector, LabelSelector | None]
Match = tuple[Part, ...]
NamespaceLabels = dict[str, dict[str, str]]


def incoming(
    namespaces: frozenset[str] | None, selector: LabelSelector, ns_selector: LabelSelector | None
) -> Part:
    """The part for one term of the pod being decided, as kube-scheduler v1.36 matches it: its PreFilter adds
    the namespaces the ``namespaceSelector`` selects to the term's names but keeps the selector on (it resets a
    copy), and matches placed pods against it with no namespace labels; so a selector that an empty label set
    satisfies (only ``DoesNotExist`` or ``NotIn`` requirements) selects every namespace."""
    if ns_selector is not None and ns_selector.matches({}):
        return (None, selector, None)
    return (namespaces, selector, ns_selector)


def matches(match: Match, pod: PodRecord, ns_labels: dict[str, str] | None = None) -> bool:
    """Whether ``pod`` matches every part; ``ns_labels`` are the labels of its Namespace object, None when
    that is not known. As kube-scheduler unrolls an incoming pod's ``namespaceSelector`` into the names of the
    Namespace objects it selects, a namespace without an object is never selected by label."""
    for namespaces, selector, ns_selector in match:
        if (
            namespaces is not None
            and pod.namespace not in namespaces
            and (ns_selector is None or ns_labels is None or not ns_selector.matches(ns_labels))
        ):
            return False
        if not selector.matches(pod.labels):
            return False
    return True


def _bump(counts: dict[str, int], value: str, delta: int) -> None:
    left = counts.get(value, 0) + delta
    if left:
        counts[value] = left
    else:
        counts.pop(value, None)


class Tracker:
    """Pods matching ``match``, per node and per domain of the topology keys asked for."""

    __slots__ = ("affinity", "by_namespace_labels", "domains", "live_only", "match", "namespaces", "nodes")

    def __init__(self, match: Match, live_only: bool, namespaces: NamespaceLabels) -> None:
        self.match = match
        self.live_only = live_only
        self.namespaces = namespaces  # the counts' Namespace labels, shared (read, never written here)
        # some part selects namespaces by label: the counts depend on Namespace labels too
        self.by_namespace_labels = any(ns_selector is not None for _, _, ns_selector in match)
        self.affinity = False  # some pod's required affinity uses it: a matching pod may help a waiting one
        self.nodes: dict[NodeName, int] = {}
        self.domains: dict[str, dict[str, int]] = {}

    def counts(self, key: str, nodes: dict[NodeName, NodeInfo]) -> dict[str, int]:
        """Matching pods per value of ``key`` (kept current from the first call on)."""
        d = self.domains.get(key)
        if d is None:
            d = self.domains[key] = {}
            for name, n in self.nodes.items():
                value = nodes[name].node.labels.get(key)
                if value is not None:
                    d[value] = d.get(value, 0) + n
        return d

    def wants(self, pod: PodRecord) -> bool:
        return self.wants_in(pod, self.namespaces.get(pod.namespace))

    def wants_in(self, pod: PodRecord, ns_labels: dict[str, str] | None) -> bool:
        """``wants`` with the pod's Namespace labels given (before or after a Namespace change)."""
        return not (self.live_only and pod.deleting) and matches(self.match, pod, ns_labels)

    def change(self, name: NodeName, labels: dict[str, str], delta: int) -> None:
        _bump_node(self.nodes, name, delta)
        for key, d in self.domains.items():
            value = labels.get(key)
            if value is not None:
                _bump(d, value, delta)

    def relabel(self, name: NodeName, old: dict[str, str], new: dict[str, str]) -> None:
        n = self.nodes.get(name)
        if not n:
            return
        for key, d in self.domains.items():
            before, after = old.get(key), new.get(key)
            if before != after:
                if before is not None:
                    _bump(d, before, -n)
                if after is not None:
                    _bump(d, after, n)


def _bump_node(counts: dict[NodeName, int], name: NodeName, delta: int) -> None:
    left = counts.get(name, 0) + delta
    if left:
        counts[name] = left
    else:
        counts.pop(name, None)


class Group:
    """Placed pods carrying ``term`` (with ``weight``), per node and per domain of the term's topology key."""

    __slots__ = ("domains", "nodes", "term", "weight")

    def __init__(self, term: PodTerm, weight: int) -> None:
        self.term = term
        self.weight = weight
        self.nodes: dict[NodeName, int] = {}
        self.domains: dict[str, int] = {}

    def change(self, name: NodeName, labels: dict[str, str], delta: int) -> None:
        _bump_node(self.nodes, name, delta)
        value = labels.get(self.term.topology_key)
        if value is not None:
            _bump(self.domains, value, delta)

    def relabel(self, name: NodeName, old: dict[str, str], new: dict[str, str]) -> None:
        n = self.nodes.get(name)
        key = self.term.topology_key
        if n and old.get(key) != new.get(key):
            if key in old:
                _bump(self.domains, old[key], -n)
            if key in new:
                _bump(self.domains, new[key], n)


T = TypeVar("T", Tracker, Group)


def _anchor(selector: LabelSelector) -> tuple[str, tuple[str, ...]] | None:
    """A ``key In [values]`` requirement every matching pod satisfies, to index the selector by."""
    if selector.nothing:
        return None
    for req in selector.requirements:
        if req.operator == "In":
            return req.key, req.values
    return None


class _LabelIndex(Generic[T]):
    """Items by one (label key, value) their selector requires; items without such a requirement are always
    candidates."""

    def __init__(self) -> None:
        self.by_label: dict[tuple[str, str], dict[int, T]] = {}
        self.anywhere: dict[int, T] = {}

    def add(self, item: T, selector: LabelSelector) -> None:
        anchor = _anchor(selector)
        if anchor is None:
            self.anywhere[id(item)] = item
            return
        key, values = anchor
        for v in values:
            self.by_label.setdefault((key, v), {})[id(item)] = item

    def remove(self, item: T, selector: LabelSelector) -> None:
        anchor = _anchor(selector)
        if anchor is None:
            self.anywhere.pop(id(item), None)
            return
        key, values = anchor
        for v in values:
            bucket = self.by_label.get((key, v))
            if bucket is not None:
                bucket.pop(id(item), None)
                if not bucket:
                    del self.by_label[(key, v)]

    def candidates(self, labels: dict[str, str]) -> Iterator[T]:
        yield from self.anywhere.values()
        if self.by_label:
            for kv in labels.items():
                bucket = self.by_label.get(kv)
                if bucket:
                    yield from bucket.values()

    def __bool__(self) -> bool:
        return bool(self.anywhere or self.by_label)


class _Groups:
    """Groups by (term, weight), indexed by label; a group is dropped when its last pod goes."""

    def __init__(self) -> None:
        self.groups: dict[tuple[PodTerm, int], Group] = {}
        self.index: _LabelIndex[Group] = _LabelIndex()

    def change(self, key: tuple[PodTerm, int], name: NodeName, labels: dict[str, str], delta: int) -> None:
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = Group(*key)
            self.index.add(g, g.term.selector)
        g.change(name, labels, delta)
        if not g.nodes:
            del self.groups[key]
            self.index.remove(g, g.term.selector)


class TopologyCounts:
    """The cache's inter-pod counts (see the module docstring); ``nodes`` is the cache's node map."""

    def __init__(self, nodes: dict[NodeName, NodeInfo]) -> None:
        self.nodes = nodes
        self.trackers: OrderedDict[tuple[Match, bool], Tracker] = OrderedDict()
        self._tracker_index: _LabelIndex[Tracker] = _LabelIndex()
        # required anti-affinity terms of placed pods
        self._anti = _Groups()
        self.anti_groups = self._anti.groups
        # placed pods' terms that score an incoming pod, by (term, signed weight)
        self._score = _Groups()
        self.score_groups = self._score.groups
        # (label key, value) -> the accounted pods carrying it, with their node, for the label keys some
        # tracker's selector was anchored on: a new tracker walks only the pods carrying its anchor label
        self._by_label: dict[tuple[str, str], dict[PodKey, tuple[PodRecord, NodeName]]] = {}
        self._indexed: set[str] = set()
        # Namespace name -> its labels (the Namespace objects the worker watches), for namespaceSelectors
        self.namespace_labels: NamespaceLabels = {}
        # trackers whose match selects namespaces by label, and, while there is one, the accounted pods by
        # namespace: a Namespace relabelled re-checks only its own pods against only these trackers
        self._ns_trackers: dict[int, Tracker] = {}
        self._by_namespace: dict[str, dict[PodKey, tuple[PodRecord, NodeName]]] | None = None
        self.version = 0
        self.node_version = 0

    # ----- what decisions read -----------------------------------------------------------------------------

    def tracker(self, match: Match, *, live_only: bool) -> Tracker:
        """The tracker for ``match``, made (one walk over the placed pods) if it is not kept yet."""
        key = (match, live_only)
        t = self.trackers.get(key)
        if t is not None:
            self.trackers.move_to_end(key)
            return t
        t = Tracker(match, live_only, self.namespace_labels)
        if t.by_namespace_labels:
            self._index_namespaces()
            self._ns_trackers[id(t)] = t
        anchored = match[0][1] if len(match) == 1 else _first_anchored(match)
        anchor = _anchor(anchored)
        if anchor is not None:
            # only the pods carrying one of the anchor's labels can match
            label, values = anchor
            self._index_label(label)
            for value in values:
                for pod, name in self._by_label.get((label, value), {}).values():
                    if t.wants(pod):
                        t.nodes[name] = t.nodes.get(name, 0) + 1
        else:
            for name, info in self.nodes.items():
                n = sum(1 for p in info.pods.values() if t.wants(p))
                if n:
                    t.nodes[name] = n
        self.trackers[key] = t
        self._tracker_index.add(t, anchored)
        if len(self.trackers) > MAX_TRACKERS:
            _, old = self.trackers.popitem(last=False)
            self._ns_trackers.pop(id(old), None)
            if not self._ns_trackers:
                self._by_namespace = None
            self._tracker_index.remove(
                old, old.match[0][1] if len(old.match) == 1 else _first_anchored(old.match)
            )
        return t

    def _index_label(self, label: str) -> None:
        """Start indexing the pods by ``label`` (one walk over the pods, once per label key)."""
        if label in self._indexed:
            return
        self._indexed.add(label)
        for name, info in self.nodes.items():
            for pod in info.pods.values():
                value = pod.labels.get(label)
                if value is not None:
                    self._by_label.setdefault((label, value), {})[pod.key] = (pod, name)

    def _index_namespaces(self) -> None:
        """Start indexing the accounted pods by namespace (one walk over the pods)."""
        if self._by_namespace is not None:
            return
        index: dict[str, dict[PodKey, tuple[PodRecord, NodeName]]] = {}
        for name, info in self.nodes.items():
            for pod in info.pods.values():
                index.setdefault(pod.namespace, {})[pod.key] = (pod, name)
        self._by_namespace = index

    def helps(self, pod: PodRecord) -> bool:
        """Whether ``pod`` matches a tracker some pod's required affinity uses."""
        return any(t.affinity and t.wants(pod) for t in self._tracker_index.candidates(pod.labels))

    def anti_against(self, pod: PodRecord) -> Iterator[Group]:
        """Groups of placed pods whose required anti-affinity term matches ``pod`` (the symmetric rule)."""
        if not self.anti_groups:
            return
        for g in self._anti.index.candidates(pod.labels):
            if g.domains and g.term.matches(
                pod.namespace, pod.labels, self.namespace_labels.get(pod.namespace)
            ):
                yield g

    def scoring(self, pod: PodRecord) -> Iterator[Group]:
        """Groups of placed pods whose scoring terms match ``pod``."""
        if not self.score_groups:
            return
        for g in self._score.index.candidates(pod.labels):
            if g.domains and g.term.matches(
                pod.namespace, pod.labels, self.namespace_labels.get(pod.namespace)
            ):
                yield g

    # ----- kept current by the cache ------------------------------------------------------------------------

    def add(self, pod: PodRecord, info: NodeInfo) -> bool:
        """``pod`` is now accounted on ``info``'s node. True when it matches some pod's required affinity (it
        may make a waiting pod schedulable)."""
        return self._change(pod, info, 1)

    def remove(self, pod: PodRecord, info: NodeInfo) -> None:
        self._change(pod, info, -1)

    def _change(self, pod: PodRecord, info: NodeInfo, delta: int) -> bool:
        self.version += 1
        name = NodeName(info.node.name)
        labels = info.node.labels
        helps = False
        by_label = self._by_label
        for label in self._indexed:
            value = pod.labels.get(label)
            if value is None:
                continue
            if delta > 0:
                by_label.setdefault((label, value), {})[pod.key] = (pod, name)
            else:
                bucket = by_label.get((label, value))
                if bucket is not None:
                    bucket.pop(pod.key, None)
                    if not bucket:
                        del by_label[(label, value)]
        by_namespace = self._by_namespace
        if by_namespace is not None:
            if delta > 0:
                by_namespace.setdefault(pod.namespace, {})[pod.key] = (pod, name)
            else:
                pods = by_namespace.get(pod.namespace)
                if pods is not None:
                    pods.pop(pod.key, None)
                    if not pods:
                        del by_namespace[pod.namespace]
        if self.trackers:
            for t in self._tracker_index.candidates(pod.labels):
                if t.wants(pod):
                    t.change(name, labels, delta)
                    helps = helps or t.affinity
        rules = pod.inter_pod
        if rules is not None:
            for term in rules.anti_affinity:
                self._anti.change((term, 0), name, labels, delta)
            # weight 0: a required affinity term, which scores with the plugin's hardPodAffinityWeight
            for term in rules.affinity:
                self._score.change((term, 0), name, labels, delta)
            for weight, term in rules.preferred_affinity:
                self._score.change((term, weight), name, labels, delta)
            for weight, term in rules.preferred_anti_affinity:
                self._score.change((term, -weight), name, labels, delta)
        return helps

    def relabel(self, name: NodeName, old: dict[str, str], new: dict[str, str]) -> None:
        """A node's labels changed from ``old`` to ``new`` (or it was added or removed)."""
        self.version += 1
        self.node_version += 1
        if old == new:
            return
        for t in self.trackers.values():
            t.relabel(name, old, new)
        for groups in (self.anti_groups.values(), self.score_groups.values()):
            for g in groups:
                g.relabel(name, old, new)

    def set_namespace(self, name: str, labels: dict[str, str] | None) -> bool:
        """Namespace ``name`` now has ``labels`` (None: it was deleted). The trackers selecting namespaces by
        label count or uncount the pods of that namespace whose match changed. True when a pod started to
        count for some pod's required affinity (it may make a waiting pod schedulable)."""
        old = self.namespace_labels.get(name)
        if old == labels:
            return False
        self.version += 1
        if labels is None:
            del self.namespace_labels[name]
        else:
            self.namespace_labels[name] = labels
        helps = False
        pods = self._by_namespace.get(name) if self._by_namespace is not None else None
        if not pods:
            return False
        for t in self._ns_trackers.values():
            for pod, node in pods.values():
                before, after = t.wants_in(pod, old), t.wants_in(pod, labels)
                if before != after:
                    t.change(node, self.nodes[node].node.labels, 1 if after else -1)
                    helps = helps or (after and t.affinity)
        return helps

    def replace_namespaces(self, namespaces: dict[str, dict[str, str]]) -> bool:
        """Every Namespace (a relist): the ones not listed are gone."""
        helps = False
        for name in [n for n in self.namespace_labels if n not in namespaces]:
            helps = self.set_namespace(name, None) or helps
        for name, labels in namespaces.items():
            helps = self.set_namespace(name, labels) or helps
        return helps

    def statistics(self) -> dict[str, int]:
        return {
            "trackers": len(self.trackers),
            "anti_affinity_groups": len(self.anti_groups),
            "scoring_groups": len(self.score_groups),
        }


def _first_anchored(match: Match) -> LabelSelector:
    """For a conjunction, the first part's selector with an anchor (any part must match, so any anchors it)."""
    for _, selector, _ in match:
        if _anchor(selector) is not None:
            return selector
    return match[0][1]
