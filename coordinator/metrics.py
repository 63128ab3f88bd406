"""The coordinator's own Prometheus metrics, served on its ``--metrics-address`` beside the shared ones
(``common.metrics``).

Most are read at scrape time from the term being led (``CoordinatorCollector``): the term registers a
``TermView`` when it starts leading and withdraws it when it ends, so a standby exports
``agent_scheduler_coordinator_is_leader 0`` and nothing about a term it does not lead (``max(is_leader) < 1``
across the replicas means nobody leads). Counters that live in a term's objects (re-dispatches) are carried
over when the term ends, so they never go backwards within one process.

Observed as they happen: handoff durations (``HandoffTimer``, fed by the shard map after each write it made),
NodeShard write errors (``nodeshard_write_errors``), and the topology lane's waits and cycle time
(``lane_waits``, ``lane_settle_duration``, fed by the dispatcher).

Cardinality: labels are a pod state, a handoff phase, a NodeShard write part and reason, a lane wait reason,
or a worker id;
workers are few (tens), and a departed worker's series disappear with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common.etcd.keys import WorkerId
from common.etcd.schema import ShardAssignment
from common.records import NodeName

_HANDOFF_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)
HANDOFF_HORIZON = 3600.0  # a revoked node not granted again within this long is forgotten (it left the pool)

handoff_duration = Histogram(
    "agent_scheduler_coordinator_handoff_duration_seconds",
    "Node handoff between workers, from the revocation written: phase=release until the shard map recorded "
    "the release (the holder's ack, or its lease confirmed gone), phase=grant until the node was granted again.",
    ["phase"],
    buckets=_HANDOFF_BUCKETS,
)
nodeshard_write_errors = Counter(
    "agent_scheduler_coordinator_nodeshard_write_errors_total",
    "NodeShard writes the API server refused or failed, by part (spec, status) and reason (conflict, error).",
    ["part", "reason"],
)

lane_waits = Counter(
    "agent_scheduler_coordinator_lane_waits_total",
    "Pods the topology lane held back before dispatch, by reason: lane_busy (another pod with a cross-node "
    "rule was in flight), anti_affinity (a required cross-node anti-affinity between it and a pod in flight), "
    "lost_dispatch (a lane pod's dispatch was lost lately), earlier_term (a new term's leader waits until no "
    "worker binds a pod an earlier term dispatched). Counted once per wait.",
    ["reason"],
)
claims = Counter(
    "agent_scheduler_coordinator_claims_total",
    "Pods left to the worker that claims them from its own watch (common.claims), by event: claimed (at the "
    "leader's count), handed_back (the worker could not place it; the leader's path from there), taken_over "
    "(its claimant neither placed nor handed it back within the dispatch timeout; dispatched).",
    ["event"],
)
lane_settle_duration = Histogram(
    "agent_scheduler_coordinator_lane_settle_duration_seconds",
    "From a lane pod's dispatch to the pending watch showing it bound or deleted (the lane's cycle time: "
    "lane pods go out one at a time).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)


@dataclass(frozen=True, slots=True)
class DispatchBacklog:
    """The dispatcher's backlog at one instant."""

    pending: int  # pods in the pending table, in any state
    parked: int  # declared unschedulable, waiting for a retry
    in_flight: Mapping[str, int]  # worker -> dispatches awaiting their RESULT
    redispatched: int  # dispatches withdrawn and sent again during this term (cumulative)
    lane_in_flight: int = 0  # lane pods dispatched and not yet settled (0 or 1)
    lane_waiting: int = 0  # pods the topology lane holds back now


@dataclass(frozen=True, slots=True)
class TermView:
    """What the collector reads from the term being led; each callable is cheap and never blocks."""

    term: int  # the election key's create revision: it increases with every new term
    epoch: Callable[[], int]  # the shard map's epoch
    backlog: Callable[[], DispatchBacklog]
    nodes_per_worker: Callable[[], Mapping[WorkerId, int]]  # granted nodes per worker in the shard map
    agent_pool: Callable[[], int]  # nodes in the agent pool the shard map grants from


class CoordinatorCollector(Collector):
    """Collects the gauges of the term being led (if any). One per process, registered at import."""

    def __init__(self) -> None:
        self._view: TermView | None = None
        self._redispatched_before = 0  # re-dispatches of the terms that ended

    def lead(self, view: TermView) -> None:
        self._view = view

    def step_down(self, view: TermView) -> None:
        if self._view is view:
            self._redispatched_before += view.backlog().redispatched
            self._view = None

    def collect(self) -> Iterator[Metric]:
        # Every family is yielded, empty on a standby: the names exist (and are documented) either way.
        view = self._view
        backlog = view.backlog() if view is not None else None
        yield GaugeMetricFamily(
            "agent_scheduler_coordinator_is_leader",
            "1 while this coordinator replica leads, else 0.",
            value=1 if view is not None else 0,
        )
        yield CounterMetricFamily(
            "agent_scheduler_coordinator_redispatches",
            "Dispatches withdrawn (worker stream lost, or no result in time) and sent again.",
            value=self._redispatched_before + (backlog.redispatched if backlog is not None else 0),
        )
        term = _gauge(
            "agent_scheduler_coordinator_leader_term",
            "The term this replica leads (the election key's etcd create revision; higher is newer).",
        )
        epoch = _gauge(
            "agent_scheduler_coordinator_shard_epoch",
            "The shard map's epoch (bumped by every shard map write).",
        )
        pods = _gauge(
            "agent_scheduler_coordinator_pending_pods",
            "Pending pods the leader tracks: all of them (state=pending) and those declared unschedulable "
            "(state=parked).",
            ["state"],
        )
        in_flight = _gauge(
            "agent_scheduler_coordinator_in_flight_dispatches",
            "Pods dispatched to each worker and awaiting its result.",
            ["worker"],
        )
        nodes = _gauge(
            "agent_scheduler_coordinator_worker_nodes",
            "Nodes granted to each worker in the shard map.",
            ["worker"],
        )
        lane = _gauge(
            "agent_scheduler_coordinator_lane_pods",
            "Pods in the topology lane: state=in_flight (a pod with a cross-node rule dispatched and not yet "
            "settled: 0 or 1), state=waiting (pods the lane holds back).",
            ["state"],
        )
        pool = _gauge(
            "agent_scheduler_agent_pool_nodes",
            "Nodes in the agent pool (the agent shard) the shard map grants from; 0 means nothing can be "
            "scheduled (the leader's /readyz and Warning events say why).",
        )
        if view is not None and backlog is not None:
            term.add_metric([], view.term)
            epoch.add_metric([], view.epoch())
            pods.add_metric(["pending"], backlog.pending)
            pods.add_metric(["parked"], backlog.parked)
            for worker, n in sorted(backlog.in_flight.items()):
                in_flight.add_metric([worker], n)
            for worker, n in sorted(view.nodes_per_worker().items()):
                nodes.add_metric([worker], n)
            pool.add_metric([], view.agent_pool())
            lane.add_metric(["in_flight"], backlog.lane_in_flight)
            lane.add_metric(["waiting"], backlog.lane_waiting)
        yield from (term, epoch, pods, in_flight, nodes, pool, lane)


def _gauge(name: str, documentation: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=labels or [])


COLLECTOR = CoordinatorCollector()
REGISTRY.register(COLLECTOR)


class HandoffTimer:
    """Times node handoffs from the shard map's writes (``written`` after each successful write).

    A node's clock starts when a write moves it into a worker's revoking set; ``release`` is observed when a
    write drops it from every revoking set, ``grant`` when a write grants it again (to any worker). A node
    that is never granted again (it left the pool) is forgotten after ``HANDOFF_HORIZON``.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._revoked_at: dict[NodeName, float] = {}
        self._released: set[NodeName] = set()

    def written(
        self, before: Mapping[WorkerId, ShardAssignment], diff: Mapping[WorkerId, ShardAssignment | None]
    ) -> None:
        now = self._clock()
        revoking_after: set[NodeName] = set()
        revoking_before: set[NodeName] = set()
        granted: set[NodeName] = set()
        for worker, new in diff.items():
            old = before.get(worker)
            old_revoking = old.revoking if old is not None else frozenset()
            old_granted = old.granted if old is not None else frozenset()
            revoking_before |= old_revoking
            if new is not None:
                revoking_after |= new.revoking
                granted |= new.granted - old_granted
                for node in new.revoking - old_revoking:
                    self._revoked_at.setdefault(node, now)
        for node in revoking_before - revoking_after:
            started = self._revoked_at.get(node)
            if started is not None and node not in self._released:
                self._released.add(node)
                handoff_duration.labels("release").observe(now - started)
        for node in granted:
            started = self._revoked_at.pop(node, None)
            self._released.discard(node)
            if started is not None:
                handoff_duration.labels("grant").observe(now - started)
        horizon = now - HANDOFF_HORIZON
        for node in [n for n, t in self._revoked_at.items() if t < horizon]:
            del self._revoked_at[node]
            self._released.discard(node)
