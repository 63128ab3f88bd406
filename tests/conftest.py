"""Shared fixtures: one real local cluster per test session, a fresh namespace and an API client per test.

Fixtures:
- ``cluster`` (session): a ``scale.cluster.Cluster`` with ``CLUSTER_NODES`` kwok nodes (the deterministic fleet,
  seed 0), kube-controller-manager and kube-scheduler, started once in a temporary directory on free ports and
  stopped at the end.
  kube-scheduler always runs: it schedules only pods with ``schedulerName: default-scheduler`` (the default),
  so it never competes for our scheduler's pods, and tests can compare against it. Its client limits are raised
  (``SCHEDULER_QPS``) so that it is not the slow part of a test.
  Set ``AGENT_SCHEDULER_TEST_CLUSTER=DIR`` to run against an already running cluster
  (``agent-scheduler cluster up --with-kube-scheduler --nodes 500 --dir DIR``) instead; it is left running.
- ``kube``: an admin ``KubeClient`` on the test's event loop, closed after the test.
- ``namespace``: a new namespace (its name derived from the test's), deleted after the test: its pods are
  deleted at once (grace period 0) and the namespace is finalized by hand, which is quicker than waiting for the
  namespace controller and works on a cluster without one.

Only tests that ask for these fixtures start the cluster; such tests must carry ``@pytest.mark.integration``.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from common.kube import KubeClient, NotFound
from scale.cluster import Cluster, ClusterOptions, start_cluster

CLUSTER_NODES = 500
SCHEDULER_QPS = 1000.0
SCHEDULER_BURST = 1000
REUSE_ENV = "AGENT_SCHEDULER_TEST_CLUSTER"
DELETE_TIMEOUT = 300.0


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reuse = os.environ.get(REUSE_ENV)
    if reuse:
        yield Cluster.open(reuse)
        return
    handle = start_cluster(
        tmp_path_factory.mktemp("cluster"),
        nodes=CLUSTER_NODES,
        with_kube_scheduler=True,
        options=ClusterOptions(scheduler_qps=SCHEDULER_QPS, scheduler_burst=SCHEDULER_BURST),
    )
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture
async def kube(cluster: Cluster) -> AsyncIterator[KubeClient]:
    client = cluster.client()
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def namespace(kube: KubeClient, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    name = _namespace_name(request.node.name)
    await kube.post(
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {"e2e-test": "true"}}},
    )
    try:
        yield name
    finally:
        await delete_namespace(kube, name)


async def delete_namespace(kube: KubeClient, name: str) -> None:
    """Delete the namespace's pods immediately, then the namespace, finalizing it ourselves."""
    try:
        # One request that deletes every pod server-side; thousands of them take a while on a busy machine.
        await kube.request(
            "DELETE",
            f"/api/v1/namespaces/{name}/pods",
            params={"gracePeriodSeconds": "0"},
            timeout=DELETE_TIMEOUT,
        )
        await kube.delete(f"/api/v1/namespaces/{name}")
        ns = await kube.get(f"/api/v1/namespaces/{name}")
        ns.setdefault("spec", {})["finalizers"] = []
        await kube.put(f"/api/v1/namespaces/{name}/finalize", ns)
    except NotFound:
        pass


def _namespace_name(test_name: str) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:48].strip("-")
    return f"t-{slug}-{uuid.uuid4().hex[:6]}"
