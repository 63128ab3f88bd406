"""The watches that feed one worker: nodes and pods from the API server into the cache and the queue.

- ``NodeFeed``: every node (of ``--node-selector``) into the cache; a node added or changed in a way a filter
  sees wakes the unschedulable pods (``queue.move_all``).
- ``PodFeed``: every non-terminal pod into the cache (pods of every scheduler use capacity); with
  ``watch_pending`` (standalone) also every pending pod of our scheduler name into the queue. Freed capacity
  wakes the unschedulable pods; a deleted pod leaves the queue and the reporter.
- ``StorageFeed``: claims, PVs, StorageClasses and CSINodes into the cache's volume store
  (``worker.volumes``); any change wakes the unschedulable pods (a claim bound, a PV or class created).
- ``Watches``: the reflectors, and the ``worker.shard.PodWatch`` view the shard's catch-up of newly granted
  nodes waits on (the watch's progress, a consistent LIST per node, and a direct apply when the watch lags).

Invariant: the cache is only written here (from the API server's view) and by the scheduler's own
assumptions; nothing here decides.
"""

from __future__ import annotations

from typing import Any

from common import metrics
from common.kube import KubeClient
from common.records import NodeName, PodRecord, node_from_json, pod_from_json
from common.reporting import Reporter
from common.watching import Reflector
from worker.cache import Cache
from worker.queue import SchedulingQueue

POD_PARAMS = {"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"}


class NodeFeed:
    def __init__(self, cache: Cache, queue: SchedulingQueue) -> None:
        self.cache = cache
        self.queue = queue

    def replace(self, objects: list[dict[str, Any]]) -> None:
        self.cache.replace_nodes([node_from_json(o) for o in objects])
        self.queue.move_all()

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        record = node_from_json(obj)
        if kind == "DELETED":
            self.cache.remove_node(record.name)
        elif self.cache.upsert_node(record):
            self.queue.move_all()


class PodFeed:
    def __init__(
        self,
        cache: Cache,
        queue: SchedulingQueue,
        reporter: Reporter,
        *,
        scheduler_name: str,
        watch_pending: bool,
    ) -> None:
        self.cache = cache
        self.queue = queue
        self.reporter = reporter
        self.scheduler_name = scheduler_name
        self.watch_pending = watch_pending

    def admit(self, pod: PodRecord, seen_at: float) -> None:
        """A pod from the watch: queue it if it is ours and waiting; drop it from the queue once placed.
        ``seen_at`` (the queue's clock) is when the watch delivered it: the start of the "queued" stage."""
        if pod.scheduler_name != self.scheduler_name:
            return
        if pod.node_name or pod.deleting:
            self.queue.delete(pod.key)
            return
        if self.watch_pending and not self.cache.is_assumed(pod.key):
            new = pod.key not in self.queue
            self.queue.add(pod)
            if new and pod.key in self.queue:
                metrics.observe_stage("queued", self.queue.clock() - seen_at)

    def replace(self, objects: list[dict[str, Any]]) -> None:
        seen_at = self.queue.clock()
        pods = [pod_from_json(o) for o in objects]
        self.cache.replace_pods([p for p in pods if p.node_name and not p.terminal])
        for p in pods:
            self.admit(p, seen_at)

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        seen_at = self.queue.clock()
        pod = pod_from_json(obj)
        if kind == "DELETED" or pod.terminal:
            self.queue.delete(pod.key)
            self.reporter.forget(pod.key)
            if self.cache.remove_pod(pod.key):
                self.queue.move_all()
            return
        if self.cache.upsert_pod(pod):
            self.queue.move_all()
        self.admit(pod, seen_at)


STORAGE_PATHS = {
    "claims": "/api/v1/persistentvolumeclaims",
    "volumes": "/api/v1/persistentvolumes",
    "classes": "/apis/storage.k8s.io/v1/storageclasses",
    "csinodes": "/apis/storage.k8s.io/v1/csinodes",
}


class StorageFeed:
    def __init__(self, kind: str, cache: Cache, queue: SchedulingQueue) -> None:
        self.kind = kind
        self.cache = cache
        self.queue = queue

    def replace(self, objects: list[dict[str, Any]]) -> None:
        self.cache.volumes.replace(self.kind, objects)
        self.queue.move_all()

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.cache.volumes.remove(self.kind, obj)
        else:
            self.cache.volumes.upsert(self.kind, obj)
        self.queue.move_all()


class Watches:
    """The node and pod reflectors of one worker (the pod one only after the node one has synced)."""

    def __init__(
        self,
        client: KubeClient,
        cache: Cache,
        queue: SchedulingQueue,
        reporter: Reporter,
        *,
        scheduler_name: str,
        node_selector: str,
        watch_pending: bool,
    ) -> None:
        self.client = client
        self.cache = cache
        self.pods = Reflector(
            client,
            "/api/v1/pods",
            PodFeed(cache, queue, reporter, scheduler_name=scheduler_name, watch_pending=watch_pending),
            params=POD_PARAMS,
            name="pods",
        )
        node_params = {"labelSelector": node_selector} if node_selector else {}
        self.nodes = Reflector(
            client, "/api/v1/nodes", NodeFeed(cache, queue), params=node_params, name="nodes"
        )
        self.storage = [
            Reflector(client, path, StorageFeed(kind, cache, queue), name=kind)
            for kind, path in STORAGE_PATHS.items()
        ]

    def synced(self) -> bool:
        return (
            self.pods.synced.is_set()
            and self.nodes.synced.is_set()
            and all(r.synced.is_set() for r in self.storage)
        )

    # ----- worker.shard.PodWatch -------------------------------------------------------------------------

    async def wait_synced(self) -> None:
        await self.pods.synced.wait()

    def listed_since(self, moment: float) -> bool:
        return self.pods.list_started_at >= moment

    def revision(self) -> int:
        # resourceVersions are etcd revisions in every API server we know; compared as integers here only.
        return int(self.pods.resource_version or 0)

    async def list_bound(self, node: NodeName) -> tuple[list[PodRecord], int]:
        reply = await self.client.get("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"})
        items = reply.get("items") or []
        target = max((int(i["metadata"]["resourceVersion"]) for i in items), default=0)
        return [pod_from_json(i) for i in items], target

    def apply_direct(self, pods: list[PodRecord]) -> None:
        for pod in pods:
            if not pod.terminal and pod.key not in self.cache.pod_node:
                self.cache.upsert_pod(pod)
