"""The policy in force, as the leader publishes it in etcd for ``agent-scheduler status``.

One JSON value at ``{prefix}/policy`` (outside the families of ``common.etcd.keys``, so the shard map and the
workers skip it), written only by the leader through a term-guarded transaction and only when its content
changed. It is a report, not an input: nothing reads it back to decide anything.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Self

from common.etcd.keys import KeyLayout

POLICY_KEY_SUFFIX = "/policy"


def policy_key(keys: KeyLayout) -> str:
    """The etcd key of the published policy record."""
    return keys.prefix + POLICY_KEY_SUFFIX


class PolicyRecordError(ValueError):
    """Raised when the stored policy record is not what this version writes."""


@dataclass(frozen=True, slots=True)
class PolicyRecord:
    mode: str
    """``policy`` (a sharding policy is in force) or ``label-pool`` (none yet: the node-selector pool)."""
    version: str = ""
    summary: str = ""
    origin: str = ""
    """``configmap ns/name@resourceVersion`` or ``built-in default``."""
    configmap: str = ""
    """``ns/name`` watched."""
    configmap_present: bool = False
    agent_shard: str = ""
    """The NodeShard name this coordinator serves."""
    last_rejected: str = ""
    """The latest rejection (resourceVersion and reason), empty when the latest version was accepted."""
    desired: dict[str, int] = field(default_factory=dict)
    """Scheduler -> size of its nodesDesired at the latest evaluation."""
    in_use: int = 0
    """Nodes published in the agent shard's status.nodesInUse."""
    pool: int = 0
    """Nodes offered to the shard map."""
    waiting: int = 0
    """Desired agent nodes another shard still uses."""
    deferred: int = 0
    """Moves held back by the move budget at the latest evaluation."""
    nodeshards: bool = False
    """Whether the NodeShard CRD is installed (interop on)."""
    rebalance: str = ""
    """The worker-shard assignment's rebalancing in force (``AssignmentConfig.describe``)."""

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Self:
        try:
            body: Any = json.loads(raw)
            if not isinstance(body, dict):
                raise TypeError("not an object")
            return cls(**body)
        except (ValueError, TypeError) as e:
            raise PolicyRecordError(f"policy record: {e}") from e
