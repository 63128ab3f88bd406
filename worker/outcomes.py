"""Who is told what happened to a pod this worker tried to place: the ``Outcomes`` seam.

The scheduler and its binder are constructed with one ``Outcomes`` object and tell it every final outcome:
- ``bound``: the API server accepted the binding (with the assume and bind times, for the audit trail);
- ``unschedulable``: no usable node can take the pod (the decision carries kube-scheduler's reasons);
- ``rejected``: the binding failed permanently (400/403/422: the API server refused it), capacity returned.
Not final, under a coordinator only:
- ``waiting``: the pod is nominated to a node of this shard where it preempted, and stays in this worker's
  queue until its victims are gone (the leader then keeps its dispatch past the usual timeout).
Not an outcome: ``gone``, the pod watch showed the pod deleted, finished or placed (what is kept per pod for
its outcome can go; a pod deleted in the queue or placed by someone else gets no outcome at all); and
``retry``, asked before a pod whose binding failed transiently goes back to this worker's queue (under a
coordinator, a pod dispatched over a leader stream that has since been replaced is dropped instead: the
leader of the new stream dispatches it again, and must know of every placement it did not order).

Transient outcomes are not reported: a binding that failed with 429/5xx/timeouts, or that could not be sent
before the worker's fencing deadline (node revoked, lease unhealthy), goes back to this worker's queue
(``worker.binder``), and a binding the pod's deletion made moot (404) is simply forgotten.

Implementations: ``PodReports`` (standalone: the user learns it from the pod's condition and events) and
``worker.intake.LeaderResults`` (under a coordinator: the leader gets a RESULT, users still get Scheduled
events).
"""

from __future__ import annotations

from typing import Protocol

from common.kube import KubeClient
from common.records import NodeName, PodKey, PodRecord
from common.reporting import Reporter
from worker.engine import Decision
from worker.settings import WorkerSettings


class Outcomes(Protocol):
    def bound(self, pod: PodRecord, node: NodeName, *, assumed_at: float, bound_at: float) -> None:
        """The binding succeeded. Times are wall-clock seconds (assumption made, binding answered)."""
        ...

    def unschedulable(self, pod: PodRecord, decision: Decision) -> None:
        """No usable node fits the pod (``decision`` says why)."""
        ...

    def rejected(self, pod: PodRecord, message: str) -> None:
        """The binding failed permanently; the assumption is already forgotten."""
        ...

    def waiting(self, pod: PodRecord, node: NodeName) -> None:
        """Not final: the pod waits in this worker's queue for its victims on ``node`` to go."""
        ...

    def gone(self, key: PodKey, uid: str) -> None:
        """The pod ``key`` (of ``uid``; "" if not known) was deleted, finished or placed, as the pod watch or a
        binding's 404 showed: no decision of it follows here, and an outcome follows only if this worker's own
        binding placed it (its ``bound`` may come after the watch)."""
        ...

    def retry(self, pod: PodRecord) -> bool:
        """May ``pod``, whose binding failed transiently (its assumption forgotten), be decided here again?
        If not, nothing more is done or told for it here."""
        ...


class PodReports:
    """Standalone outcomes: report on the pod itself (PodScheduled condition, Scheduled/FailedScheduling)."""

    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter

    def bound(self, pod: PodRecord, node: NodeName, *, assumed_at: float, bound_at: float) -> None:
        self.reporter.scheduled(pod, node)

    def unschedulable(self, pod: PodRecord, decision: Decision) -> None:
        self.reporter.unschedulable(pod, decision.message)

    def rejected(self, pod: PodRecord, message: str) -> None:
        self.reporter.unschedulable(pod, message)

    def waiting(self, pod: PodRecord, node: NodeName) -> None:
        pass  # standalone, the pod is in this worker's own queue: nobody else is waiting for an answer

    def gone(self, key: PodKey, uid: str) -> None:
        pass  # nothing is kept per pod here

    def retry(self, pod: PodRecord) -> bool:
        return True  # standalone, every pending pod of ours is this worker's to place


def new_reporter(client: KubeClient, settings: WorkerSettings) -> Reporter:
    """The worker's reporter, as its settings ask (shared by the scheduler and its outcome receiver)."""
    return Reporter(
        client,
        component=settings.scheduling.scheduler_name,
        instance=settings.worker_id,
        qps=settings.reporting.qps,
        scheduled_events=settings.reporting.scheduled_events,
    )
