"""Where the scheduler's coordination state lives in etcd: the key layout, and nothing else.

Everything sits under one configurable prefix (``/agent-scheduler`` by default) so several scheduler
installations, or test runs, can share one etcd without seeing each other::

    {prefix}/election/{lease:016x}  LeaderRecord      candidate key, on the candidate's lease; the
                                                      candidate with the lowest create revision leads
    {prefix}/workers/{worker}       WorkerRecord      membership, on the worker's lease
    {prefix}/load/{worker}          LoadReport        the worker's latest load, on the worker's lease
    {prefix}/acks/{worker}          ReleaseAck        the worker's latest release acknowledgement, on the lease
    {prefix}/assign/{worker}        ShardAssignment   written only by the leader, no lease: a worker keeps
                                                      its nodes while leaders come and go
    {prefix}/shardmap               ShardMapMeta      the map's epoch; every leader write bumps it

Invariants:
- A worker id is a DNS-label-like token (no ``/``), so ``parse`` can split any key unambiguously.
- Keys written by workers are attached to the worker's lease: when the lease ends, membership, load and
  acknowledgements vanish together, which is how the leader learns that a worker is gone.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import NewType

from common.wellknown import DEFAULT_ETCD_PREFIX

WorkerId = NewType("WorkerId", str)

DEFAULT_PREFIX = DEFAULT_ETCD_PREFIX

_WORKER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class KeyFamily(enum.Enum):
    """The kind of record a key holds; ``KeyLayout.parse`` returns it."""

    ELECTION = "election"
    MEMBER = "workers"
    LOAD = "load"
    ACK = "acks"
    ASSIGNMENT = "assign"
    SHARDMAP = "shardmap"


def worker_id(raw: str) -> WorkerId:
    """Validate and brand a worker id; raises ``ValueError`` for ids that would break the key layout."""
    if not _WORKER_ID.match(raw):
        raise ValueError(
            f"invalid worker id {raw!r}: want 1-63 characters of [A-Za-z0-9._-], no leading punctuation"
        )
    return WorkerId(raw)


@dataclass(frozen=True, slots=True)
class KeyLayout:
    """The key names under one prefix. Cheap to build; pass one instance around instead of strings."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if not self.prefix.startswith("/") or self.prefix.endswith("/") or "//" in self.prefix:
            raise ValueError(
                f"etcd prefix must look like /a/b (leading slash, no trailing one): {self.prefix!r}"
            )

    @property
    def root(self) -> str:
        """Prefix of every key of this installation (for one watch over all of them)."""
        return self.prefix + "/"

    def _family(self, family: KeyFamily) -> str:
        return f"{self.prefix}/{family.value}/"

    @property
    def election_prefix(self) -> str:
        return self._family(KeyFamily.ELECTION)

    def election(self, lease_id: int) -> str:
        return f"{self.election_prefix}{lease_id:016x}"

    @property
    def members_prefix(self) -> str:
        return self._family(KeyFamily.MEMBER)

    def member(self, worker: WorkerId) -> str:
        return self.members_prefix + worker

    @property
    def loads_prefix(self) -> str:
        return self._family(KeyFamily.LOAD)

    def load(self, worker: WorkerId) -> str:
        return self.loads_prefix + worker

    @property
    def acks_prefix(self) -> str:
        return self._family(KeyFamily.ACK)

    def ack(self, worker: WorkerId) -> str:
        return self.acks_prefix + worker

    @property
    def assignments_prefix(self) -> str:
        return self._family(KeyFamily.ASSIGNMENT)

    def assignment(self, worker: WorkerId) -> str:
        return self.assignments_prefix + worker

    @property
    def shardmap(self) -> str:
        return f"{self.prefix}/{KeyFamily.SHARDMAP.value}"

    def parse(self, key: str) -> tuple[KeyFamily, str] | None:
        """Split a key of this layout into its family and the name after it (worker id, lease hex).

        Returns None for keys outside the layout, so a mirror of the whole prefix can skip strangers.
        """
        if key == self.shardmap:
            return KeyFamily.SHARDMAP, ""
        if not key.startswith(self.root):
            return None
        family_name, sep, name = key[len(self.root) :].partition("/")
        if not sep or not name or "/" in name:
            return None
        try:
            family = KeyFamily(family_name)
        except ValueError:
            return None
        if family is KeyFamily.SHARDMAP:
            return None
        return family, name
