"""Bindings denied in one namespace for a while, then allowed, on the real local cluster.

The API server itself refuses the bindings: a ``ValidatingAdmissionPolicy`` and its binding
(``admissionregistration.k8s.io/v1``) deny every CREATE of ``pods/binding`` in one namespace, while a burst of
pods in that namespace and another burst in a second namespace are scheduled; after ``denial`` seconds the
policy is deleted. As with kube-scheduler:

- the second namespace's pods bind normally while the first's are refused;
- a refused binding is retried with backoff (a worker reports it on the pod and, under a coordinator, answers
  RESULT rejected; the leader dispatches the pod again after a growing wait, a standalone worker queues it
  again with the same backoff), so the refusals per pod stay bounded: no retry storm against the API server;
- once the policy is gone every pod ends bound exactly once, no node is overcommitted and no node was used by
  two workers (``test_coordinator``'s audit);
- no bound pod keeps a stale ``PodScheduled=False`` (the binding sets it True server-side, and a failure
  report must not land after that), and ``FailedScheduling`` events per refused pod are few (deduplicated).

The coordinated scenario runs a coordinator and two workers as processes, with a denial of 20 s (60 s in the
variant marked slow); the standalone one a single ``worker --standalone``, with a denial of 12 s. Counts
(refusals from the API server's own admission metrics, binding POSTs, status patches, events) and the time
from the policy's deletion to all bound are printed and recorded as test properties, never asserted as
speeds; generous timeouts guard hangs. The refusals per pod and the events per pod are asserted against
bounds that follow from the backoff and the deduplication window, so a retry storm or an event flood fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from common.kube import ApiError, KubeClient, NotFound
from common.reporting import REPEAT_AFTER
from coordinator.dispatch.pending import REJECT_BACKOFF_MAX
from scale.cluster import Cluster
from scale.workload import agent_pod
from tests.conftest import delete_namespace
from tests.integration.etcd_server import EtcdServer
from tests.integration.support import (
    SchedulerProcess,
    all_bound,
    audit_capacity,
    create_pods,
    list_pods,
    start_worker,
    wait_for,
)
from tests.integration.test_chaos_dispatch import SecureDeployment
from tests.integration.test_coordinator import (  # the harness and the audit of the coordinator tests
    audit,
    burst,
    lease_etcd,  # noqa: F401 - the fixture, used by name
    settled,
    started,
    stopped_after,
)

pytestmark = [pytest.mark.integration]

DENIED_PODS = 200
OTHER_PODS = 200
CI_DENIAL = 20.0
FULL_DENIAL = 60.0
STANDALONE_DENIAL = 12.0  # enough for four refusals per pod, each after a longer backoff
GATE_TIMEOUT = 30.0  # hang guard: the API server takes up (or drops) the policy within seconds
SETTLE_TIMEOUT = 180.0  # hang guard for "all bound"
LATE_REPORTS = 3.0  # after all are bound: time for any failure report still under way to land
DENIED_MESSAGE = "bindings are closed in this namespace"


# ----- the denial: a real admission policy --------------------------------------------------------------


class BindingGate:
    """A ``ValidatingAdmissionPolicy`` + binding that deny ``pods/binding`` CREATE in one namespace."""

    def __init__(self, kube: KubeClient, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace
        self.policy = f"deny-bindings-{uuid.uuid4().hex[:6]}"
        self.probes = 0  # binding POSTs the gate itself sent
        self.refused = 0  # of which the policy refused

    async def _denied(self) -> bool:
        """Probe with a binding of a pod that does not exist: admission runs before the pod is looked up, so
        a refusal is the policy's and a 404 means the policy let it through."""
        self.probes += 1
        try:
            await self.kube.bind(self.namespace, "gate-probe-no-such-pod", "", "no-such-node")
        except NotFound:
            return False
        except ApiError as e:
            if e.status in (403, 422) and DENIED_MESSAGE in e.message:
                self.refused += 1
                return True
            raise
        raise AssertionError("a binding of a pod that does not exist succeeded")

    async def _until(self, denied: bool) -> None:
        deadline = time.monotonic() + GATE_TIMEOUT
        while await self._denied() != denied:
            assert time.monotonic() < deadline, f"the API server did not {'take up' if denied else 'drop'} it"
            await asyncio.sleep(0.2)

    async def close(self) -> None:
        """Bindings refused from now on (returns once the API server enforces the policy)."""
        base = "/apis/admissionregistration.k8s.io/v1"
        await self.kube.post(
            f"{base}/validatingadmissionpolicies",
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicy",
                "metadata": {"name": self.policy},
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": {
                        "resourceRules": [
                            {
                                "apiGroups": [""],
                                "apiVersions": ["v1"],
                                "operations": ["CREATE"],
                                "resources": ["pods/binding"],
                            }
                        ]
                    },
                    "validations": [
                        {"expression": "false", "message": DENIED_MESSAGE, "reason": "Forbidden"}
                    ],
                },
            },
        )
        await self.kube.post(
            f"{base}/validatingadmissionpolicybindings",
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": {"name": self.policy},
                "spec": {
                    "policyName": self.policy,
                    "validationActions": ["Deny"],
                    "matchResources": {
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.namespace}}
                    },
                },
            },
        )
        await self._until(denied=True)

    async def open(self) -> None:
        """Delete the policy; returns once the API server lets bindings through again."""
        await self.remove()
        await self._until(denied=False)

    async def remove(self) -> None:
        base = "/apis/admissionregistration.k8s.io/v1"
        for kind in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
            with contextlib.suppress(NotFound):
                await self.kube.delete(f"{base}/{kind}/{self.policy}")


@contextlib.asynccontextmanager
async def closed_gate(kube: KubeClient, namespace: str) -> AsyncIterator[BindingGate]:
    gate = BindingGate(kube, namespace)
    try:
        await gate.close()
        yield gate
    finally:
        await gate.remove()


@contextlib.asynccontextmanager
async def second_namespace(kube: KubeClient, first: str) -> AsyncIterator[str]:
    name = f"{first[:50]}-b"
    await kube.post(
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {"e2e-test": "true"}}},
    )
    try:
        yield name
    finally:
        await delete_namespace(kube, name)


# ----- counting what the API server saw -----------------------------------------------------------------


async def apiserver_counts(kube: KubeClient, policy: str) -> Counter[str]:
    """From the API server's own /metrics: binding POSTs by code, pod status PATCHes, event POSTs, and the
    refusals by ``policy``."""
    async with kube._session.get(kube.creds.server + "/metrics") as resp:
        text = await resp.text()
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        series, _, value = line.rpartition(" ")
        if series.startswith("apiserver_request_total{"):
            labels = dict(
                part.split("=", 1)
                for part in series[len("apiserver_request_total{") : -1].split(",")
                if "=" in part
            )
            labels = {k: v.strip('"') for k, v in labels.items()}
            verb, resource, sub = labels.get("verb"), labels.get("resource"), labels.get("subresource", "")
            if verb == "POST" and resource == "pods" and sub == "binding":
                counts[f"binding_{labels.get('code')}"] += int(float(value))
                counts["binding"] += int(float(value))
            elif verb == "PATCH" and resource == "pods" and sub == "status":
                counts["status_patch"] += int(float(value))
            elif verb == "POST" and resource == "events":
                counts["event_post"] += int(float(value))
        elif (
            series.startswith("apiserver_validating_admission_policy_check_total{")
            and f'policy="{policy}"' in series
            and 'enforcement_action="deny"' in series
        ):
            counts["denied"] += int(float(value))
    return counts


# ----- what the pods show -------------------------------------------------------------------------------


def stale_unscheduled(pods: list[dict[str, Any]]) -> list[str]:
    """Bound pods whose PodScheduled condition still says False."""
    return [
        p["metadata"]["name"]
        for p in pods
        if p["spec"].get("nodeName")
        for c in (p.get("status") or {}).get("conditions") or []
        if c.get("type") == "PodScheduled" and c.get("status") != "True"
    ]


async def failed_scheduling(kube: KubeClient, namespace: str) -> Counter[str]:
    """FailedScheduling events per pod name (each event's ``count`` included)."""
    events = (await kube.get(f"/api/v1/namespaces/{namespace}/events"))["items"]
    per_pod: Counter[str] = Counter()
    for e in events:
        if e.get("reason") == "FailedScheduling":
            per_pod[e["involvedObject"]["name"]] += int(e.get("count") or 1)
    return per_pod


def max_attempts(denial: float) -> int:
    """A generous bound on the binding attempts per pod in ``denial`` seconds with a backoff that doubles from
    one second up to ``REJECT_BACKOFF_MAX``: twice the attempts that schedule allows, plus a few."""
    attempts, t, backoff = 1, 0.0, 1.0
    while t + backoff <= denial:
        t += backoff
        attempts += 1
        backoff = min(REJECT_BACKOFF_MAX, backoff * 2)
    return 2 * attempts + 4


def max_events(denial: float, reporters: int) -> int:
    """Each reporter reports a pod at most once per ``REPEAT_AFTER`` while its message stays the same."""
    return reporters * (1 + math.ceil(denial / REPEAT_AFTER))


class Scenario:
    """One run of the scenario: bursts in both namespaces, the denial, the lifting, the checks."""

    def __init__(self, kube: KubeClient, denied: str, other: str, gate: BindingGate, denial: float) -> None:
        self.kube, self.denied, self.other, self.gate, self.denial = kube, denied, other, gate, denial

    async def run(
        self, create: Any, audit_ns: Any, *, reporters: int, record_property: Any, label: str
    ) -> dict[str, Any]:
        kube = self.kube
        before = await apiserver_counts(kube, self.gate.policy)
        probes, refused = self.gate.probes, self.gate.refused
        closed_at = time.monotonic()
        await asyncio.gather(create(self.denied, DENIED_PODS), create(self.other, OTHER_PODS))
        # The other namespace binds in full while the policy is still in force (it is lifted only after).
        await audit_ns(self.other, OTHER_PODS)
        other_bound = time.monotonic() - closed_at
        pods = await list_pods(kube, self.denied)
        assert not [p for p in pods if p["spec"].get("nodeName")], "a binding got through the policy"
        await asyncio.sleep(max(0.0, closed_at + self.denial - time.monotonic()))
        during = await apiserver_counts(kube, self.gate.policy)
        lifting = time.monotonic()
        await self.gate.open()
        opened = time.monotonic()
        pods = await audit_ns(self.denied, DENIED_PODS)
        recovered = time.monotonic()
        await asyncio.sleep(LATE_REPORTS)
        after = await apiserver_counts(kube, self.gate.policy)
        stale = stale_unscheduled(await list_pods(kube, self.denied)) + stale_unscheduled(
            await list_pods(kube, self.other)
        )
        events = await failed_scheduling(kube, self.denied)
        other_events = await failed_scheduling(kube, self.other)
        denied_total = after["denied"] - before["denied"] - (self.gate.refused - refused)
        refused_per_pod = denied_total / DENIED_PODS
        spent = after - before
        numbers = {
            "pods": DENIED_PODS + OTHER_PODS,
            "denial_s": self.denial,
            "other_namespace_all_bound_s": round(other_bound, 1),
            "policy_deleted_to_enforced_off_s": round(opened - lifting, 1),
            "policy_deleted_to_all_bound_s": round(recovered - lifting, 1),
            "refusals": denied_total,
            "refusals_per_pod": round(refused_per_pod, 1),
            "refusals_during_denial": during["denied"] - before["denied"],
            "binding_posts": spent["binding"] - (self.gate.probes - probes),
            "status_patches": spent["status_patch"],
            "event_posts": spent["event_post"],
            "failed_scheduling_per_pod": dict(sorted(Counter(events.values()).items())),
            "pods_with_failed_scheduling": len(events),
        }
        for key, value in numbers.items():
            record_property(key, value)
        print(f"\n{label}: {numbers}")
        assert not stale, f"bound pods with PodScheduled=False: {sorted(stale)[:10]}"
        assert not other_events, dict(other_events)
        assert len({p["metadata"]["uid"] for p in pods}) == DENIED_PODS
        assert denied_total >= DENIED_PODS, numbers  # every pod of the namespace was refused at least once
        assert refused_per_pod <= max_attempts(self.denial), numbers  # backoff, not a retry storm
        assert max(events.values(), default=0) <= max_events(self.denial, reporters), numbers
        return numbers


DENIALS = [pytest.param(CI_DENIAL, id="20s"), pytest.param(FULL_DENIAL, id="60s", marks=pytest.mark.slow)]


# ----- coordinated: a coordinator and two workers -------------------------------------------------------


@pytest.fixture
async def deployment(
    cluster: Cluster,
    lease_etcd: EtcdServer,  # noqa: F811 - the imported fixture
    tmp_path: Path,
) -> AsyncIterator[SecureDeployment]:
    with stopped_after(SecureDeployment(cluster, lease_etcd, tmp_path), killed=False) as d:
        yield d


@pytest.mark.parametrize("denial", DENIALS)
async def test_bindings_denied_in_one_namespace_then_allowed(
    kube: KubeClient, namespace: str, deployment: SecureDeployment, denial: float, record_property: Any
) -> None:
    d = deployment
    d.coordinator("coord-a")
    d.worker("w1")
    d.worker("w2")
    await started(d, 2)
    await settled(d, kube)  # the test asserts both workers placed pods

    async def create(ns: str, n: int) -> None:
        await burst(kube, d, ns, n, concurrency=16)

    async def audit_ns(ns: str, n: int) -> list[dict[str, Any]]:
        return await audit(d, kube, ns, n)

    async with second_namespace(kube, namespace) as other, closed_gate(kube, namespace) as gate:
        await Scenario(kube, namespace, other, gate, denial).run(
            create, audit_ns, reporters=2, record_property=record_property, label="coordinated, 2 workers"
        )
    by_worker = Counter(t["worker"] for t in d.trails())
    assert set(by_worker) == {"w1", "w2"}, by_worker


# ----- standalone: one worker --standalone --------------------------------------------------------------


@pytest.fixture
def standalone(cluster: Cluster, tmp_path: Path) -> Iterator[tuple[SchedulerProcess, str]]:
    name = f"agent-gate-{uuid.uuid4().hex[:6]}"
    proc = start_worker(cluster, tmp_path, name, worker_id="gate-worker")
    try:
        yield proc, name
    finally:
        assert proc.stop() == 0, proc.tail()


async def test_standalone_bindings_denied_in_one_namespace_then_allowed(
    kube: KubeClient, namespace: str, standalone: tuple[SchedulerProcess, str], record_property: Any
) -> None:
    proc, scheduler_name = standalone

    async def create(ns: str, n: int) -> None:
        pods = [agent_pod(i, namespace=ns, scheduler_name=scheduler_name) for i in range(n)]
        await create_pods(kube, ns, pods, concurrency=16)

    async def audit_ns(ns: str, n: int) -> list[dict[str, Any]]:
        pods = await wait_for(kube, ns, all_bound(n), timeout=SETTLE_TIMEOUT, what=f"{n} pods bound in {ns}")
        assert (await audit_capacity(kube)).overcommitted == []
        return pods

    async with second_namespace(kube, namespace) as other, closed_gate(kube, namespace) as gate:
        await Scenario(kube, namespace, other, gate, STANDALONE_DENIAL).run(
            create, audit_ns, reporters=1, record_property=record_property, label="standalone"
        )
    assert proc.alive(), proc.tail()
