"""``warmup``: score 1.0 for nodes carrying a label with a given value, else 0.0 (a scorer only).

With ``weight: N`` a warm node gets a +N boost in the weighted sort without excluding cold nodes, as in Volcano.
Unlike Volcano's map lookup, an absent label never matches, even when ``warmupLabelValue`` is empty.

Arguments (optional): ``warmupLabel`` (a label key, default ``node.volcano.sh/warmup``) and ``warmupLabelValue``
(a label value, default ``"true"``; an unquoted ``true`` is a YAML boolean and is rejected with a hint).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from common.wellknown import WARM_LABEL, WARM_LABEL_VALUE
from coordinator.nodeshards.policy import fields, safeyaml
from coordinator.nodeshards.policy.errors import PolicyConfigError
from coordinator.nodeshards.policy.nodes import NodeView

NAME = "warmup"
LABEL_KEY = "warmupLabel"
VALUE_KEY = "warmupLabelValue"
DEFAULT_LABEL = WARM_LABEL
DEFAULT_VALUE = WARM_LABEL_VALUE

_NAME_PART = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_NAME = re.compile(rf"^{_NAME_PART}$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def valid_label_key(key: str) -> bool:
    """Kubernetes label-key syntax: optional DNS-subdomain prefix and ``/``, then a name of <= 63 chars."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return bool(_LABEL_NAME.match(name))


def valid_label_value(value: str) -> bool:
    """Kubernetes label-value syntax: empty, or a name of <= 63 chars."""
    return value == "" or bool(_LABEL_NAME.match(value))


@dataclass(frozen=True, slots=True)
class Warmup:
    """Matches nodes with ``label == value``."""

    label: str = DEFAULT_LABEL
    value: str = DEFAULT_VALUE

    @property
    def name(self) -> str:
        return NAME

    def score(self, node: NodeView) -> float:
        return 1.0 if node.labels.get(self.label) == self.value else 0.0

    def arguments(self) -> dict[str, object]:
        return {LABEL_KEY: self.label, VALUE_KEY: self.value}

    def describe(self) -> str:
        return f"warm {self.label}={self.value}"


def parse(args: Mapping[str, object], path: str, warnings: list[str]) -> Warmup:
    """Build the plugin from ``arguments`` found at ``path``."""
    for key in ("minNodes", "maxNodes"):
        if key in args:
            raise PolicyConfigError(fields.sub(path, key), "only supported by the node-limit policy")
    fields.reject_unknown(args, path, (LABEL_KEY, VALUE_KEY))
    label = fields.get_str(args, LABEL_KEY, path, DEFAULT_LABEL)
    if not valid_label_key(label):
        raise PolicyConfigError(
            fields.sub(path, LABEL_KEY), f"not a valid label key: {safeyaml.shown(label)}"
        )
    value = fields.get_str(args, VALUE_KEY, path, DEFAULT_VALUE)
    if not valid_label_value(value):
        raise PolicyConfigError(
            fields.sub(path, VALUE_KEY), f"not a valid label value: {safeyaml.shown(value)}"
        )
    return Warmup(label, value)
