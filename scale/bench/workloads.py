"""The workloads of ``bench cluster`` and the arrival plan each one expands to. Pure and deterministic.

A ``WorkloadSpec`` is parameters only; ``arrivals(spec, ...)`` turns it into the exact list of pods to create and
when (seconds after the workload starts), identical for every scheduler so that runs compare like for like.

- ``backlog``: ``pods`` agent pods created while the scheduler under test is paused (SIGSTOP), then released
  at once (SIGCONT): the scheduler's throughput on a ready backlog, without the creates competing with its
  bindings for the API server. Latency counts from the release.
- ``burst``: ``pods`` agent pods all at once (the load generator creates them as fast as the API server takes
  them, ``create_concurrency`` in flight) while the scheduler runs: creates and bindings share the API server.
- ``steady``: ``pods`` agent pods arriving as a Poisson process at ``rate`` pods/s.
- ``churn``: like steady, and each pod carries a lifetime (uniform in 0.5–1.5 × ``lifetime_s``): the bench's kwok
  stages (``scale.bench.stages``) complete it that long after it runs and then delete it, so capacity frees
  continuously and the scheduler sees a stream of deletions alongside the creations.
- ``preempt`` (not in the default list: it fills the cluster first): every untainted node is first filled with
  placeholder pods of the lowest priority (``PLACEHOLDER_CLASS``; ``PLACEHOLDER`` each, ``LARGE_PLACEHOLDER``
  above ``LARGE_FLEET`` nodes; bound by ``nodeName`` so that no scheduler places them), then ``pods`` agent pods
  of a high priority (``PREEMPTOR_CLASS``) the size of one placeholder arrive at once: each one binds only after
  the scheduler under test has preempted a placeholder and kwok has deleted it (the cluster's ``pod-delete``
  stage deletes a pod as soon as it has a deletionTimestamp, so a graceful delete completes at once). Latency
  counts from each create to its bind;
  the victims are the placeholders gone at the end. The first bind comes only after every preemptor's first
  attempt, so the stall rule waits ``PREEMPT_FIRST_BIND_S`` for it (``first_bind_s``).
- ``spread``: ``pods`` agent pods as a backlog (created while the scheduler is paused, then released, so the
  throughput is not bounded by how fast pods are created), in sandbox pools of 8 with inter-pod rules
  (``scale.workload.interpod_pod``: zone spread with DoNotSchedule, required hostname anti-affinity, or both
  rules soft), as agent platforms spread a session's sandboxes; afterwards the placements are audited against
  the hard rules (``scale.workload.pool_rule_violations``).
- ``mix``: agent pods with placement rules (``scale.workload`` mix: tolerations, zone affinity, node selectors,
  a few GPU pods) at ``rate``, plus batch pods at ``batch_rate`` for the default scheduler (kube-scheduler) on the
  batch nodes, so two schedulers share the cluster.

Agent pods are ``scale.workload.agent_pod`` (100m–500m CPU, 128–512Mi); batch pods ask for 1 CPU / 2Gi.

With ``pull_delay_s`` > 0 every agent pod carries ``scale.bench.pulls.PULL_ANNOTATION``: it starts only after
the images its node lacks are pulled (simulated, ``pull_delay_s`` per image), so create -> running shows what
image locality saves.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from scale.bench.pulls import PULL_ANNOTATION
from scale.cluster.nodes import LABEL_POOL
from scale.workload import agent_pod, interpod_pod

BACKLOG = "backlog"
BURST = "burst"
STEADY = "steady"
CHURN = "churn"
MIX = "mix"
PREEMPT = "preempt"
SPREAD = "spread"
WORKLOADS = (BACKLOG, BURST, STEADY, CHURN, MIX, SPREAD, PREEMPT)

# A preemptor's retry comes after every other preemptor's first attempt (as in kube-scheduler: a pod moved back
# to the active queue is queued anew), so the first bind waits for about ``pods`` failed passes and dry runs:
# ~40 s for ours at 5,000 nodes, ~70 s under a coordinator. The stall rule waits this long for it.
PREEMPT_FIRST_BIND_S = 300.0
PLACEHOLDER_CLASS = "bench-placeholder"  # PriorityClass of the placeholders
PLACEHOLDER_PRIORITY = -10
PREEMPTOR_CLASS = "bench-agent-high"  # PriorityClass of the preemptors
PREEMPTOR_PRIORITY = 100000
PLACEHOLDER = {"cpu": "2", "memory": "8Gi"}  # the nodes' 1 CPU : 4Gi ratio: a node fills on both at once
# Above this many nodes a placeholder (and so a preemptor) is ``LARGE_PLACEHOLDER``: the fill stays ~4 pods per
# node (~19,000 at 5,000 nodes, not ~75,000), which one API server on the bench machine takes in a minute or two.
LARGE_FLEET = 2000
LARGE_PLACEHOLDER = {"cpu": "8", "memory": "32Gi"}

AGENT = "agent"
BATCH = "batch"

RUN_LABEL = "bench.agent-scheduler.io/workload"
LIFETIME_ANNOTATION = "bench.agent-scheduler.io/lifetime"
NODE_ANNOTATION = "bench.agent-scheduler.io/node"  # the no-decision binder's precomputed node
DEFAULT_SCHEDULER = "default-scheduler"


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkloadSpec:
    """Parameters of one workload; see the module docstring for what each kind does with them."""

    name: str
    #: agent pods created (the pods whose latency is measured)
    pods: int
    #: Poisson arrival rate of agent pods in pods/s; 0 means all at once
    rate: float = 0.0
    #: churn: mean pod lifetime in seconds after it runs (0: pods live until the workload is cleaned up)
    lifetime_s: float = 0.0
    #: mix: Poisson arrival rate of batch pods for the default scheduler
    batch_rate: float = 0.0
    #: agent pods with placement rules (``scale.workload`` mix)
    mix: bool = False
    #: fill the cluster with placeholders first; the agent pods preempt them (the preempt workload)
    preempt: bool = False
    #: sandbox pools with inter-pod rules (``scale.workload.interpod_pod``; the spread workload)
    spread: bool = False
    #: the requests of one placeholder, and of each preemptor (the preempt workload)
    placeholder: tuple[tuple[str, str], ...] = tuple(PLACEHOLDER.items())
    #: create every pod while the scheduler is paused, then release them at once (the backlog workload)
    paused: bool = False
    #: creates in flight at once
    create_concurrency: int = 64
    #: seconds a node takes to pull one image an agent pod needs and it lacks (0: no pulls simulated)
    pull_delay_s: float = 0.0
    #: how long the first bind may take before the bench's stall rule (``--stall``) applies, if longer
    first_bind_s: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if (
            self.pods < 0
            or self.rate < 0
            or self.lifetime_s < 0
            or self.batch_rate < 0
            or self.pull_delay_s < 0
            or self.first_bind_s < 0
        ):
            raise ValueError(f"workload {self.name}: counts and rates must be >= 0")
        if self.create_concurrency < 1:
            raise ValueError(f"workload {self.name}: create_concurrency must be >= 1")

    @property
    def duration_s(self) -> float:
        """Expected arrival span in seconds (0 for a burst)."""
        return self.pods / self.rate if self.rate > 0 else 0.0

    def params(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "lifetime_s": self.lifetime_s,
            "batch_rate": self.batch_rate,
            "mix": self.mix,
            "paused": self.paused,
            "preempt": self.preempt,
            "spread": self.spread,
            **({"placeholder": dict(self.placeholder)} if self.preempt else {}),
            "create_concurrency": self.create_concurrency,
            "pull_delay_s": self.pull_delay_s,
            **({"first_bind_s": self.first_bind_s} if self.first_bind_s else {}),
            "seed": self.seed,
        }


@dataclass(frozen=True, slots=True)
class Arrival:
    at: float  # seconds after the workload starts
    kind: str  # AGENT or BATCH
    pod: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])


def default_workloads(
    nodes: int,
    *,
    quick: bool = False,
    rate: float | None = None,
    burst: int | None = None,
    pods: int | None = None,
) -> dict[str, WorkloadSpec]:
    """The standard parameters for a cluster of ``nodes`` (quick: small and short, for a two-minute run).

    ``rate``, ``burst`` and ``pods`` override the arrival rate, the burst size and the pod count of the
    steady, churn and mix workloads."""
    if quick:
        burst_pods, steady_rate, steady_pods = 400, 40.0, 400
    else:
        burst_pods = 3000 if nodes <= 2000 else 5000
        steady_rate, steady_pods = 50.0, 1500
    burst_pods = burst if burst is not None else burst_pods
    steady_rate = rate if rate is not None else steady_rate
    steady_pods = max(steady_pods, int(steady_rate * 30)) if not quick else steady_pods
    steady_pods = pods if pods is not None else steady_pods
    lifetime = 5.0 if quick else 10.0
    return {
        BACKLOG: WorkloadSpec(name=BACKLOG, pods=burst_pods, paused=True),
        BURST: WorkloadSpec(name=BURST, pods=burst_pods),
        STEADY: WorkloadSpec(name=STEADY, pods=steady_pods, rate=steady_rate),
        CHURN: WorkloadSpec(name=CHURN, pods=steady_pods, rate=steady_rate, lifetime_s=lifetime),
        MIX: WorkloadSpec(
            name=MIX, pods=steady_pods, rate=steady_rate, mix=True, batch_rate=max(1.0, steady_rate / 5)
        ),
        SPREAD: WorkloadSpec(name=SPREAD, pods=burst_pods, spread=True, paused=True),
        PREEMPT: WorkloadSpec(
            name=PREEMPT,
            pods=burst if burst is not None else 1000,
            preempt=True,
            placeholder=tuple((LARGE_PLACEHOLDER if nodes > LARGE_FLEET else PLACEHOLDER).items()),
            first_bind_s=PREEMPT_FIRST_BIND_S,
        ),
    }


def poisson_times(count: int, rate: float, rng: random.Random) -> list[float]:
    """``count`` arrival times of a Poisson process at ``rate`` per second (all 0.0 when rate is 0)."""
    if rate <= 0:
        return [0.0] * count
    t, out = 0.0, []
    for _ in range(count):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def batch_pod(index: int, *, namespace: str) -> dict[str, Any]:
    """A batch job's pod for the default scheduler, pinned to the batch pool (tolerates its taint)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"batch-{index:06d}", "namespace": namespace, "labels": {"app": "batch"}},
        "spec": {
            "schedulerName": DEFAULT_SCHEDULER,
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {LABEL_POOL: "batch"},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "batch", "effect": "NoSchedule"}
            ],
            "containers": [
                {
                    "name": "job",
                    "image": "registry.local/batch-job:1",
                    "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
                }
            ],
        },
    }


def priority_classes() -> list[dict[str, Any]]:
    """The two PriorityClasses of the preempt workload."""
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
            "description": "agent-scheduler bench: preempt workload",
        }
        for name, value in ((PLACEHOLDER_CLASS, PLACEHOLDER_PRIORITY), (PREEMPTOR_CLASS, PREEMPTOR_PRIORITY))
    ]


def placeholders(
    fleet: list[dict[str, Any]], *, namespace: str, requests: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Lowest-priority placeholder pods of ``requests`` (``PLACEHOLDER``: whole CPUs, memory in Gi) that fill
    every untainted node of ``fleet`` (node objects) on CPU, memory and pod count, each bound to its node by
    ``spec.nodeName``."""
    requests = dict(requests or PLACEHOLDER)
    milli = _milli(requests["cpu"])
    mem_gi = _gi(requests["memory"])
    out: list[dict[str, Any]] = []
    for node in fleet:
        if (node.get("spec") or {}).get("taints"):
            continue  # the agent pods do not tolerate them: no preemptor would go there
        name = node["metadata"]["name"]
        alloc = node["status"]["allocatable"]
        count = min(
            _milli(alloc["cpu"]) // milli, _gi(alloc["memory"]) // mem_gi, int(alloc.get("pods", 110))
        )
        for i in range(count):
            out.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"placeholder-{name}-{i:03d}",
                        "namespace": namespace,
                        "labels": {"app": "placeholder", RUN_LABEL: PREEMPT},
                    },
                    "spec": {
                        "nodeName": name,
                        "priorityClassName": PLACEHOLDER_CLASS,
                        "containers": [
                            {
                                "name": "pause",
                                "image": "registry.local/pause:3",
                                "resources": {"requests": dict(requests)},
                            }
                        ],
                    },
                }
            )
    return out


def _milli(q: str) -> int:
    return int(q[:-1]) if q.endswith("m") else int(q) * 1000


def _gi(q: str) -> int:
    for suffix, div in (("Gi", 1), ("Mi", 1024), ("Ki", 1024 * 1024)):
        if q.endswith(suffix):
            return int(q.removesuffix(suffix)) // div
    return int(q) // 2**30


Placer = Callable[[dict[str, Any]], str | None]


def arrivals(
    spec: WorkloadSpec,
    *,
    namespace: str,
    scheduler_name: str,
    placer: Placer | None = None,
) -> list[Arrival]:
    """Every pod of the workload with its arrival time, sorted by time (ties: agent pods first, by name).

    ``scheduler_name`` goes into the agent pods' ``spec.schedulerName``. ``placer`` (no-decision runs only)
    returns a node known to fit each agent pod; it is written into the ``NODE_ANNOTATION`` for the binder.
    """
    rng = random.Random(f"workload:{spec.name}:{spec.seed}")
    times = poisson_times(spec.pods, spec.rate, rng)
    out: list[Arrival] = []
    for i, at in enumerate(times):
        if spec.spread:
            pod = interpod_pod(i, namespace=namespace, scheduler_name=scheduler_name, seed=spec.seed)
        else:
            pod = agent_pod(
                i, namespace=namespace, scheduler_name=scheduler_name, mix=spec.mix, seed=spec.seed
            )
        meta = pod["metadata"]
        meta["labels"][RUN_LABEL] = spec.name
        annotations: dict[str, str] = meta.setdefault("annotations", {})
        if spec.pull_delay_s > 0:
            annotations[PULL_ANNOTATION] = "true"
        if spec.preempt:
            pod["spec"]["priorityClassName"] = PREEMPTOR_CLASS
            for c in pod["spec"]["containers"]:
                c.setdefault("resources", {})["requests"] = dict(spec.placeholder)
        if spec.lifetime_s > 0:
            lifetime = spec.lifetime_s * rng.uniform(0.5, 1.5)
            annotations[LIFETIME_ANNOTATION] = f"{lifetime * 1000:.0f}ms"
        if placer is not None:
            node = placer(pod)
            if node is not None:
                annotations[NODE_ANNOTATION] = node
        out.append(Arrival(round(at, 6), AGENT, pod))
    if spec.batch_rate > 0:
        span = spec.duration_s or 1.0
        count = max(1, round(spec.batch_rate * span))
        batch_rng = random.Random(f"batch:{spec.name}:{spec.seed}")
        for i, at in enumerate(poisson_times(count, spec.batch_rate, batch_rng)):
            pod = batch_pod(i, namespace=namespace)
            pod["metadata"]["labels"][RUN_LABEL] = spec.name
            out.append(Arrival(round(at, 6), BATCH, pod))
    out.sort(key=lambda a: (a.at, a.kind != AGENT, a.name))
    return out


def scaled(spec: WorkloadSpec, **changes: Any) -> WorkloadSpec:
    """A copy of ``spec`` with some parameters changed (the CLI's overrides)."""
    return replace(spec, **changes)
