"""The Helm chart on the real local cluster:

- every object of the default render passes the API server's validation (server-side dry run), and a pod of
  every workload is admitted into a namespace enforcing the ``restricted`` Pod Security level;
- SubjectAccessReviews show each role's ServiceAccount may do what its code does (``common/kube.py`` callers)
  and nothing a scheduler must never do (read Secrets, create or delete pods, write nodes, read other
  ConfigMaps);
- ``/metrics`` with delegated auth answers only callers bound to the chart's metrics-reader role;
- a coordinator and a worker running on the host as the chart's ServiceAccounts, through the in-cluster path a
  pod takes (``KUBERNETES_SERVICE_HOST``/``PORT`` and the account's files under
  ``/var/run/secrets/kubernetes.io/serviceaccount``, in a mount namespace of their own), with the chart's
  rendered configuration and a TLS etcd requiring client certificates, schedule with no refusal;
- installed into a ``restricted`` namespace, every Deployment and the StatefulSet reach their replicas on kwok
  nodes (with kube-controller-manager in the local cluster; skipped, saying so, without it);
- ``helm install`` / ``upgrade`` / ``uninstall`` work against the API server, and an upgrade keeps the
  generated etcd certificates and dispatch secret.

Objects are rendered by the pinned helm into the test's namespace under a name of their own; cluster-scoped
ones are deleted at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import psutil
import pytest
import yaml

from common import metrics, metricsauth
from common.kube import ApiError, KubeClient, NotFound
from scale.cluster import Cluster
from tests.integration.etcd_pki import etcd_tls
from tests.integration.etcd_server import EtcdServer
from tests.integration.policy_rig import TTL, Rig, ensure_crd, eventually, small_pod
from tests.integration.support import SchedulerProcess, all_bound, create_pods, wait_for
from tests.unit.install.chart import CHART, HELM, helm

pytestmark = pytest.mark.integration

POLICY = "volcano-sharding-configmap"
HANG = 60.0  # a guard against hanging, never a speed requirement
COLLECTIONS = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
}


def rendered_config(namespace: str, directory: Path, *values: str) -> dict[str, Path]:
    """Each role's configuration file as the chart renders it into its ConfigMap (``--config``)."""
    sets = [a for v in values for a in ("--set", v)]
    text = helm(
        "template", "agent-scheduler", CHART, "--namespace", namespace, *sets,
        "--show-only", "templates/config.yaml",
    )  # fmt: skip
    (configmap,) = [d for d in yaml.safe_load_all(text) if d]
    files = {}
    for role in ("coordinator", "worker"):
        files[role] = directory / f"{role}.yaml"
        files[role].write_text(configmap["data"][f"{role}.yaml"])
    return files


def rendered_rbac(fullname: str, namespace: str) -> list[dict[str, Any]]:
    text = helm(
        "template", "agent-scheduler", CHART, "--namespace", namespace, "--set", f"fullnameOverride={fullname}",
        "--show-only", "templates/serviceaccounts.yaml", "--show-only", "templates/rbac.yaml",
    )  # fmt: skip
    return [d for d in yaml.safe_load_all(text) if d]


async def review(
    kube: KubeClient, namespace: str, account: str, verb: str, resource: str, *, group: str = "", ns: str = "",
    name: str = "", subresource: str = "",
) -> bool:  # fmt: skip
    attributes = {"verb": verb, "group": group, "resource": resource, "namespace": ns, "name": name}
    if subresource:
        attributes["subresource"] = subresource
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{namespace}:{account}",
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{namespace}",
                "system:authenticated",
            ],
            "resourceAttributes": attributes,
        },
    }
    reply = await kube.post("/apis/authorization.k8s.io/v1/subjectaccessreviews", body)
    return bool(reply["status"].get("allowed"))


async def test_each_service_account_may_do_its_job_and_nothing_dangerous(
    kube: KubeClient, namespace: str
) -> None:
    fullname = f"rbac-{uuid.uuid4().hex[:8]}"
    cluster_scoped: list[str] = []
    try:
        for doc in rendered_rbac(fullname, namespace):
            collection = COLLECTIONS[doc["kind"]].format(ns=namespace)
            await kube.post(collection, doc)
            if "{ns}" not in COLLECTIONS[doc["kind"]]:
                cluster_scoped.append(f"{collection}/{doc['metadata']['name']}")
        coordinator, worker = f"{fullname}-coordinator", f"{fullname}-worker"
        other = "some-user-namespace"

        async def can(account: str, verb: str, resource: str, **kw: str) -> bool:
            return await review(kube, namespace, account, verb, resource, **kw)

        # What each role's code does.
        needs = {
            coordinator: [
                ("list", "pods", {}), ("watch", "pods", {}),
                ("patch", "pods", {"ns": other, "name": "p", "subresource": "status"}),
                ("create", "events", {"ns": other}), ("create", "events", {"ns": namespace}),
                ("list", "nodes", {}), ("watch", "nodes", {}),
                ("list", "nodeshards", {"group": "shard.volcano.sh"}),
                ("watch", "nodeshards", {"group": "shard.volcano.sh"}),
                ("create", "nodeshards", {"group": "shard.volcano.sh"}),
                ("patch", "nodeshards", {"group": "shard.volcano.sh", "name": "agent-scheduler"}),
                ("patch", "nodeshards", {"group": "shard.volcano.sh", "name": "agent-scheduler", "subresource": "status"}),
                ("get", "configmaps", {"ns": namespace, "name": POLICY}),
                ("list", "configmaps", {"ns": namespace, "name": POLICY}),
                ("watch", "configmaps", {"ns": namespace, "name": POLICY}),
                ("create", "tokenreviews", {"group": "authentication.k8s.io"}),
                ("create", "subjectaccessreviews", {"group": "authorization.k8s.io"}),
            ],
            worker: [
                ("list", "pods", {}), ("watch", "pods", {}), ("list", "pods", {"ns": other}),
                ("create", "pods", {"ns": other, "name": "p", "subresource": "binding"}),
                ("patch", "pods", {"ns": other, "name": "p", "subresource": "status"}),
                ("create", "events", {"ns": other}),
                ("list", "nodes", {}), ("watch", "nodes", {}), ("get", "nodes", {"name": "n"}),
                ("list", "namespaces", {}), ("watch", "namespaces", {}),
                ("list", "services", {}), ("watch", "services", {}),
                ("list", "replicationcontrollers", {}), ("watch", "replicationcontrollers", {}),
                ("list", "replicasets", {"group": "apps"}), ("watch", "replicasets", {"group": "apps"}),
                ("list", "statefulsets", {"group": "apps"}), ("watch", "statefulsets", {"group": "apps"}),
                # preemption: victims are deleted (as kube-scheduler's own role may), budgets read
                ("delete", "pods", {"ns": other, "name": "p"}),
                ("list", "poddisruptionbudgets", {"group": "policy"}),
                ("watch", "poddisruptionbudgets", {"group": "policy"}),
                # volumes: storage watched, claims and PVs patched for WaitForFirstConsumer binding
                ("list", "persistentvolumeclaims", {}), ("watch", "persistentvolumeclaims", {}),
                ("patch", "persistentvolumeclaims", {"ns": other, "name": "c"}),
                ("list", "persistentvolumes", {}), ("watch", "persistentvolumes", {}),
                ("patch", "persistentvolumes", {"name": "pv"}),
                ("list", "storageclasses", {"group": "storage.k8s.io"}),
                ("watch", "storageclasses", {"group": "storage.k8s.io"}),
                ("list", "csinodes", {"group": "storage.k8s.io"}), ("watch", "csinodes", {"group": "storage.k8s.io"}),
                ("create", "tokenreviews", {"group": "authentication.k8s.io"}),
                ("create", "subjectaccessreviews", {"group": "authorization.k8s.io"}),
            ],
        }  # fmt: skip
        # What neither may: read secrets, create pods, write nodes or PVs beyond a patch, read other ConfigMaps.
        never = [
            ("get", "secrets", {"ns": namespace}), ("list", "secrets", {}), ("create", "pods", {"ns": other}),
            ("patch", "nodes", {"name": "n"}), ("delete", "persistentvolumes", {"name": "pv"}),
            ("delete", "persistentvolumeclaims", {"ns": other, "name": "c"}),
            ("update", "nodes", {"name": "n", "subresource": "status"}), ("delete", "nodes", {"name": "n"}),
            ("list", "configmaps", {"ns": namespace}), ("get", "configmaps", {"ns": namespace, "name": "other"}),
            ("get", "configmaps", {"ns": other, "name": POLICY}), ("create", "serviceaccounts", {"ns": namespace, "name": "x", "subresource": "token"}),
            ("delete", "nodeshards", {"group": "shard.volcano.sh", "name": "volcano"}),
            ("update", "events", {"ns": other, "name": "e"}),
        ]  # fmt: skip
        worker_never = [
            ("create", "nodeshards", {"group": "shard.volcano.sh"}),
            ("list", "nodeshards", {"group": "shard.volcano.sh"}),
            ("get", "configmaps", {"ns": namespace, "name": POLICY}),
        ]
        coordinator_never = [
            ("create", "pods", {"ns": other, "name": "p", "subresource": "binding"}),
            ("delete", "pods", {"ns": other, "name": "p"}),
        ]
        wrong: list[str] = []
        for account, checks in needs.items():
            for verb, resource, kw in checks:
                if not await can(account, verb, resource, **kw):
                    wrong.append(f"{account} denied {verb} {resource} {kw}")
        for account, checks in ((coordinator, never + coordinator_never), (worker, never + worker_never)):
            for verb, resource, kw in checks:
                if await can(account, verb, resource, **kw):
                    wrong.append(f"{account} allowed {verb} {resource} {kw}")
        assert not wrong, "\n".join(wrong)
    finally:
        for path in cluster_scoped:
            with contextlib.suppress(NotFound):
                await kube.delete(path)


# A pod's view of its ServiceAccount for a process on the host, without touching the host's /run: in a mount
# namespace of its own (private propagation, so no mount reaches the host) a tmpfs goes over /run/secrets, or over
# /run when the host has none (a scheduler needs nothing from /run), the account's three files are copied to the
# fixed in-cluster path, and the shell execs the scheduler, so the PID the launcher recorded is the scheduler's
# (``unshare`` without ``--fork`` execs its command in place). ``mount -n``: libmount's utab lives under /run.
IN_POD = """set -e
source=$1
shift
if [ -d /run/secrets ]; then top=/run/secrets; else top=/run; fi
mount -n -t tmpfs -o mode=0755 tmpfs "$top"
mkdir -p /run/secrets/kubernetes.io/serviceaccount
cp "$source/token" "$source/ca.crt" "$source/namespace" /run/secrets/kubernetes.io/serviceaccount/
exec "$@"
"""


def in_pod(account: Path) -> list[str]:
    """The wrapper that runs a command as a pod of ``account`` (a directory with token, ca.crt, namespace)."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", IN_POD, "sh", str(account)]


def _host_has_run_secrets() -> bool:
    return os.path.lexists("/run/secrets")


async def _is_the_scheduler(proc: SchedulerProcess) -> bool:
    """Whether the recorded PID now runs the scheduler itself (not ``unshare`` or the shell around it)."""
    assert proc.alive(), proc.tail()
    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(proc.pid).cmdline()[:3] == [sys.executable, "-m", "agent_scheduler.cli"]
    return False


async def token_of(kube: KubeClient, namespace: str, account: str) -> str:
    reply = await kube.post(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 600},
        },
    )
    token: str = reply["status"]["token"]
    return token


async def test_metrics_are_read_only_by_bound_callers(
    kube: KubeClient, namespace: str, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A metrics server with delegated auth, asking the real API server: 401 without a valid token, 403 for an
    account without the chart's metrics-reader role, 200 with it; health endpoints open."""
    fullname = f"metrics-{uuid.uuid4().hex[:8]}"
    reader = f"{fullname}-metrics-reader"
    cluster_scoped: list[str] = []
    monkeypatch.setenv(metricsauth.ENV, "delegated")
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    runner = await metrics.serve("127.0.0.1", 0, lambda: True)
    base = f"http://{metrics.addresses(runner)[0]}"
    try:
        for doc in rendered_rbac(fullname, namespace):
            if doc["kind"] == "ClusterRole" and doc["metadata"]["name"] == reader:
                await kube.post(COLLECTIONS["ClusterRole"], doc)
                cluster_scoped.append(f"{COLLECTIONS['ClusterRole']}/{reader}")
        for account in ("prometheus", "stranger"):
            await kube.post(
                f"/api/v1/namespaces/{namespace}/serviceaccounts",
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}},
            )
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{fullname}-prometheus"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": reader},
            "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": namespace}],
        }
        await kube.post(COLLECTIONS["ClusterRoleBinding"], binding)
        cluster_scoped.append(f"{COLLECTIONS['ClusterRoleBinding']}/{fullname}-prometheus")

        async def status(path: str, token: str | None = None) -> int:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            async with aiohttp.ClientSession() as s, s.get(base + path, headers=headers) as r:
                return r.status

        assert await status("/healthz") == 200
        assert await status("/readyz") == 200
        assert await status("/metrics") == 401
        assert await status("/metrics", "not-a-token") == 401
        assert await status("/metrics", await token_of(kube, namespace, "stranger")) == 403
        assert await status("/metrics", await token_of(kube, namespace, "prometheus")) == 200
    finally:
        await runner.cleanup()
        for path in cluster_scoped:
            with contextlib.suppress(NotFound):
                await kube.delete(path)


WORKLOAD_COLLECTIONS = {
    "Service": "/api/v1/namespaces/{ns}/services",
    "Secret": "/api/v1/namespaces/{ns}/secrets",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "StatefulSet": "/apis/apps/v1/namespaces/{ns}/statefulsets",
    "PodDisruptionBudget": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
    "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
    **COLLECTIONS,
}


async def test_the_rendered_chart_is_accepted_and_its_pods_are_restricted(
    kube: KubeClient, namespace: str
) -> None:
    """Every object of the default render passes the API server's validation (server-side dry run), and a pod of
    every workload is admitted into a namespace that enforces the ``restricted`` Pod Security level."""
    await kube.patch(
        f"/api/v1/namespaces/{namespace}",
        {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}},
    )
    fullname = f"dry-{uuid.uuid4().hex[:8]}"
    text = helm(
        "template",
        "agent-scheduler",
        CHART,
        "--namespace",
        namespace,
        "--set",
        f"fullnameOverride={fullname}",
    )
    docs = [d for d in yaml.safe_load_all(text) if d]
    dry = {"dryRun": "All"}
    for doc in docs:
        await kube.post(WORKLOAD_COLLECTIONS[doc["kind"]].format(ns=namespace), doc, params=dry)
    for doc in docs:  # the pods need their ServiceAccounts to exist
        if doc["kind"] == "ServiceAccount":
            await kube.post(COLLECTIONS["ServiceAccount"].format(ns=namespace), doc)
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    assert len(workloads) == 3
    for workload in workloads:
        template = workload["spec"]["template"]
        spec = dict(template["spec"])
        for claim in workload["spec"].get("volumeClaimTemplates", []):  # a PVC stands in as an emptyDir
            spec["volumes"] = [*spec.get("volumes", []), {"name": claim["metadata"]["name"], "emptyDir": {}}]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{workload['metadata']['name']}-0",
                "labels": template["metadata"]["labels"],
            },
            "spec": spec,
        }
        admitted = await kube.post(f"/api/v1/namespaces/{namespace}/pods", pod, params=dry)
        assert admitted["spec"]["priorityClassName"] == "system-cluster-critical"
    # The namespace does enforce the level: a pod without the chart's securityContext is refused.
    plain = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "plain"},
        "spec": {"containers": [{"name": "c", "image": "agent-scheduler:0.1.0"}]},
    }
    with pytest.raises(ApiError) as refused:
        await kube.post(f"/api/v1/namespaces/{namespace}/pods", plain, params=dry)
    assert refused.value.status == 403 and "PodSecurity" in refused.value.message


async def test_helm_install_upgrade_keeps_generated_secrets_and_uninstall_removes_the_release(
    kube: KubeClient, namespace: str, cluster: Cluster, tmp_path: Path
) -> None:
    """``helm install`` into a ``restricted`` namespace, ``helm upgrade`` keeps etcd's certificates and the
    dispatch secret (they must never change under running members), ``helm uninstall`` removes what it made."""
    await kube.patch(
        f"/api/v1/namespaces/{namespace}",
        {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}},
    )
    fullname = f"inst-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "HELM_CACHE_HOME": str(tmp_path / "cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "config"),
        "HELM_DATA_HOME": str(tmp_path / "data"),
    }

    def run_helm(*args: str) -> None:
        done = subprocess.run(
            [str(HELM), *args, "--namespace", namespace],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, f"helm {args[0]}: {done.stdout}{done.stderr}"

    secrets = [f"{fullname}-etcd-server-tls", f"{fullname}-etcd-client-tls", f"{fullname}-dispatch"]

    async def secret_data() -> list[dict[str, str]]:
        return [(await kube.get(f"/api/v1/namespaces/{namespace}/secrets/{s}"))["data"] for s in secrets]

    release = "as"
    values = ["--set", f"fullnameOverride={fullname}", "--skip-crds"]
    try:
        await asyncio.to_thread(run_helm, "install", release, str(CHART), *values)
        before = await secret_data()
        deployment = await kube.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{fullname}-worker")
        assert deployment["spec"]["replicas"] == 3
        await asyncio.to_thread(
            run_helm,
            "upgrade",
            release,
            str(CHART),
            "--set",
            f"fullnameOverride={fullname}",
            "--set",
            "worker.replicas=5",
        )
        assert await secret_data() == before
        deployment = await kube.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{fullname}-worker")
        assert deployment["spec"]["replicas"] == 5
    finally:
        await asyncio.to_thread(run_helm, "uninstall", release)
    for kind, path in (
        ("ClusterRole", f"{COLLECTIONS['ClusterRole']}/{fullname}-worker"),
        ("Deployment", f"/apis/apps/v1/namespaces/{namespace}/deployments/{fullname}-worker"),
        ("Secret", f"/api/v1/namespaces/{namespace}/secrets/{secrets[0]}"),
    ):
        with pytest.raises(NotFound):
            await kube.get(path)
            pytest.fail(f"{kind} left after uninstall: {path}")


async def test_the_roles_schedule_as_the_charts_service_accounts(
    kube: KubeClient, namespace: str, cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A coordinator and a worker run on the host as the chart's two ServiceAccounts, as pods see them: no
    kubeconfig, the API server named by ``KUBERNETES_SERVICE_HOST``/``PORT``, and a token from the TokenRequest
    API, the cluster's CA and the namespace at the fixed in-cluster path (``in_pod``); the chart's RBAC only,
    ``/metrics`` with delegated auth; each with its role's settings
    as the chart renders them (``--config``, JSON logs) and against an etcd that speaks TLS and requires
    client certificates, as the chart's etcd does: the shard policy is read, the NodeShards written, a burst of
    agent pods bound, and no request is refused."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare (util-linux): the roles need a mount namespace of their own")
    host_had_secrets = _host_has_run_secrets()
    fullname = f"sa-{uuid.uuid4().hex[:8]}"
    cluster_scoped: list[str] = []
    rig = Rig(cluster, kube, namespace, tmp_path)
    rig.configmap = POLICY  # the one ConfigMap the coordinator's Role names
    monkeypatch.setenv(metricsauth.ENV, "delegated")
    etcd = EtcdServer(tmp_path / "etcd", tls=etcd_tls(tmp_path / "pki"))
    try:
        etcd.start()
        for doc in rendered_rbac(fullname, namespace):
            collection = COLLECTIONS[doc["kind"]].format(ns=namespace)
            await kube.post(collection, doc)
            if "{ns}" not in COLLECTIONS[doc["kind"]]:
                cluster_scoped.append(f"{collection}/{doc['metadata']['name']}")
        accounts = {}
        for role in ("coordinator", "worker"):
            accounts[role] = tmp_path / f"{role}-serviceaccount"
            accounts[role].mkdir()
            token = await token_of(kube, namespace, f"{fullname}-{role}")
            (accounts[role] / "token").write_text(token)
            (accounts[role] / "ca.crt").write_bytes(cluster.ca_file.read_bytes())
            (accounts[role] / "namespace").write_text(namespace)
        await ensure_crd(kube)
        nodes = await rig.manage(4)
        await rig.forget_shards({rig.scheduler_name, rig.batch_name})
        await rig.put_configmap(
            {
                "sharding.yaml": f"""\
schedulerConfigs:
  - name: {rig.scheduler_name}
    type: agent
    policies:
      - {{name: node-limit, arguments: {{minNodes: 1, maxNodes: 2}}}}
  - name: {rig.batch_name}
    type: volcano
    policies:
      - {{name: node-limit, arguments: {{maxNodes: 100}}}}
shardSyncPeriod: "2s"
enableNodeEventTrigger: true
"""
            }
        )
        configs = rendered_config(
            namespace,
            tmp_path,
            f"schedulerName={rig.scheduler_name}",
            f"leaseTTL={TTL}",
            f"coordinator.agentNodeSelector={rig.managed_label}=true",
        )
        tls = etcd.tls
        assert tls is not None
        api = urlsplit(cluster.server)
        assert api.hostname and api.port
        pod_env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        pod_env |= {"KUBERNETES_SERVICE_HOST": api.hostname, "KUBERNETES_SERVICE_PORT": str(api.port)}
        for role, name, own in (
            ("coordinator", "coordinator", ["--metrics-address=127.0.0.1:0"]),
            ("worker", "w0", ["--metrics-address=127.0.0.1:0", "--listen=127.0.0.1:0"]),
        ):
            args = [
                "--log-format=json", "--log-level=INFO", role, f"--config={configs[role]}",
                f"--id={name}", *own,
                f"--etcd-endpoints={etcd.url}", f"--etcd-prefix={rig.prefix}", f"--etcd-cafile={tls.ca}",
                f"--etcd-certfile={tls.client_cert}", f"--etcd-keyfile={tls.client_key}",
            ]  # fmt: skip
            rig.procs[name] = SchedulerProcess(
                args, tmp_path / f"{name}.log", wrapper=in_pod(accounts[role]), env=pod_env
            )
        for proc in rig.procs.values():
            await eventually(
                functools.partial(_is_the_scheduler, proc), HANG, "the recorded PID runs the scheduler"
            )
        pods = [small_pod(f"agent-{i}", scheduler=rig.scheduler_name, kind="agent") for i in range(20)]
        await create_pods(kube, namespace, pods)
        bound = await wait_for(kube, namespace, all_bound(len(pods)), timeout=HANG, what="agent pods bound")
        agent_nodes = {p["spec"]["nodeName"] for p in bound}
        assert agent_nodes <= set(nodes) and len(agent_nodes) <= 2
        shard = await rig.shard(rig.scheduler_name)
        assert shard is not None and len(shard.nodes_desired) == 2 and agent_nodes <= set(shard.nodes_desired)
        for proc in rig.procs.values():
            text = proc.log_path.read_text()
            # An API error reads "403 Forbidden: ..." (``common.kube.ApiError``).
            assert not re.search(r"\b403( \w+)?:", text) and "Forbidden" not in text, proc.tail()
            lines = [json.loads(line) for line in text.splitlines() if line.strip()]  # JSON, as in the chart
            assert lines, proc.tail()
    finally:
        failures = await rig.close()
        etcd.stop()
        for path in cluster_scoped:
            with contextlib.suppress(NotFound):
                await kube.delete(path)
    assert not failures, "\n".join(failures)
    assert not any(p.alive() for p in rig.procs.values()), "stopping the recorded PIDs stopped the schedulers"
    assert _host_has_run_secrets() == host_had_secrets, "the host's /run was left as it was"


async def test_the_chart_reaches_its_replicas_in_a_restricted_namespace(
    kube: KubeClient, namespace: str, cluster: Cluster, tmp_path: Path
) -> None:
    """``helm install`` into a namespace enforcing ``restricted``: both Deployments and the etcd StatefulSet
    reach their desired replicas on kwok nodes (kwok runs the pods; the controllers are kube-controller-manager's,
    so this needs a cluster that runs it)."""
    await kube.patch(
        f"/api/v1/namespaces/{namespace}",
        {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}},
    )
    fullname = f"rep-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "HELM_CACHE_HOME": str(tmp_path / "cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "config"),
        "HELM_DATA_HOME": str(tmp_path / "data"),
    }

    def run_helm(*args: str) -> None:
        done = subprocess.run(
            [str(HELM), *args, "--namespace", namespace],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, f"helm {args[0]}: {done.stdout}{done.stderr}"

    workloads = {
        f"/apis/apps/v1/namespaces/{namespace}/deployments/{fullname}-coordinator": 2,
        f"/apis/apps/v1/namespaces/{namespace}/deployments/{fullname}-worker": 3,
        f"/apis/apps/v1/namespaces/{namespace}/statefulsets/{fullname}-etcd": 3,
    }

    async def ready() -> bool:
        for path, want in workloads.items():
            status = (await kube.get(path)).get("status") or {}
            if status.get("readyReplicas", 0) != want:
                return False
        return True

    # etcd on emptyDir: the local cluster has no volume provisioner.
    values = [
        "--set",
        f"fullnameOverride={fullname}",
        "--set",
        "etcd.persistence.enabled=false",
        "--skip-crds",
    ]
    values += ["--set", "coordinator.antiAffinity=required"]
    await asyncio.to_thread(run_helm, "install", "rep", str(CHART), *values)
    try:
        replica_sets = f"/apis/apps/v1/namespaces/{namespace}/replicasets"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if await _items(kube, replica_sets):
                break
            await asyncio.sleep(0.5)
        else:
            pytest.skip("no kube-controller-manager in this local cluster: nothing creates the pods")
        await eventually(ready, HANG * 2, "every Deployment and the StatefulSet at their replicas")
        pods = (await kube.get(f"/api/v1/namespaces/{namespace}/pods"))["items"]
        assert len(pods) == 8
        nodes = {p["spec"]["nodeName"] for p in pods if "coordinator" in p["metadata"]["name"]}
        assert len(nodes) == 2, "the two coordinators are spread over two nodes"
    finally:
        await asyncio.to_thread(run_helm, "uninstall", "rep")


async def _items(kube: KubeClient, path: str) -> list[Any]:
    items: list[Any] = (await kube.get(path))["items"]
    return items
