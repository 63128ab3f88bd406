"""NodePorts: a pod asking for host ports fits only where none of them is taken (dynamic filter).

The ports in use on a node are indexed by (protocol, port), once per change of the node (its ``generation``),
so checking a pod costs one lookup per port it asks for, not one per pair of its ports and the node's: a
node full of pods with many host ports cannot make every decision over it quadratic."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.records import HostPort, PodRecord
from worker.framework import Status
from worker.nodeinfo import NodeInfo

_TAKEN = Status.unschedulable("node(s) didn't have free ports for the requested pod ports")
_WILDCARD = ("", "0.0.0.0")
# Up to this many (pod port, node port) pairs are compared directly; above it the node's index is used.
_DIRECT_PAIRS = 64
_MAX_INDEXED = 4096  # nodes whose index is kept; beyond that the cache starts over

_Index = dict[tuple[str, int], set[str]]


def _index(ports: list[HostPort]) -> _Index:
    index: _Index = {}
    for used in ports:
        index.setdefault((used.protocol, used.port), set()).add(used.host_ip)
    return index


def _conflicts(want: HostPort, index: _Index) -> bool:
    """``any(want.conflicts(used) for used in ports)`` for the ports ``index`` was built from."""
    addresses = index.get((want.protocol, want.port))
    if not addresses:
        return False
    return want.host_ip in _WILDCARD or want.host_ip in addresses or not addresses.isdisjoint(_WILDCARD)


class NodePorts:
    name = "NodePorts"
    static = False

    def __init__(self) -> None:
        # node name -> (the NodeInfo, its generation then, index of its ports)
        self._indexes: dict[str, tuple[NodeInfo, int, _Index]] = {}

    def node_pods(self, pod: PodRecord) -> bool:
        return bool(pod.host_ports)  # a pod without host ports passes every node

    def passes_every_node(self, pod: PodRecord) -> bool:
        """True when ``filter`` passes every node for ``pod`` (it asks for no host port): the engine's walk
        then leaves this filter out of the pod's decision."""
        return not pod.host_ports

    def filter(self, pod: PodRecord, node: NodeInfo) -> Status | None:
        if not pod.host_ports or not node.ports:
            return None
        if len(pod.host_ports) * len(node.ports) <= _DIRECT_PAIRS:
            for want in pod.host_ports:
                for used in node.ports:
                    if want.conflicts(used):
                        return _TAKEN
            return None
        index = self._index_of(node)
        return _TAKEN if any(_conflicts(want, index) for want in pod.host_ports) else None

    def _index_of(self, node: NodeInfo) -> _Index:
        entry = self._indexes.get(node.name)
        if entry is not None and entry[0] is node and entry[1] == node.generation:
            return entry[2]
        if len(self._indexes) >= _MAX_INDEXED:
            self._indexes.clear()
        index = _index(node.ports)
        self._indexes[node.name] = (node, node.generation, index)
        return index


def node_ports(_: Mapping[str, Any]) -> NodePorts:
    return NodePorts()
