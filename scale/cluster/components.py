"""The five components of a local cluster: how each is started and how we know it is ready.

A ``Component`` is data: its name, the ports it needs, a function from those ports to its command line, and a
readiness probe (an HTTP GET on its health endpoint). The lifecycle owns starting, retrying and stopping; this
module owns the flags, which are the part worth reading:

- etcd: one member on loopback, data in ``DIR/etcd``; ``--unsafe-no-fsync`` unless fsync was asked for.
- kube-apiserver: loopback only, our serving certificate, static tokens, ``Node,RBAC`` authorization,
  in-flight limits from ``ClusterOptions``. Two default admission plugins stay off:
  ``TaintNodesByCondition`` taints every new node ``not-ready`` until the node lifecycle controller lifts it,
  and that controller does not run here (below); ``ServiceAccount`` would reject a namespace's pods until the
  ServiceAccount controller has created its ``default`` ServiceAccount, a race every test and bench that
  creates a namespace and then pods at once would have to wait out, for pods that never run a process.
- kwok: manages only nodes annotated ``kwok.x-k8s.io/node=fake`` and serves ``/healthz`` on a free port.
- kube-controller-manager: leader election off, the default controllers (``CONTROLLERS``) but three:
  ``node-lifecycle-controller`` (kwok nodes heartbeat every few minutes and hold no leases, so it would mark
  every node unreachable, taint it and evict its pods), ``taint-eviction-controller`` (tests taint nodes that
  already hold pods on purpose) and ``ttl-controller`` (it annotates every node, thousands of writes at scale
  for a kubelet cache that does not exist here). What runs: workload controllers (Deployments, ReplicaSets,
  Jobs, StatefulSets, ...), the garbage collector, the namespace controller, the PersistentVolume binder (it
  binds existing PVs to claims; there is no provisioner, so a claim of a class without PVs stays Pending),
  ServiceAccounts and the root CA ConfigMap. It signs nothing: its client is a ``system:masters`` user.
- kube-scheduler: a ``KubeSchedulerConfiguration`` with leader election off; it schedules only pods whose
  ``schedulerName`` is ``default-scheduler``.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scale.cluster.config import SERVICE_CLUSTER_IP_RANGE, ClusterOptions, Layout
from scale.cluster.errors import ToolMissing
from scale.cluster.nodes import KWOK_ANNOTATION, KWOK_ANNOTATION_VALUE
from scale.cluster.pki import Pki
from scale.cluster.ports import LOOPBACK

ETCD = "etcd"
APISERVER = "kube-apiserver"
KWOK = "kwok"
SCHEDULER = "kube-scheduler"
CONTROLLER_MANAGER = "kube-controller-manager"
TOOLS = (ETCD, APISERVER, KWOK, SCHEDULER, CONTROLLER_MANAGER)

#: kube-controller-manager ``--controllers``: the defaults but those that act on kwok nodes as if they were
#: kubelets (see the module docstring)
CONTROLLERS = "*,-node-lifecycle-controller,-taint-eviction-controller,-ttl-controller"
CONTROLLER_MANAGER_QPS = 100
CONTROLLER_MANAGER_BURST = 200

PROBE_TIMEOUT = 2.0
# kube-apiserver deletes a collection with one worker by default: 2,000 pods of a test namespace took 8 s.
DELETE_COLLECTION_WORKERS = 16
ETCD_QUOTA_BYTES = 8 * 1024**3
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"

Ports = dict[str, int]


@dataclass(frozen=True, slots=True)
class Component:
    """How to start one process and how to tell it is ready (``probe`` returns None when ready, else why not)."""

    name: str
    port_names: tuple[str, ...]
    command: Callable[[Ports], list[str]]
    probe: Callable[[Ports], str | None]


def binary(options: ClusterOptions, name: str) -> str:
    path = options.bin_dir / name
    if not path.is_file():
        raise ToolMissing(f"{name} not found at {path}; build the pinned tools with `make tools`")
    return str(path)


def http_probe(url: str, *, ca_file: Path | None = None, token: str | None = None) -> str | None:
    """GET ``url``: None on 200, else a one-line reason. TLS is verified against ``ca_file`` when given."""
    context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    if ca_file is None:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT, context=context) as response:
            status = int(response.status)
            body = response.read(2000)
    except urllib.error.HTTPError as e:
        failed = [line for line in e.read(20000).decode("utf-8", "replace").splitlines() if "failed" in line]
        return f"HTTP {e.code} from {url}" + (f": {'; '.join(failed[:5])}" if failed else "")
    except (urllib.error.URLError, OSError) as e:
        return f"{url}: {e}"
    if status != 200:
        return f"HTTP {status} from {url}: {body[:200]!r}"
    return None


def get_json(url: str, *, ca_file: Path, token: str) -> Any:
    """GET ``url`` and decode its JSON (verified TLS, bearer token); raises ``OSError`` subclasses on failure."""
    context = ssl.create_default_context(cafile=str(ca_file))
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10.0, context=context) as response:
        return json.loads(response.read())


def etcd(options: ClusterOptions, layout: Layout) -> Component:
    exe = binary(options, ETCD)

    def command(ports: Ports) -> list[str]:
        client = f"http://{LOOPBACK}:{ports['etcd_client']}"
        peer = f"http://{LOOPBACK}:{ports['etcd_peer']}"
        args = [
            exe,
            "--name=local",
            f"--data-dir={layout.etcd_data}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=local={peer}",
            "--initial-cluster-state=new",
            f"--quota-backend-bytes={ETCD_QUOTA_BYTES}",
            "--log-level=warn",
        ]
        if not options.etcd_fsync:
            args.append("--unsafe-no-fsync")
        return args

    return Component(
        ETCD,
        ("etcd_client", "etcd_peer"),
        command,
        lambda ports: http_probe(f"http://{LOOPBACK}:{ports['etcd_client']}/health"),
    )


def apiserver(
    options: ClusterOptions, layout: Layout, pki: Pki, *, etcd_endpoint: str, admin_token: str
) -> Component:
    exe = binary(options, APISERVER)

    def command(ports: Ports) -> list[str]:
        return [
            exe,
            f"--etcd-servers={etcd_endpoint}",
            f"--bind-address={LOOPBACK}",
            f"--advertise-address={LOOPBACK}",
            f"--secure-port={ports['apiserver']}",
            f"--cert-dir={layout.pki}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--token-auth-file={layout.token_file}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
            "--allow-privileged=true",
            f"--delete-collection-workers={DELETE_COLLECTION_WORKERS}",
            f"--max-requests-inflight={options.max_requests_inflight}",
            f"--max-mutating-requests-inflight={options.max_mutating_requests_inflight}",
        ]

    return Component(
        APISERVER,
        ("apiserver",),
        command,
        lambda ports: http_probe(
            f"https://{LOOPBACK}:{ports['apiserver']}/readyz", ca_file=pki.ca_cert, token=admin_token
        ),
    )


def kwok(options: ClusterOptions, layout: Layout) -> Component:
    exe = binary(options, KWOK)

    def command(ports: Ports) -> list[str]:
        return [
            exe,
            f"--kubeconfig={layout.component_kubeconfig(KWOK)}",
            f"--config={layout.kwok_config}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}={KWOK_ANNOTATION_VALUE}",
            "--manage-nodes-with-label-selector=",
            f"--server-address={LOOPBACK}:{ports['kwok']}",
        ]

    return Component(
        KWOK, ("kwok",), command, lambda ports: http_probe(f"http://{LOOPBACK}:{ports['kwok']}/healthz")
    )


def scheduler(options: ClusterOptions, layout: Layout) -> Component:
    exe = binary(options, SCHEDULER)

    def command(ports: Ports) -> list[str]:
        return [
            exe,
            f"--config={layout.scheduler_config}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={ports['kube_scheduler']}",
            f"--cert-dir={layout.scheduler_certs}",
        ]

    return Component(
        SCHEDULER,
        ("kube_scheduler",),
        command,
        lambda ports: http_probe(f"https://{LOOPBACK}:{ports['kube_scheduler']}/healthz"),
    )


def controller_manager(options: ClusterOptions, layout: Layout, pki: Pki) -> Component:
    exe = binary(options, CONTROLLER_MANAGER)

    def command(ports: Ports) -> list[str]:
        # No --authentication/--authorization-kubeconfig: as for kube-scheduler, /healthz is always allowed,
        # and the API server here has no client CA for the delegated authentication to look up.
        return [
            exe,
            f"--kubeconfig={layout.component_kubeconfig(CONTROLLER_MANAGER)}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={ports['kube_controller_manager']}",
            f"--cert-dir={layout.controller_manager_certs}",
            "--leader-elect=false",
            f"--controllers={CONTROLLERS}",
            f"--service-account-private-key-file={pki.sa_key}",
            f"--root-ca-file={pki.ca_cert}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            f"--kube-api-qps={CONTROLLER_MANAGER_QPS}",
            f"--kube-api-burst={CONTROLLER_MANAGER_BURST}",
        ]

    return Component(
        CONTROLLER_MANAGER,
        ("kube_controller_manager",),
        command,
        lambda ports: http_probe(f"https://{LOOPBACK}:{ports['kube_controller_manager']}/healthz"),
    )
