"""The plugin framework: status codes, the Filter and Score interfaces, and the registry.

Policy apart from mechanism: the engine, cache and queue never import a concrete plugin; they get plugin
instances from ``Registry.build(profile)``. A plugin is pure over the pod record and the node's state in the
cache: it never does I/O and never mutates what it is given. The inter-pod plugins also read the cache's
per-domain counts (``worker.topology``, given through ``attach(cache)``); asking for a selector's counts may
make the cache start keeping them, which changes no count.

Two kinds of filter:
- *static* filters depend only on the node record (labels, taints, readiness) and on the pod's placement
  signature, so the engine caches their verdict per (signature, node) until the node's record changes;
- dynamic filters (resources, host ports, inter-pod rules) depend on what is placed on the node (or, for the
  inter-pod rules, in its topology domain) and run every time; one with an ``applies(pod)`` method runs only
  for the pods it applies to.

Every filter declares, per pod, whether its verdict may depend on the pods placed (``node_pods``): preemption's
arithmetic dry run (``worker.preemption``) trusts that answer to skip re-running a filter with victims set
aside, so ``Registry.build`` refuses a filter that does not declare it (a new filter is never silently taken
for one whose verdict ignores the pods). A filter that cannot tell answers True.

What a batch may keep (``worker.engine``'s batched decisions of pods of one shape): a dynamic filter without
``applies`` reads only the pod's signature and requests and the node's ``NodeInfo``; a score plugin with a
``batch_key(pod)`` method is *node-local*: its score of a node is a function of that key and of the node's
``NodeInfo`` alone (whatever else it reads, such as cluster-wide image counts, is part of the key), never
normalized over the nodes it is given. A shape always holds the pod's signature and requests, so a key need
not repeat them. Any change of a ``NodeInfo`` bumps its ``generation``, so a verdict or node-local score kept
for a shape stays exact while the node's generation does. A plugin that cannot promise that has no
``batch_key`` and is computed again for every decision. A node-local plugin with ``batch_fresh = True`` is left
out of the shape and scored for every decision (a key that changes every few pods, such as a session, would
otherwise split a template's pods into many shapes). Every decision, batched or not, sums the kept node-local
scores first, then the ``batch_fresh`` ones, then those without ``batch_key``, each group in profile order.

Status codes, not exceptions, for expected outcomes (kube-scheduler's codes):
- ``UNSCHEDULABLE``: the node cannot take the pod now; the pod waits in the unschedulable pool and moves back
  when an event (a node change, a pod deletion) could help it.
- ``UNRESOLVABLE`` (UnschedulableAndUnresolvable): the pod can never fit this node as it is; same pod fate,
  but it tells the operator that deleting pods will not help.
- ``ERROR``: an internal failure; the pod goes to the backoff queue.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from common.records import PodRecord
from worker.nodeinfo import NodeInfo


class Code(enum.IntEnum):
    SUCCESS = 0
    UNSCHEDULABLE = 1
    UNRESOLVABLE = 2
    ERROR = 3


@dataclass(frozen=True, slots=True)
class Status:
    """Why a node was rejected: one or more kube-scheduler-shaped reasons ("Insufficient cpu")."""

    code: Code
    reasons: tuple[str, ...]

    @staticmethod
    def unschedulable(*reasons: str) -> Status:
        return Status(Code.UNSCHEDULABLE, reasons)

    @staticmethod
    def unresolvable(*reasons: str) -> Status:
        return Status(Code.UNRESOLVABLE, reasons)


class FilterPlugin(Protocol):
    name: str
    static: bool

    def filter(self, pod: PodRecord, node: NodeInfo) -> Status | None:
        """None when the node can take the pod, else why not."""

    def node_pods(self, pod: PodRecord) -> bool:
        """May this filter's verdict for ``pod`` change when pods are added to or removed from a node (the
        node's own pods, or those in its topology domain)? False only when it certainly cannot: a static
        filter, or a dynamic one that passes every node for this pod whatever is placed."""


class ScorePlugin(Protocol):
    name: str

    def applies(self, pod: PodRecord) -> bool:
        """False when the plugin would give every node the same score for this pod (it is then skipped)."""

    def scores(self, pod: PodRecord, nodes: list[NodeInfo]) -> list[float]:
        """One score on 0..100 per candidate node, normalized over the candidates where the plugin's raw
        scores are relative (kube-scheduler's Score + NormalizeScore in one call, to keep the per-node cost
        of the hot path to one list comprehension)."""


class NodeLocalScore(ScorePlugin, Protocol):
    """A score plugin whose scores a batch may keep per node (see the module docstring)."""

    def batch_key(self, pod: PodRecord) -> Hashable:
        """Everything of the pod (and of the cluster beyond the node) that the node's score depends on."""


PluginFactory = Callable[[Mapping[str, Any]], Any]


@dataclass(slots=True)
class Profile:
    """Which plugins run, in order, and the weights of the scores. Arguments go to each factory."""

    filters: list[str]
    scores: dict[str, int]
    args: dict[str, dict[str, Any]] = field(default_factory=dict)


class Registry:
    """Maps plugin names to factories; the only place concrete plugins are named."""

    def __init__(self) -> None:
        self._factories: dict[str, PluginFactory] = {}

    def register(self, name: str, factory: PluginFactory) -> None:
        if name in self._factories:
            raise ValueError(f"plugin {name!r} registered twice")
        self._factories[name] = factory

    def names(self) -> list[str]:
        return sorted(self._factories)

    def build(self, profile: Profile) -> tuple[list[FilterPlugin], list[tuple[ScorePlugin, int]]]:
        unknown = [n for n in [*profile.filters, *profile.scores] if n not in self._factories]
        if unknown:
            raise ValueError(f"unknown plugins {unknown}; known: {self.names()}")
        filters: list[FilterPlugin] = [self._factories[n](profile.args.get(n, {})) for n in profile.filters]
        undeclared = [
            n
            for n, f in zip(profile.filters, filters, strict=True)
            if not callable(getattr(f, "node_pods", None))
        ]
        if undeclared:
            # preemption's arithmetic dry run relies on the declaration (see the module docstring)
            raise ValueError(f"filter plugins {undeclared} do not declare node_pods(pod)")
        scores: list[tuple[ScorePlugin, int]] = []
        for name, weight in profile.scores.items():
            if weight < 0:
                raise ValueError(f"score plugin {name!r}: negative weight {weight}")
            if weight:
                scores.append((self._factories[name](profile.args.get(name, {})), weight))
        return filters, scores
