"""The ``share`` workload's arrival plan (issue 15 item 1), pure and deterministic: agent sandboxes in waves over
a standing backlog of batch pods. ``agent-scheduler bench share`` (``scale.bench.share_run``) runs it on the real
local cluster under three shard policies side by side; ``bench cluster`` refuses ``--workloads share`` and
points there.

Time is *simulated* and compressed: ``ShareSpec.compression`` simulated seconds pass per real second, so ten
simulated minutes of waves (the issue's minimum) take one real minute at the default 10. Every time in the plan
(arrival offsets, lifetime annotations) is already real, i.e. divided by the compression.

- Agent pods (``scale.workload.agent_pod``, the agent scheduler's name) arrive in waves: each
  ``wave_period_s`` starts with a burst of ``wave_burst_s`` during which they arrive as a Poisson process at
  ``wave_rate`` per simulated second, then a quiet rest of the period. Each lives a log-uniform time between
  ``lifetime_min_s`` and ``lifetime_max_s`` simulated seconds after it runs (seconds to minutes), carried in the
  lifetime annotation the bench's kwok stages act on (``scale.bench.stages``), so capacity frees as it would.
- Batch pods (``scale.bench.workloads.batch_pod``: 1 CPU / 2Gi, the default scheduler) are a backlog of
  ``batch_backlog`` pods queued at the start, each running ``batch_runtime_s`` simulated seconds. They carry no
  node constraint here: the batch side (a stand-in following Volcano's NodeShard protocol, like
  ``scale.bench.share_batch.BatchSide``) releases them at safe points, each restricted (required node affinity on
  ``metadata.name``) to the nodes of the batch NodeShard it has confirmed at that safe point.

Invariants: the plan depends only on the spec (same spec, same pods, same times); agent arrivals fall inside
burst windows only; every lifetime is within its bounds after compression.

The run (``scale.bench.share_run``) gives every configuration nodes of ``node_cpu`` CPUs; the ``tuned_*`` fields
parameterise the tuned configuration's policy there, the ``scheduled_*`` fields the scheduled one's (the tuned
policy with its free-CPU target, or a node count, switched ahead of each wave: ``scheduled_levels``, pure like the
plan); ``tuned_residence_s`` / ``tuned_batch_residence_s`` are both configurations' ``minResidenceSeconds``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from scale.bench.workloads import AGENT, BATCH, LIFETIME_ANNOTATION, RUN_LABEL, Arrival, batch_pod
from scale.workload import agent_pod

SHARE = "share"
MIN_SIMULATED_S = 600.0  # the issue asks for at least ten simulated minutes of waves


@dataclass(frozen=True, kw_only=True, slots=True)
class ShareSpec:
    """Parameters of the share workload; times in simulated seconds (see the module docstring)."""

    simulated_s: float = MIN_SIMULATED_S
    compression: float = 10.0
    wave_period_s: float = 120.0
    wave_burst_s: float = 20.0
    wave_rate: float = 10.0
    lifetime_min_s: float = 5.0
    lifetime_max_s: float = 300.0
    batch_backlog: int = 400
    batch_runtime_s: float = 240.0
    seed: int = 0
    #: every node of the run: this many CPUs and 4 GiB of memory per CPU
    node_cpu: int = 4
    #: the tuned configuration (``scale.bench.share_run.policies``): the agent shard's allocation-rate ceiling
    #: and free CPU to keep (cores, ``free-capacity``), its sync period (simulated seconds) and hysteresis
    tuned_agent_max_util: float = 0.95
    tuned_free_cpu: float = 28.0
    tuned_sync_s: float = 60.0
    tuned_band_hysteresis: float = 0.0
    tuned_rank_hysteresis: float = 1.0
    tuned_max_moves: int = 4
    #: free-capacity's ``reclaim`` (count batch pods on a node as capacity that comes back) with the agent's
    #: util ceiling lifted to 100 %, so the shard can take nodes a batch backlog keeps full
    tuned_reclaim: bool = False
    #: the scheduled configuration: the tuned policy whose ``minFreeCPU`` the run switches from ``low`` (quiet) to
    #: ``high`` ``scheduled_lead_s`` simulated seconds before each wave and back when its burst ends, as an
    #: operator's scheduled edit of the ConfigMap would for waves known in advance
    scheduled_free_cpu_low: float = 4.0
    scheduled_free_cpu_high: float = 28.0
    scheduled_lead_s: float = 60.0
    #: simulated seconds ``high`` stays in force after a burst ends, while its last pods are still being placed
    scheduled_hold_s: float = 20.0
    #: when > 0, the scheduled configuration switches node-limit's ``maxNodes`` between ``scheduled_nodes_high``
    #: (for a wave) and ``scheduled_nodes_low`` (between waves) instead of ``minFreeCPU``: the agent shard holds
    #: a fixed number of nodes during a wave (the static split's, say) and does not grow while the wave fills it
    scheduled_nodes_high: int = 0
    scheduled_nodes_low: int = 1
    #: the tuned and scheduled configurations' ``minResidenceSeconds`` (simulated s; 0: off): a node that moved
    #: stays with its new shard at least this long
    tuned_residence_s: float = 0.0
    #: the same for nodes given to the batch shard (``minResidenceSecondsByScheduler``; 0: as above): a lent node
    #: stays with batch that long, so with it above the gap between waves the nodes lent after one wave are not
    #: the ones taken back before the next
    tuned_batch_residence_s: float = 0.0

    def __post_init__(self) -> None:
        if self.simulated_s < MIN_SIMULATED_S:
            raise ValueError(f"share: at least {MIN_SIMULATED_S:.0f} simulated seconds of waves")
        if self.compression <= 0 or self.wave_rate <= 0 or self.batch_runtime_s <= 0:
            raise ValueError("share: compression, wave_rate and batch_runtime_s must be > 0")
        if not 0 < self.wave_burst_s <= self.wave_period_s:
            raise ValueError("share: 0 < wave_burst_s <= wave_period_s")
        if not 0 < self.lifetime_min_s <= self.lifetime_max_s:
            raise ValueError("share: 0 < lifetime_min_s <= lifetime_max_s")
        if not 0 < self.scheduled_free_cpu_low <= self.scheduled_free_cpu_high:
            raise ValueError("share: 0 < scheduled_free_cpu_low <= scheduled_free_cpu_high")
        if self.scheduled_lead_s < 0 or self.scheduled_hold_s < 0:
            raise ValueError("share: scheduled_lead_s and scheduled_hold_s must be >= 0")
        if self.batch_backlog < 0:
            raise ValueError("share: batch_backlog must be >= 0")
        if self.scheduled_nodes_high and not 0 < self.scheduled_nodes_low <= self.scheduled_nodes_high:
            raise ValueError("share: 0 < scheduled_nodes_low <= scheduled_nodes_high")
        if self.tuned_residence_s < 0 or self.tuned_batch_residence_s < 0:
            raise ValueError("share: tuned_residence_s and tuned_batch_residence_s must be >= 0")

    def real(self, simulated: float) -> float:
        return simulated / self.compression


def scheduled_levels(spec: ShareSpec) -> list[tuple[float, bool]]:
    """The scheduled configuration's switches as (real offset from the first wave, high?), sorted: high
    ``scheduled_lead_s`` before every wave after the first (the first starts under high), low
    ``scheduled_hold_s`` after each burst ends (lead + hold are cut to fit the quiet part of a period, the
    lead first). The waves go on after the measured ones: the high switch for the wave that would follow the
    last is kept when it falls inside the run, so the schedule does not lend nodes over the end of the run
    that it would have to take back in time for that wave. Depends on the spec only."""
    quiet = spec.wave_period_s - spec.wave_burst_s
    hold = min(spec.scheduled_hold_s, quiet)
    lead = min(spec.scheduled_lead_s, quiet - hold)
    out: list[tuple[float, bool]] = []
    start = 0.0
    while start - lead < spec.simulated_s:
        if start > 0:
            out.append((spec.real(start - lead), True))
        if start < spec.simulated_s:
            out.append((spec.real(start + spec.wave_burst_s + hold), False))
        start += spec.wave_period_s
    return out


def scheduled_targets(spec: ShareSpec) -> list[tuple[float, float]]:
    """``scheduled_levels`` as ``minFreeCPU`` switches: (real offset from the first wave, cores)."""
    high, low = spec.scheduled_free_cpu_high, spec.scheduled_free_cpu_low
    return [(at, high if up else low) for at, up in scheduled_levels(spec)]


def agent_demand(spec: ShareSpec) -> list[float]:
    """Cores the plan's agent pods request at each whole simulated second of the waves, were every pod running
    from its arrival for its lifetime: the demand a split must serve (its peak) and the capacity a fixed agent
    pool leaves idle (pool minus the mean). Depends on the spec only."""
    plan = share_plan(spec, namespace="demand", scheduler_name="demand")
    seconds = math.ceil(spec.simulated_s)
    delta = [0] * (seconds + 1)  # milli CPU, exact
    for arrival in plan.agents:
        pod = arrival.pod
        milli = sum(_milli(c["resources"]["requests"]["cpu"]) for c in pod["spec"]["containers"])
        start = arrival.at * spec.compression
        life = float(pod["metadata"]["annotations"][LIFETIME_ANNOTATION].removesuffix("ms")) / 1000
        end = start + life * spec.compression
        delta[min(seconds, math.ceil(start))] += milli
        delta[min(seconds, math.ceil(end))] -= milli
    out, level = [], 0
    for d in delta[:seconds]:
        level += d
        out.append(level / 1000)
    return out


def _milli(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else round(float(quantity) * 1000)


@dataclass(frozen=True, slots=True)
class SharePlan:
    agents: list[Arrival]  # at real offsets, sorted by time
    batch_backlog: list[Arrival]  # all at 0: queued for the batch side to release


def share_plan(spec: ShareSpec, *, namespace: str, scheduler_name: str) -> SharePlan:
    rng = random.Random(f"share:{spec.seed}")
    agents: list[Arrival] = []
    index = 0
    start = 0.0
    while start < spec.simulated_s:
        t = start
        end = min(start + spec.wave_burst_s, spec.simulated_s)
        while True:
            t += rng.expovariate(spec.wave_rate)
            if t >= end:
                break
            pod = agent_pod(index, namespace=namespace, scheduler_name=scheduler_name, seed=spec.seed)
            life = math.exp(rng.uniform(math.log(spec.lifetime_min_s), math.log(spec.lifetime_max_s)))
            pod["metadata"]["labels"][RUN_LABEL] = SHARE
            annotations = pod["metadata"].setdefault("annotations", {})
            annotations[LIFETIME_ANNOTATION] = f"{spec.real(life) * 1000:.0f}ms"
            agents.append(Arrival(round(spec.real(t), 6), AGENT, pod))
            index += 1
        start += spec.wave_period_s
    batch: list[Arrival] = []
    for i in range(spec.batch_backlog):
        pod = batch_pod(i, namespace=namespace)
        pod["metadata"]["labels"][RUN_LABEL] = SHARE
        pod["metadata"]["annotations"] = {
            LIFETIME_ANNOTATION: f"{spec.real(spec.batch_runtime_s) * 1000:.0f}ms"
        }
        batch.append(Arrival(0.0, BATCH, pod))
    return SharePlan(agents, batch)
