"""Agent-specific scores: warm nodes (images and runtimes already pulled; a node label) and session
locality (pods of one agent session prefer the node where the session's earlier pods run)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.records import PodRecord
from worker.nodeinfo import NodeInfo

DEFAULT_WARM_LABEL = "node.volcano.sh/warmup"
DEFAULT_WARM_VALUE = "true"
DEFAULT_SESSION_LABEL = "agent-scheduler.io/session"


class WarmNode:
    name = "WarmNode"

    def __init__(self, label: str, value: str) -> None:
        self.label = label
        self.value = value

    def applies(self, pod: PodRecord) -> bool:
        return True

    def score(self, pod: PodRecord, node: NodeInfo) -> float:
        return 100.0 if node.node.labels.get(self.label) == self.value else 0.0

    def normalize(self, scores: list[float]) -> None:
        return None


class SessionLocality:
    """100 on nodes already running a pod of the same session. The cache counts sessions per node with
    the same label name (``NodeInfo.sessions``), so scoring is O(1)."""

    name = "SessionLocality"

    def __init__(self, label: str) -> None:
        self.label = label

    def applies(self, pod: PodRecord) -> bool:
        return self.label in pod.labels

    def score(self, pod: PodRecord, node: NodeInfo) -> float:
        return 100.0 if node.sessions.get(pod.labels[self.label], 0) else 0.0

    def normalize(self, scores: list[float]) -> None:
        return None


def warm_node(args: Mapping[str, Any]) -> WarmNode:
    return WarmNode(str(args.get("label", DEFAULT_WARM_LABEL)), str(args.get("value", DEFAULT_WARM_VALUE)))


def session_locality(args: Mapping[str, Any]) -> SessionLocality:
    return SessionLocality(str(args.get("label", DEFAULT_SESSION_LABEL)))
