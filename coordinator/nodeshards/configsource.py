"""The sharding ConfigMap, watched: every version is validated, and only a valid one replaces the policy in force.

``PolicySource`` is the watch handler of one ConfigMap (name and namespace from the coordinator's flags). On each
version it sees (a new ``resourceVersion``) it runs ``coordinator.nodeshards.policy.parse_configmap`` plus the one
check that depends on who we are - the policy must have an ``agent`` entry this coordinator can serve - and then:

- valid: the new ``EffectivePolicy`` replaces the old one in a single assignment (readers see the old or the new
  policy, never a mix) and listeners are told, if its version differs; a Normal ``ShardingPolicyApplied`` event
  records it on the ConfigMap;
- invalid: a log line and a Warning ``InvalidShardingPolicy`` event on the ConfigMap, both naming the data key,
  the field path and the reason; the previous policy stays in force (Volcano's behaviour). The text is written by
  whoever may edit the ConfigMap, so the parser bounds its size, depth and literals and refuses YAML aliases
  (``coordinator.nodeshards.policy.safeyaml``), and every message is short; should the parser still raise
  anything other than ``PolicyConfigError``, that too is a rejection (its type in the event, the traceback in a
  debug log), never an exception out of the watch handler;
- deleted: the previous policy stays in force, and a log line says so.

Before any ConfigMap was seen: the built-in ``default_policy()`` when the operator named the ConfigMap explicitly
(``use_default``), else no policy at all (``current`` is ``None``: the caller keeps its label pool).

Invariants: ``current`` only ever holds a policy that passed validation; judging never raises; a version that was already judged is not
judged again (a relist replays the same object), so one bad edit yields one event.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.events import NORMAL, WARNING, ObjectRef
from coordinator.nodeshards.eventsender import EventSender
from coordinator.nodeshards.policy import (
    AGENT_TYPE,
    EffectivePolicy,
    PolicyConfigError,
    SchedulerPolicy,
    default_policy,
    parse_configmap,
)

log = logging.getLogger(__name__)

REASON_INVALID = "InvalidShardingPolicy"
REASON_APPLIED = "ShardingPolicyApplied"
_SHOWN = 200
"""At most this much of an unexpected exception's text goes into an event."""


def agent_entry(policy: EffectivePolicy, scheduler_name: str) -> SchedulerPolicy:
    """The ``agent`` entry this coordinator serves: the one named ``scheduler_name``, else the only one.

    Raises ``PolicyConfigError`` (path ``schedulerConfigs``) when neither exists.
    """
    agents = policy.sharding.agent_schedulers
    for entry in agents:
        if entry.name == scheduler_name:
            return entry
    if len(agents) == 1:
        return agents[0]
    names = ", ".join(repr(a.name) for a in agents)
    raise PolicyConfigError(
        "schedulerConfigs",
        f"{len(agents)} schedulers of type {AGENT_TYPE!r} ({names}) and none named {scheduler_name!r}; "
        "name one after this scheduler",
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    """The latest judgement of the ConfigMap, for ``status``."""

    resource_version: str
    accepted: bool
    message: str
    at: float


class PolicySource:
    """Watch handler (``common.watching.WatchHandler``) of the sharding ConfigMap."""

    def __init__(
        self,
        namespace: str,
        name: str,
        *,
        scheduler_name: str,
        use_default: bool,
        events: EventSender | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self._scheduler_name = scheduler_name
        self._events = events
        self._clock = clock
        self.current: EffectivePolicy | None = default_policy() if use_default else None
        self.agent: SchedulerPolicy | None = (
            agent_entry(self.current, scheduler_name) if self.current is not None else None
        )
        self.origin = "built-in default" if use_default else "none"
        """Where ``current`` came from: ``built-in default``, ``configmap ns/name@rv`` or ``none``."""
        self.present = False
        """Whether the ConfigMap exists now."""
        self.last_verdict: Verdict | None = None
        self.listeners: list[Callable[[], None]] = []
        self._judged_rv = ""

    @property
    def where(self) -> str:
        return f"{self.namespace}/{self.name}"

    # ---- WatchHandler ----

    def replace(self, objects: list[dict[str, Any]]) -> None:
        mine = [o for o in objects if (o.get("metadata") or {}).get("name") == self.name]
        if mine:
            self._judge(mine[0])
        elif self.present:
            self._deleted()

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        if (obj.get("metadata") or {}).get("name") != self.name:
            return
        if kind == "DELETED":
            self._deleted()
        else:
            self._judge(obj)

    # ---- judging ----

    def _deleted(self) -> None:
        self.present = False
        self._judged_rv = ""
        kept = self.current.version if self.current is not None else "none"
        log.warning("sharding ConfigMap %s deleted; keeping policy %s (%s)", self.where, kept, self.origin)
        self._notify()

    def _judge(self, obj: dict[str, Any]) -> None:
        self.present = True
        meta = obj.get("metadata") or {}
        rv = str(meta.get("resourceVersion") or "")
        if rv and rv == self._judged_rv:
            return
        self._judged_rv = rv
        ref = ObjectRef.of(obj, api_version="v1", kind="ConfigMap")
        data = obj.get("data")
        try:
            if data is not None and not isinstance(data, dict):
                raise PolicyConfigError("", "ConfigMap data is not a mapping")
            policy = parse_configmap(data)
            agent = agent_entry(policy, self._scheduler_name)
        except PolicyConfigError as e:
            self._reject(ref, rv, str(e))
            return
        except Exception as e:  # the text is untrusted: a parser bug must not end the leader
            log.debug("sharding ConfigMap %s: validation failed unexpectedly", self.where, exc_info=True)
            self._reject(ref, rv, f"could not be validated ({type(e).__name__}: {str(e)[:_SHOWN]})")
            return
        changed = self.current is None or policy.version != self.current.version
        self.current, self.agent = policy, agent
        self.origin = f"configmap {self.where}@{rv}"
        self.last_verdict = Verdict(rv, True, f"policy {policy.version}", self._clock())
        if changed:
            summary = " | ".join(line.strip() for line in policy.summary().splitlines())
            log.info("sharding ConfigMap %s applied: %s", self.where, summary)
            self._emit(
                ref,
                NORMAL,
                REASON_APPLIED,
                f"applied policy {policy.version} (resourceVersion {rv}) for scheduler {agent.name}",
            )
        else:
            log.info(
                "sharding ConfigMap %s resourceVersion %s: policy %s unchanged",
                self.where,
                rv,
                policy.version,
            )
        self._notify()

    def _reject(self, ref: ObjectRef, rv: str, reason: str) -> None:
        kept = self.current.version if self.current is not None else "none"
        message = f"rejected (resourceVersion {rv}): {reason}; keeping policy {kept}"
        log.warning("sharding ConfigMap %s %s", self.where, message)
        self.last_verdict = Verdict(rv, False, reason, self._clock())
        self._emit(ref, WARNING, REASON_INVALID, message)
        self._notify()

    def _emit(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        if self._events is not None:
            self._events.emit(ref, type_, reason, message)

    def _notify(self) -> None:
        for callback in self.listeners:
            callback()
