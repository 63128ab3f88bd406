"""The watches that feed one worker: nodes and pods from the API server into the cache and the queue.

- ``NodeFeed``: every node (of ``--node-selector``) into the cache; a node added or changed in a way a filter
  sees wakes the unschedulable pods it may help (``worker.hints``), a relist every one (``queue.move_all``).
- ``PodFeed``: every non-terminal pod into the cache (pods of every scheduler use capacity); with
  ``watch_pending`` (standalone, or the sole worker under a coordinator: ``worker.intake``) also every
  pending pod of our scheduler name into the queue, and under a coordinator the pending pods this worker
  claims (``claims``, ``worker.claims``). Freed capacity
  wakes the unschedulable pods; a deleted pod leaves the queue and the reporter, and ``gone`` is told (what
  the scheduler keeps per dispatched pod outside the queue goes with it); so does a queued pod a relist no
  longer lists, unless its record is newer than the list (a DISPATCH that came after it was read). An event costs what it changes
  (``shortcuts``, on outside tests that compare them with the full path):
  - a DELETED event is not parsed (its key and uid are all it is read for);
  - a pod with no placed or assumed record here, not placed, not terminal, of another scheduler or (without
    ``watch_pending``) ours neither nominated nor being deleted nor one ``Claims.to_read`` wants (this
    worker its claimant, or a required anti-affinity stated), is not parsed: a parse would only tell
    ``admit`` to drop it from ``pending``. Under a coordinator every worker sees every pending pod of ours
    and only one claims it or gets its DISPATCH, which then parses it in full (``worker.intake``, with
    ``previous``); the claims keep the unparsed object, read when the claim set changes;
  - an event of a placed pod is parsed with its cached record (``common.records.pod_update``), which is kept
    as it is, and the cache is not touched, when nothing a reader of a placed pod reads changed (a kubelet's
    status updates after the start, annotations): the record is current in every field read. Pods on nodes
    this worker does not own get the same record as its own: their labels and nodes count for the inter-pod
    rules across the cluster, and a node granted later is used with the records the watch gave it;
  - any other event is parsed with the pod's latest record as ``previous`` (the placed pod's from the cache,
    or the pending pod's kept in ``pending`` for pods of our scheduler name), so a status-only event re-reads
    the status only; a DISPATCH of a pending pod is parsed the same way (``worker.intake``).
- ``NamespaceFeed``: every Namespace's labels into the cache (``namespaceSelector`` terms of pod (anti-)affinity);
  a change that may satisfy a waiting pod's required affinity wakes the unschedulable pods.
- ``WorkloadFeed``: the selectors of Services, ReplicationControllers, ReplicaSets and StatefulSets into the
  cache's ``workloads`` (kube's default topology spread constraints); watched only when a default constraint
  is configured.
- ``StorageFeed``: claims, PVs, StorageClasses and CSINodes into the cache's volume store
  (``worker.volumes``); a change wakes the unschedulable pods it may help (a claim bound, a PV or class
  created: ``VolumeStore.wakes``, pods with a claim it concerns), a relist all of them.
- ``Watches``: the reflectors, and the ``worker.shard.PodWatch`` view the shard's catch-up of newly granted
  nodes waits on (the watch's progress, a consistent LIST per node, and a direct apply when the watch lags).
  ``progress`` is set after every pod event or relist the cache applied (the dispatch gate,
  ``worker.gate``, waits on it for the watch to reach a DISPATCH's ``min_rv``).

Pods read directly (``PodFeed.apply_direct``: the catch-up of a granted node when the watch lags) are ahead
of the watch: until the watch delivers a record of such a pod at least as new as the direct one, its older
events (the pod still pending, before its binding) and an older relist snapshot are not applied to it, or they
would take the pod off its node and free capacity the API server has given it (an overcommitted node).

Nominations: a pending pod of our scheduler name whose ``status.nominatedNodeName`` is set is nominated in the
cache (its room reserved, ``worker.cache``), so a nomination made by another worker, or by this one before a
restart, is honoured; an update without one keeps the cache's nomination (this worker's own may be ahead of
its patch), and placement or deletion ends it.

Invariant: the cache is only written here (from the API server's view) and by the scheduler's own
assumptions; nothing here decides.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from common import metrics
from common.kube import KubeClient
from common.records import NodeName, PodKey, PodRecord, node_from_json, pod_from_json, pod_key, pod_update
from common.reporting import Reporter
from common.watching import Reflector, revision_of
from worker.cache import Cache
from worker.claims import Claims
from worker.hints import NodeHints
from worker.queue import SchedulingQueue
from worker.workloads import REPLICA_SET, REPLICATION_CONTROLLER, SERVICE, STATEFUL_SET

# kind -> the collection path of the objects whose selectors the default spread constraints read
WORKLOAD_PATHS = {
    SERVICE: "/api/v1/services",
    REPLICATION_CONTROLLER: "/api/v1/replicationcontrollers",
    REPLICA_SET: "/apis/apps/v1/replicasets",
    STATEFUL_SET: "/apis/apps/v1/statefulsets",
}

POD_PARAMS = {"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"}


class NodeFeed:
    """Nodes into the cache; a node added or changed moves the unschedulable pods it may help
    (``worker.hints``), a relist every one."""

    def __init__(self, cache: Cache, queue: SchedulingQueue, hints: NodeHints) -> None:
        self.cache = cache
        self.queue = queue
        self.hints = hints

    def replace(self, objects: list[dict[str, Any]]) -> None:
        self.cache.replace_nodes([node_from_json(o) for o in objects])
        self.queue.move_all()

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        record = node_from_json(obj)
        if kind == "DELETED":
            self.cache.remove_node(record.name)
            return
        added = record.name not in self.cache.nodes
        if self.cache.upsert_node(record):
            self.queue.move_if(self.hints.after((record,), added=added))


def _namespace_labels(obj: dict[str, Any]) -> tuple[str, dict[str, str]]:
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    return str(meta.get("name") or ""), {str(k): str(v) for k, v in labels.items()} if isinstance(
        labels, dict
    ) else {}


class NamespaceFeed:
    def __init__(self, cache: Cache, queue: SchedulingQueue) -> None:
        self.cache = cache
        self.queue = queue

    def replace(self, objects: list[dict[str, Any]]) -> None:
        if self.cache.replace_namespaces(dict(_namespace_labels(o) for o in objects)):
            self.queue.move_all()

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        name, labels = _namespace_labels(obj)
        if self.cache.upsert_namespace(name, None if kind == "DELETED" else labels):
            self.queue.move_all()


class WorkloadFeed:
    """One kind's selectors (scores only: a change wakes no pod, as kube-scheduler's queue is not moved)."""

    def __init__(self, cache: Cache, kind: str) -> None:
        self.cache = cache
        self.kind = kind

    def replace(self, objects: list[dict[str, Any]]) -> None:
        self.cache.workloads.replace(self.kind, objects)

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            meta = obj.get("metadata") or {}
            self.cache.workloads.remove(
                self.kind, str(meta.get("namespace") or "default"), str(meta.get("name"))
            )
        else:
            self.cache.workloads.upsert(self.kind, obj)


class PodFeed:
    def __init__(
        self,
        cache: Cache,
        queue: SchedulingQueue,
        reporter: Reporter,
        *,
        scheduler_name: str,
        watch_pending: bool,
        progress: asyncio.Event | None = None,
        gone: Callable[[PodKey, str], None] = lambda key, uid: None,
        shortcuts: bool = True,
        claims: Claims | None = None,
    ) -> None:
        self.cache = cache
        self.queue = queue
        self.reporter = reporter
        self.scheduler_name = scheduler_name
        self.watch_pending = watch_pending
        self.progress = progress or asyncio.Event()
        # a pod (key, uid; "" if not known) was deleted or finished, or one of ours placed: it will not be
        # decided here again
        self.gone = gone
        # Off: every event is parsed in full and applied (the reference the shortcuts are tested against).
        self.shortcuts = shortcuts
        # The latest record of each pending pod of ours that was parsed (standalone: all of them; under a
        # coordinator nominated ones and those ``Claims.to_read`` wants, see ``_unread``): the ``previous``
        # of its next parse, here and for a DISPATCH of it (``worker.intake``), so neither parses again what
        # the watch already has.
        self.pending: dict[PodKey, PodRecord] = {}
        # Under a coordinator: the pods this worker claims from this watch (``worker.claims``)
        self.claims = claims
        if claims is not None:
            claims.changed = self.claims_changed
        # Pods read directly, ahead of the watch (``apply_direct``): their record and its resourceVersion.
        self.direct: dict[PodKey, tuple[int, PodRecord]] = {}
        # The resourceVersion of the relist being applied (``Watches`` sets it to the pod reflector's).
        self.listed_revision: Callable[[], int] = lambda: 0
        # The pods the watch removed since the sole worker's list of pending pods began (``take_listed``);
        # None while no such list is under way.
        self.removed_since_list: set[PodKey] | None = None

    def previous(self, key: PodKey) -> PodRecord | None:
        """The latest record of ``key`` this worker holds (placed, or pending and ours), if any."""
        return self.cache.placed(key) or self.pending.get(key)

    def admit(self, pod: PodRecord, seen_at: float) -> None:
        """A pod from the watch: queue it if it is ours, waiting, and taken here (standalone or sole: every such
        pod; otherwise under a coordinator: those this worker claims); drop it from the queue once placed.
        ``seen_at`` (the queue's clock) is when the watch delivered it: the start of the "queued" stage."""
        claims = self.claims
        if pod.scheduler_name != self.scheduler_name:
            self.pending.pop(pod.key, None)
            if claims is not None:
                claims.left(pod.key)
            return
        if pod.node_name or pod.deleting:
            self.pending.pop(pod.key, None)
            self.queue.delete(pod.key)
            self.cache.unnominate(pod.key)
            if claims is not None:
                claims.left(pod.key)
            self.gone(pod.key, pod.uid)
            return
        self.pending[pod.key] = pod
        nominated = pod.nominated_node or self.cache.nominated_node.get(pod.key)
        if nominated:
            self.cache.nominate(pod, NodeName(nominated))  # the newest record holds the room
        take = self.watch_pending
        if claims is not None:
            claims.pending(pod)
            take = claims.take(pod) or take  # (a sole worker holds no claim set: ``worker.intake``)
        if take and not self.cache.is_assumed(pod.key):
            new = pod.key not in self.queue
            self.queue.add(pod)
            if new and pod.key in self.queue:
                metrics.observe_stage("queued", self.queue.clock() - seen_at)

    def claims_changed(self) -> None:
        """The claim set changed: let go of the claimed pods now hashed elsewhere (unless already being
        placed), and take the pods now hashed here: those parsed (``pending``) and those the watch left
        unread."""
        claims = self.claims
        assert claims is not None  # only ever called back by the claims
        for key in claims.not_mine():
            if not self.cache.is_assumed(key):
                self.queue.delete(key)
        seen_at = self.queue.clock()
        for pod in list(self.pending.values()):
            self.admit(pod, seen_at)  # parsed already: claimed again if hashed here (``Claims.take``)
        for key, obj in list(claims.unread.items()):
            if claims.to_read(key, obj):
                self._apply(pod_from_json(obj, self.pending.get(key)), seen_at)

    def take_listed(self, objects: list[dict[str, Any]]) -> None:
        """The pending pods of ours a list read when this worker became the sole one (``worker.intake``),
        at or after this watch's position: admitted as the watch's own events are from now on (the watch
        passed over them unparsed before: ``_unread``). A pod the watch shows placed or assumed here, or
        removed since the list began (``removed_since_list``, set by the caller), is not taken, and a newer
        record the watch holds is kept."""
        seen_at = self.queue.clock()
        removed = self.removed_since_list or ()
        for obj in objects:
            key = pod_key(obj)
            if key in self.cache.pod_node or self.cache.is_assumed(key) or key in removed:
                continue
            held = self.pending.get(key)
            pod = pod_from_json(obj, held)
            if held is not None and revision_of(held.resource_version) > revision_of(pod.resource_version):
                pod = held
            if not pod.terminal:
                self.admit(pod, seen_at)

    def apply_direct(self, pods: list[PodRecord]) -> None:
        """Account pods read directly (a consistent read, ahead of the watch), and hold them against the
        watch's older records of them (see the module docstring)."""
        for pod in pods:
            if not pod.terminal and pod.key not in self.cache.pod_node:
                self.cache.upsert_pod(pod)
                self.direct[pod.key] = (int(pod.resource_version or 0), pod)

    def replace(self, objects: list[dict[str, Any]]) -> None:
        seen_at = self.queue.clock()
        pods = [pod_from_json(o) for o in objects]
        listed_uids = {p.key: p.uid for p in pods}
        self.pending.clear()
        claims = self.claims
        if claims is not None:
            # Read again from the snapshot; what it claimed stays claimed. Every pending pod's anti-affinity
            # terms first, so that no pod is claimed against a half-read list (``admit`` checks them).
            for key in [k for k in (*claims.claimed, *claims.handed_back) if k not in listed_uids]:
                claims.left(key)  # deleted during the watch's gap
            claims.anti.clear()
            claims.unread.clear()
            for p in pods:
                if p.scheduler_name == self.scheduler_name and not (p.node_name or p.deleting or p.terminal):
                    claims.pending(p)
        if self.direct:
            # A snapshot as new as a direct read replaces it; an older one (a relist that started before the
            # read) must not undo it: the direct record is applied again and the watch's events awaited.
            snapshot = self.listed_revision()
            self.direct = {k: held for k, held in self.direct.items() if held[0] > snapshot}
            pods = [p for p in pods if p.key not in self.direct]
        self.cache.replace_pods([p for p in pods if p.node_name and not p.terminal])
        for _, record in self.direct.values():
            self.cache.upsert_pod(record)
        for p in pods:
            self.admit(p, seen_at)
        self._drop_vanished(listed_uids, self.listed_revision())
        listed = {p.key for p in pods if not p.node_name and not p.deleting and not p.terminal}
        for key in [k for k in self.cache.nominated_node if k not in listed]:
            self.cache.unnominate(key)
        self.progress.set()

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        seen_at = self.queue.clock()
        key = pod_key(obj)
        if self.direct and (held := self.direct.get(key)) is not None:
            if int((obj.get("metadata") or {}).get("resourceVersion") or 0) < held[0]:
                self.progress.set()
                return  # older than the pod's direct read: applying it would undo that read
            del self.direct[key]
        if kind == "DELETED":
            # nothing of the object is read but its key and uid
            self._remove(key, str((obj.get("metadata") or {}).get("uid") or ""))
        elif not self.shortcuts:
            self._apply(pod_from_json(obj), seen_at)
        elif not self._unread(key, obj):
            placed = self.cache.placed(key)
            if placed is not None and placed.node_name and key not in self.cache.assumed:
                # Most events of a placed pod change only its status: the cached record is kept when nothing
                # a reader of a placed pod reads changed (``common.records.pod_update``)
                pod = pod_update(obj, placed)
                if pod is placed:
                    if pod.scheduler_name == self.scheduler_name:
                        self.admit(pod, seen_at)  # as the full path would (drops nothing it still holds)
                else:
                    self._apply(pod, seen_at)
            else:
                self._apply(pod_from_json(obj, placed or self.pending.get(key)), seen_at)
        self.progress.set()

    def _drop_vanished(self, listed_uids: dict[PodKey, str], snapshot: int) -> None:
        """After a relist: a queued pod (or one in flight) the snapshot does not list, or lists with another
        uid, was deleted or finished while the watch was down; it goes as if its DELETED had come, or it
        would be decided, assumed and sent to a binding that can only fail. A queued record newer than the
        snapshot is kept: the pod came (by DISPATCH) after the list was read, and the watch, resuming from
        the snapshot, brings its events."""
        for pod in self.queue.records():
            if listed_uids.get(pod.key) == pod.uid:
                continue
            try:
                newer = int(pod.resource_version or 0) > snapshot
            except ValueError:
                newer = True  # no revision to compare: only its own DELETED may take it
            if not newer:
                self._remove(pod.key, pod.uid)

    def _apply(self, pod: PodRecord, seen_at: float) -> None:
        if pod.terminal:
            self._remove(pod.key, pod.uid)
        else:
            if self.cache.upsert_pod(pod):
                self.queue.move_all()
            self.admit(pod, seen_at)

    def _remove(self, key: PodKey, uid: str) -> None:
        if self.removed_since_list is not None:
            self.removed_since_list.add(key)
        self.pending.pop(key, None)
        if self.claims is not None:
            self.claims.left(key)
        self.queue.delete(key)
        self.cache.unnominate(key)
        self.reporter.forget(key)
        self.gone(key, uid)
        if self.cache.remove_pod(key):
            self.queue.move_all()

    def _unread(self, key: PodKey, obj: dict[str, Any]) -> bool:
        """True when ``obj``, a pod this worker has no placed or assumed record of, needs no parse: it is not
        placed, not terminal, and either of another scheduler or (``watch_pending`` off: the leader's DISPATCH
        brings our pods) ours, neither nominated nor being deleted nor one ``Claims.to_read`` wants. A parse
        would only have told ``admit`` to drop the pod from ``pending`` (or to keep it there for the
        DISPATCH's parse, which then parses in full: the same record). ``pending`` drops its older record, so
        nothing stale is kept."""
        spec = obj.get("spec") or {}
        if spec.get("nodeName") or key in self.cache.pod_node:
            return False
        status = obj.get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            return False
        if (spec.get("schedulerName") or "default-scheduler") == self.scheduler_name and (
            self.watch_pending
            or status.get("nominatedNodeName")
            or key in self.cache.nominated_node
            or (obj.get("metadata") or {}).get("deletionTimestamp")
            or (self.claims is not None and self.claims.to_read(key, obj))
        ):
            return False
        self.pending.pop(key, None)
        return True


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
        self.queue.move_if(self.cache.volumes.wakes(self.kind, obj))


class Watches:
    """The reflectors of one worker: nodes, then Namespaces and (``watch_workloads``) the objects the default
    spread constraints are built from, then pods (each group only after the one before has synced)."""

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
        watch_workloads: bool = True,
        gone: Callable[[PodKey, str], None] = lambda key, uid: None,
        hints: NodeHints,
        claims: Claims | None = None,
    ) -> None:
        self.client = client
        self.cache = cache
        self.progress = asyncio.Event()
        self.pod_feed = PodFeed(
            cache,
            queue,
            reporter,
            scheduler_name=scheduler_name,
            watch_pending=watch_pending,
            progress=self.progress,
            gone=gone,
            claims=claims,
        )
        self.pods = Reflector(client, "/api/v1/pods", self.pod_feed, params=POD_PARAMS, name="pods")
        self.pod_feed.listed_revision = lambda: int(self.pods.resource_version or 0)
        node_params = {"labelSelector": node_selector} if node_selector else {}
        self.nodes = Reflector(
            client, "/api/v1/nodes", NodeFeed(cache, queue, hints), params=node_params, name="nodes"
        )
        self.others = [
            Reflector(client, "/api/v1/namespaces", NamespaceFeed(cache, queue), name="namespaces")
        ]
        if watch_workloads:
            self.others += [
                Reflector(client, path, WorkloadFeed(cache, kind), name=path.rsplit("/", 1)[1])
                for kind, path in WORKLOAD_PATHS.items()
            ]
        self.others += [
            Reflector(client, path, StorageFeed(kind, cache, queue), name=kind)
            for kind, path in STORAGE_PATHS.items()
        ]

    def synced(self) -> bool:
        return (
            self.pods.synced.is_set()
            and self.nodes.synced.is_set()
            and all(r.synced.is_set() for r in self.others)
        )

    # ----- worker.shard.PodWatch -------------------------------------------------------------------------

    async def wait_synced(self) -> None:
        await self.pods.synced.wait()

    def listed_since(self, moment: float) -> bool:
        return self.pods.list_started_at >= moment

    def revision(self) -> int:
        # resourceVersions are etcd revisions in every API server we know; compared as integers here only.
        return int(self.pods.resource_version or 0)

    def object_revision(self) -> int:
        """The highest resourceVersion of a pod the pod watch delivered (``Reflector.object_version``): one the
        other workers' pod watches reach too, where ``revision`` may be a bookmark's or a list's."""
        return self.pods.object_version

    async def list_pending(self) -> list[dict[str, Any]]:
        """The pending pods of ours not bound, listed at or after the pod watch's position (for
        ``PodFeed.take_listed``: the sole worker's start, ``worker.intake``)."""
        feed = self.pod_feed
        params = {"fieldSelector": f"spec.schedulerName={feed.scheduler_name},status.phase=Pending"}
        rv = self.revision()
        if rv:
            params |= {"resourceVersion": str(rv), "resourceVersionMatch": "NotOlderThan"}
        reply = await self.client.get("/api/v1/pods", params)
        return [i for i in reply.get("items") or () if not (i.get("spec") or {}).get("nodeName")]

    async def list_bound(self, node: NodeName) -> tuple[list[PodRecord], int]:
        reply = await self.client.get("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"})
        items = reply.get("items") or []
        target = max((int(i["metadata"]["resourceVersion"]) for i in items), default=0)
        return [pod_from_json(i) for i in items], target

    def apply_direct(self, pods: list[PodRecord]) -> None:
        self.pod_feed.apply_direct(pods)
