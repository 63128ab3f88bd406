"""Kubernetes Events and timestamps: the one place an Event body and an RFC 3339 time are written.

``event_body`` builds a core/v1 Event (the form ``kubectl describe`` shows) for any object; the pod reporter
(``common.reporting``) and the coordinator's shard-policy events both use it. ``rfc3339`` formats
``metav1.Time`` (UTC, second precision); ``parse_rfc3339`` reads one back.

Event names are ``<object>.<random hex>``, like kubectl's, so two events on one object never collide.
Messages are cut to ``MAX_MESSAGE`` characters: the API server refuses longer ones.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

NORMAL = "Normal"
WARNING = "Warning"
MAX_MESSAGE = 1024


def rfc3339(moment: datetime | None = None) -> str:
    """``metav1.Time`` as the API serialises it: ``2026-01-15T16:00:00Z``. Default: now."""
    if moment is None:
        moment = datetime.now(UTC)
    elif moment.tzinfo is None:
        raise ValueError("timestamps must be timezone-aware")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> datetime:
    """Parse an RFC 3339 timestamp; raise ``ValueError`` if it is malformed or has no offset."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        raise ValueError(f"timestamp {text!r} has no timezone")
    return moment


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an event is about (``involvedObject``)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""
    resource_version: str = ""

    @classmethod
    def of(cls, obj: dict[str, Any], *, api_version: str, kind: str) -> ObjectRef:
        """The reference to a raw API object."""
        meta = obj.get("metadata") or {}
        return cls(
            api_version,
            kind,
            str(meta.get("namespace") or ""),
            str(meta.get("name") or ""),
            str(meta.get("uid") or ""),
            str(meta.get("resourceVersion") or ""),
        )

    @classmethod
    def pod(cls, namespace: str, name: str, uid: str = "") -> ObjectRef:
        return cls("v1", "Pod", namespace, name, uid)


def event_body(
    ref: ObjectRef,
    *,
    type_: str,
    reason: str,
    message: str,
    component: str,
    instance: str,
    at: datetime | None = None,
) -> dict[str, Any]:
    """A core/v1 Event about ``ref``, to POST to ``/api/v1/namespaces/{ref.namespace}/events``."""
    stamp = rfc3339(at)
    involved: dict[str, Any] = {
        "apiVersion": ref.api_version,
        "kind": ref.kind,
        "namespace": ref.namespace,
        "name": ref.name,
    }
    if ref.uid:
        involved["uid"] = ref.uid
    if ref.resource_version:
        involved["resourceVersion"] = ref.resource_version
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{ref.name}.{uuid.uuid4().hex[:16]}", "namespace": ref.namespace},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "type": type_,
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def events_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/events"
