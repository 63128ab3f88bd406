"""API credentials that rotate under a running worker, on the real local cluster.

The worker authenticates with a service-account token read from a file (a kubeconfig ``tokenFile``, as a
projected token is). Mid-burst the file gets a new token and the old one is revoked (its bound Secret deleted):
the worker must pick the new token up on the first 401 and finish the burst, every binding refused with the
old token sent again with the new one (none rejected). A slow variant then revokes every
token it could read: its ``/healthz`` must fail once the refusals have lasted ``LASTING_DENIAL``.
"""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from common.kube import LASTING_DENIAL, ApiError, Credentials, KubeClient
from scale.cluster import Cluster
from scale.workload import agent_pod
from tests.integration.support import SchedulerProcess, all_bound, create_pods, wait_for

pytestmark = pytest.mark.integration

PODS = 100
GUARD = 120.0


async def service_account(kube: KubeClient, namespace: str) -> tuple[str, str]:
    """A ServiceAccount with cluster-admin (the binding is deleted by the caller); its name and the binding's."""
    name = "rotating"
    await kube.post(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": name}})
    binding = f"rotating-{uuid.uuid4().hex[:6]}"
    await kube.post(
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "metadata": {"name": binding},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    )
    return name, binding


async def bound_token(kube: KubeClient, namespace: str, account: str, secret: str) -> str:
    """A token for ``account`` that stays valid only while Secret ``secret`` exists."""
    created = await kube.post(f"/api/v1/namespaces/{namespace}/secrets", {"metadata": {"name": secret}})
    reply = await kube.post(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": 3600,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "name": secret,
                    "uid": created["metadata"]["uid"],
                },
            },
        },
    )
    return str(reply["status"]["token"])


def token_file_kubeconfig(cluster: Cluster, path: Path, token_file: Path) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "local",
                        "cluster": {"server": cluster.server, "certificate-authority": str(cluster.ca_file)},
                    }
                ],
                "users": [{"name": "sa", "user": {"tokenFile": str(token_file)}}],
                "contexts": [{"name": "local", "context": {"cluster": "local", "user": "sa"}}],
                "current-context": "local",
            }
        )
    )
    return path


async def wait_refused(cluster: Cluster, token: str) -> None:
    """Until the API server refuses ``token`` (it caches accepted tokens for a few seconds)."""
    deadline = time.monotonic() + GUARD
    async with KubeClient(
        Credentials(server=cluster.server, token=token, ca_file=str(cluster.ca_file))
    ) as probe:
        while True:
            try:
                await probe.get("/api")
            except ApiError as e:
                if e.status == 401:
                    return
            assert time.monotonic() < deadline, "the revoked token is still accepted"
            await asyncio.sleep(0.5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def posts_refused(port: int) -> float:
    """POST requests (bindings, Events) the worker's API server answered with 401, from its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "rest_client_requests_total"
        and sample.labels.get("code") == "401"
        and sample.labels.get("method") == "POST"
    )


async def run_rotation(
    kube: KubeClient, namespace: str, cluster: Cluster, tmp_path: Path, *, revoke_all: bool
) -> dict[str, Any]:
    account, binding = await service_account(kube, namespace)
    token_file = tmp_path / "token"
    first = await bound_token(kube, namespace, account, "first")
    token_file.write_text(first)
    kubeconfig = token_file_kubeconfig(cluster, tmp_path / "kubeconfig", token_file)
    scheduler = f"agent-rot-{uuid.uuid4().hex[:6]}"
    port = _free_port()
    worker = SchedulerProcess(
        [
            "worker",
            "--standalone",
            f"--kubeconfig={kubeconfig}",
            f"--scheduler-name={scheduler}",
            "--id=rotating",
            f"--metrics-address=127.0.0.1:{port}",
        ],
        tmp_path / "worker.log",
    )
    out: dict[str, Any] = {}
    try:
        pods = [agent_pod(i, namespace=namespace, scheduler_name=scheduler) for i in range(2 * PODS)]
        await create_pods(kube, namespace, pods[:PODS])
        await wait_for(kube, namespace, all_bound(PODS), timeout=GUARD, what="the first half bound")
        # Rotate: the file gets a new token, the old one is revoked.
        second = await bound_token(kube, namespace, account, "second")
        token_file.write_text(second)
        await kube.delete(f"/api/v1/namespaces/{namespace}/secrets/first")
        if revoke_all:
            await kube.delete(f"/api/v1/namespaces/{namespace}/secrets/second")
        for token in (first, second) if revoke_all else (first,):
            await wait_refused(cluster, token)
        rotated = time.monotonic()
        await create_pods(kube, namespace, pods[PODS:])
        if not revoke_all:
            await wait_for(kube, namespace, all_bound(2 * PODS), timeout=GUARD, what="every pod bound")
            out["recover_s"] = time.monotonic() - rotated
            out["posts_refused"] = posts_refused(port)
        else:
            deadline = time.monotonic() + LASTING_DENIAL + GUARD
            while healthz(port) != 503:
                assert time.monotonic() < deadline, worker.tail()
                await asyncio.sleep(1)
            out["unhealthy_after_s"] = time.monotonic() - rotated
        out["log"] = worker.log_path.read_text()
    finally:
        worker.stop()
        await kube.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{binding}")
    return out


async def test_a_rotated_token_file_is_picked_up_mid_burst(
    kube: KubeClient, namespace: str, cluster: Cluster, tmp_path: Path, record_property: Any
) -> None:
    result = await run_rotation(kube, namespace, cluster, tmp_path, revoke_all=False)
    assert "API bearer token refreshed" in result["log"], result["log"][-3000:]
    assert "refused every request" not in result["log"]
    # the bindings in flight with the old token were sent again with the new one, not rejected and rescheduled
    # (37 of the second half's 100 were, before that). How many met the rotation is reported, not asserted: a kept-warm GET or the
    # token file's re-read may pick the new token up before the burst, and then none does (the unit tests in
    # tests/unit/common/test_credentials.py hold requests in flight deterministically).
    assert "bind rejected" not in result["log"], result["log"][-3000:]
    record_property("posts_refused_401", result["posts_refused"])
    record_property("pods", 2 * PODS)
    record_property("recover_s", round(result["recover_s"], 2))
    print(
        f"\ntoken rotated mid-burst: all {2 * PODS} pods bound {result['recover_s']:.2f}s after the rotation;"
        f" {result['posts_refused']:.0f} POSTs refused with the old token and sent again"
    )


@pytest.mark.slow
async def test_lasting_refusals_make_the_worker_unhealthy(
    kube: KubeClient, namespace: str, cluster: Cluster, tmp_path: Path, record_property: Any
) -> None:
    result = await run_rotation(kube, namespace, cluster, tmp_path, revoke_all=True)
    assert result["log"].count("refused every request") == 1, result["log"][-3000:]
    record_property("unhealthy_after_s", round(result["unhealthy_after_s"], 2))
    print(f"\nevery token revoked: /healthz failing {result['unhealthy_after_s']:.2f}s later")
