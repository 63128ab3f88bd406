"""Bindings whose replies come too late, on the real API server: the worker's cache must never count less on
a node than the API server has bound there.

Under load a binding attempt can run out of time on the client while kube-apiserver still applies it. The
client here is a real ``KubeClient`` whose binding replies are delayed past the attempt's deadline (a slow
network), for half the pods after the POST reached the API server (the binding lands) and for the other half
before it is sent (it never lands). Every attempt of every pod times out, so the binder gives each binding up;
afterwards, read from the API server, each bound pod must still be accounted on its node in the cache (it was
not forgotten, its capacity not handed to the next decision), and each unbound pod must be forgotten and
handed back for another scheduling attempt.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, cast

import pytest

from common.kube import KubeClient
from common.records import NodeName, PodKey, PodRecord, node_from_json, pod_from_json
from scale.cluster import Cluster
from scale.workload import agent_pod
from worker.binder import Binder
from worker.cache import Cache

pytestmark = pytest.mark.integration

PODS = 24
ATTEMPT_TIMEOUT = 0.5
HOLD = 1.0  # the test's MAX_BIND_TIME: a delayed reply is released only after the binder gave up


class LateReplies(KubeClient):
    """A real client; the reply to a binding of a pod in ``lands`` arrives after the attempt's deadline, and a
    binding of any other pod is held back before it is sent until the deadline has passed."""

    lands: set[str]
    sent: set[asyncio.Future[Any]]

    async def post(
        self, path: str, body: Any, params: dict[str, str] | None = None, *, timeout: float | None = None
    ) -> Any:
        if not path.endswith("/binding"):
            return await super().post(path, body, params)
        if body["metadata"]["name"] in self.lands:
            # Reaches the API server (a retry after the first lands: 409), but its answer, whatever it is,
            # comes after the attempt's deadline.
            self.sent.add(asyncio.ensure_future(super().post(path, body, params)))
        await asyncio.sleep(3600)  # cancelled at the attempt's deadline


class Recorded:
    def __init__(self) -> None:
        self.requeued: list[str] = []
        self.bound: list[str] = []

    def bound_(self, pod: PodRecord, node: NodeName, *, assumed_at: float, bound_at: float) -> None:
        self.bound.append(pod.key)

    def requeue(self, pod: PodRecord, attempts: int) -> None:
        self.requeued.append(pod.key)


class Outcomes:
    def __init__(self, rec: Recorded) -> None:
        self.bound = rec.bound_
        self.unschedulable = lambda pod, decision: None
        self.rejected = lambda pod, message: None


async def test_a_binding_given_up_after_unanswered_attempts_keeps_its_capacity_if_it_landed(
    cluster: Cluster, kube: KubeClient, namespace: str
) -> None:
    nodes = (await kube.get("/api/v1/nodes"))["items"]
    node = node_from_json(next(n for n in nodes if n["metadata"]["name"].startswith("kwok-")))
    scheduler = f"nobody-{uuid.uuid4().hex[:6]}"  # no scheduler binds these pods but ours
    created = [
        await kube.post(
            f"/api/v1/namespaces/{namespace}/pods",
            agent_pod(i, namespace=namespace, scheduler_name=scheduler),
        )
        for i in range(PODS)
    ]
    pods = [pod_from_json(obj) for obj in created]
    cache = Cache()
    cache.upsert_node(node)
    client = LateReplies(cluster.credentials())
    client.lands = {p.name for i, p in enumerate(pods) if i % 2 == 0}
    client.sent = set()
    rec = Recorded()
    binder = Binder(
        client,
        cache,
        cast(Any, Outcomes(rec)),
        requeue=rec.requeue,
        retries=1,
        retry_backoff=0.05,
        attempt_timeout=ATTEMPT_TIMEOUT,
        unanswered_hold=HOLD,
    )
    task = asyncio.create_task(binder.run())
    try:
        for pod in pods:
            cache.assume(pod, node.name)
            binder.submit(pod, node.name, queued_at=0.0, attempts=1)
        await asyncio.wait_for(binder.drain(), 60)  # hang guard
    finally:
        task.cancel()
        await asyncio.gather(task, *client.sent, return_exceptions=True)
        await client.close()
    listed = (await kube.get(f"/api/v1/namespaces/{namespace}/pods"))["items"]
    on_server = {PodKey(f"{namespace}/{o['metadata']['name']}"): o["spec"].get("nodeName") for o in listed}
    landed = {key for key, n in on_server.items() if n}
    assert landed == {p.key for p in pods if p.name in client.lands}  # the scenario happened as scripted
    assert not rec.bound  # no attempt was answered in time
    for key in landed:  # bound on the server: still counted on its node
        assert cache.pod_node.get(key) == node.name, key
    assert sorted(rec.requeued) == sorted(k for k in on_server if k not in landed)
    assert set(cache.pod_node) == landed
    expected = sum(p.requests.milli_cpu for p in pods if p.key in landed)
    assert cache.nodes[node.name].requested.milli_cpu == expected
