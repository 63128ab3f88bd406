"""PodDisruptionBudgets, as preemption reads them: which victims would violate a budget.

Fed by a watch of ``policy/v1`` PodDisruptionBudgets (``Budgets`` is the reflector's handler). Preemption
(``worker.preemption``) asks ``split`` to divide a node's potential victims into those whose eviction would
violate a budget and the rest, as kube-scheduler's DefaultPreemption does:

- a budget covers a pod in its namespace whose labels its selector matches; a null or empty selector covers
  nothing, and so does a selector that does not parse (kube-scheduler skips it);
- a pod already listed in the budget's ``status.disruptedPods`` was accounted by the API server: it uses no
  allowance;
- walking the pods in the given order, each covered pod takes one of the budget's
  ``status.disruptionsAllowed``; a pod that takes one the budget no longer has is violating.

The order matters (earlier pods use the allowance first), and ``split`` keeps it within each group.
Invariant: the store holds exactly the budgets of the latest list plus the events since (keyed by
namespace/name); nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common.records import LabelSelector, PodRecord, label_selector


@dataclass(frozen=True, slots=True)
class Budget:
    namespace: str
    name: str
    selector: LabelSelector | None  # None: covers no pod (null, empty or malformed selector)
    allowed: int
    disrupted: frozenset[str]

    def covers(self, pod: PodRecord) -> bool:
        return (
            self.selector is not None
            and pod.namespace == self.namespace
            and bool(pod.labels)
            and self.selector.matches(pod.labels)
        )


def budget_from_json(obj: dict[str, Any]) -> Budget:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    selector: LabelSelector | None
    try:
        selector = label_selector(spec.get("selector"), "spec.selector")
    except ValueError:
        selector = None
    if selector is not None and (selector.nothing or not selector.requirements):
        selector = None
    allowed = status.get("disruptionsAllowed")
    disrupted = status.get("disruptedPods")
    return Budget(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        selector=selector,
        allowed=allowed if isinstance(allowed, int) and not isinstance(allowed, bool) else 0,
        disrupted=frozenset(disrupted) if isinstance(disrupted, dict) else frozenset(),
    )


class Budgets:
    """The PodDisruptionBudgets of the cluster (a ``common.watching.WatchHandler``)."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], Budget] = {}
        self.version = 0  # increases on every change (the preemption memo depends on the budgets)

    def replace(self, objects: list[dict[str, Any]]) -> None:
        budgets = [budget_from_json(o) for o in objects]
        self.items = {(b.namespace, b.name): b for b in budgets}
        self.version += 1

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        b = budget_from_json(obj)
        self.version += 1
        if kind == "DELETED":
            self.items.pop((b.namespace, b.name), None)
        else:
            self.items[(b.namespace, b.name)] = b

    def split(self, pods: Sequence[PodRecord]) -> tuple[list[PodRecord], list[PodRecord]]:
        """(violating, non-violating) in the order of ``pods`` (see the module docstring)."""
        if not self.items:
            return [], list(pods)
        budgets = [b for b in self.items.values() if b.selector is not None]
        left = [b.allowed for b in budgets]
        violating: list[PodRecord] = []
        fine: list[PodRecord] = []
        for pod in pods:
            violated = False
            for i, b in enumerate(budgets):
                if not b.covers(pod) or pod.name in b.disrupted:
                    continue
                left[i] -= 1
                if left[i] < 0:
                    violated = True
            (violating if violated else fine).append(pod)
        return violating, fine
