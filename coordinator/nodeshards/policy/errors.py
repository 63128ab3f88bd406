"""The one exception the policy parser raises.

Every rejected ConfigMap is reported as ``PolicyConfigError`` with the ConfigMap key it came from, the path of
the offending field inside that key's YAML (``schedulerConfigs[1].policies[0].arguments.minCPUUtil``) and a
reason, so an operator can find the line without reading code. The path and the reason are cut to
``MAX_PATH`` and ``MAX_REASON`` characters (the key to ``MAX_SOURCE``), so a message stays short whatever the ConfigMap holds (values are
shown through ``safeyaml.shown`` for the same reason). The coordinator catches it, logs it and keeps
the previous policy (Volcano's behaviour for an invalid ConfigMap).
"""

from __future__ import annotations

MAX_PATH = 200
MAX_REASON = 400
MAX_SOURCE = 100


class PolicyConfigError(ValueError):
    """Raised when the sharding ConfigMap cannot be parsed or violates a constraint.

    ``source`` is the ConfigMap data key (``sharding.yaml``, ``agent-scheduler.yaml``) or ``None`` when the
    text did not come from a ConfigMap; ``path`` is empty for errors about the document as a whole (YAML
    syntax, duplicate keys).
    """

    def __init__(self, path: str, reason: str, *, source: str | None = None) -> None:
        self.path = _cut(path, MAX_PATH)
        self.reason = _cut(reason, MAX_REASON)
        self.source = None if source is None else _cut(source, MAX_SOURCE)
        super().__init__(self._render())

    def _render(self) -> str:
        parts = [p for p in (self.source, self.path) if p]
        return ": ".join([*parts, self.reason])

    def in_source(self, source: str) -> PolicyConfigError:
        """Return a copy of this error attributed to ConfigMap key ``source``."""
        return PolicyConfigError(self.path, self.reason, source=source)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[: limit - 3]}..."
