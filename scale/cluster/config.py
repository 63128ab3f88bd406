"""Settings of a local cluster, the layout of its state directory, and the config files written into it.

``ClusterOptions`` holds every knob with its default; the CLI and the test fixtures fill it, nothing reads the
environment here. ``Layout`` names every path under the cluster directory, so that the lifecycle, ``down`` and
``status`` agree on where things are, and ``--force`` knows which entries it may wipe.

Directory layout (``DIR`` defaults to ``.local/cluster`` under the project root)::

    DIR/state.json        pids, ports, endpoints (``state``)
    DIR/kubeconfig        admin kubeconfig (token of a system:masters user)
    DIR/pki/              CA, serving certificate, service-account keys (``pki``)
    DIR/config/           token file, per-component kubeconfigs, kwok and kube-scheduler configs
    DIR/etcd/             etcd data
    DIR/logs/<name>.log   one log per process
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from scale.cluster.nodes import DEFAULT_SEED, PREPULLED_FRACTION

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DIR = PROJECT_ROOT / ".local" / "cluster"
DEFAULT_BIN_DIR = PROJECT_ROOT / ".local" / "bin"

ADMIN_USER = "agent-scheduler-admin"
SCHEDULER_USER = "system:kube-scheduler"  # bound to its ClusterRole by the API server's bootstrap RBAC policy
# In system:masters: without --use-service-account-credentials every controller acts as this one user.
CONTROLLER_MANAGER_USER = "system:kube-controller-manager"
KWOK_USER = "kwok-controller"
MASTERS_GROUP = "system:masters"
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterOptions:
    """Tuning of a local cluster. The defaults suit tests; scale runs raise the limits."""

    #: kube-apiserver ``--max-requests-inflight`` (its default is 400). With priority and fairness on (the
    #: default) the two limits are summed into the server's total concurrency.
    max_requests_inflight: int = 400
    #: kube-apiserver ``--max-mutating-requests-inflight`` (its default is 200).
    max_mutating_requests_inflight: int = 200
    #: kube-scheduler's client rate limit (``clientConnection.qps``/``burst``); its defaults are 50 and 100.
    scheduler_qps: float = 50.0
    scheduler_burst: int = 100
    #: seed of the node generator (``nodes.generate_nodes``).
    node_seed: int = DEFAULT_SEED
    #: share of fleet nodes besides the warm ones that list the agent images (``nodes.make_node``).
    prepulled_fraction: float = PREPULLED_FRACTION
    #: node creation requests in flight.
    node_concurrency: int = 64
    #: etcd fsyncs its WAL. Off by default: a throwaway cluster does not need durability, and fsync latency
    #: on a shared disk would dominate API write latency.
    etcd_fsync: bool = False
    #: pods kwok moves through their stages in parallel.
    kwok_pod_parallelism: int = 16
    #: seconds to wait for each component to become ready.
    ready_timeout: float = 120.0
    #: seconds between SIGTERM and SIGKILL when stopping.
    stop_grace: float = 10.0
    #: where the etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok binaries are.
    bin_dir: Path = DEFAULT_BIN_DIR
    #: how many times a component is restarted on fresh ports when its port was taken meanwhile.
    port_retries: int = 3


@dataclass(frozen=True, slots=True)
class Layout:
    """Every path under one cluster directory."""

    root: Path

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def config(self) -> Path:
        return self.root / "config"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    @property
    def token_file(self) -> Path:
        return self.config / "tokens.csv"

    def component_kubeconfig(self, name: str) -> Path:
        return self.config / f"{name}.kubeconfig"

    @property
    def kwok_config(self) -> Path:
        return self.config / "kwok.yaml"

    @property
    def scheduler_config(self) -> Path:
        return self.config / "kube-scheduler.yaml"

    @property
    def scheduler_certs(self) -> Path:
        return self.pki / "kube-scheduler"

    @property
    def controller_manager_certs(self) -> Path:
        return self.pki / "kube-controller-manager"

    def owned_entries(self) -> frozenset[str]:
        """Names of the top-level entries this package creates (what ``--force`` may delete)."""
        entries = (self.state, self.kubeconfig, self.pki, self.config, self.etcd_data, self.logs)
        return frozenset(p.name for p in entries) | {self.state.name + ".tmp"}

    def is_ours(self) -> bool:
        """True when the directory is missing, empty, or holds only entries this package creates."""
        if not self.root.exists():
            return True
        names = {p.name for p in self.root.iterdir()}
        return names <= self.owned_entries()


def kubeconfig_document(*, server: str, ca_pem: bytes, token: str, user: str, cluster: str = "local") -> str:
    """A kubeconfig with the CA embedded, so the file can be copied anywhere."""
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster,
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
        "current-context": cluster,
        "preferences": {},
    }
    return yaml.safe_dump(doc, sort_keys=False)


def token_file_document(tokens: dict[str, str]) -> str:
    """kube-apiserver ``--token-auth-file`` CSV: ``token,user,uid,"groups"`` for each user in ``tokens``."""
    groups = {
        ADMIN_USER: MASTERS_GROUP,
        KWOK_USER: MASTERS_GROUP,
        CONTROLLER_MANAGER_USER: MASTERS_GROUP,
        SCHEDULER_USER: "",
    }
    lines = []
    for user, token in tokens.items():
        group = groups.get(user, "")
        lines.append(f'{token},{user},{user},"{group}"' if group else f"{token},{user},{user}")
    return "\n".join(lines) + "\n"


def scheduler_config_document(*, kubeconfig: Path, qps: float, burst: int) -> str:
    """A KubeSchedulerConfiguration: one default profile, leader election off, client limits from options."""
    doc = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig), "qps": float(qps), "burst": int(burst)},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": "default-scheduler"}],
    }
    return yaml.safe_dump(doc, sort_keys=False)
