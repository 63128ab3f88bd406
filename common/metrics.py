"""Prometheus metrics shared by workers and the coordinator, and the small HTTP server that exposes them.

Names follow kube-scheduler where the meaning is the same (``scheduler_*``), so existing dashboards work;
the project's own metrics are prefixed ``agent_scheduler_``. Metrics are module-level singletons in the
default registry: one process, one set.

Per-stage latency (``agent_scheduler_pod_scheduling_stage_duration_seconds{stage}``, as Volcano's
``task_scheduling_latency{stage}``): the path of one pod, cut where it changes hands, each stage named by the
event that ends it. Every stage is measured on one process's monotonic clock, from and to moments that process
saw itself; clocks of different processes are never subtracted. The leader observes its two stages when the
RESULT ``bound`` arrives, a worker each of its stages when it ends (``queued`` per pod taken into the queue,
``decided`` per placing decision, ``bind_sent`` and ``bound`` per successful binding); a retried pod counts its
retries in the stage they happened in:

| stage | from | to | observed by |
|---|---|---|---|
| ``dispatched`` | the leader's watch shows the pod pending (or its gate lifted) | the DISPATCH that got it bound is sent | leader |
| ``result`` | that DISPATCH is sent | its RESULT ``bound`` arrives (the whole worker side and both hops) | leader |
| ``queued`` | the worker reads the DISPATCH (standalone, or a pod it claims: its watch delivers the pod) | the pod is in the scheduling queue (after any wait for the DISPATCH's ``min_rv``, ``worker.gate``) | worker |
| ``decided`` | the pod entered the queue | the decision that placed it is made and assumed (queue wait included) | worker |
| ``bind_sent`` | assumed | the binding POST that succeeded is sent (binder slot wait and retries) | worker |
| ``bound`` | that POST is sent | its answer arrives | worker |

A pod a worker claims (``common.claims``) has no leader stage: its path is the worker's four, as standalone.
In coordinated mode ``result`` spans ``queued`` to ``bound`` of the worker plus the two network hops, so a
leader's stages and a worker's stages are two views of one path, never to be summed.

The server answers ``/metrics``, ``/healthz`` (the caller's liveness check passes: the process is not wedged,
its API credentials are accepted; a failing check means "restart me") and ``/readyz`` (the caller's readiness
check passes: caches synced, not fenced, or for a coordinator, leading and making progress or a healthy
standby). A check returns True/False, a string saying what is wrong (which fails it), or ``Ready(note)``: it
passes, and the body says what the operator should know (e.g. "owns no nodes: ...").
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

from common import metricsauth

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30)
# kube-scheduler's exponential buckets: 1 ms doubling up to about 33 s.
_STAGE_BUCKETS = tuple(0.001 * 2**k for k in range(16))

LEADER_STAGES = ("dispatched", "result")
WORKER_STAGES = ("queued", "decided", "bind_sent", "bound")
STAGE_METRIC = "agent_scheduler_pod_scheduling_stage_duration_seconds"

schedule_attempts = Counter(
    "scheduler_schedule_attempts_total",
    "Scheduling attempts by result (scheduled, unschedulable, error) and profile (the scheduler name).",
    ["result", "profile"],
)
attempt_duration = Histogram(
    "scheduler_scheduling_attempt_duration_seconds",
    "Scheduling attempt latency (decision only, without binding), by result and profile (the scheduler name).",
    ["result", "profile"],
    buckets=_LATENCY_BUCKETS,
)
pod_sli_duration = Histogram(
    "scheduler_pod_scheduling_sli_duration_seconds",
    "From the pod entering the queue to its binding succeeding, including retries.",
    ["attempts"],
    buckets=_LATENCY_BUCKETS,
)
pending_pods = Gauge("scheduler_pending_pods", "Pods waiting in each queue.", ["queue"])
binding_duration = Histogram(
    "agent_scheduler_binding_duration_seconds",
    "Latency of the binding POST, by result.",
    ["result"],
    buckets=_LATENCY_BUCKETS,
)
bind_results = Counter(
    "agent_scheduler_bind_results_total",
    "Binding outcomes: bound, conflict (409), gone (404), retried (429/5xx), failed.",
    ["result"],
)
index_lookups = Counter(
    "agent_scheduler_index_lookups_total",
    "Decisions by whether the capacity index found the node (hit) or a full scan ran (miss).",
    ["outcome"],
)
nodes_evaluated = Histogram(
    "agent_scheduler_nodes_evaluated",
    "Nodes examined per decision.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096, 16384),
)
owned_nodes = Gauge("agent_scheduler_owned_nodes", "Nodes this worker may place pods on now.")
reports_dropped = Counter(
    "agent_scheduler_events_dropped_total",
    "Informational events (Scheduled) dropped because the event queue was full.",
)
pods_claimed = Counter(
    "agent_scheduler_pods_claimed",
    "Pending pods this worker claimed from its own pod watch (common.claims), without a DISPATCH.",
)
paced_sleeps = Counter(
    "agent_scheduler_paced_sleeps",
    "Idle passes of the event loop that slept instead of blocking, while work was queued (--pace).",
)
paced_seconds = Counter(
    "agent_scheduler_paced_seconds",
    "Seconds the event loop slept in idle passes while work was queued (--pace).",
)
assumed_expired = Counter(
    "agent_scheduler_assumed_expired_total", "Assumed pods whose binding the watch never confirmed."
)
# kube-scheduler's preemption metrics: every PostFilter call, and the victims of each preemption carried out
preemption_attempts = Counter(
    "scheduler_preemption_attempts", "Total preemption attempts in the cluster till now"
)
preemption_victims = Histogram(
    "scheduler_preemption_victims",
    "Number of selected preemption victims",
    buckets=tuple(float(2**k) for k in range(7)),  # kube-scheduler's ExponentialBuckets(1, 2, 7)
)
preemption_writes_fenced = Counter(
    "agent_scheduler_preemption_writes_fenced_total",
    "Writes of a preemption (nomination, clearing a lower nomination, a victim's condition, delete or event) not "
    "sent: the node no longer "
    "usable by this worker, or its lease's fencing deadline too close.",
)
pod_stage_duration = Histogram(
    STAGE_METRIC,
    "Latency of each stage of a bound pod's path, by stage (see common.metrics for each stage's ends).",
    ["stage"],
    buckets=_STAGE_BUCKETS,
)
watch_restarts = Counter(
    "agent_scheduler_watch_restarts_total",
    "Watch streams of the API server restarted, by resource and reason: gone (410, relisted), error (a failed "
    "request or broken stream, resumed), closed (the API server ended the stream before its timeout, resumed), "
    "oversized (an event too large, relisted), handler_error (relisted).",
    ["resource", "reason"],
)
watch_wait = Histogram(
    "agent_scheduler_lane_watch_wait_seconds",
    "Time a dispatched pod waited for this worker's pod watch to reach the DISPATCH's min_rv (the topology "
    "lane: the placements its decision must see); only pods that had to wait are observed.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)


# Label children resolved once: every bound pod observes several stages, and ``labels()`` is a locked dict
# lookup per call.
_STAGE_CHILDREN = {stage: pod_stage_duration.labels(stage) for stage in (*LEADER_STAGES, *WORKER_STAGES)}


def observe_stage(stage: str, seconds: float) -> None:
    """One pod's time in ``stage`` (one of ``LEADER_STAGES`` or ``WORKER_STAGES``); never negative."""
    child = _STAGE_CHILDREN.get(stage) or pod_stage_duration.labels(stage)
    child.observe(max(0.0, seconds))


class Ready(str):
    """A passing verdict that carries a note for the response body."""


Check = Callable[[], bool | str]


def _answer(check: Check, failed: str) -> web.Response:
    verdict = check()
    if verdict is True:
        return web.Response(text="ok")
    if isinstance(verdict, Ready):
        return web.Response(text=f"ok: {verdict}" if verdict else "ok")
    return web.Response(status=503, text=verdict if isinstance(verdict, str) and verdict else failed)


async def serve(host: str, port: int, ready: Check, healthy: Check = lambda: True) -> web.AppRunner:
    """Start the metrics/health server; returns the runner (``await runner.cleanup()`` to stop)."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return _answer(healthy, "unhealthy")

    async def readyz(_: web.Request) -> web.Response:
        return _answer(ready, "not ready")

    app = web.Application()
    metricsauth.apply(app)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


def addresses(runner: web.AppRunner) -> list[str]:
    """host:port of each socket the server listens on (useful when port 0 picked a free one)."""
    out: list[str] = []
    for site in runner.sites:
        server = getattr(site, "_server", None)
        for sock in getattr(server, "sockets", None) or ():
            host, port = sock.getsockname()[:2]
            out.append(f"{host}:{port}")
    return out
