"""NodeShard (``shard.volcano.sh/v1alpha1``, cluster-scoped) request bodies built and parsed. No client here.

One NodeShard per scheduler, named after it. The sharding controller owns ``spec.nodesDesired``; the scheduler
owns ``status`` (``nodesInUse``, ``nodesToAdd``, ``nodesToRemove``, ``lastUpdateTime``) and writes it through
the ``/status`` subresource - a plain update of the object silently drops status, a known Volcano bug.

Invariants:
- Node lists in every body we build are sorted and free of duplicates, so an unchanged set produces a
  byte-identical body and the caller can skip the write.
- Patch bodies are JSON merge patches (``application/merge-patch+json``): lists are replaced wholesale, and all
  three status lists are always sent, so an emptied list is cleared rather than left stale. Passing
  ``resource_version`` makes the patch conditional (409 Conflict when the object changed meanwhile).
- Parsing is strict about types (``NodeShardFormatError`` names the field) and lenient about absence: a missing
  or ``null`` list is empty (Go serialises a nil slice without ``omitempty`` as ``null``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict

from common.events import parse_rfc3339, rfc3339
from common.records import NodeName

GROUP = "shard.volcano.sh"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "NodeShard"
PLURAL = "nodeshards"
COLLECTION_PATH = f"/apis/{GROUP}/{VERSION}/{PLURAL}"
MERGE_PATCH = "application/merge-patch+json"


class NodeShardFormatError(ValueError):
    """Raised when a NodeShard object from the API server has a field of the wrong type."""


class SpecBody(TypedDict):
    nodesDesired: list[str]


class StatusBody(TypedDict, total=False):
    nodesInUse: list[str]
    nodesToAdd: list[str]
    nodesToRemove: list[str]
    lastUpdateTime: str


class NodeShardBody(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: dict[str, Any]
    spec: SpecBody
    status: StatusBody


@dataclass(frozen=True, slots=True)
class NodeShard:
    """A parsed NodeShard."""

    name: str
    resource_version: str
    nodes_desired: frozenset[NodeName]
    nodes_in_use: frozenset[NodeName]
    nodes_to_add: frozenset[NodeName]
    nodes_to_remove: frozenset[NodeName]
    last_update_time: datetime | None


def object_path(name: str) -> str:
    """The API path of NodeShard ``name``."""
    return f"{COLLECTION_PATH}/{name}"


def status_path(name: str) -> str:
    """The API path of NodeShard ``name``'s status subresource."""
    return f"{COLLECTION_PATH}/{name}/status"


def _names(nodes: Iterable[str]) -> list[str]:
    return sorted(set(nodes))


def _conditional(body: dict[str, Any], resource_version: str | None) -> dict[str, Any]:
    if resource_version is not None:
        body["metadata"] = {"resourceVersion": resource_version}
    return body


def new_nodeshard(
    name: str, nodes_desired: Iterable[str], *, labels: Mapping[str, str] | None = None
) -> NodeShardBody:
    """A complete NodeShard to create (no status: the scheduler writes it)."""
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = dict(labels)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {"nodesDesired": _names(nodes_desired)},
    }


def spec_patch(nodes_desired: Iterable[str], *, resource_version: str | None = None) -> dict[str, Any]:
    """Merge patch setting ``spec.nodesDesired`` (PATCH ``object_path(name)``)."""
    return _conditional({"spec": {"nodesDesired": _names(nodes_desired)}}, resource_version)


def status_patch(
    *,
    nodes_in_use: Iterable[str],
    nodes_to_add: Iterable[str],
    nodes_to_remove: Iterable[str],
    now: datetime,
    resource_version: str | None = None,
) -> dict[str, Any]:
    """Merge patch for the status subresource (PATCH ``status_path(name)``); ``now`` from the caller's clock."""
    status: StatusBody = {
        "nodesInUse": _names(nodes_in_use),
        "nodesToAdd": _names(nodes_to_add),
        "nodesToRemove": _names(nodes_to_remove),
        "lastUpdateTime": rfc3339(now),
    }
    return _conditional({"status": status}, resource_version)


def _mapping(obj: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise NodeShardFormatError(f"{where}{key}: expected an object, got {type(value).__name__}")
    return value


def _node_set(obj: Mapping[str, Any], key: str, where: str) -> frozenset[NodeName]:
    value = obj.get(key)
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise NodeShardFormatError(f"{where}{key}: expected a list of node names")
    return frozenset(NodeName(v) for v in value)


def parse_nodeshard(obj: Mapping[str, Any]) -> NodeShard:
    """Parse a NodeShard object (raw JSON from a list, get or watch)."""
    meta = _mapping(obj, "metadata", "")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise NodeShardFormatError("metadata.name: missing")
    spec = _mapping(obj, "spec", "")
    status = _mapping(obj, "status", "")
    raw_time = status.get("lastUpdateTime")
    last_update: datetime | None = None
    if raw_time is not None:
        if not isinstance(raw_time, str):
            raise NodeShardFormatError("status.lastUpdateTime: expected a string")
        try:
            last_update = parse_rfc3339(raw_time)
        except ValueError as e:
            raise NodeShardFormatError(f"status.lastUpdateTime: {e}") from e
    return NodeShard(
        name=name,
        resource_version=str(meta.get("resourceVersion") or ""),
        nodes_desired=_node_set(spec, "nodesDesired", "spec."),
        nodes_in_use=_node_set(status, "nodesInUse", "status."),
        nodes_to_add=_node_set(status, "nodesToAdd", "status."),
        nodes_to_remove=_node_set(status, "nodesToRemove", "status."),
        last_update_time=last_update,
    )
