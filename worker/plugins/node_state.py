"""Filters on the node's own state: cordoned (``spec.unschedulable``) and not Ready. Both are static."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.records import PodRecord, Taint
from worker.framework import Status
from worker.nodeinfo import NodeInfo
from worker.plugins.taints import tolerated

# A cordoned node is as if tainted with this (no value); a pod tolerating that taint may still go there.
_UNSCHEDULABLE_TAINT = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")
_CORDONED = Status.unresolvable("node(s) were unschedulable")
_NOT_READY = Status.unresolvable("node(s) were not ready")
_NO_CAPACITY = Status.unresolvable("node(s) had invalid allocatable")


class NodeUnschedulable:
    """Rejects cordoned nodes unless the pod tolerates the unschedulable taint (as DaemonSet pods do)."""

    name = "NodeUnschedulable"
    static = True

    def node_pods(self, pod: PodRecord) -> bool:
        return False  # static: the node record only

    def filter(self, pod: PodRecord, node: NodeInfo) -> Status | None:
        if not node.node.unschedulable:
            return None
        if tolerated(_UNSCHEDULABLE_TAINT, pod.tolerations):
            return None
        return _CORDONED


class NodeReady:
    """Rejects nodes whose Ready condition is not True, and nodes without usable allocatable."""

    name = "NodeReady"
    static = True

    def node_pods(self, pod: PodRecord) -> bool:
        return False  # static: the node record only

    def filter(self, pod: PodRecord, node: NodeInfo) -> Status | None:
        if node.node.allocatable_error is not None:
            return _NO_CAPACITY
        return None if node.node.ready else _NOT_READY


def node_unschedulable(_: Mapping[str, Any]) -> NodeUnschedulable:
    return NodeUnschedulable()


def node_ready(_: Mapping[str, Any]) -> NodeReady:
    return NodeReady()
