"""The schedulers a scale run compares, and how each is started, made ready, measured and stopped.

Kinds:
- ``agent``: this project. ``agent-standalone`` is one ``agent-scheduler worker --standalone`` process;
  ``agent-coord-N`` is one ``agent-scheduler coordinator`` and N coordinated workers sharing the cluster's etcd
  (under a prefix of their own). All of them are measured together.
- ``kube-scheduler``: the cluster's own kube-scheduler (v1.36, started by ``scale.cluster`` with the client
  qps/burst of the spec: 5000/5000 as its scheduler_perf runs it, or its defaults 50/100).
- ``no-decision``: ``scale.bench.noop_binder``, binds each pod to a precomputed node (the ceiling), with 256
  bindings in flight over its client's 128 write connections (the worker's default is 128 in flight): fewer
  than the API server's priority-and-fairness level admits (at 512, bindings get 429s here).
- ``volcano-agent-scheduler``: Volcano's agent-scheduler binary (``scale.bench.volcano`` locates or builds it)
  with N scheduling workers in its one process (``--scheduler-worker-count``: 1 is its default), client
  qps/burst 5000, sharding mode ``none`` (no Volcano CRDs), leader election off, its default configuration
  (actions ``allocate``, plugins ``predicates`` and ``nodeorder``). Runs only when a binary was found.

Every cluster runs kube-scheduler, because the mix workload's batch pods are the default scheduler's; when it
is not the scheduler under test it runs at qps 5000 and is not measured.

Fair identity: our processes use the kubeconfig of the user kube-scheduler runs as (``system:kube-scheduler``),
after ``grant_agent_rbac`` bound the rules of both roles (``manifests/rbac.yaml``, rendered from the chart) to that
user too; so every
scheduler goes through the same API priority-and-fairness level and none is exempt as an admin would be.

Processes are started with the scale tooling's one launcher (``scale.cluster.processes``: their own session, a
log file each) and are stopped by PID only: SIGTERM (graceful: the worker drains its bindings), then SIGKILL
after a grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from common.kube import ApiError, Conflict, KubeClient
from common.wellknown import DEFAULT_ETCD_PREFIX, DEFAULT_SCHEDULER_NAME
from scale.bench import noop_binder
from scale.bench.meter import with_children
from scale.cluster import Cluster
from scale.cluster.components import SCHEDULER
from scale.cluster.config import PROJECT_ROOT, SCHEDULER_USER
from scale.cluster.ports import LOOPBACK, free_ports
from scale.cluster.processes import ProcessRecord, exit_code, is_running, spawn, stop, tail

log = logging.getLogger(__name__)

AGENT = "agent"
KUBE = "kube-scheduler"
NOOP = "no-decision"
VOLCANO = "volcano-agent-scheduler"

AGENT_SCHEDULER_NAME = DEFAULT_SCHEDULER_NAME
KUBE_SCHEDULER_NAME = "default-scheduler"
VOLCANO_SCHEDULER_NAME = "volcano-agent-scheduler"
ETCD_PREFIX = f"{DEFAULT_ETCD_PREFIX}-bench"
CLIENT_QPS = 5000.0
CLIENT_BURST = 5000
STOP_GRACE = 30.0
READY_TIMEOUT = 180.0
RBAC_FILE = PROJECT_ROOT / "manifests" / "rbac.yaml"
RBAC_BINDING = "agent-scheduler-bench"


@dataclass(frozen=True, kw_only=True, slots=True)
class SchedulerSpec:
    """One scheduler configuration under test."""

    name: str
    kind: str
    description: str
    #: agent: 0 for standalone, else a coordinator and this many workers; Volcano: its scheduling workers
    workers: int = 0
    #: client qps/burst of the cluster's kube-scheduler
    kube_qps: float = CLIENT_QPS
    kube_burst: int = CLIENT_BURST
    #: bindings in flight (agent workers' ``--bind-concurrency``, the no-decision binder's ``--concurrency``)
    bind_concurrency: int = 128
    #: agent, coordinated: flags of the coordinator beyond the bench's own
    coordinator_flags: tuple[str, ...] = ()
    #: in ``bench cluster``'s default list (every configuration but Volcano's unless its binary is found)
    in_default: bool = True

    @property
    def pod_scheduler_name(self) -> str:
        """What the measured pods put in ``spec.schedulerName``."""
        return {
            AGENT: AGENT_SCHEDULER_NAME,
            KUBE: KUBE_SCHEDULER_NAME,
            NOOP: noop_binder.SCHEDULER_NAME,
            VOLCANO: VOLCANO_SCHEDULER_NAME,
        }[self.kind]


SCHEDULERS: dict[str, SchedulerSpec] = {
    s.name: s
    for s in (
        SchedulerSpec(
            name="agent-standalone", kind=AGENT, description="agent scheduler, one standalone worker process"
        ),
        SchedulerSpec(
            name="agent-standalone-bc256",
            kind=AGENT,
            bind_concurrency=256,
            description="agent scheduler, one standalone worker process, --bind-concurrency 256",
        ),
        SchedulerSpec(
            name="agent-coord-1",
            kind=AGENT,
            workers=1,
            description="agent scheduler, coordinator + 1 worker (the sole worker, on by default)",
        ),
        SchedulerSpec(
            # the default spelled out: the name results made while it was off by default use
            name="agent-coord-1-sole",
            kind=AGENT,
            workers=1,
            coordinator_flags=("--sole-worker",),
            in_default=False,  # agent-coord-1, spelled out
            description="agent scheduler, coordinator --sole-worker + 1 worker",
        ),
        SchedulerSpec(
            name="agent-coord-1-dispatched",
            kind=AGENT,
            workers=1,
            coordinator_flags=("--no-sole-worker",),
            description="agent scheduler, coordinator --no-sole-worker + 1 worker (the leader dispatches every pod)",
        ),
        SchedulerSpec(
            name="agent-coord-2",
            kind=AGENT,
            workers=2,
            description="agent scheduler, coordinator + 2 workers",
        ),
        SchedulerSpec(
            name="kube-scheduler-qps5000",
            kind=KUBE,
            description="kube-scheduler v1.36, client qps/burst 5000",
        ),
        SchedulerSpec(
            name="kube-scheduler-default",
            kind=KUBE,
            kube_qps=50.0,
            kube_burst=100,
            description="kube-scheduler v1.36, default client qps 50 / burst 100",
        ),
        SchedulerSpec(
            name="no-decision",
            kind=NOOP,
            bind_concurrency=256,
            description="binds to precomputed nodes, 256 bindings in flight: the API server's ceiling",
        ),
        SchedulerSpec(
            name="volcano-agent-1w",
            kind=VOLCANO,
            workers=1,
            description="Volcano's agent-scheduler, 1 scheduling worker (its default), client qps/burst 5000",
        ),
        SchedulerSpec(
            name="volcano-agent-4w",
            kind=VOLCANO,
            workers=4,
            description="Volcano's agent-scheduler, 4 scheduling workers in one process, client qps/burst 5000",
        ),
    )
}
QUICK_SCHEDULERS = ("agent-standalone", "kube-scheduler-qps5000", "no-decision")


def default_schedulers(*, quick: bool) -> list[str]:
    """``bench cluster``'s configurations when none are named: every one in the default list but Volcano's
    (added when its binary is found), or ``QUICK_SCHEDULERS``."""
    if quick:
        return list(QUICK_SCHEDULERS)
    return [n for n, s in SCHEDULERS.items() if s.kind != VOLCANO and s.in_default]


def start(name: str, argv: list[str], log_path: Path, *, code: Path = PROJECT_ROOT) -> ProcessRecord:
    """Start one of our processes from the project checkout ``code`` (this one by default; another one's
    modules come first on its path), its output in ``log_path``."""
    record = spawn(name, argv, log_path, cwd=code, env=checkout_env(code))
    log.info("started %s (pid %d)", name, record.pid)
    return record


def checkout_env(code: Path) -> dict[str, str] | None:
    """The environment of a process run from the project checkout ``code``: this one's (None: inherited), or
    with ``code`` first on ``PYTHONPATH`` (ahead of this checkout's editable install)."""
    if code == PROJECT_ROOT:
        return None
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": str(code) + (os.pathsep + path if path else "")}


PROFILER = Path(__file__).with_name("cpuprofile.py")  # standard library only: runs beside any checkout


def python_module(module: str, *args: str, profile_to: Path | None = None, window: bool = False) -> list[str]:
    """The command running ``module``; under cProfile into ``profile_to`` if given, only within the windows
    ``Running.profile_window`` opens if ``window``. The profiler is this checkout's, run by its path: a
    contender from another checkout (``PYTHONPATH``) is profiled, and signalled, the way this bench expects,
    whatever that checkout's own profiler knows."""
    if profile_to is not None:
        profiler = [str(PROFILER), *(["--window"] if window else []), str(profile_to)]
        return [sys.executable, *profiler, module, *args]
    return [sys.executable, "-m", module, *args]


def stop_children(children: list[ProcessRecord], *, grace: float = STOP_GRACE) -> list[str]:
    """SIGTERM all (workers before the coordinator: reverse start order), SIGKILL what outlives ``grace``.

    Returns one line per process that did not exit cleanly."""
    problems = []
    for stopped in stop(list(reversed(children)), grace=grace, tail_lines=5):
        if stopped.killed:
            problems.append(f"{stopped.name} had to be killed")
        elif stopped.code:
            problems.append(f"{stopped.name} exited with status {stopped.code}: {stopped.log_tail}")
    return problems


class Running:
    """A scheduler under test, started on one cluster."""

    def __init__(
        self,
        spec: SchedulerSpec,
        cluster: Cluster,
        children: list[ProcessRecord],
        *,
        etcd_endpoint: str = "",
        etcd_prefix: str = "",
        metrics_addresses: list[str] | None = None,
        code: Path = PROJECT_ROOT,
        profiled_windows: bool = False,
    ) -> None:
        self.spec = spec
        self.cluster = cluster
        self.children = children
        self.etcd_endpoint = etcd_endpoint
        self.etcd_prefix = etcd_prefix  # a coordinated configuration's, under ``ETCD_PREFIX``
        self.code = code  # the project checkout our processes run from
        self.metrics_addresses = metrics_addresses or []  # host:port of each of our processes' /metrics
        self.notes: list[str] = []
        # our processes run under this checkout's ``cpuprofile.py --window`` (``PROFILER``): they take
        # SIGUSR1/SIGUSR2
        self.profiled_windows = profiled_windows

    def process_names(self) -> dict[int, str]:
        """PID -> name of each process counted as the scheduler's (``coordinator``, ``worker-1``, ...)."""
        if self.spec.kind == KUBE:
            return dict.fromkeys(self.pids(), "kube-scheduler")
        return {c.pid: c.name for c in self.children}

    def pids(self) -> list[int]:
        """The processes whose CPU and memory count as the scheduler's (children included by the meter)."""
        if self.spec.kind == KUBE:
            record = self.cluster.state.process(SCHEDULER)
            return [record.pid] if record is not None else []
        return [c.pid for c in self.children if is_running(c)]

    def pause(self) -> None:
        """SIGSTOP every process of the scheduler (the backlog workload); ``resume`` undoes it."""
        self._signal_all(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal_all(signal.SIGCONT)

    def profile_window(self, on: bool) -> None:
        """Turn the profilers of our processes on (a measured window starts) or off (it ended); nothing
        unless they run under ``scale.bench.cpuprofile --window`` (to any other process these signals are
        fatal)."""
        if self.profiled_windows:
            self._signal(self.pids(), signal.SIGUSR1 if on else signal.SIGUSR2)

    def _signal_all(self, sig: int) -> None:
        self._signal(with_children(self.pids()), sig)

    @staticmethod
    def _signal(pids: list[int], sig: int) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def dead(self) -> list[str]:
        return [
            f"{c.name} exited early (status {exit_code(c)}): {tail(c.log, 8)}"
            for c in self.children
            if not is_running(c)
        ]

    def stop(self) -> list[str]:
        return stop_children(self.children)


def scheduler_kubeconfig(cluster: Cluster) -> Path:
    """The kubeconfig of the ``system:kube-scheduler`` user the cluster wrote for kube-scheduler."""
    return cluster.layout.component_kubeconfig(SCHEDULER)


def agent_rules(docs: list[dict[str, Any]], *, configmap: str | None = None) -> list[dict[str, Any]]:
    """The rules of every ClusterRole and Role in the chart's rendered RBAC (``manifests/rbac.yaml``): what one
    identity running both roles needs. A Role's rules name its namespace's objects; as cluster-wide rules they
    keep their ``resourceNames`` (``configmap``, when given, replaces the ConfigMap's name)."""
    rules: list[dict[str, Any]] = []
    for doc in docs:
        if doc.get("kind") not in ("ClusterRole", "Role"):
            continue
        for rule in doc.get("rules") or []:
            named = configmap and "configmaps" in rule.get("resources", []) and rule.get("resourceNames")
            rules.append({**rule, "resourceNames": [configmap]} if named else rule)
    return rules


async def grant_agent_rbac(client: KubeClient, rbac_file: Path = RBAC_FILE) -> str:
    """Create a ClusterRole with the rules of both roles from ``rbac_file`` and bind it to
    ``system:kube-scheduler``.

    Returns "" when done, else why not (the caller then runs our processes as admin and says so)."""
    try:
        text = await asyncio.to_thread(rbac_file.read_text)
        docs = [d for d in yaml.safe_load_all(text) if d]
    except (OSError, yaml.YAMLError) as e:
        return f"cannot read {rbac_file}: {e}"
    rules = agent_rules(docs)
    if not rules:
        return f"{rbac_file} has no ClusterRole"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": RBAC_BINDING},
        "rules": rules,
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": RBAC_BINDING},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": RBAC_BINDING},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": SCHEDULER_USER}],
    }
    try:
        for path, body in (
            ("/apis/rbac.authorization.k8s.io/v1/clusterroles", role),
            ("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding),
        ):
            with contextlib.suppress(Conflict):
                await client.post(path, body)
    except ApiError as e:
        return f"creating the RBAC for {SCHEDULER_USER} failed: {e}"
    return ""


PAUSED_LEASE_TTL = 120
PAUSED_NOTE = (
    "coordinated processes ran with --lease-ttl {ttl}: a backlog pauses them while its pods are created"
)


def paused_lease_ttl(spec: SchedulerSpec, *, paused: bool) -> int | None:
    """The ``--lease-ttl`` of a coordinated configuration's processes when a workload pauses them (SIGSTOP while
    a backlog's pods are created), else None (their default). Creating the backlog takes longer here than the
    5 s a process keeps its lease unrefreshed at the default 10-s TTL: every process would be fenced, and the
    run would measure a failover onto the backlog instead of the backlog. At ``PAUSED_LEASE_TTL`` (fenced after
    60 s) the leases are refreshed every 20 s instead of every 1.7 s, and a binding attempt may last up to its
    own 30-s limit instead of ending a margin before a fencing deadline 5 s away. ``bench cluster`` runs every
    workload of a configuration on one launch, so all of them get it when one pauses. The dispatch stream's
    own silence limit (5 s, ``common.protocol.DEAD_AFTER``) is not lengthened: a pause may still end a link."""
    return PAUSED_LEASE_TTL if paused and spec.kind == AGENT and spec.workers > 0 else None


def launch(
    spec: SchedulerSpec,
    cluster: Cluster,
    logs: Path,
    *,
    kubeconfig: Path,
    profile_to: Path | None = None,
    tag: str = "",
    volcano_binary: str = "",
    code: Path = PROJECT_ROOT,
    profile_windows: bool = False,
    lease_ttl: int | None = None,
) -> Running:
    """Start the processes of ``spec`` (none for kube-scheduler, which the cluster runs; Volcano's from
    ``volcano_binary``; ours from the project checkout ``code``). A coordinated configuration gets the etcd
    prefix ``ETCD_PREFIX/<name>[-<tag>]``: a launch with a new tag starts from an empty shard map, and its
    processes' ``--lease-ttl`` is ``lease_ttl`` (None: their default)."""
    cli = "agent_scheduler.cli"
    common = [
        f"--kubeconfig={kubeconfig}",
        f"--scheduler-name={spec.pod_scheduler_name}",
        f"--kube-api-qps={CLIENT_QPS:g}",
        f"--kube-api-burst={CLIENT_BURST}",
    ]
    suffix = f"-{tag}" if tag else ""
    # AGENT_BENCH_PROFILE_DIR: every one of our processes runs under cProfile (CPU-timed: scale.bench.cpuprofile),
    # its stats written there when it stops (to find where the CPU of a coordinator and its workers goes; the
    # processes run slower meanwhile). With ``profile_windows`` (a caller that opens ``Running.profile_window``
    # around what it measures) only those windows are profiled; otherwise the whole run.
    # absolute: our processes run in their checkout's directory, which may not be the bench's
    profile_dir = str(Path(d).resolve()) if (d := os.environ.get("AGENT_BENCH_PROFILE_DIR", "")) else ""
    window = profile_windows and profile_to is None and bool(profile_dir)
    if profile_dir and profile_to is None:
        # cProfile writes its stats into an existing directory only: without it every process's are lost
        Path(profile_dir).mkdir(parents=True, exist_ok=True)

    def profiled(process: str) -> Path | None:
        if profile_to is not None:
            return profile_to
        return Path(profile_dir) / f"{spec.name}-{process}{suffix}.pstats" if profile_dir else None

    if spec.kind == KUBE:
        return Running(spec, cluster, [])
    if spec.kind == VOLCANO:
        if not volcano_binary:
            raise ValueError(f"{spec.name}: no Volcano agent-scheduler binary")
        listen, healthz = free_ports(2)
        child = start(
            "volcano-agent-scheduler",
            [
                volcano_binary,
                f"--kubeconfig={kubeconfig}",
                f"--scheduler-name={spec.pod_scheduler_name}",
                f"--scheduler-worker-count={spec.workers}",
                f"--kube-api-qps={CLIENT_QPS:g}",
                f"--kube-api-burst={CLIENT_BURST}",
                "--leader-elect=false",
                "--scheduler-sharding-mode=none",
                f"--listen-address={LOOPBACK}:{listen}",
                f"--healthz-address={LOOPBACK}:{healthz}",
                "--cache-dumper=false",
            ],
            logs / f"{spec.name}{suffix}.log",
        )
        return Running(spec, cluster, [child])
    if spec.kind == NOOP:
        child = start(
            "no-decision",
            python_module(
                "scale.bench.noop_binder",
                f"--kubeconfig={kubeconfig}",
                f"--scheduler-name={spec.pod_scheduler_name}",
                f"--qps={CLIENT_QPS:g}",
                f"--burst={CLIENT_BURST}",
                f"--concurrency={spec.bind_concurrency}",
            ),
            logs / f"no-decision{suffix}.log",
            code=code,
        )
        return Running(spec, cluster, [child], code=code)
    # Each of our processes serves /metrics on a port chosen here, so the bench can read its stage latencies.
    addresses = [f"{LOOPBACK}:{port}" for port in free_ports(spec.workers + 1)]
    if spec.workers == 0:
        child = start(
            "worker",
            python_module(
                cli,
                "worker",
                "--standalone",
                *common,
                f"--metrics-address={addresses[0]}",
                f"--bind-concurrency={spec.bind_concurrency}",
                "--id=bench-standalone",
                profile_to=profiled("worker"),
                window=window,
            ),
            logs / f"{spec.name}-worker{suffix}.log",
            code=code,
        )
        return Running(
            spec, cluster, [child], metrics_addresses=addresses, code=code, profiled_windows=window
        )
    etcd = cluster.etcd_endpoint.removeprefix("http://")
    prefix = f"{ETCD_PREFIX}/{spec.name}{suffix}"
    leases = () if lease_ttl is None else (f"--lease-ttl={lease_ttl}",)
    children = []
    try:
        # Workers first: when the coordinator's first round runs, they are all registered and the nodes are
        # placed once, instead of all going to the first worker and then being rebalanced.
        for i in range(spec.workers):
            children.append(
                start(
                    f"worker-{i + 1}",
                    python_module(
                        cli,
                        "worker",
                        *common,
                        f"--etcd-endpoints={etcd}",
                        f"--etcd-prefix={prefix}",
                        *leases,
                        f"--id=bench-w{i + 1}",
                        f"--bind-concurrency={spec.bind_concurrency}",
                        f"--metrics-address={addresses[i]}",
                        profile_to=profiled(f"worker-{i + 1}"),
                        window=window,
                    ),
                    logs / f"{spec.name}-worker-{i + 1}{suffix}.log",
                    code=code,
                )
            )
        children.append(
            start(
                "coordinator",
                python_module(
                    cli,
                    "coordinator",
                    *common,
                    f"--etcd-endpoints={etcd}",
                    f"--etcd-prefix={prefix}",
                    *leases,
                    "--id=bench-coordinator",
                    f"--metrics-address={addresses[spec.workers]}",
                    *spec.coordinator_flags,
                    profile_to=profiled("coordinator"),
                    window=window,
                ),
                logs / f"{spec.name}-coordinator{suffix}.log",
                code=code,
            )
        )
    except BaseException:
        stop_children(children)  # what started before the failure does not outlive it
        raise
    return Running(
        spec,
        cluster,
        children,
        etcd_endpoint=etcd,
        etcd_prefix=prefix,
        metrics_addresses=addresses,
        code=code,
        profiled_windows=window,
    )


async def shard_status(running: Running) -> dict[str, Any] | None:
    """``agent-scheduler status --json`` for a coordinated scheduler (None when it cannot be read)."""
    proc = await asyncio.create_subprocess_exec(
        *python_module(
            "agent_scheduler.cli",
            "status",
            "--json",
            f"--etcd-endpoints={running.etcd_endpoint}",
            f"--etcd-prefix={running.etcd_prefix}",
        ),
        cwd=running.code,
        env=checkout_env(running.code),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    out, _ = await proc.communicate()
    try:
        status: dict[str, Any] = json.loads(out)
    except json.JSONDecodeError:
        return None
    return status


async def wait_sharded(running: Running, nodes: int, *, timeout: float = READY_TIMEOUT) -> str:
    """Wait until every worker holds nodes, all ``nodes`` are granted, no handoff is under way and every live
    worker places pods on all the nodes granted to it (its load report's ``usable``): a worker granted nodes
    after its pod watch listed catches up on them node by node, and a burst sent meanwhile would measure the
    catch-up, not the scheduler.

    Returns "" when settled, else a note on how far it got (the run goes on; the note is reported)."""
    deadline = time.monotonic() + timeout
    settled_polls = 0
    last: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        if running.dead():
            return "; ".join(running.dead())
        last = await shard_status(running)
        workers = (last or {}).get("workers") or {}
        live = [w for w in workers.values() if w.get("live") and w.get("nodes", 0) > 0]
        granted = sum(int(w.get("nodes", 0)) for w in workers.values())
        moving = sum(int(w.get("revoking", 0)) for w in workers.values())
        catching_up = [w for w in live if int(w.get("usable", 0)) < int(w.get("nodes", 0))]
        if len(live) == running.spec.workers and granted >= nodes and moving == 0 and not catching_up:
            settled_polls += 1
            if settled_polls >= 2:
                return ""
        else:
            settled_polls = 0
        await asyncio.sleep(1.0)
    shards = {
        k: (v.get("nodes"), v.get("usable"), v.get("revoking"))
        for k, v in ((last or {}).get("workers") or {}).items()
    }
    return f"shard map not settled after {timeout:.0f}s: (nodes, usable, revoking) per worker {shards}"
