"""In-memory stand-ins for the dispatcher's collaborators: a link per worker that records what is sent and
lets a test play the worker's side, a reporter that records verdicts, and a clock the test moves."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from common import protocol
from common.etcd.keys import WorkerId
from common.kube import KubeClient
from common.records import PodKey, PodRecord, pod_key
from coordinator.dispatch import Dispatcher
from coordinator.dispatch.links import LinkEvents

GIB = 1 << 30


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class FakeReporter:
    verdicts: list[tuple[PodKey, str]] = field(default_factory=list)
    forgotten: list[PodKey] = field(default_factory=list)

    def unschedulable(self, pod: PodRecord, message: str) -> None:
        self.verdicts.append((pod.key, message))

    def forget(self, key: PodKey) -> None:
        self.forgotten.append(key)

    def keys(self) -> list[PodKey]:
        return [key for key, _ in self.verdicts]


class FakeLink:
    """One worker's link; ``up``/``summary``/``ack``/``result``/``down`` play what the worker would send."""

    def __init__(self, worker_id: str, address: str, events: LinkEvents) -> None:
        self.worker_id = worker_id
        self.address = address
        self.events = events
        self._connected = False
        self.stopped = False
        self.sent: list[protocol.Message] = []
        self.writes: list[
            list[protocol.Message]
        ] = []  # what each flush wrote (flushes with nothing left out)

    @property
    def connected(self) -> bool:
        return self._connected

    def send(self, message: protocol.Message) -> None:
        if self._connected:
            self.sent.append(message)

    def flush(self) -> bool:
        written = sum(len(w) for w in self.writes)
        if len(self.sent) > written:
            self.writes.append(self.sent[written:])
        return False

    async def drain(self) -> None:
        return None

    def stop(self) -> None:
        self.stopped, self._connected = True, False

    # the worker's side

    def up(self) -> FakeLink:
        self._connected = True
        self.events.link_up(self)
        return self

    def summary(
        self,
        *,
        nodes: int = 4,
        max_cpu: int = 4000,
        max_memory: int = 16 * GIB,
        syncing: int = 0,
        placing: bool = True,
        earlier: int = 0,
        revision: int = 0,
        sole: bool = False,
    ) -> FakeLink:
        capacity = protocol.Capacity(
            nodes=nodes,
            free_cpu=max_cpu * nodes,
            free_memory=max_memory * nodes,
            max_cpu=max_cpu,
            max_memory=max_memory,
            pending=0,
            syncing=syncing,
            binds_per_s=0.0,
            ts=0.0,
            placing=placing,
            earlier=earlier,
            revision=revision,
            sole=sole,
        )
        self.events.received(self, capacity)
        return self

    def down(self) -> None:
        self._connected = False
        self.events.link_down(self)

    def dispatches(self) -> list[protocol.Dispatch]:
        return [m for m in self.sent if isinstance(m, protocol.Dispatch)]

    def ids_for(self, name: str) -> list[int]:
        return [m.id for m in self.dispatches() if m.pod["metadata"]["name"] == name]

    def ack(self, dispatch_id: int) -> None:
        self.events.received(self, protocol.Ack(dispatch_id))

    def ack_all(self) -> None:
        for m in self.dispatches():
            self.ack(m.id)

    def key_of(self, dispatch_id: int) -> str:
        """The pod a DISPATCH sent over this link was for ("" for an id never sent): a worker's RESULT names it."""
        return next((pod_key(m.pod) for m in self.dispatches() if m.id == dispatch_id), "")

    def bound(self, dispatch_id: int, node: str = "node-1", *, uid: str = "") -> None:
        self.events.received(
            self, protocol.Result.bound(dispatch_id, self.key_of(dispatch_id), node, uid=uid)
        )

    def unschedulable(
        self,
        dispatch_id: int,
        nodes: int,
        reasons: dict[str, int],
        *,
        preemption: protocol.Candidate | None = None,
    ) -> None:
        result = protocol.Result.unschedulable(
            dispatch_id,
            self.key_of(dispatch_id),
            nodes=nodes,
            reasons=reasons,
            message="no",
            preemption=preemption,
        )
        self.events.received(self, result)

    def rejected(self, dispatch_id: int) -> None:
        self.events.received(self, protocol.Result.rejected(dispatch_id, self.key_of(dispatch_id), "fenced"))

    def waiting(self, dispatch_id: int, node: str) -> None:
        self.events.received(self, protocol.Result.waiting(dispatch_id, self.key_of(dispatch_id), node))


class Rig:
    """A Dispatcher over fake links, a fake reporter, a fake clock and a seeded rng."""

    def __init__(
        self, client: KubeClient, *, claims: bool = False, listed: bool = True, sole: bool = False
    ) -> None:
        self.clock = FakeClock()
        # the shard map's view: nodes granted per worker, nodes in transit (``Dispatcher.granted``, ``in_transit``)
        self.granted: dict[WorkerId, int] = {}
        self.in_transit = 0
        self.reporter = FakeReporter()
        self.links: dict[str, FakeLink] = {}
        self.d = Dispatcher(
            client,
            self.reporter,
            scheduler_name="agent-scheduler",
            leader_id="leader",
            term=1,
            clock=self.clock,
            rng=random.Random(7),
            connect=self._connect,
            claims=claims,
            sole=sole,
            granted=lambda: self.granted,
            in_transit=lambda: self.in_transit,
        )
        if listed:
            # The term's pending watch has listed (nothing pending): the term inherits only until its workers
            # say they bind nothing of an earlier stream (their summaries, ``FakeLink.summary``).
            self.d.listed(0)

    def _connect(self, worker_id: str, address: str, events: LinkEvents) -> FakeLink:
        link = self.links[worker_id] = FakeLink(worker_id, address, events)
        return link

    def workers(self, *names: str) -> list[FakeLink]:
        """Set the live workers (by name) and return their links, not yet connected."""
        self.d.set_workers({n: f"{n}:7000" for n in names})
        return [self.links[n] for n in names]

    def rescan(self) -> None:
        """What the loop does when idle: consider every waiting pod again."""
        self.d.table.requeue_waiting()

    def step(self) -> int:
        """One pass of the dispatch loop over everything queued, as often as it finds work."""
        total = 0
        while n := self.d.dispatch_ready():
            total += n
        return total
