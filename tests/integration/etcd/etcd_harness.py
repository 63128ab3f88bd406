"""Test harness: leaders and workers in one event loop, each with its own etcd connection (as separate
processes would have), and an ownership log that checks the one invariant at every observed point."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from etcd3aio import Etcd3Client

from common.aiotools import cancel_and_wait
from common.etcd.keys import KeyLayout, WorkerId
from common.etcd.kv import connect
from common.etcd.schema import LeaderRecord, WorkerRecord
from common.records import NodeName
from coordinator.leadership.election import LeaderElection, LeaderTerm, run_as_leader
from coordinator.workershards.shardmap import ShardMapLeader
from tests.integration.etcd.static_pool import StaticPool
from worker.shard import ReleaseHook, Shard, ShardChange

TTL = 2


async def eventually(predicate: Callable[[], bool], timeout: float, what: str = "condition") -> float:
    """Poll until ``predicate()``; returns the seconds it took. Fails the test after ``timeout``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what} not reached within {timeout} s")
        await asyncio.sleep(0.01)
    return time.monotonic() - start


def node_names(n: int) -> list[NodeName]:
    return [NodeName(f"node-{i:02d}") for i in range(n)]


@dataclass
class OwnershipLog:
    """Usable-set changes of all workers, in the order they happened, plus periodic ``owns()`` samples."""

    events: list[tuple[float, WorkerId, str, frozenset[NodeName]]] = field(default_factory=list)
    owners: dict[NodeName, set[WorkerId]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    samples: int = 0

    def record(self, worker: WorkerId, change: ShardChange) -> None:
        now = time.monotonic()
        if change.removed:
            self.events.append((now, worker, "removed", change.removed))
        for node in change.removed:
            self.owners.setdefault(node, set()).discard(worker)
        if change.added:
            self.events.append((now, worker, "added", change.added))
        for node in change.added:
            holders = self.owners.setdefault(node, set())
            holders.add(worker)
            if len(holders) > 1:
                self.violations.append(f"{node} usable on {sorted(holders)} at once")

    def sample(self, workers: Iterable[Shard], nodes: Iterable[NodeName]) -> None:
        self.samples += 1
        members = list(workers)
        for node in nodes:
            owning = [m.worker_id for m in members if m.owns(node)]
            if len(owning) > 1:
                self.violations.append(f"owns({node}) True on {owning} at once")

    def first(self, worker: WorkerId, kind: str, node: NodeName, after: float = 0.0) -> float | None:
        """When ``worker``'s usable set first gained (``added``) or lost (``removed``) ``node``."""
        return next(
            (t for t, w, k, ns in self.events if w == worker and k == kind and node in ns and t >= after),
            None,
        )


@dataclass
class Leader:
    client: Etcd3Client
    election: LeaderElection
    task: asyncio.Task[None]
    maps: list[ShardMapLeader] = field(default_factory=list)


class ShardCluster:
    """A coordination cluster under one key prefix; ``close()`` stops everything it started."""

    def __init__(
        self, endpoint: str, keys: KeyLayout, nodes: Iterable[NodeName] = (), ttl: int = TTL
    ) -> None:
        self.endpoint = endpoint
        self.keys = keys
        self.ttl = ttl
        self.pool = StaticPool(nodes)
        self.log = OwnershipLog()
        self.leaders: dict[str, Leader] = {}
        self.workers: dict[str, Shard] = {}
        self._clients: list[Etcd3Client] = []
        self._sampler: asyncio.Task[None] | None = None

    async def client(self) -> Etcd3Client:
        client = await connect([self.endpoint])
        self._clients.append(client)
        return client

    async def start_leader(self, name: str) -> Leader:
        client = await self.client()
        election = LeaderElection(client, LeaderRecord(name), keys=self.keys, ttl=self.ttl)
        leader = Leader(client, election, asyncio.create_task(asyncio.sleep(0)))

        async def body(term: LeaderTerm) -> None:
            shardmap = ShardMapLeader(client, term, self.pool, keys=self.keys, interval=0.5)
            leader.maps.append(shardmap)
            await shardmap.run()

        leader.task = asyncio.create_task(run_as_leader(election, body), name=f"leader-{name}")
        self.leaders[name] = leader
        return leader

    async def start_worker(self, name: str, *, on_release: ReleaseHook | None = None) -> Shard:
        """A worker's shard without a scheduler: granted nodes are usable at once (no cache to catch up)."""
        client = await self.client()
        record = WorkerRecord(WorkerId(name), "127.0.0.1:9000", started_at=time.time())
        member = Shard(client, record, keys=self.keys, ttl=self.ttl)
        member.subscribe(lambda change: self.log.record(member.worker_id, change))
        await member.start(on_release=on_release)
        self.workers[name] = member
        if self._sampler is None:
            self._sampler = asyncio.create_task(self._sample())
        return member

    async def _sample(self) -> None:
        while True:
            self.log.sample(self.workers.values(), self.pool())
            await asyncio.sleep(0.005)

    def owned(self) -> dict[str, frozenset[NodeName]]:
        return {name: m.owned() for name, m in self.workers.items()}

    def fully_assigned(self, names: Iterable[str] | None = None) -> bool:
        """Every pool node owned by exactly one of ``names`` (default: all workers)."""
        chosen = [self.workers[n] for n in (names if names is not None else self.workers)]
        owned = [m.owned() for m in chosen]
        union = frozenset().union(*owned) if owned else frozenset()
        return union == frozenset(self.pool()) and sum(map(len, owned)) == len(union)

    def leading(self) -> list[str]:
        return [name for name, leader in self.leaders.items() if leader.election.leading]

    async def close(self) -> None:
        await cancel_and_wait(self._sampler)
        for member in self.workers.values():
            await member.close()
        for leader in self.leaders.values():
            await cancel_and_wait(leader.task)
        for client in self._clients:
            await client.close()
