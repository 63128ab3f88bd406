"""Settings, as grouped dataclasses with a default and a docstring per field.

The environment and command line are read only at the entry points (``*/command.py``), which build these
objects; library code receives them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class ApiSettings:
    kubeconfig: str | None = None
    """Path of a kubeconfig; None means in-cluster credentials."""
    qps: float = 2000.0
    """Client-side request rate limit (client-go's QPS)."""
    burst: int = 2000
    """Client-side burst (client-go's Burst)."""
    max_connections: int = 128
    """Kept-alive connections to the API server, per pool: the writes' (``common.apiconn``) and the reads' and
    watches' (aiohttp) each hold up to this many."""
    warm_connections: int | None = None
    """Connections held open while idle (``common.kube.KubeClient.keep_warm``), so a burst after a quiet spell
    binds without opening them first; None: as many as bindings in flight at once (``binding.concurrency``);
    0: none held."""


@dataclass(slots=True)
class SchedulingSettings:
    scheduler_name: str = "agent-scheduler"
    """Pods whose ``spec.schedulerName`` is this are ours."""
    feasible_nodes: int = 16
    """Stop looking for candidates after this many feasible nodes (kube-scheduler's percentageOfNodesToScore)."""
    score_weights: dict[str, int] = field(default_factory=dict)
    """Override weights of the default profile's score plugins by name (0 disables one)."""
    strategy: str = "MostAllocated"
    """Allocation strategy: MostAllocated (binpack, default) or LeastAllocated (spread)."""
    warm_label: str = "node.volcano.sh/warmup=true"
    """Nodes with this label=value are warm (images pulled)."""
    session_label: str = "agent-scheduler.io/session"
    """Pods sharing this label's value prefer the nodes their session already runs on."""
    node_selector: str = ""
    """Standalone mode: only nodes matching this label selector are used."""
    spread_defaulting: str = "System"
    """kube-scheduler's PodTopologySpreadArgs ``defaultingType`` for pods stating no spread constraint:
    System (hostname maxSkew 3, zone maxSkew 5, ScheduleAnyway) or List (``spread_default_constraints``)."""
    spread_default_constraints: list[dict[str, Any]] = field(default_factory=list)
    """With List: the default constraints (topologySpreadConstraints without a selector); empty: none."""


@dataclass(slots=True)
class BindingSettings:
    concurrency: int = 128
    """Bindings in flight at once, over the write pool's connections (``api.max_connections``, shared with the
    Scheduled events and status writes). A backlog binds at most this many per binding round trip: on the
    2-core bench host, where the loaded API server answers a binding in 0.1-0.3 s, a backlog of 2,000 pods on
    1,000 nodes bound 500 pods/s at 64 and 693 at 128 in one paired run, 648 at 128 against the no-decision
    binder's 704 in another (docs/results/bind-concurrency-2026-12-07/). Where the API server answers faster fewer are in flight at
    once (all are held open while idle: ``api.warm_connections``); where several workers share it, keep
    their sum within what its priority level admits (the chart's ``worker.bindConcurrency``)."""
    retries: int = 4
    """Retries of a binding after 429/5xx/timeouts before the pod is rescheduled."""
    assume_ttl: float = 30.0
    """Seconds an assumed pod may stay unconfirmed by the watch after its binding returned."""


@dataclass(slots=True)
class ReportingSettings:
    qps: float = 50.0
    """Rate of unschedulable reports (condition patch + event) sent to the API server."""
    scheduled_events: bool = True
    """Emit a Scheduled event for every bound pod, as kube-scheduler does."""


@dataclass(slots=True)
class WorkerSettings:
    api: ApiSettings = field(default_factory=ApiSettings)
    scheduling: SchedulingSettings = field(default_factory=SchedulingSettings)
    binding: BindingSettings = field(default_factory=BindingSettings)
    reporting: ReportingSettings = field(default_factory=ReportingSettings)
    metrics_host: str = "127.0.0.1"
    """Address of the /metrics, /healthz, /readyz server."""
    metrics_port: int = 0
    """Port of that server; 0 picks a free one (logged at start)."""
    worker_id: str = ""
    """Identity in logs, events and etcd; defaults to hostname-pid."""
