"""NodePorts: a pod asking for host ports fits only where none of them is taken (dynamic filter)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.records import PodRecord
from worker.framework import Status
from worker.nodeinfo import NodeInfo

_TAKEN = Status.unschedulable("node(s) didn't have free ports for the requested pod ports")


class NodePorts:
    name = "NodePorts"
    static = False

    def filter(self, pod: PodRecord, node: NodeInfo) -> Status | None:
        if not pod.host_ports or not node.ports:
            return None
        for want in pod.host_ports:
            for used in node.ports:
                if want.conflicts(used):
                    return _TAKEN
        return None


def node_ports(_: Mapping[str, Any]) -> NodePorts:
    return NodePorts()
