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

    def batch_key(self, pod: PodRecord) -> tuple[()]:
        return ()

    def applies(self, pod: PodRecord) -> bool:
        return True

    def scores(self, pod: PodRecord, nodes: list[NodeInfo]) -> list[float]:
        label, value = self.label, self.value
        return [100.0 if info.node.labels.get(label) == value else 0.0 for info in nodes]


class SessionLocality:
    """100 on nodes already running a pod of the same session. The cache counts sessions per node with
    the same label name (``NodeInfo.sessions``), so scoring is O(1).

    ``batch_fresh``: a batch scores it for every decision rather than keep it. Its key, the session, changes
    every few pods of a template, and a key in the shape would end the template's run at each new session;
    one lookup per node is cheaper than the filters and scores the run keeps."""

    name = "SessionLocality"
    batch_fresh = True

    def __init__(self, label: str) -> None:
        self.label = label

    def batch_key(self, pod: PodRecord) -> str:
        return pod.labels[self.label]

    def applies(self, pod: PodRecord) -> bool:
        return self.label in pod.labels

    def scores(self, pod: PodRecord, nodes: list[NodeInfo]) -> list[float]:
        session = pod.labels[self.label]
        return [100.0 if info.sessions.get(session) else 0.0 for info in nodes]


def warm_node(args: Mapping[str, Any]) -> WarmNode:
    return WarmNode(str(args.get("label", DEFAULT_WARM_LABEL)), str(args.get("value", DEFAULT_WARM_VALUE)))


def session_locality(args: Mapping[str, Any]) -> SessionLocality:
    return SessionLocality(str(args.get("label", DEFAULT_SESSION_LABEL)))
