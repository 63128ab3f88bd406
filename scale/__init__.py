"""Scale tooling: everything needed to run the scheduler against real Kubernetes parts, never the product.

- ``scale.cluster``: a local cluster (etcd, kube-apiserver, kwok, optionally kube-scheduler) on free ports,
  with deterministic fake nodes; used by ``agent-scheduler cluster``, the test fixtures, the demo and benchmarks.
- ``scale.cluster.processes``: the one launcher of OS processes (log file, PID + start time, stop by PID);
  the cluster, the benchmarks, the demo and the integration tests start and stop their processes with it.
- ``scale.tracking``: create-to-bound times of the pods a load generator created (demo and benchmarks);
  ``scale.workload``: agent pod shapes; ``scale.audit``: the capacity audit read back from the API server.
- ``scale.bench``: the engine, simulation and cluster benchmarks; ``scale.demo``: ``make demo``.
- ``scale.tools``: the pinned Go builds of those binaries (``build.sh``).

The product packages (``coordinator``, ``worker``) must not import anything from here (import-linter contract).
"""
