"""The Helm chart: lint, render, and what a cluster operator relies on in the rendered objects."""

from __future__ import annotations

import base64
import filecmp
import json
import re
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY

import common.metrics  # noqa: F401  (registers the exported metrics)
import coordinator.metrics  # noqa: F401  (the coordinator's own)
from agent_scheduler import cli
from tests.unit.install.chart import CHART, ROOT, find, helm, one, render
from worker.coordinated import DRAIN_TIMEOUT

ROLES = ("coordinator", "worker")
# Checking /metrics callers with the API server (common/metricsauth.py), on by default.
REVIEWS = {
    ("authentication.k8s.io", "tokenreviews"): {"create"},
    ("authorization.k8s.io", "subjectaccessreviews"): {"create"},
}
FORBIDDEN_RESOURCES = {"secrets", "serviceaccounts", "serviceaccounts/token", "*"}


@pytest.fixture(scope="module")
def default() -> list[dict[str, Any]]:
    return render()


def containers(docs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    out = []
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            pod = d["spec"]["template"]["spec"]
            out += [(pod, c) for c in pod["containers"]]
    return out


def test_lint_passes_with_default_and_plain_values() -> None:
    helm("lint", "--strict", CHART)
    helm("lint", "--strict", CHART, "-f", ROOT / "manifests" / "plain-values.yaml")
    helm("lint", "--strict", CHART, "--set", "etcd.enabled=false,etcd.external.endpoints=etcd:2379",
         "--set", "etcd.external.tlsSecret=etcd-client")  # fmt: skip


def test_committed_manifests_are_a_fresh_render(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(ROOT / "manifests" / "render.sh"), str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    names = (
        "agent-scheduler.yaml",
        "configmap-sharding.yaml",
        "rbac.yaml",
        "crds/nodeshards.shard.volcano.sh.yaml",
    )
    for name in names:
        assert filecmp.cmp(tmp_path / name, ROOT / "manifests" / name, shallow=False), (
            f"manifests/{name} differs from the chart: run `make manifests` and commit"
        )


def test_workloads(default: list[dict[str, Any]]) -> None:
    coordinator = one(default, "Deployment", "agent-scheduler-coordinator")
    worker = one(default, "Deployment", "agent-scheduler-worker")
    etcd = one(default, "StatefulSet", "agent-scheduler-etcd")
    assert coordinator["spec"]["replicas"] == 2
    assert worker["spec"]["replicas"] == 3
    assert etcd["spec"]["replicas"] == 3
    assert etcd["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
    spread = coordinator["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert spread["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["topologyKey"] == (
        "kubernetes.io/hostname"
    )
    required = render("coordinator.antiAffinity=required")
    pod = one(required, "Deployment", "agent-scheduler-coordinator")["spec"]["template"]["spec"]
    assert pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    # one ServiceAccount per role
    accounts = {
        d["metadata"]["name"].removeprefix("agent-scheduler-"): d["spec"]["template"]["spec"][
            "serviceAccountName"
        ]
        for d in (coordinator, worker)
    }
    assert accounts == {"coordinator": "agent-scheduler-coordinator", "worker": "agent-scheduler-worker"}
    assert etcd["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_pods_meet_the_restricted_pod_security_level(default: list[dict[str, Any]]) -> None:
    found = containers(default)
    assert len(found) == 3
    for pod, c in found:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert not pod.get("hostNetwork") and not pod.get("hostPID")
        assert all("hostPath" not in v for v in pod.get("volumes", []))


def test_resources_priority_probes_and_grace(default: list[dict[str, Any]]) -> None:
    for pod, c in containers(default):
        assert set(c["resources"]) == {"requests", "limits"}, c["name"]
        assert pod["priorityClassName"] == "system-cluster-critical"
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert c[probe]["timeoutSeconds"] >= 3, (c["name"], probe)
    worker = one(default, "Deployment", "agent-scheduler-worker")["spec"]["template"]["spec"]
    assert worker["terminationGracePeriodSeconds"] > DRAIN_TIMEOUT
    none = render("priorityClassName=")
    assert all("priorityClassName" not in pod for pod, _ in containers(none))


def test_disruption_budgets(default: list[dict[str, Any]]) -> None:
    budgets = {d["metadata"]["name"]: d["spec"] for d in find(default, "PodDisruptionBudget")}
    assert budgets["agent-scheduler-coordinator"]["minAvailable"] == 1
    assert budgets["agent-scheduler-worker"]["maxUnavailable"] == 1
    assert budgets["agent-scheduler-etcd"]["minAvailable"] == 2


def rules_of(docs: list[dict[str, Any]], kind: str, name: str) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in one(docs, kind, name)["rules"]:
        assert "resourceNames" not in rule or kind == "Role"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def test_rbac_is_least_privilege_per_role(default: list[dict[str, Any]]) -> None:
    read = {"get", "list", "watch"}
    coordinator = rules_of(default, "ClusterRole", "agent-scheduler-coordinator")
    assert coordinator == {
        ("", "pods"): read,
        ("", "pods/status"): {"patch"},
        ("", "nodes"): read,
        ("", "events"): {"create"},
        ("shard.volcano.sh", "nodeshards"): read | {"create", "patch"},
        ("shard.volcano.sh", "nodeshards/status"): {"patch"},
        **REVIEWS,
    }
    worker = rules_of(default, "ClusterRole", "agent-scheduler-worker")
    assert worker == {
        ("", "pods"): read | {"delete"},  # preemption's victims, on owned nodes (worker/preemption.py)
        ("", "pods/binding"): {"create"},
        ("policy", "poddisruptionbudgets"): {"list", "watch"},
        ("", "pods/status"): {"patch"},
        ("", "nodes"): read,
        ("", "namespaces"): read,
        # kube's default topology spread constraints: only the selectors are kept (worker/workloads.py)
        ("", "services"): read,
        ("", "replicationcontrollers"): read,
        ("apps", "replicasets"): read,
        ("apps", "statefulsets"): read,
        ("", "events"): {"create"},
        ("", "persistentvolumeclaims"): {"list", "watch", "patch"},
        ("", "persistentvolumes"): {"list", "watch", "patch"},
        ("storage.k8s.io", "storageclasses"): {"list", "watch"},
        ("storage.k8s.io", "csinodes"): {"list", "watch"},
        **REVIEWS,
    }
    # default spread constraints turned off: none of those objects are watched, nor readable
    off = render(
        extra=["--set-json", 'worker.podTopologySpread={"defaultingType":"List","defaultConstraints":[]}']
    )
    unwatched = {
        ("", "services"),
        ("", "replicationcontrollers"),
        ("apps", "replicasets"),
        ("apps", "statefulsets"),
    }
    assert set(worker) - set(rules_of(off, "ClusterRole", "agent-scheduler-worker")) == unwatched
    reader = one(default, "ClusterRole", "agent-scheduler-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    open_metrics = render("metrics.auth=none")
    for role in ROLES:
        rules = rules_of(open_metrics, "ClusterRole", f"agent-scheduler-{role}")
        assert not set(REVIEWS) & set(rules)
        assert env_of(open_metrics, role)["AGENT_SCHEDULER_METRICS_AUTH"] == "none"
        assert env_of(default, role)["AGENT_SCHEDULER_METRICS_AUTH"] == "delegated"
    assert not find(open_metrics, "ClusterRole", "agent-scheduler-metrics-reader")
    policy = one(default, "Role", "agent-scheduler-coordinator-policy")
    assert policy["metadata"]["namespace"] == "agent-scheduler"
    assert policy["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["volcano-sharding-configmap"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    for d in find(default, "ClusterRole") + find(default, "Role"):
        for rule in d["rules"]:
            assert not FORBIDDEN_RESOURCES & set(rule.get("resources", [])), d["metadata"]["name"]
            assert "*" not in rule["verbs"]
    bindings = {d["metadata"]["name"]: d for d in find(default, "ClusterRoleBinding")}
    for role in ROLES:
        subject = bindings[f"agent-scheduler-{role}"]["subjects"]
        assert subject == [
            {"kind": "ServiceAccount", "name": f"agent-scheduler-{role}", "namespace": "agent-scheduler"}
        ]
    # next to Volcano: the Role moves to the ConfigMap's namespace; without a policy, no ConfigMap access
    volcano = render("sharding.namespace=volcano-system")
    assert (
        one(volcano, "Role", "agent-scheduler-coordinator-policy")["metadata"]["namespace"]
        == "volcano-system"
    )
    off = render("sharding.enabled=false")
    assert not find(off, "Role")
    assert ("shard.volcano.sh", "nodeshards") not in rules_of(
        off, "ClusterRole", "agent-scheduler-coordinator"
    )


def args_of(docs: list[dict[str, Any]], role: str) -> list[str]:
    pod = one(docs, "Deployment", f"agent-scheduler-{role}")["spec"]["template"]["spec"]
    args: list[str] = pod["containers"][0]["args"]
    return args


def env_of(docs: list[dict[str, Any]], role: str) -> dict[str, Any]:
    pod = one(docs, "Deployment", f"agent-scheduler-{role}")["spec"]["template"]["spec"]
    return {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}


def config_of(docs: list[dict[str, Any]], role: str) -> dict[str, Any]:
    text = one(docs, "ConfigMap", "agent-scheduler-config")["data"][f"{role}.yaml"]
    doc: dict[str, Any] = yaml.safe_load(text)
    return doc


def test_first_apply_uses_the_label_pool_until_a_policy_exists(default: list[dict[str, Any]]) -> None:
    settings = config_of(default, "coordinator")
    assert "policyConfigmap" not in settings
    assert settings["policyNamespace"] == "agent-scheduler"
    assert settings["agentNodeSelector"] == ""
    volcano_default = config_of(render("sharding.volcanoDefaultUntilPresent=true"), "coordinator")
    assert volcano_default["policyConfigmap"] == "volcano-sharding-configmap"
    assert config_of(render("sharding.enabled=false"), "coordinator")["policyConfigmap"] == ""
    selected = config_of(render("coordinator.agentNodeSelector=pool=agents"), "coordinator")
    assert selected["agentNodeSelector"] == "pool=agents"


def test_roles_get_etcd_endpoints_tls_and_json_logs(default: list[dict[str, Any]]) -> None:
    for role in ROLES:
        args = args_of(default, role)
        assert args[: args.index(role)] == ["--log-format=json", "--log-level=INFO"]
        assert "--etcd-cafile=/etc/agent-scheduler/etcd/ca.crt" in args
        assert "--etcd-certfile=/etc/agent-scheduler/etcd/tls.crt" in args
        assert "--etcd-keyfile=/etc/agent-scheduler/etcd/tls.key" in args
        endpoints = env_of(default, role)["AGENT_SCHEDULER_ETCD"].split(",")
        assert endpoints == [
            f"agent-scheduler-etcd-{i}.agent-scheduler-etcd-headless.agent-scheduler.svc:2379"
            for i in range(3)
        ]
    plain = render("etcd.tls.enabled=false")
    assert not [a for a in args_of(plain, "worker") if a.startswith("--etcd-cafile")]
    etcd_args = one(plain, "StatefulSet", "agent-scheduler-etcd")["spec"]["template"]["spec"]["containers"][0]
    assert "--listen-client-urls=http://0.0.0.0:2379" in etcd_args["args"]
    external = render(
        "etcd.enabled=false", "etcd.external.endpoints=etcd.example:2379", "etcd.external.tlsSecret=ext"
    )
    assert not find(external, "StatefulSet")
    assert env_of(external, "worker")["AGENT_SCHEDULER_ETCD"] == "etcd.example:2379"
    volumes = one(external, "Deployment", "agent-scheduler-worker")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "etcd-client-tls", "secret": {"secretName": "ext"}} in volumes


def test_etcd_members_speak_mutual_tls(default: list[dict[str, Any]]) -> None:
    args = one(default, "StatefulSet", "agent-scheduler-etcd")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert "--client-cert-auth" in args and "--peer-client-cert-auth" in args
    cluster = next(a for a in args if a.startswith("--initial-cluster="))
    assert cluster.count("https://") == 3
    headless = one(default, "Service", "agent-scheduler-etcd-headless")
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True


def test_generated_certificates_verify(default: list[dict[str, Any]], tmp_path: Path) -> None:
    server = one(default, "Secret", "agent-scheduler-etcd-server-tls")["data"]
    client = one(default, "Secret", "agent-scheduler-etcd-client-tls")["data"]
    files = {}
    for prefix, data in (("server", server), ("client", client)):
        for key in ("ca.crt", "tls.crt", "tls.key"):
            path = tmp_path / f"{prefix}-{key}"
            path.write_bytes(base64.b64decode(data[key]))
            files[f"{prefix}-{key}"] = path
    assert files["server-ca.crt"].read_bytes() == files["client-ca.crt"].read_bytes()
    # Each key matches its certificate and the CA loads: Python's TLS would accept them.
    for prefix in ("server", "client"):
        ctx = ssl.create_default_context(cafile=str(files[f"{prefix}-ca.crt"]))
        ctx.load_cert_chain(str(files[f"{prefix}-tls.crt"]), str(files[f"{prefix}-tls.key"]))
    text = subprocess.run(
        ["openssl", "x509", "-noout", "-text", "-in", str(files["server-tls.crt"])],
        capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    if text:  # openssl is optional here; the SANs decide whether members and clients can verify etcd
        assert "DNS:*.agent-scheduler-etcd-headless.agent-scheduler.svc" in text
        assert "IP Address:127.0.0.1" in text


def test_cert_manager_mode_renders_certificates_not_secrets() -> None:
    docs = render("etcd.tls.certManager.enabled=true")
    assert not [d for d in find(docs, "Secret") if "etcd" in d["metadata"]["name"]]
    certs = {d["metadata"]["name"]: d["spec"] for d in find(docs, "Certificate")}
    assert certs["agent-scheduler-etcd-server"]["secretName"] == "agent-scheduler-etcd-server-tls"
    assert certs["agent-scheduler-etcd-client"]["secretName"] == "agent-scheduler-etcd-client-tls"
    assert certs["agent-scheduler-etcd-ca"]["isCA"] is True


def test_network_policies(default: list[dict[str, Any]]) -> None:
    worker = one(default, "NetworkPolicy", "agent-scheduler-worker")["spec"]
    dispatch = next(r for r in worker["ingress"] if {"protocol": "TCP", "port": 7070} in r["ports"])
    assert dispatch["from"] == [
        {
            "podSelector": {
                "matchLabels": {
                    "app.kubernetes.io/name": "agent-scheduler",
                    "app.kubernetes.io/instance": "agent-scheduler",
                    "app.kubernetes.io/component": "coordinator",
                }
            }
        }
    ]
    etcd = one(default, "NetworkPolicy", "agent-scheduler-etcd")["spec"]
    client = etcd["ingress"][0]
    assert client["ports"] == [{"protocol": "TCP", "port": 2379}]
    (selector,) = client["from"]
    components = next(
        e["values"]
        for e in selector["podSelector"]["matchExpressions"]
        if e["key"] == "app.kubernetes.io/component"
    )
    assert components == ["coordinator", "worker"]
    peer = etcd["ingress"][1]
    assert {"protocol": "TCP", "port": 2380} in peer["ports"]
    assert peer["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "etcd"


def test_metrics_service_and_monitors_only_when_the_operator_is_there(default: list[dict[str, Any]]) -> None:
    assert {d["metadata"]["name"] for d in find(default, "Service")} >= {
        "agent-scheduler-coordinator-metrics",
        "agent-scheduler-worker-metrics",
    }
    on = ("metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true")
    assert not find(render(*on), "ServiceMonitor") and not find(render(*on), "PodMonitor")
    apis = ["--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"]
    apis += ["--api-versions", "monitoring.coreos.com/v1/PodMonitor"]
    with_operator = render(*on, extra=apis)
    monitors = find(with_operator, "ServiceMonitor")
    assert len(monitors) == 2
    assert all(m["spec"]["endpoints"][0]["bearerTokenFile"] for m in monitors)
    assert len(find(with_operator, "PodMonitor")) == 1
    assert not find(render(extra=apis), "ServiceMonitor")


def test_dispatch_secret_is_generated_and_mounted(default: list[dict[str, Any]]) -> None:
    secret = one(default, "Secret", "agent-scheduler-dispatch")
    assert len(base64.b64decode(secret["data"]["secret"])) >= 32
    for role in ROLES:
        assert (
            env_of(default, role)["AGENT_SCHEDULER_DISPATCH_SECRET_FILE"]
            == "/etc/agent-scheduler/dispatch/secret"
        )
    assert not find(render("dispatchSecret.create=false"), "Secret", "agent-scheduler-dispatch")


def test_namespace_is_labelled_restricted_when_created() -> None:
    (ns,) = find(render("namespace.create=true"), "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def _metric_names(expr: str) -> set[str]:
    return {m for m in re.findall(r"\b([a-z_]+)\{", expr) if m not in ("by", "sum", "rate")}


def _exported() -> set[str]:
    names: set[str] = set()
    for metric in REGISTRY.collect():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
        names.update(metric.name + suffix for suffix in suffixes.get(metric.type, ("",)))
    return names


def test_dashboard_and_alerts_use_exported_metrics() -> None:
    apis = ["--api-versions", "monitoring.coreos.com/v1/PrometheusRule"]
    on = ("metrics.prometheusRule.enabled=true", "metrics.dashboard.enabled=true")
    assert not find(render(*on), "PrometheusRule")
    assert not find(render(extra=apis), "PrometheusRule")
    assert not find(render(), "ConfigMap", "agent-scheduler-dashboard")
    docs = render(*on, extra=apis)
    dashboard = json.loads(
        one(docs, "ConfigMap", "agent-scheduler-dashboard")["data"]["agent-scheduler.json"]
    )
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    (rule,) = find(docs, "PrometheusRule")
    alerts = {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {
        "AgentSchedulerPodsStuckPending",
        "AgentSchedulerWorkerOwnsNoNodes",
        "AgentSchedulerShardImbalance",
        "AgentSchedulerNoLeader",
        "AgentSchedulerAgentPoolEmpty",
    } <= set(alerts)
    assert "max(agent_scheduler_coordinator_is_leader" in alerts["AgentSchedulerNoLeader"]
    titles = {p["title"] for p in dashboard["panels"]}
    assert {"Coordinator leader and failovers", "Dispatch backlog", "Node handoff duration"} <= titles
    exported = _exported()
    for expr in exprs + list(alerts.values()):
        used = _metric_names(expr)
        assert used, expr
        unknown = {m for m in used if m not in exported and not m.startswith("process_")}
        assert not unknown, f"{expr}: {unknown} not exported by common/metrics.py"


def test_rendered_arguments_and_configuration_parse_with_the_cli(tmp_path: Path) -> None:
    # The etcd TLS flags are checked by name above; here every other argument and every field of the rendered
    # configuration must be one the command knows, with the values the chart meant.
    docs = render("etcd.tls.enabled=false", "coordinator.agentNodeSelector=pool=agents")
    parsed = {}
    for role in ROLES:
        path = tmp_path / f"{role}.yaml"
        path.write_text(one(docs, "ConfigMap", "agent-scheduler-config")["data"][f"{role}.yaml"])
        args = [f"--config={path}" if a.startswith("--config=") else a for a in args_of(docs, role)]
        parser = cli._build_parser(role)
        parsed[role] = cli._apply_config(parser, parser.parse_args(args), args)
        assert parsed[role].command == role
        assert parsed[role].log_format == "json"
        assert parsed[role].scheduler_name == "agent-scheduler"
        assert parsed[role].metrics_address == "0.0.0.0:9090"
        assert parsed[role].lease_ttl == 10
        assert parsed[role].id == "$(POD_NAME)"
    assert parsed["coordinator"].agent_node_selector == "pool=agents"
    assert parsed["coordinator"].policy_configmap is None
    assert parsed["worker"].listen == "0.0.0.0:7070"
    assert parsed["worker"].advertise_host == "$(POD_IP)"
    assert parsed["worker"].strategy == "MostAllocated"


def test_a_configuration_change_rolls_the_pods(default: list[dict[str, Any]]) -> None:
    changed = render("worker.strategy=LeastAllocated")
    for role in ROLES:
        before = one(default, "Deployment", f"agent-scheduler-{role}")["spec"]["template"]["metadata"]
        after = one(changed, "Deployment", f"agent-scheduler-{role}")["spec"]["template"]["metadata"]
        assert before["annotations"]["checksum/config"] != after["annotations"]["checksum/config"]
