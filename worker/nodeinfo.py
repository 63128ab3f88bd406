"""Per-node scheduling state: the node's record plus what is placed on it (bound and assumed pods).

Owned by the cache (``worker.cache``), which is the only writer; plugins and the engine read it. There is no
snapshot copy per cycle: the worker is one asyncio thread, so the engine reads the live state between awaits.

Invariants:
- ``requested`` is the sum of the effective requests of the pods in ``pods`` (bound or assumed);
  ``nonzero_cpu``/``nonzero_memory`` the same sums with kube-scheduler's defaults for request-less pods.
- ``generation`` increases on every change, so a decision can tell whether the node changed under it.
"""

from __future__ import annotations

from common.records import (
    DEFAULT_MEMORY_FOR_SCORING,
    DEFAULT_MILLI_CPU_FOR_SCORING,
    HostPort,
    NodeRecord,
    PodKey,
    PodRecord,
    Resources,
)


class NodeInfo:
    __slots__ = (
        "generation",
        "node",
        "nonzero_cpu",
        "nonzero_memory",
        "pods",
        "ports",
        "requested",
        "session_label",
        "sessions",
    )

    def __init__(self, node: NodeRecord, *, session_label: str = "") -> None:
        self.node = node
        self.session_label = session_label
        # session label value -> number of this node's pods carrying it (for session locality)
        self.sessions: dict[str, int] = {}
        self.requested = Resources()
        self.nonzero_cpu = 0
        self.nonzero_memory = 0
        self.pods: dict[PodKey, PodRecord] = {}
        self.ports: list[HostPort] = []
        self.generation = 0

    @property
    def name(self) -> str:
        return self.node.name

    def free_milli_cpu(self) -> int:
        return self.node.allocatable.milli_cpu - self.requested.milli_cpu

    def free_memory(self) -> int:
        return self.node.allocatable.memory - self.requested.memory

    def add_pod(self, pod: PodRecord) -> None:
        self.pods[pod.key] = pod
        self.requested.add(pod.requests)
        self.nonzero_cpu += pod.requests.milli_cpu or DEFAULT_MILLI_CPU_FOR_SCORING
        self.nonzero_memory += pod.requests.memory or DEFAULT_MEMORY_FOR_SCORING
        if pod.host_ports:
            self.ports.extend(pod.host_ports)
        session = pod.labels.get(self.session_label) if self.session_label else None
        if session:
            self.sessions[session] = self.sessions.get(session, 0) + 1
        self.generation += 1

    def remove_pod(self, key: PodKey) -> PodRecord | None:
        pod = self.pods.pop(key, None)
        if pod is None:
            return None
        self.requested.sub(pod.requests)
        self.nonzero_cpu -= pod.requests.milli_cpu or DEFAULT_MILLI_CPU_FOR_SCORING
        self.nonzero_memory -= pod.requests.memory or DEFAULT_MEMORY_FOR_SCORING
        for port in pod.host_ports:
            self.ports.remove(port)
        session = pod.labels.get(self.session_label) if self.session_label else None
        if session:
            left = self.sessions.get(session, 0) - 1
            if left > 0:
                self.sessions[session] = left
            else:
                self.sessions.pop(session, None)
        self.generation += 1
        return pod

    def set_node(self, node: NodeRecord) -> None:
        self.node = node
        self.generation += 1
