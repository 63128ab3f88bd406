"""``node-limit``: truncate the ranked list to ``maxNodes`` (a selector only).

``minNodes`` is informational, as in Volcano: the policy cannot create nodes, so a shorter result is reported
(``ShardEvaluation.shortfall``) but never padded. ``maxNodes`` absent means no upper bound; unlike Volcano, where
``maxNodes <= 0`` also means "unbounded", an explicit zero or negative value is rejected here, because
``maxNodes: 0`` reads as "no nodes" and silently meaning the opposite is a trap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from coordinator.nodeshards.policy import fields
from coordinator.nodeshards.policy.errors import PolicyConfigError
from coordinator.nodeshards.policy.nodes import NodeView

NAME = "node-limit"
MIN_KEY = "minNodes"
MAX_KEY = "maxNodes"


@dataclass(frozen=True, slots=True)
class NodeLimit:
    """At most ``max_nodes`` nodes (``None``: unbounded); ``min_nodes`` is reported, not enforced."""

    min_nodes: int = 0
    max_nodes: int | None = None

    @property
    def name(self) -> str:
        return NAME

    def select(self, ranked: Sequence[NodeView], reserved: int, scheduler: str) -> Sequence[NodeView]:
        if self.max_nodes is None:
            return ranked
        return ranked[: max(0, self.max_nodes - reserved)]

    def shortfall(self, selected: int) -> int:
        return max(0, self.min_nodes - selected)

    def arguments(self) -> dict[str, object]:
        return {MIN_KEY: self.min_nodes, MAX_KEY: self.max_nodes}

    def describe(self) -> str:
        upper = "" if self.max_nodes is None else str(self.max_nodes)
        return f"nodes {self.min_nodes}..{upper}"


def limits(min_nodes: int | None, max_nodes: int | None, *, min_path: str, max_path: str) -> NodeLimit:
    """Validate node-count bounds (shared with the deprecated scheduler-level fields) and build the plugin."""
    low = 0 if min_nodes is None else min_nodes
    if low < 0:
        raise PolicyConfigError(min_path, f"must be >= 0, got {low}")
    if max_nodes is not None and max_nodes <= 0:
        raise PolicyConfigError(max_path, f"must be > 0 (omit it for no limit), got {max_nodes}")
    if max_nodes is not None and low > max_nodes:
        raise PolicyConfigError(min_path, f"must be <= {MAX_KEY} (got {low} > {max_nodes})")
    return NodeLimit(low, max_nodes)


def parse(args: Mapping[str, object], path: str, warnings: list[str]) -> NodeLimit:
    """Build the plugin from ``arguments`` found at ``path``."""
    fields.reject_unknown(args, path, (MIN_KEY, MAX_KEY))
    return limits(
        fields.get_int(args, MIN_KEY, path, 0),
        fields.get_int(args, MAX_KEY, path, None),
        min_path=fields.sub(path, MIN_KEY),
        max_path=fields.sub(path, MAX_KEY),
    )
