"""A real local Kubernetes for development, tests and scale runs: etcd, kube-apiserver, kwok,
kube-controller-manager, kube-scheduler.

Public surface (everything else in this package is an implementation module)::

    cluster = start_cluster(dir, nodes=200, with_kube_scheduler=True)   # or await start_cluster_async(...)
    cluster.kubeconfig, cluster.server, cluster.etcd_endpoint, cluster.credentials(), cluster.client()
    await cluster.add_nodes(100)                                         # more fleet nodes
    cluster.stop()                                                       # every process, by PID; removes dir
    Cluster.open(dir).status(); stop_cluster(dir)                        # from any process
    generate_nodes(n, seed=0); await create_nodes(client, nodes)         # the deterministic fleet

Modules: ``lifecycle`` (start/stop, the ``Cluster`` handle), ``components`` (flags and readiness probes),
``nodes`` (fleet shapes), ``pki`` (openssl key material), ``processes`` (spawn/stop by PID), ``ports``,
``stages`` (kwok Stage objects), ``state`` (``state.json``), ``config`` (options, directory layout, config files),
``errors``, ``command`` (the CLI).

The binaries come from ``scale/tools/build.sh`` (``make tools``) in ``.local/bin``.
"""

from scale.cluster.config import DEFAULT_DIR, ClusterOptions
from scale.cluster.errors import ClusterError, ComponentFailed, DirectoryInUse, NoCluster, ToolMissing
from scale.cluster.lifecycle import (
    Cluster,
    ClusterStatus,
    ComponentStatus,
    start_cluster,
    start_cluster_async,
    stop_cluster,
)
from scale.cluster.nodes import NodeShape, create_nodes, generate_nodes, make_node

__all__ = [
    "DEFAULT_DIR",
    "Cluster",
    "ClusterError",
    "ClusterOptions",
    "ClusterStatus",
    "ComponentFailed",
    "ComponentStatus",
    "DirectoryInUse",
    "NoCluster",
    "NodeShape",
    "ToolMissing",
    "create_nodes",
    "generate_nodes",
    "make_node",
    "start_cluster",
    "start_cluster_async",
    "stop_cluster",
]
