"""The one exception the policy parser raises.

Every rejected ConfigMap is reported as ``PolicyConfigError`` with the ConfigMap key it came from, the path of
the offending field inside that key's YAML (``schedulerConfigs[1].policies[0].arguments.minCPUUtil``) and a
reason, so an operator can find the line without reading code. The coordinator catches it, logs it and keeps
the previous policy (Volcano's behaviour for an invalid ConfigMap).
"""

from __future__ import annotations


class PolicyConfigError(ValueError):
    """Raised when the sharding ConfigMap cannot be parsed or violates a constraint.

    ``source`` is the ConfigMap data key (``sharding.yaml``, ``agent-scheduler.yaml``) or ``None`` when the
    text did not come from a ConfigMap; ``path`` is empty for errors about the document as a whole (YAML
    syntax, duplicate keys).
    """

    def __init__(self, path: str, reason: str, *, source: str | None = None) -> None:
        self.path = path
        self.reason = reason
        self.source = source
        super().__init__(self._render())

    def _render(self) -> str:
        parts = [p for p in (self.source, self.path) if p]
        return ": ".join([*parts, self.reason])

    def in_source(self, source: str) -> PolicyConfigError:
        """Return a copy of this error attributed to ConfigMap key ``source``."""
        return PolicyConfigError(self.path, self.reason, source=source)
