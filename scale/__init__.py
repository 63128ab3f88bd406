"""Scale tooling: everything needed to run the scheduler against real Kubernetes parts, never the product.

- ``scale.cluster``: a local cluster (etcd, kube-apiserver, kwok, optionally kube-scheduler) on free ports,
  with deterministic fake nodes; used by ``agent-scheduler cluster``, the test fixtures, the demo and benchmarks.
- ``scale.tools``: the pinned Go builds of those binaries (``build.sh``).

The product packages (``coordinator``, ``worker``) must not import anything from here (import-linter contract).
"""
