"""Saying why the agent pool is empty: with no node in the pool nothing is scheduled, and the operator must
learn why from the cluster, not from reading the code.

While the leader's agent pool stays empty for ``GRACE`` seconds, ``EmptyPoolNotice``
- posts a Warning event ``AgentPoolEmpty`` with the reason (again when the reason changes, and every
  ``REPEAT`` while it lasts) on the shard-policy ConfigMap when a policy from it is in force, else on the
  coordinator's own Pod (``POD_NAME``/``POD_NAMESPACE`` from the downward API), else only logs it;
- puts the reason in ``PoolVerdict``, which the leader's ``/readyz`` shows in its body. Readiness stays
  passing: an empty pool is a configuration or cluster state that a standby taking over would not change,
  and an unready leader would only add a misleading restart or failover signal.
The gauge ``agent_scheduler_agent_pool_nodes`` (``coordinator.metrics``) reads 0 meanwhile.

The reason comes from the pool's owner (``explain``): the label selector matching no node, the shard policy
giving the agent shard no node, or the policy's nodes all still in use by another shard.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

from common.events import WARNING, ObjectRef
from coordinator.nodeshards.eventsender import EventSender

log = logging.getLogger(__name__)

GRACE = 5.0  # seconds the pool must stay empty before it is reported (a policy change may refill it)
REPEAT = 600.0  # while it lasts, the event is posted again this often
CHECK_INTERVAL = 1.0
REASON = "AgentPoolEmpty"


class PoolVerdict:
    """Why the agent pool is empty (``reason``), or None; written by the term, read by the probes."""

    def __init__(self) -> None:
        self.reason: str | None = None


def own_pod() -> ObjectRef | None:
    """This coordinator's Pod, from the downward API environment; None outside a pod."""
    name, namespace = os.environ.get("POD_NAME", ""), os.environ.get("POD_NAMESPACE", "")
    return ObjectRef.pod(namespace, name) if name and namespace else None


class EmptyPoolNotice:
    """Watches the pool size during one term; ``run()`` until cancelled (it clears the verdict then)."""

    def __init__(
        self,
        *,
        size: Callable[[], int],
        explain: Callable[[], str],
        target: Callable[[], ObjectRef | None],
        events: EventSender,
        verdict: PoolVerdict,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._size = size
        self._explain = explain
        self._target = target
        self._events = events
        self._verdict = verdict
        self._clock = clock
        self._empty_since: float | None = None
        self._reported: tuple[str, float] | None = None  # reason, when

    def check(self) -> None:
        now = self._clock()
        if self._size() > 0:
            if self._reported is not None:
                log.info("the agent pool has nodes again")
            self._empty_since, self._reported, self._verdict.reason = None, None, None
            return
        if self._empty_since is None:
            self._empty_since = now
        if now - self._empty_since < GRACE:
            return
        reason = f"the agent pool is empty: {self._explain()}; no agent pod can be scheduled"
        self._verdict.reason = reason
        if self._reported is not None and self._reported[0] == reason and now - self._reported[1] < REPEAT:
            return
        self._reported = (reason, now)
        log.warning("%s", reason)
        target = self._target()
        if target is not None:
            self._events.emit(target, WARNING, REASON, reason)

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._events.run(), name="pool-events")
                while True:
                    self.check()
                    await asyncio.sleep(CHECK_INTERVAL)
        finally:
            self._verdict.reason = None
