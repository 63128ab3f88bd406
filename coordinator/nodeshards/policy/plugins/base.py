"""The extension points of the shard policy: one small interface per phase, as in kube-scheduler.

A configured policy (``allocation-rate``, ``warmup``, ``node-limit``) is a ``ShardPlugin`` that also implements
any of the phase interfaces below; the pipeline (``coordinator.nodeshards.policy.pipeline``) discovers which with
``isinstance`` once per scheduler and never names a concrete plugin.

Phases, per scheduler, in Volcano's order:
- ``Filterer``: a node is eligible only if every filter accepts it (AND). ``margin_pct`` widens the filter for a
  node the scheduler already holds (hysteresis); 0 for every other node. No filter means every node passes.
- ``Scorer``: a score in ``[0, 1]``; the pipeline sorts by ``sum(weight * score)`` descending, ties by name.
- ``Selector``: gets the ranked list and returns a prefix of it; selectors run in config order, each on the
  previous one's output. ``reserved`` counts nodes already pinned to the scheduler that occupy its slots.

Plugins are immutable values: ``arguments()`` returns their canonical arguments (what the policy version hashes)
and ``describe()`` a short text for ``agent-scheduler status``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from coordinator.nodeshards.policy.nodes import NodeView


class ShardPlugin(Protocol):
    """Every configured policy."""

    @property
    def name(self) -> str:
        """The registered policy name, as written in ``policies[].name``."""
        ...

    def arguments(self) -> dict[str, object]:
        """Canonical arguments, defaults filled in (hashed into the policy version)."""
        ...

    def describe(self) -> str:
        """A few words for a status line, e.g. ``util 0.70-1.00``."""
        ...


@runtime_checkable
class Filterer(Protocol):
    """Filter phase: may this scheduler have the node at all?"""

    def accepts(self, node: NodeView, margin_pct: int) -> bool: ...


@runtime_checkable
class Scorer(Protocol):
    """Sort phase: how much does this scheduler want the node, in ``[0, 1]``."""

    def score(self, node: NodeView) -> float: ...


@runtime_checkable
class Selector(Protocol):
    """Select phase: keep a subsequence of the ranked list (usually a prefix; never reorder it)."""

    def select(self, ranked: Sequence[NodeView], reserved: int, scheduler: str) -> Sequence[NodeView]:
        """Cut ``ranked`` for ``scheduler`` (the entry's name, its pods' ``schedulerName``); ``reserved`` nodes
        are pinned to it already and not in ``ranked``."""
        ...

    def shortfall(self, selected: int) -> int:
        """How many nodes short of this selector's informational minimum ``selected`` is (0 if none)."""
        ...
