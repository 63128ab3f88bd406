"""The scheduler cache: every node and every placed pod, fed by watches, plus the worker's assumptions.

Pod states (as in kube-scheduler's cache):

    Initial --assume--> Assumed --finish_binding--> Assumed(ttl running) --watch shows it bound--> Added
       |                  |                              |                                          |
       |                forget (bind failed)         expire (ttl passed, never confirmed)        remove
       +--watch shows it bound---------------------------------------------------------------> Added

Invariants:
- A pod is accounted on at most one node, ``pod_node`` says which; ``NodeInfo.requested`` always equals the
  sum over the pods accounted there. No pod is assumed twice.
- Every exit from Assumed other than confirmation (forget, expire) gives the capacity back.
- The capacity index holds exactly the nodes that are usable (``worker.shard``: the cache asks the shard, and
  re-indexes on the shard's change stream) and known (a real Node object), and not at their pod limit; its
  bucket and free amounts for a node are updated after every change to that node's pods or record, so the
  capacity summary (``CapacityIndex.summary``) is always current without a scan.
- Pods of every scheduler are accounted (they use capacity too); terminal pods are not.
- ``static_versions`` holds a version for each node in ``nodes``, changed when what a static filter reads of
  the node record changes (``NodeRecord.static_key``), and when the node is deleted, added (again) or first
  seen through its pods; versions come from one cache-wide clock and are never given twice, so the engine's
  per-signature static filter verdicts, kept per version, stay valid across capacity changes and never outlive
  the record they were made for. A node's entry goes with its ``NodeInfo``.
- ``images`` (``worker.images``) holds the image counts of exactly the known nodes' current records: every
  record a node gets or loses passes through ``images.update``.
- ``image_holders`` lists, per large image, exactly the indexed nodes holding it, in their index bucket:
  ``_reindex`` (the only caller of the index's update and remove besides ``remove_node``) places every node
  there after the index, and ``remove_node`` takes it out.
- ``topology`` (``worker.topology``) is told of every pod accounted or unaccounted (bound or assumed, any
  scheduler) and of every node label change, so its per-domain counts for the inter-pod rules are always
  current; a pod that matches some pod's required affinity counts as an event that may help waiting pods.
  It is also told of every Namespace's labels (for ``namespaceSelector`` terms): a Namespace change that
  makes a pod count for some pod's required affinity is such an event too.
- ``workloads`` (``worker.workloads``) holds the selectors of the Services and controllers that kube's
  default topology spread constraints are built from; nothing else.
- ``claim_users`` counts, per claim, the accounted pods (bound or assumed) naming it in a
  ``persistentVolumeClaim`` volume; ``volumes`` (``worker.volumes``) holds the storage objects, written by
  the feeds and by the scheduler's volume assumptions only.

Nominations (kube-scheduler's PodNominator): a pending pod nominated to a node (``status.nominatedNodeName``
seen in the watch, or set by this worker's own preemption before its patch lands) is kept in ``nominated``
until it is assumed, deleted, bound, or its nomination is cleared. It holds no capacity in ``NodeInfo``;
the engine adds the nominated pods of equal or higher priority to a node while filtering a pod there
(``worker.engine``), so the capacity freed for a preemptor is not taken by a lower-priority pod.

What-if evaluation (preemption): ``set_aside`` and ``put_back`` take a pod off its node's ``NodeInfo`` and the
topology counts and put it back, without touching the index, the pod map or the generation. They exist for
synchronous dry runs only (``worker.preemption``): every ``set_aside`` is undone by a ``put_back`` before the
caller yields to the event loop, so no other code ever sees the intermediate state.

The cache does no I/O and knows nothing of the API; ``worker.feeds`` feeds it from the watches.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from common.records import NO_IMAGES, NodeName, NodeRecord, PodKey, PodRecord, Resources
from worker.images import ImageHolders, ImageStates
from worker.index import CapacityIndex
from worker.nodeinfo import NodeInfo
from worker.shard import ShardChange, ShardView, WholeCluster
from worker.topology import TopologyCounts
from worker.volumes import VolumeStore
from worker.workloads import WorkloadSelectors

log = logging.getLogger(__name__)

DEFAULT_ASSUME_TTL = 30.0  # seconds an assumed pod may stay unconfirmed by the watch after its binding


def _placeholder(name: NodeName) -> NodeRecord:
    """A record for a node that pods reference but that the watch has not shown (or has deleted)."""
    return NodeRecord(
        name=name,
        uid="",
        resource_version="",
        labels={},
        taints=(),
        unschedulable=True,
        ready=False,
        allocatable=Resources(),
        allocatable_error="node not known to the cache",
        static_key=("placeholder",),
    )


@dataclass(slots=True)
class Assumed:
    pod: PodRecord
    node: NodeName
    deadline: float | None  # None while the binding is in flight


class Cache:
    def __init__(
        self,
        *,
        shard: ShardView | None = None,
        ascending: bool = True,
        session_label: str = "",
        assume_ttl: float = DEFAULT_ASSUME_TTL,
    ) -> None:
        self.shard: ShardView = shard or WholeCluster()
        # The shard's bound methods, no extra frame: ``usable`` for one node, ``usable_now`` for a decision's
        # walk over many (``worker.shard.ShardView``)
        self.usable: Callable[[NodeName], bool] = self.shard.usable
        self.usable_now: Callable[[], Callable[[NodeName], bool]] = self.shard.usable_now
        self.index = CapacityIndex(ascending=ascending)
        self.session_label = session_label
        self.assume_ttl = assume_ttl
        self.nodes: dict[NodeName, NodeInfo] = {}
        self.known: set[NodeName] = set()  # nodes backed by a real Node object
        # per node in ``nodes``: a version from one cache-wide clock, so no version is ever given twice, also to
        # a node deleted and added again (the engine's memos of static verdicts key on it)
        self.static_versions: dict[NodeName, int] = {}
        self._static_clock = itertools.count(1)
        self.pod_node: dict[PodKey, NodeName] = {}
        self.assumed: dict[PodKey, Assumed] = {}
        # session label value -> {node: pods of that session there}, for session-locality candidates
        self.sessions: dict[str, dict[NodeName, int]] = {}
        # extended resource (nvidia.com/gpu, ...) -> nodes that have some: pods asking for one look only there
        self.scalar_nodes: dict[str, set[NodeName]] = {}
        self._scalar_order: dict[str, list[NodeName]] = {}  # scalar_nodes in name order, rebuilt on a change
        # per-topology-domain counts for pod (anti-)affinity and topology spread
        self.topology = TopologyCounts(self.nodes)
        # node -> pending pods nominated to it (kube-scheduler's nominator), and the reverse
        self.nominated: dict[NodeName, dict[PodKey, PodRecord]] = {}
        self.nominated_node: dict[PodKey, NodeName] = {}
        # image name -> (size, nodes listing it), over the known nodes, for ImageLocality
        self.images = ImageStates()
        # image -> usable nodes holding it, in the index's buckets: ImageLocality's extra candidates
        self.image_holders = ImageHolders()
        # selectors of Services and controllers, for the default topology spread constraints
        self.workloads = WorkloadSelectors()
        # claims, PVs, storage classes, CSINodes (fed by worker.feeds), and how many placed pods use each
        # claim ("namespace/name", persistentVolumeClaim volumes): VolumeRestrictions' ReadWriteOncePod count
        self.volumes = VolumeStore()
        self.claim_users: dict[str, int] = {}
        # Bumped on any change that could make an unschedulable pod schedulable or change a failure reason.
        self.generation = 0
        self.expired = 0
        self.shard.subscribe(self._shard_changed)

    # ----- nodes -----------------------------------------------------------------------------------------

    def _info(self, name: NodeName) -> NodeInfo:
        info = self.nodes.get(name)
        if info is None:
            info = self.nodes[name] = NodeInfo(_placeholder(name), session_label=self.session_label)
            self._new_static_version(name)
        return info

    def _new_static_version(self, name: NodeName) -> None:
        """A version ``name`` never had: the engine keeps static verdicts per (node name, version), and one
        made for an earlier record of the node (or its earlier life, deleted and added again) must not match."""
        self.static_versions[name] = next(self._static_clock)

    def upsert_node(self, record: NodeRecord) -> bool:
        """Add or update a node; True when something a filter looks at changed (or the node is new)."""
        name = record.name
        info = self.nodes.get(name)
        changed = True
        if info is None:
            info = self.nodes[name] = NodeInfo(record, session_label=self.session_label)
            self._new_static_version(name)  # also for a node added again: not its earlier life's version
            self.topology.relabel(name, {}, record.labels)
            self.images.update(NO_IMAGES, record.images)
        else:
            # a placeholder lists no images, so this is right for a node first seen through its pods too
            self.images.update(info.node.images, record.images)
            changed = name not in self.known or info.node.static_key != record.static_key
            capacity_changed = info.node.allocatable != record.allocatable
            old_labels = info.node.labels
            info.set_node(record)
            if changed:
                self._new_static_version(name)
                self.topology.relabel(name, old_labels, record.labels)
            changed = changed or capacity_changed
        self.known.add(name)
        self._index_scalars(name, record)
        self._reindex(info)
        if changed:
            self.generation += 1
        return changed

    def remove_node(self, name: NodeName) -> None:
        info = self.nodes.get(name)
        if info is None:
            return
        self.known.discard(name)
        self.index.remove(name)
        self.image_holders.place(info, None)
        self._index_scalars(name, None)
        old_labels = info.node.labels
        self.images.update(info.node.images, NO_IMAGES)
        if info.pods:
            info.set_node(_placeholder(name))  # keep accounting until its pods are gone too
            self._new_static_version(name)
        else:
            del self.nodes[name]
            del self.static_versions[name]
        self.topology.relabel(name, old_labels, {})
        self.generation += 1

    def replace_nodes(self, records: list[NodeRecord]) -> None:
        seen = {r.name for r in records}
        for name in [n for n in self.known if n not in seen]:
            self.remove_node(name)
        for r in records:
            self.upsert_node(r)

    def _index_scalars(self, name: NodeName, record: NodeRecord | None) -> None:
        have = set(record.allocatable.scalar) if record is not None else set()
        for resource, nodes in list(self.scalar_nodes.items()):
            if resource not in have and name in nodes:
                nodes.discard(name)
                self._scalar_order.pop(resource, None)
                if not nodes:
                    del self.scalar_nodes[resource]
        for resource in have:
            nodes = self.scalar_nodes.setdefault(resource, set())
            if name not in nodes:
                nodes.add(name)
                self._scalar_order.pop(resource, None)

    def scalar_candidates(self, resource: str) -> list[NodeInfo]:
        """Indexed nodes offering an extended resource, fullest CPU first (binpack) or emptiest (spread), equal
        free CPU in name order (the set's own order depends on the process's string hash seed, and the walk's
        order breaks score ties: the same cluster must give the same placement in every process)."""
        order = self._scalar_order.get(resource)
        if order is None:  # sorted once per change of the set, not per decision
            order = self._scalar_order[resource] = sorted(self.scalar_nodes.get(resource, ()))
        infos = [self.nodes[n] for n in order if n in self.index]
        # A stable sort: equal free CPU keeps the name order, in both directions.
        infos.sort(key=NodeInfo.free_milli_cpu, reverse=not self.index.ascending)
        return infos

    def _shard_changed(self, change: ShardChange) -> None:
        """Nodes became usable or stopped being usable: fix their place in the index."""
        for name in change.added | change.removed:
            info = self.nodes.get(name)
            if info is not None:
                self._reindex(info)
        self.generation += 1

    def _reindex(self, info: NodeInfo) -> None:
        name = info.node.name
        if name in self.known and self.usable(name):
            self.index.update(info)
            self.image_holders.place(info, self.index.bucket(name))
        else:
            self.index.remove(name)
            self.image_holders.place(info, None)

    def static_version(self, name: NodeName) -> int:
        return self.static_versions.get(name, 0)

    # ----- namespaces ------------------------------------------------------------------------------------

    def upsert_namespace(self, name: str, labels: dict[str, str] | None) -> bool:
        """A Namespace's labels (None: deleted). True when it may help a pod waiting for pod affinity."""
        helps = self.topology.set_namespace(name, labels)
        if helps:
            self.generation += 1
        return helps

    def replace_namespaces(self, namespaces: dict[str, dict[str, str]]) -> bool:
        helps = self.topology.replace_namespaces(namespaces)
        if helps:
            self.generation += 1
        return helps

    # ----- pods ------------------------------------------------------------------------------------------

    def _account(self, pod: PodRecord, node: NodeName) -> bool:
        """Account ``pod`` on ``node``; True when it may help a pod waiting for pod affinity."""
        info = self._info(node)
        info.add_pod(pod)
        for _, ephemeral, claim in pod.claims:
            if not ephemeral:
                ref = f"{pod.namespace}/{claim}"
                self.claim_users[ref] = self.claim_users.get(ref, 0) + 1
        helps = self.topology.add(pod, info)
        self.pod_node[pod.key] = node
        session = pod.labels.get(self.session_label) if self.session_label else None
        if session:
            nodes = self.sessions.setdefault(session, {})
            nodes[node] = nodes.get(node, 0) + 1
        self._reindex(info)
        return helps

    def _unaccount(self, key: PodKey) -> PodRecord | None:
        node = self.pod_node.pop(key, None)
        if node is None:
            return None
        info = self.nodes[node]
        pod = info.remove_pod(key)
        if pod is not None:
            self.topology.remove(pod, info)
            for _, ephemeral, claim in pod.claims:
                if not ephemeral:
                    ref = f"{pod.namespace}/{claim}"
                    left = self.claim_users.get(ref, 0) - 1
                    if left > 0:
                        self.claim_users[ref] = left
                    else:
                        self.claim_users.pop(ref, None)
        session = pod.labels.get(self.session_label) if pod is not None and self.session_label else None
        if session:
            nodes = self.sessions.get(session, {})
            left = nodes.get(node, 0) - 1
            if left > 0:
                nodes[node] = left
            else:
                nodes.pop(node, None)
                if not nodes:
                    self.sessions.pop(session, None)
        if not info.pods and node not in self.known:
            del self.nodes[node]
            del self.static_versions[node]
        else:
            self._reindex(info)
        return pod

    def upsert_pod(self, pod: PodRecord) -> bool:
        """Apply a pod from the watch. True when capacity was freed, or a pod that may satisfy a waiting pod's
        required pod affinity was placed (events that may help waiting pods)."""
        key = pod.key
        if pod.terminal or not pod.node_name:
            if key in self.assumed and not pod.terminal:
                return False  # our binding is in flight; the watch has not caught up yet
            freed = self._unaccount(key) is not None
            self.assumed.pop(key, None)
            if freed:
                self.generation += 1
            return freed
        node = NodeName(pod.node_name)
        assumed = self.assumed.pop(key, None)
        current = self.pod_node.get(key)
        if assumed is not None and assumed.node != node:
            log.warning("bound elsewhere than assumed (%s)", assumed.node, extra={"pod": key, "node": node})
        if current == node:
            info = self.nodes[node]
            old = info.pods.get(key)
            if (
                old is not None
                and old.requests == pod.requests
                and old.labels == pod.labels
                and old.deleting == pod.deleting
            ):
                info.pods[key] = pod  # confirmation: nothing changes in the accounting
                if old.start_time != pod.start_time:
                    # what preemption's dry run reads of the pod changed (the order it spares victims in):
                    # its per-node memo keys on the node's generation
                    info.generation += 1
                # kube-scheduler wakes pods waiting for pod affinity when an assigned pod is added
                return assumed is not None and self.topology.helps(pod)
        freed = self._unaccount(key) is not None
        helps = self._account(pod, node)
        if freed or helps:
            self.generation += 1
        return freed or helps

    def placed(self, key: PodKey) -> PodRecord | None:
        """The record accounted for ``key`` (bound or assumed), if any."""
        node = self.pod_node.get(key)
        return self.nodes[node].pods.get(key) if node is not None else None

    def remove_pod(self, key: PodKey) -> bool:
        self.assumed.pop(key, None)
        freed = self._unaccount(key) is not None
        if freed:
            self.generation += 1
        return freed

    def replace_pods(self, pods: list[PodRecord]) -> None:
        """After a relist: drop pods the list no longer has (unless assumed), apply the rest."""
        seen = {p.key for p in pods}
        for key in [k for k in self.pod_node if k not in seen and k not in self.assumed]:
            self.remove_pod(key)
        for p in pods:
            self.upsert_pod(p)

    # ----- assumptions -----------------------------------------------------------------------------------

    def assume(self, pod: PodRecord, node: NodeName) -> NodeName | None:
        """Account ``pod`` on ``node`` until its binding is seen; returns the node its nomination kept room on,
        if it had one (the nomination goes)."""
        if pod.key in self.assumed or pod.key in self.pod_node:
            raise ValueError(f"pod {pod.key} is already assumed or placed")
        nominated = self.unnominate(pod.key)
        self.assumed[pod.key] = Assumed(pod, node, None)
        self._account(pod, node)
        return nominated

    def finish_binding(self, key: PodKey, now: float) -> None:
        a = self.assumed.get(key)
        if a is not None:
            a.deadline = now + self.assume_ttl

    def forget(self, key: PodKey) -> None:
        if self.assumed.pop(key, None) is not None:
            self._unaccount(key)
            self.generation += 1

    def is_assumed(self, key: PodKey) -> bool:
        return key in self.assumed

    def cleanup_expired(self, now: float) -> list[PodKey]:
        gone = [k for k, a in self.assumed.items() if a.deadline is not None and a.deadline <= now]
        for key in gone:
            log.warning("assumption expired without confirmation; capacity returned", extra={"pod": key})
            self.forget(key)
        self.expired += len(gone)
        return gone

    # ----- nominations -----------------------------------------------------------------------------------

    def nominate(self, pod: PodRecord, node: NodeName) -> None:
        """``pod`` (pending) is nominated to ``node``: pods of lower priority must leave it the room."""
        if self.nominated_node.get(pod.key) == node:
            self.nominated[node][pod.key] = pod  # a newer record of the same nomination: nothing else changes
            return
        self.unnominate(pod.key)
        self.nominated.setdefault(node, {})[pod.key] = pod
        self.nominated_node[pod.key] = node
        self.generation += 1

    def unnominate(self, key: PodKey) -> NodeName | None:
        """Drop ``key``'s nomination (it was placed, deleted or its nomination cleared); the node it had."""
        node = self.nominated_node.pop(key, None)
        if node is None:
            return None
        pods = self.nominated.get(node)
        if pods is not None:
            pods.pop(key, None)
            if not pods:
                del self.nominated[node]
        self.generation += 1  # the room it held is free for others again
        return node

    def nominated_for(self, pod: PodRecord, node: NodeName) -> list[PodRecord]:
        """Pods nominated to ``node`` that ``pod`` must leave room for: priority at least ``pod``'s, not itself."""
        pods = self.nominated.get(node)
        if not pods:
            return []
        return [p for k, p in pods.items() if k != pod.key and p.priority >= pod.priority]

    # ----- what-if (see the module docstring) ----------------------------------------------------------------

    def set_aside(self, info: NodeInfo, pod: PodRecord, *, counts: bool = True) -> None:
        """Take ``pod`` off ``info`` and out of the topology counts, for a dry run; undo with ``put_back``.
        ``counts=False`` leaves the topology counts alone: only for a dry run whose every ``set_aside`` and
        ``put_back`` passes it, and whose filters read no count (the caller's proof)."""
        if info.remove_pod(pod.key) is not None and counts:
            self.topology.remove(pod, info)

    def put_back(self, info: NodeInfo, pod: PodRecord, *, counts: bool = True) -> None:
        """Add ``pod`` to ``info`` and the topology counts for a dry run (a pod set aside, or a nominated pod
        counted while filtering); undo with ``set_aside``."""
        info.add_pod(pod)
        if counts:
            self.topology.add(pod, info)

    def session_nodes(self, session: str) -> list[NodeInfo]:
        return [self.nodes[n] for n in self.sessions.get(session, ()) if n in self.index]

    def statistics(self) -> dict[str, int]:
        return {
            "nodes": len(self.known),
            "indexed_nodes": len(self.index),
            "pods": len(self.pod_node),
            "assumed": len(self.assumed),
            "nominated": len(self.nominated_node),
            "expired": self.expired,
            "namespaces": len(self.topology.namespace_labels),
            **self.workloads.statistics(),
        }
