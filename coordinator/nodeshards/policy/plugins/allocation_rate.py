"""``allocation-rate``: keep nodes whose CPU request utilisation is inside a band; prefer busier ones.

Filter: ``minCPUUtil <= util <= maxCPUUtil`` on whole percentages (bounds rounded half up); a node the
scheduler already holds gets the band widened by the hysteresis margin on both sides. Nodes without
utilisation (no allocatable CPU) never pass.

Score: utilisation normalised into the band, ``(util - min) / (max - min)`` clamped to ``[0, 1]`` (1 for a
zero-width band), as in Volcano: agent pods pack onto already-busy nodes and leave idle ones to batch work.

Arguments (all optional): ``minCPUUtil`` (default 0.0) and ``maxCPUUtil`` (default 1.0, where Volcano's current
code defaults to 0.0 and so rejects a config that sets only the minimum), both in ``[0, 1]``. The deprecated
``preferWarmupNodes`` of older Volcano releases is accepted and ignored with a warning; ``minNodes``/``maxNodes``
are rejected here, as in Volcano: they belong to ``node-limit``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal

from coordinator.nodeshards.policy import fields
from coordinator.nodeshards.policy.errors import PolicyConfigError
from coordinator.nodeshards.policy.nodes import NodeView

NAME = "allocation-rate"
MIN_KEY = "minCPUUtil"
MAX_KEY = "maxCPUUtil"
_DEPRECATED = "preferWarmupNodes"
_NODE_LIMIT_KEYS = ("minNodes", "maxNodes")


def to_percent(fraction: float) -> int:
    """A utilisation fraction as a whole percentage, half rounded up (``0.695`` -> 70)."""
    return int((Decimal(repr(fraction)) * 100).to_integral_value(rounding=ROUND_HALF_UP))


@dataclass(frozen=True, slots=True)
class AllocationRate:
    """The band ``[min_cpu_util, max_cpu_util]`` (fractions) and its whole-percent form."""

    min_cpu_util: float = 0.0
    max_cpu_util: float = 1.0
    min_pct: int = field(init=False, repr=False, compare=False)
    max_pct: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "min_pct", to_percent(self.min_cpu_util))
        object.__setattr__(self, "max_pct", to_percent(self.max_cpu_util))

    @property
    def name(self) -> str:
        return NAME

    def accepts(self, node: NodeView, margin_pct: int) -> bool:
        util = node.util_pct
        if util is None:
            return False
        return self.min_pct - margin_pct <= util <= self.max_pct + margin_pct

    def score(self, node: NodeView) -> float:
        util = node.util_pct
        if util is None:
            return 0.0
        width = self.max_pct - self.min_pct
        if width == 0:
            return 1.0
        return min(1.0, max(0.0, (util - self.min_pct) / width))

    def arguments(self) -> dict[str, object]:
        return {MIN_KEY: self.min_cpu_util, MAX_KEY: self.max_cpu_util}

    def describe(self) -> str:
        return f"util {self.min_cpu_util:.2f}-{self.max_cpu_util:.2f}"


def band(
    min_cpu_util: float, max_cpu_util: float, *, min_path: str, max_path: str, max_name: str
) -> AllocationRate:
    """Validate a band (shared with the deprecated scheduler-level fields) and build the plugin."""
    fields.check_range(min_cpu_util, min_path, 0.0, 1.0)
    fields.check_range(max_cpu_util, max_path, 0.0, 1.0)
    if min_cpu_util > max_cpu_util:
        raise PolicyConfigError(min_path, f"must be <= {max_name} (got {min_cpu_util:g} > {max_cpu_util:g})")
    return AllocationRate(min_cpu_util, max_cpu_util)


def parse(args: Mapping[str, object], path: str, warnings: list[str]) -> AllocationRate:
    """Build the plugin from ``arguments`` found at ``path``."""
    for key in _NODE_LIMIT_KEYS:
        if key in args:
            raise PolicyConfigError(fields.sub(path, key), "only supported by the node-limit policy")
    fields.reject_unknown(args, path, (MIN_KEY, MAX_KEY, _DEPRECATED))
    if _DEPRECATED in args:
        fields.get_bool(args, _DEPRECATED, path, False)
        warnings.append(
            f"{fields.sub(path, _DEPRECATED)}: deprecated and ignored; add a warmup policy instead"
        )
    return band(
        fields.get_float(args, MIN_KEY, path, 0.0),
        fields.get_float(args, MAX_KEY, path, 1.0),
        min_path=fields.sub(path, MIN_KEY),
        max_path=fields.sub(path, MAX_KEY),
        max_name=MAX_KEY,
    )
