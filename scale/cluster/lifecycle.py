"""Bringing a local cluster up and down: the ``Cluster`` handle and the functions that make one.

Start order, each step waiting for the previous one to be ready: key material and tokens, etcd, kube-apiserver
(``/readyz``), the kubeconfigs (they need the API server's port), kwok, kube-controller-manager (unless left
out), optionally kube-scheduler, then the fake nodes. ``state.json`` is rewritten after every process start.

Invariants:
- Every process this package starts is recorded before we wait for it, so no failure path leaks a process:
  a failed start stops everything it started (phase ``failed``, logs kept), and ``--force`` stops whatever a
  crashed run left behind, matched by PID *and* start time.
- A directory is only wiped (``--force``, ``down``) when it holds nothing but entries this package creates.
- Ports are picked free just before each start; a component that then dies with "address already in use" is
  started again on fresh ports (``ClusterOptions.port_retries`` times).
- Stopping goes in reverse: kube-scheduler, kube-controller-manager, kwok and kube-apiserver first, etcd once
  they are gone.
- An interpreter that starts a cluster answers SIGTERM from then on as it answers Ctrl-C, unless it handles
  SIGTERM its own way (``processes.stop_on_sigterm``, from the main thread): a start interrupted in the main
  thread stops what it started, and the caller's cleanup (a benchmark's, the demo's, the test session's)
  runs. A cluster ``start_cluster_async`` was starting when its caller was interrupted is stopped by the
  starting thread once its start ends. ``cluster up`` still leaves a started cluster running.

With kube-controller-manager, Deployments, ReplicaSets and Jobs make pods, the garbage collector deletes what
lost its owner, deleted namespaces are emptied and removed, and PersistentVolumes bind to claims (see
``components`` for which controllers run). Nodes still never turn NotReady on their own: the node lifecycle
controller is left out, as kwok's nodes do not heartbeat like kubelets. Scale runs leave the controller manager
out (``with_controller_manager=False``): its controllers watch every pod, and on a small machine that CPU would
be taken from the schedulers being measured.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import shutil
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from common.backoff import Backoff
from common.kube import ApiError, Credentials, KubeClient
from scale.cluster import components
from scale.cluster.components import (
    APISERVER,
    CONTROLLER_MANAGER,
    ETCD,
    KWOK,
    SCHEDULER,
    Component,
    Ports,
)
from scale.cluster.config import (
    ADMIN_USER,
    CONTROLLER_MANAGER_USER,
    DEFAULT_DIR,
    KWOK_USER,
    SCHEDULER_USER,
    ClusterOptions,
    Layout,
    kubeconfig_document,
    scheduler_config_document,
    token_file_document,
)
from scale.cluster.errors import ClusterError, ComponentFailed, DirectoryInUse
from scale.cluster.nodes import create_nodes, make_node
from scale.cluster.pki import generate_pki, new_token
from scale.cluster.ports import LOOPBACK, free_ports
from scale.cluster.processes import (
    ProcessRecord,
    exit_code,
    is_running,
    rss_bytes,
    spawn,
    stop_on_sigterm,
    tail,
    terminate,
)
from scale.cluster.stages import kwok_config
from scale.cluster.state import FAILED, RUNNING, STARTING, ClusterState, load, save

log = logging.getLogger(__name__)

STOPPED = "stopped"
READY_POLL_INITIAL = 0.05  # a component's readiness probe: often at first, then every half second
READY_POLL_MAX = 0.5
_PORT_TAKEN = "address already in use"
_T = TypeVar("_T")


class _PortTaken(Exception):
    """Internal: the component lost its port to another process before binding it."""


@dataclass(frozen=True, slots=True)
class ComponentStatus:
    name: str
    pid: int
    running: bool
    rss_bytes: int | None
    log: str


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    """What ``cluster status`` shows; ``nodes`` is None when the API server could not be asked."""

    dir: str
    phase: str
    server: str
    etcd_endpoint: str
    kubeconfig: str
    ports: dict[str, int]
    components: list[ComponentStatus] = field(default_factory=list)
    nodes: int | None = None
    nodes_error: str = ""

    @property
    def healthy(self) -> bool:
        return self.phase == RUNNING and all(c.running for c in self.components)


class Cluster:
    """A handle on one cluster directory: where its API server and etcd are, and how to stop it.

    Get one from ``start_cluster`` (which started it) or ``Cluster.open(dir)`` (any cluster directory).
    ``KubeClient`` instances from ``client()`` must be created inside a running event loop and closed.
    """

    def __init__(self, layout: Layout, state: ClusterState, options: ClusterOptions | None = None) -> None:
        self.layout = layout
        self.state = state
        self.options = options or ClusterOptions()

    @classmethod
    def open(cls, directory: str | Path = DEFAULT_DIR, options: ClusterOptions | None = None) -> Cluster:
        """The cluster recorded in ``directory``; raises ``NoCluster`` when there is none."""
        layout = Layout(Path(directory).resolve())
        return cls(layout, load(layout.state), options)

    @property
    def dir(self) -> Path:
        return self.layout.root

    @property
    def kubeconfig(self) -> Path:
        return self.layout.kubeconfig

    @property
    def server(self) -> str:
        return self.state.server

    @property
    def etcd_endpoint(self) -> str:
        """Client URL of the cluster's etcd (other components may keep their own keys there)."""
        return self.state.etcd_endpoint

    @property
    def ca_file(self) -> Path:
        return self.layout.pki / "ca.crt"

    @property
    def token(self) -> str:
        """The admin user's bearer token (group system:masters)."""
        return _read_token(self.layout, ADMIN_USER)

    @property
    def processes(self) -> list[ProcessRecord]:
        return list(self.state.processes)

    def credentials(self) -> Credentials:
        return Credentials(server=self.server, token=self.token, ca_file=str(self.ca_file))

    def client(self, *, qps: float = 2000.0, burst: int = 2000, max_connections: int = 128) -> KubeClient:
        """An admin ``KubeClient``; call inside a running event loop and close it."""
        return KubeClient(self.credentials(), qps=qps, burst=burst, max_connections=max_connections)

    def running(self) -> dict[str, bool]:
        return {p.name: is_running(p) for p in self.state.processes}

    async def add_nodes(self, count: int, *, start: int | None = None, seed: int | None = None) -> int:
        """Create fleet nodes ``start .. start+count-1`` (default: after the ones made so far); returns new ones."""
        first = self.state.nodes if start is None else start
        chosen_seed = self.state.node_seed if seed is None else seed
        prepulled = self.options.prepulled_fraction
        nodes = (make_node(i, seed=chosen_seed, prepulled=prepulled) for i in range(first, first + count))
        async with self.client() as client:
            created = await create_nodes(client, nodes, concurrency=self.options.node_concurrency)
        self.state.nodes = max(self.state.nodes, first + count)
        self._save()
        return created

    def count_nodes(self) -> int:
        """How many Node objects the API server has (one cheap paged request)."""
        page = components.get_json(
            f"{self.server}/api/v1/nodes?limit=1", ca_file=self.ca_file, token=self.token
        )
        meta = page.get("metadata") or {}
        return len(page.get("items") or ()) + int(meta.get("remainingItemCount") or 0)

    def status(self) -> ClusterStatus:
        nodes: int | None = None
        nodes_error = ""
        apiserver = self.state.process(APISERVER)
        if apiserver is not None and is_running(apiserver) and self.server:
            try:
                nodes = self.count_nodes()
            except (OSError, ValueError, ClusterError) as e:
                nodes_error = str(e)
        return ClusterStatus(
            dir=str(self.dir),
            phase=self.state.phase,
            server=self.server,
            etcd_endpoint=self.etcd_endpoint,
            kubeconfig=str(self.kubeconfig) if self.kubeconfig.exists() else "",
            ports=dict(self.state.ports),
            components=[
                ComponentStatus(p.name, p.pid, is_running(p), rss_bytes(p), p.log)
                for p in self.state.processes
            ],
            nodes=nodes,
            nodes_error=nodes_error,
        )

    def stop(self, *, remove: bool = True) -> list[str]:
        """Stop every recorded process (SIGTERM, SIGKILL after the grace period); returns the names killed.

        With ``remove`` the directory's entries are deleted (and the directory, when nothing else is in it);
        without, the state is kept with phase ``stopped`` so the logs can be read.
        """
        grace = self.options.stop_grace
        clients = [p for p in reversed(self.state.processes) if p.name != ETCD]
        killed = terminate(clients, grace=grace)
        killed += terminate([p for p in self.state.processes if p.name == ETCD], grace=grace)
        if remove:
            _wipe(self.layout)
        else:
            if self.state.phase != FAILED:
                self.state.phase = STOPPED
            self._save()
        return killed

    def _save(self) -> None:
        if self.layout.root.exists():
            save(self.state, self.layout.state)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"Cluster(dir={str(self.dir)!r}, server={self.server!r}, phase={self.state.phase!r})"


def start_cluster(
    directory: str | Path = DEFAULT_DIR,
    *,
    nodes: int = 0,
    with_kube_scheduler: bool = False,
    with_controller_manager: bool = True,
    force: bool = False,
    options: ClusterOptions | None = None,
) -> Cluster:
    """Start etcd, kube-apiserver, kwok, kube-controller-manager (and kube-scheduler) in ``directory`` and create
    ``nodes`` fake nodes.

    Blocks until everything is ready. Raises ``DirectoryInUse`` when the directory holds a cluster (pass
    ``force`` to stop and wipe it), ``ComponentFailed`` with the log tail when a component dies or is not ready in
    time, ``ToolMissing`` when a binary is not built. Safe to call from inside an event loop (it blocks it).

    From the main thread, it first makes SIGTERM end this interpreter as Ctrl-C does (``stop_on_sigterm``, unless
    SIGTERM has a handler already), so that ``kill PID`` of the command runs the same cleanup as Ctrl-C: this
    function's own (a start interrupted in this thread stops what it started) and its caller's (the demo and
    the test session stop their cluster; the benchmarks call ``start_cluster_async``).
    """
    stop_on_sigterm()
    opts = options or ClusterOptions()
    layout = Layout(Path(directory).resolve())
    started = time.monotonic()
    cluster = _start_processes(
        layout,
        opts,
        with_kube_scheduler=with_kube_scheduler,
        with_controller_manager=with_controller_manager,
        force=force,
    )
    try:
        if nodes:
            try:
                _run_coroutine(cluster.add_nodes(nodes, start=0))
            except ApiError as e:
                raise ClusterError(
                    f"creating {nodes} nodes failed: {e}; the API server log is {layout.log(APISERVER)}"
                ) from e
        cluster.state.phase = RUNNING
        cluster._save()
    except BaseException:
        cluster.state.phase = FAILED
        cluster.stop(remove=False)
        raise
    log.info("cluster up in %s in %.1fs (%d nodes)", layout.root, time.monotonic() - started, nodes)
    return cluster


async def start_cluster_async(
    directory: str | Path = DEFAULT_DIR,
    *,
    nodes: int = 0,
    with_kube_scheduler: bool = False,
    with_controller_manager: bool = True,
    force: bool = False,
    options: ClusterOptions | None = None,
) -> Cluster:
    """``start_cluster`` without blocking the running event loop (it runs in a worker thread).

    A thread cannot be interrupted: when the caller is cancelled or interrupted meanwhile (Ctrl-C, SIGTERM:
    ``asyncio.run`` cancels every task), the start goes on, and the cluster it makes is stopped by that thread
    as soon as the start ends, however many more interrupts come (an executor's threads are waited for when
    the interpreter exits). A cluster already started when the caller was interrupted is stopped by a thread
    of its own, waited for in the same way."""
    stop_on_sigterm()  # here, in the loop's thread: start_cluster runs in another one
    handoff = _Handoff()
    start = asyncio.get_running_loop().run_in_executor(
        None,
        functools.partial(
            _start_for,
            handoff,
            directory,
            nodes=nodes,
            with_kube_scheduler=with_kube_scheduler,
            with_controller_manager=with_controller_manager,
            force=force,
            options=options,
        ),
    )
    try:
        return await asyncio.shield(start)
    except BaseException:
        started = handoff.abandon()
        if started is not None:
            threading.Thread(target=_stop_abandoned, args=(started,), name="cluster-stop").start()
        elif not start.done():
            log.warning("interrupted while the cluster starts: it is stopped once its start ends")
        raise


class _Handoff:
    """Who stops a cluster started for ``start_cluster_async``: its caller, if the start ended while the caller
    still waited, or else the starting thread. The lock makes the two sides agree."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._abandoned = False
        self._handed: Cluster | None = None

    def started(self, cluster: Cluster) -> bool:
        """The starting thread's side: True if the caller takes ``cluster``, False if it has gone."""
        with self._lock:
            if self._abandoned:
                return False
            self._handed = cluster
            return True

    def abandon(self) -> Cluster | None:
        """The caller's side, when it is interrupted: the cluster it would have taken, if the start has ended."""
        with self._lock:
            self._abandoned = True
            handed, self._handed = self._handed, None
            return handed


def _start_for(handoff: _Handoff, directory: str | Path, **kwargs: Any) -> Cluster:
    cluster = start_cluster(directory, **kwargs)
    if not handoff.started(cluster):
        _stop_abandoned(cluster)
    return cluster


def _stop_abandoned(cluster: Cluster) -> None:
    log.info("stopping the cluster in %s: its start was interrupted", cluster.dir)
    try:
        cluster.stop()
    except Exception:
        log.exception("stopping the cluster in %s failed", cluster.dir)


def stop_cluster(directory: str | Path = DEFAULT_DIR, *, grace: float | None = None) -> list[str]:
    """Stop the cluster recorded in ``directory`` and remove the directory; returns the names of what it stopped.

    Raises ``NoCluster`` when the directory has no cluster state.
    """
    cluster = Cluster.open(directory)
    if grace is not None:
        cluster.options = ClusterOptions(stop_grace=grace)
    names = [p.name for p in cluster.state.processes if is_running(p)]
    cluster.stop(remove=True)
    return names


def _run_coroutine(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` to completion on a fresh event loop in a worker thread (works inside or outside a loop)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="cluster") as pool:
        return pool.submit(asyncio.run, coro).result()


def _start_processes(
    layout: Layout,
    options: ClusterOptions,
    *,
    with_kube_scheduler: bool,
    with_controller_manager: bool,
    force: bool,
) -> Cluster:
    # Fail on a missing binary before touching the directory.
    optional = ((SCHEDULER,) if with_kube_scheduler else ()) + (
        (CONTROLLER_MANAGER,) if with_controller_manager else ()
    )
    for tool in (ETCD, APISERVER, KWOK, *optional):
        components.binary(options, tool)
    claim_directory(layout, force=force, grace=options.stop_grace)
    for directory in (layout.root, layout.config, layout.logs):
        directory.mkdir(parents=True, exist_ok=True)
    pki = generate_pki(layout.pki)
    tokens = {
        ADMIN_USER: new_token(),
        SCHEDULER_USER: new_token(),
        KWOK_USER: new_token(),
        CONTROLLER_MANAGER_USER: new_token(),
    }
    layout.token_file.write_text(token_file_document(tokens))
    layout.token_file.chmod(0o600)
    state = ClusterState(
        dir=str(layout.root),
        phase=STARTING,
        created=time.time(),
        node_seed=options.node_seed,
        with_kube_scheduler=with_kube_scheduler,
    )
    save(state, layout.state)
    cluster = Cluster(layout, state, options)
    try:
        ports = start_component(components.etcd(options, layout), cluster)
        state.etcd_endpoint = f"http://{LOOPBACK}:{ports['etcd_client']}"
        cluster._save()

        api = components.apiserver(
            options, layout, pki, etcd_endpoint=state.etcd_endpoint, admin_token=tokens[ADMIN_USER]
        )
        ports = start_component(api, cluster)
        state.server = f"https://{LOOPBACK}:{ports['apiserver']}"
        ca_pem = pki.ca_cert.read_bytes()
        kubeconfigs = {
            layout.kubeconfig: ADMIN_USER,
            layout.component_kubeconfig(KWOK): KWOK_USER,
            layout.component_kubeconfig(SCHEDULER): SCHEDULER_USER,
            layout.component_kubeconfig(CONTROLLER_MANAGER): CONTROLLER_MANAGER_USER,
        }
        for path, user in kubeconfigs.items():
            path.write_text(
                kubeconfig_document(server=state.server, ca_pem=ca_pem, token=tokens[user], user=user)
            )
            path.chmod(0o600)
        state.kubeconfig = str(layout.kubeconfig)
        cluster._save()

        layout.kwok_config.write_text(kwok_config(pod_parallelism=options.kwok_pod_parallelism))
        start_component(components.kwok(options, layout), cluster)

        if with_controller_manager:
            start_component(components.controller_manager(options, layout, pki), cluster)

        if with_kube_scheduler:
            layout.scheduler_config.write_text(
                scheduler_config_document(
                    kubeconfig=layout.component_kubeconfig(SCHEDULER),
                    qps=options.scheduler_qps,
                    burst=options.scheduler_burst,
                )
            )
            start_component(components.scheduler(options, layout), cluster)
    except BaseException:
        state.phase = FAILED
        cluster.stop(remove=False)
        raise
    return cluster


def start_component(component: Component, cluster: Cluster) -> Ports:
    """Start ``component`` on fresh ports, record it in the cluster's state and wait until it is ready.

    Retried on fresh ports when the component dies with "address already in use". Raises ``ComponentFailed``
    (with the log tail) when it exits otherwise or is not ready within ``ClusterOptions.ready_timeout``; the
    failed process stays recorded, so stopping the cluster covers it.
    """
    layout, options, state = cluster.layout, cluster.options, cluster.state
    for attempt in range(options.port_retries + 1):
        ports = dict(zip(component.port_names, free_ports(len(component.port_names)), strict=True))
        began = time.monotonic()
        record = spawn(component.name, component.command(ports), layout.log(component.name))
        state.processes.append(record)
        state.ports.update(ports)
        cluster._save()
        try:
            _wait_ready(component, record, ports, timeout=options.ready_timeout)
        except _PortTaken:
            state.processes.remove(record)
            log.warning(
                "%s lost its port to another process (attempt %d); retrying", component.name, attempt + 1
            )
            continue
        log.info(
            "%s ready (pid %d, ports %s) in %.1fs",
            component.name,
            record.pid,
            ", ".join(f"{k}={v}" for k, v in ports.items()),
            time.monotonic() - began,
        )
        return ports
    raise ComponentFailed(
        component.name,
        f"could not bind a free port in {options.port_retries + 1} attempts",
        log_path=str(layout.log(component.name)),
        log_tail=tail(layout.log(component.name)),
    )


def _wait_ready(component: Component, record: ProcessRecord, ports: Ports, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pause = Backoff(READY_POLL_INITIAL, READY_POLL_MAX, factor=1.5)
    while True:
        code = exit_code(record)
        if code is not None or not is_running(record):
            text = tail(record.log)
            if _PORT_TAKEN in text.lower():
                raise _PortTaken(component.name)
            status = f"status {code}" if code is not None else "status unknown"
            raise ComponentFailed(
                component.name, f"exited ({status}) before it was ready", log_path=record.log, log_tail=text
            )
        why = component.probe(ports)
        if why is None:
            return
        if time.monotonic() > deadline:
            raise ComponentFailed(
                component.name,
                f"was not ready after {timeout:.0f}s (last probe: {why})",
                log_path=record.log,
                log_tail=tail(record.log),
            )
        time.sleep(pause.next())


def claim_directory(layout: Layout, *, force: bool, grace: float) -> None:
    """Make sure ``layout.root`` is free for a new cluster; with ``force`` stop and wipe a previous one.

    Raises ``DirectoryInUse``: when a recorded process still runs (``running=True``), when a previous run left
    its state behind, and, even with ``force``, when the directory holds files this package did not create.
    """
    root = layout.root
    if not root.exists() or not any(root.iterdir()):
        return
    if not layout.is_ours():
        raise DirectoryInUse(
            f"{root} is not empty and does not look like a cluster directory; choose another --dir",
            running=False,
        )
    previous: ClusterState | None = None
    if layout.state.exists():
        try:
            previous = load(layout.state)
        except ClusterError as e:
            log.warning("ignoring unreadable %s: %s", layout.state, e)
    alive = [p for p in previous.processes if is_running(p)] if previous else []
    if not force:
        if alive:
            pids = ", ".join(f"{p.name} {p.pid}" for p in alive)
            raise DirectoryInUse(
                f"a cluster is already running in {root} ({pids}).\n"
                f"Use it (kubeconfig: {layout.kubeconfig}), stop it with "
                f"`agent-scheduler cluster down --dir {root}`, or pass --force to stop it and start afresh.",
                running=True,
            )
        phase = previous.phase if previous else "unknown"
        raise DirectoryInUse(
            f"{root} holds the leftovers of an earlier cluster (phase {phase!r}, no process of it runs).\n"
            f"Its logs are in {layout.logs}. Pass --force to wipe the directory and start afresh.",
            running=False,
        )
    if alive:
        log.warning("--force: stopping the previous cluster's processes in %s", root)
        clients = [p for p in reversed(alive) if p.name != ETCD]
        terminate(clients, grace=grace)
        terminate([p for p in alive if p.name == ETCD], grace=grace)
    log.warning("--force: wiping %s", root)
    _wipe(layout)


def _wipe(layout: Layout) -> None:
    """Delete the entries this package creates; the directory too when nothing else is left in it."""
    if not layout.root.exists():
        return
    owned = layout.owned_entries()
    for entry in layout.root.iterdir():
        if entry.name not in owned:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    if not any(layout.root.iterdir()):
        layout.root.rmdir()


def _read_token(layout: Layout, user: str) -> str:
    try:
        lines = layout.token_file.read_text().splitlines()
    except FileNotFoundError as e:
        raise ClusterError(f"no token file at {layout.token_file}") from e
    for line in lines:
        token, name, *_ = line.split(",")
        if name == user:
            return token
    raise ClusterError(f"no token for {user} in {layout.token_file}")
