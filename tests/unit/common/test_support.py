"""The placement-field table (``common.support``): every refused field is refused with a message naming it,
every accepted field kind is accepted, and the tables cover the whole v1.36 PodSpec."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from common.records import pod_from_json
from common.support import (
    _CHECKS,
    AFFINITY_FIELDS,
    INSPECTED,
    IRRELEVANT,
    REFUSED,
    REMEDY,
    SPEC_FIELDS,
    SUPPORTED,
    VOLUME_SOURCES,
    unsupported,
    unsupported_fields,
)
from tests.builders import make_node, make_pod
from tests.unit.worker.helpers import engine_over

# The JSON names of every field of PodSpec and of VolumeSource in k8s.io/api v0.36 (core/v1/types.go).
PODSPEC_V136 = {
    "volumes", "initContainers", "containers", "ephemeralContainers", "restartPolicy",
    "terminationGracePeriodSeconds", "activeDeadlineSeconds", "dnsPolicy", "nodeSelector", "serviceAccountName",
    "serviceAccount", "automountServiceAccountToken", "nodeName", "hostNetwork", "hostPID", "hostIPC",
    "shareProcessNamespace", "securityContext", "imagePullSecrets", "hostname", "subdomain", "affinity",
    "schedulerName", "tolerations", "hostAliases", "priorityClassName", "priority", "dnsConfig", "readinessGates",
    "runtimeClassName", "enableServiceLinks", "preemptionPolicy", "overhead", "topologySpreadConstraints",
    "setHostnameAsFQDN", "os", "hostUsers", "schedulingGates", "resourceClaims", "resources", "hostnameOverride",
    "schedulingGroup",
}  # fmt: skip
VOLUME_SOURCES_V136 = {
    "hostPath", "emptyDir", "gcePersistentDisk", "awsElasticBlockStore", "gitRepo", "secret", "nfs", "iscsi",
    "glusterfs", "persistentVolumeClaim", "rbd", "flexVolume", "cinder", "cephfs", "flocker", "downwardAPI", "fc",
    "azureFile", "configMap", "vsphereVolume", "quobyte", "azureDisk", "photonPersistentDisk", "projected",
    "portworxVolume", "scaleIO", "storageos", "csi", "ephemeral", "image",
}  # fmt: skip


def api_pod() -> dict[str, Any]:
    """An ordinary pod as the API server returns it: every default filled in, a service-account volume."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "agent", "namespace": "default", "uid": "u1", "labels": {"app": "agent"}},
        "spec": {
            "volumes": [
                {
                    "name": "kube-api-access-x",
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {
                                "configMap": {
                                    "name": "kube-root-ca.crt",
                                    "items": [{"key": "ca.crt", "path": "ca"}],
                                }
                            },
                            {
                                "downwardAPI": {
                                    "items": [{"path": "ns", "fieldRef": {"fieldPath": "metadata.ns"}}]
                                }
                            },
                        ],
                        "defaultMode": 420,
                    },
                },
                {"name": "scratch", "emptyDir": {}},
            ],
            "containers": [
                {
                    "name": "main",
                    "image": "agent:1",
                    "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                    "env": [{"name": "A", "value": "b"}],
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "64Mi"},
                        "limits": {"memory": "64Mi"},
                    },
                    "volumeMounts": [{"name": "scratch", "mountPath": "/tmp"}],
                    "readinessProbe": {"exec": {"command": ["true"]}},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                    "securityContext": {"runAsNonRoot": True},
                    "restartPolicyRules": [
                        {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}
                    ],
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "securityContext": {},
            "schedulerName": "agent-scheduler",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


def with_spec(**fields: Any) -> dict[str, Any]:
    pod = api_pod()
    pod["spec"].update(fields)
    return pod


def changed(edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    pod = api_pod()
    edit(pod["spec"])
    return pod


def add_volume(volume: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    return lambda spec: spec["volumes"].append(volume)


POD_TERM = {"labelSelector": {"matchLabels": {"app": "agent"}}, "topologyKey": "kubernetes.io/hostname"}

# (case id, pod, the field the message must name)
REFUSED_CASES: list[tuple[str, dict[str, Any], str]] = [
    (
        "required-pod-anti-affinity",
        with_spec(
            affinity={"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [POD_TERM]}}
        ),
        "spec.affinity.podAntiAffinity",
    ),
    (
        "preferred-pod-anti-affinity",
        with_spec(
            affinity={
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 10, "podAffinityTerm": POD_TERM}
                    ]
                }
            }
        ),
        "spec.affinity.podAntiAffinity",
    ),
    (
        "required-pod-affinity",
        with_spec(affinity={"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [POD_TERM]}}),
        "spec.affinity.podAffinity",
    ),
    (
        "preferred-pod-affinity",
        with_spec(
            affinity={
                "podAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 1, "podAffinityTerm": POD_TERM}
                    ]
                }
            }
        ),
        "spec.affinity.podAffinity",
    ),
    (
        "pod-affinity-next-to-node-affinity",
        with_spec(
            affinity={
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Exists"}]}]
                    }
                },
                "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [POD_TERM]},
            }
        ),
        "spec.affinity.podAffinity",
    ),
    (
        "topology-spread-do-not-schedule",
        with_spec(
            topologySpreadConstraints=[
                {
                    "maxSkew": 1,
                    "topologyKey": "topology.kubernetes.io/zone",
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": {"app": "agent"}},
                }
            ]
        ),
        "spec.topologySpreadConstraints",
    ),
    (
        "topology-spread-schedule-anyway",
        with_spec(
            topologySpreadConstraints=[
                {"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}
            ]
        ),
        "spec.topologySpreadConstraints",
    ),
    (
        "resource-claims",
        with_spec(resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]),
        "spec.resourceClaims",
    ),
    (
        "container-resource-claims",
        changed(lambda s: s["containers"][0]["resources"].update(claims=[{"name": "gpu"}])),
        "spec.containers[0].resources.claims",
    ),
    (
        "init-container-resource-claims",
        changed(
            lambda s: s.update(initContainers=[{"name": "i", "resources": {"claims": [{"name": "gpu"}]}}])
        ),
        "spec.initContainers[0].resources.claims",
    ),
    (
        "pod-level-resource-claims",
        with_spec(resources={"requests": {"cpu": "100m"}, "claims": [{"name": "gpu"}]}),
        "spec.resources.claims",
    ),
    (
        "scheduling-group",
        with_spec(schedulingGroup={"podGroupName": "gang"}),
        "spec.schedulingGroup",
    ),
    (
        "restart-all-containers-rule",
        changed(
            lambda s: s["containers"][0].update(
                restartPolicyRules=[
                    {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [1]}}
                ]
            )
        ),
        "spec.containers[0].restartPolicyRules (action RestartAllContainers)",
    ),
    (
        "host-network-with-user-namespaces",
        with_spec(hostNetwork=True, hostUsers=False),
        "spec.hostUsers: false with spec.hostNetwork: true",
    ),
    (
        "unknown-spec-field",
        with_spec(futurePlacementRule={"zone": "a"}),
        "spec.futurePlacementRule",
    ),
    (
        "unknown-affinity-kind",
        with_spec(affinity={"nodeAffinity": {}, "futureAffinity": {"x": 1}}),
        "spec.affinity.futureAffinity",
    ),
    (
        "unknown-volume-source",
        changed(add_volume({"name": "v", "futureVolume": {"size": "1Gi"}})),
        'spec.volumes[2].futureVolume (volume "v")',
    ),
] + [
    (
        f"volume-{source}",
        changed(add_volume({"name": "data", source: {"claimName": "c", "volumeID": "v", "pdName": "p"}})),
        f'spec.volumes[2].{source} (volume "data")',
    )
    for source, f in sorted(VOLUME_SOURCES.items())
    if f.status == REFUSED
]


# Inter-pod rules: honoured by every worker, standalone or under a coordinator (the topology lane).
_INTER_POD_IDS = {
    "required-pod-anti-affinity",
    "preferred-pod-anti-affinity",
    "required-pod-affinity",
    "preferred-pod-affinity",
    "pod-affinity-next-to-node-affinity",
    "topology-spread-do-not-schedule",
    "topology-spread-schedule-anyway",
}
INTER_POD_CASES = [c for c in REFUSED_CASES if c[0] in _INTER_POD_IDS]
REFUSED_CASES = [c for c in REFUSED_CASES if c[0] not in _INTER_POD_IDS]


@pytest.mark.parametrize(
    ("pod", "field"), [c[1:] for c in INTER_POD_CASES], ids=[c[0] for c in INTER_POD_CASES]
)
def test_inter_pod_rules_are_honoured(pod: dict[str, Any], field: str) -> None:
    assert unsupported(pod) is None
    record = pod_from_json(pod)
    assert record.parse_error is None
    assert record.inter_pod is not None


def test_a_namespace_selector_is_supported_and_parsed() -> None:
    term = dict(POD_TERM, namespaces=["other"], namespaceSelector={"matchLabels": {"team": "a"}})
    pod = with_spec(affinity={"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}})
    assert unsupported(pod) is None
    parsed = pod_from_json(pod)
    assert parsed.inter_pod is not None
    selected = parsed.inter_pod.anti_affinity[0]
    assert selected.namespaces == frozenset({"other"})
    assert selected.namespace_selector is not None
    assert selected.matches("x", {"app": "agent"}, {"team": "a"}) == selected.selector.matches(
        {"app": "agent"}
    )
    assert not selected.matches("x", {"app": "agent"}, {"team": "b"})
    everywhere = dict(POD_TERM, namespaceSelector={})
    pod = with_spec(
        affinity={"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [everywhere]}}
    )
    assert unsupported(pod) is None
    record = pod_from_json(pod)
    assert record.inter_pod is not None and record.inter_pod.affinity[0].namespaces is None


@pytest.mark.parametrize(("pod", "field"), [c[1:] for c in REFUSED_CASES], ids=[c[0] for c in REFUSED_CASES])
def test_a_pod_using_a_refused_field_is_refused_naming_it(pod: dict[str, Any], field: str) -> None:
    message = unsupported(pod)
    assert message == f"pod uses {field}, which agent-scheduler does not support yet; {REMEDY}"
    record = pod_from_json(pod)
    assert record.parse_error == message
    # a refused pod still knows its requests (it is counted if another scheduler places it)
    assert record.requests.milli_cpu == 100


def test_every_refused_field_is_named_together() -> None:
    pod = with_spec(
        affinity={"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [POD_TERM]}},
        topologySpreadConstraints=[
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
        ],
        resourceClaims=[{"name": "gpu", "resourceClaimName": "gpu-0"}],
    )
    pod["spec"]["volumes"].append({"name": "data", "gcePersistentDisk": {"pdName": "data"}})
    assert unsupported(pod) == (
        'pod uses spec.volumes[2].gcePersistentDisk (volume "data") and spec.resourceClaims, which '
        "agent-scheduler does not support yet; use the default scheduler (spec.schedulerName) for this pod"
    )


def test_the_api_servers_ordinary_pod_is_accepted() -> None:
    pod = api_pod()
    assert unsupported(pod) is None
    assert pod_from_json(pod).parse_error is None


def _sample(field: str) -> Any:
    samples: dict[str, Any] = {
        "nodeSelector": {"zone": "a"},
        "tolerations": [{"key": "k", "operator": "Exists"}],
        "schedulingGates": [{"name": "example.com/gate"}],
        "priority": 1000,
        "overhead": {"cpu": "10m"},
        "nodeName": "",  # an empty nodeName: still pending
        "resources": {"requests": {"cpu": "200m"}, "limits": {"cpu": "1"}},
        "hostUsers": False,
        "hostNetwork": True,
        "affinity": {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "preference": {"matchExpressions": [{"key": "a", "operator": "Exists"}]}}
                ]
            }
        },
        "initContainers": [{"name": "init", "image": "i", "restartPolicy": "Always"}],
        "ephemeralContainers": [{"name": "debug", "image": "busybox"}],
        "securityContext": {"runAsUser": 1000, "seLinuxOptions": {"level": "s0"}},
        "os": {"name": "linux"},
        "dnsConfig": {"nameservers": ["1.1.1.1"]},
        "hostAliases": [{"ip": "10.0.0.1", "hostnames": ["x"]}],
        "readinessGates": [{"conditionType": "example.com/ready"}],
        "imagePullSecrets": [{"name": "registry"}],
    }
    return samples.get(field, "x")


ACCEPTED_SPEC_FIELDS = sorted(k for k, f in SPEC_FIELDS.items() if f.status != REFUSED and k != "volumes")


@pytest.mark.parametrize("field", ACCEPTED_SPEC_FIELDS)
def test_every_supported_or_irrelevant_spec_field_is_accepted(field: str) -> None:
    pod = with_spec(**{field: _sample(field)})
    assert unsupported(pod) is None, SPEC_FIELDS[field]


ACCEPTED_VOLUMES = sorted(k for k, f in VOLUME_SOURCES.items() if f.status != REFUSED)


@pytest.mark.parametrize("source", ACCEPTED_VOLUMES)
def test_every_volume_source_without_placement_effect_is_accepted(source: str) -> None:
    pod = changed(add_volume({"name": "v", source: {"path": "/x"}}))
    assert unsupported(pod) is None, VOLUME_SOURCES[source]


@pytest.mark.parametrize(
    "empty",
    [
        {"topologySpreadConstraints": []},
        {"resourceClaims": None},
        {"affinity": {"podAntiAffinity": {}}},
        {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}}},
        {"resources": {"claims": []}},
        {"hostUsers": False},  # without hostNetwork
    ],
    ids=str,
)
def test_an_empty_value_uses_nothing(empty: dict[str, Any]) -> None:
    assert unsupported(with_spec(**empty)) is None


def test_a_placed_pod_is_never_refused_and_counts_its_requests() -> None:
    pod = with_spec(
        nodeName="node-1",
        affinity={"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [POD_TERM]}},
    )
    record = pod_from_json(pod)
    assert record.parse_error is None and record.node_name == "node-1"
    assert record.requests.milli_cpu == 100


def test_a_refusal_wins_over_an_invalid_spec() -> None:
    pod = with_spec(resourceClaims=[{"name": "gpu", "resourceClaimName": "gpu-0"}])
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    message = pod_from_json(pod).parse_error
    assert message is not None and message.startswith("pod uses spec.resourceClaims")


@pytest.mark.parametrize(
    "spec",
    [
        None,
        [],
        {"volumes": "nope"},
        {"volumes": [3, None, {"name": "a", "emptyDir": None}]},
        {"affinity": [1]},
        {"affinity": {"podAffinity": 5}},
        {"containers": [None, {"resources": 5, "restartPolicyRules": "x"}]},
        {"resources": 7},
    ],
    ids=str,
)
def test_garbage_never_raises(spec: Any) -> None:
    got = unsupported({"spec": copy.deepcopy(spec)})
    assert got is None or got.startswith("pod uses ")


def test_the_tables_cover_the_whole_v136_pod_spec() -> None:
    assert set(SPEC_FIELDS) == PODSPEC_V136
    assert set(VOLUME_SOURCES) == VOLUME_SOURCES_V136
    assert set(AFFINITY_FIELDS) == {"nodeAffinity", "podAffinity", "podAntiAffinity"}
    assert set(_CHECKS) == {k for k, f in SPEC_FIELDS.items() if f.status == INSPECTED}
    assert {f.status for f in SPEC_FIELDS.values()} == {SUPPORTED, IRRELEVANT, REFUSED, INSPECTED}
    for table in (SPEC_FIELDS, VOLUME_SOURCES, AFFINITY_FIELDS):
        for f in table.values():
            assert f.why, f.path


def test_unsupported_fields_lists_paths() -> None:
    spec = api_pod()["spec"]
    spec["resourceClaims"] = [{"name": "gpu"}]
    assert unsupported_fields(spec) == ["spec.resourceClaims"]


def test_the_engine_reports_a_refused_pod_unschedulable_with_the_message() -> None:
    engine = engine_over([make_node("n").record()])
    pod = make_pod("p").req(cpu="100m")
    pod.spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "gpu-0"}]
    decision = engine.schedule(pod.record())
    assert decision.node is None
    assert decision.message.startswith("pod uses spec.resourceClaims, which agent-scheduler")
