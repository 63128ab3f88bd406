"""The share workload's batch side: a stand-in for Volcano's batch scheduler that follows the NodeShard protocol.

It owns one NodeShard (its name is the batch entry of the sharding ConfigMap; the coordinator writes its
``spec.nodesDesired``) and a queue of batch pods (the standing backlog). Each step is a safe point - none of
its pods pending:

1. read its shard's ``nodesDesired`` and the agent shard's ``status.nodesInUse``; publish
   ``desired - agent in use`` as its own ``status.nodesInUse`` (this is where it releases and claims nodes);
2. confirm with a fresh read that the agent shard does not claim any of them (claim, then confirm: of two
   schedulers that claim a node and then read the other's claim, at least one keeps off);
3. release from the queue as many pods as fit in the free CPU and memory of the confirmed nodes (as the pods
   it tracks say), each restricted by required node affinity (``matchFields`` on ``metadata.name``) to the
   confirmed nodes that have room, for kube-scheduler to place;
4. wait until they are bound; pods not seen bound within ``BIND_WAIT_S`` are deleted and go back to the front of
   the queue (under a new name) before the next safe point. A withdrawn pod may have bound meanwhile (the
   deletion then ends it): its release is kept, marked ``withdrawn``, for the audit.

Invariants: a batch pod is created only restricted to nodes that were, at its release, in this side's
``nodesDesired``, published in its ``nodesInUse`` and confirmed absent from the agent shard's ``nodesInUse``;
a released pod is never left pending across a safe point (bound, or deleted and re-queued).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from common.kube import ApiError, KubeClient, NotFound
from coordinator.nodeshards import bodies
from coordinator.nodeshards.bodies import NodeShard, parse_nodeshard

log = logging.getLogger(__name__)

POLL_S = 0.25
BIND_WAIT_S = 3.0  # real seconds; a safe point blocked longer would hold up handoffs
CREATE_CONCURRENCY = 16


async def get_shard(kube: KubeClient, name: str) -> NodeShard | None:
    try:
        return parse_nodeshard(await kube.get(bodies.object_path(name)))
    except NotFound:
        return None


async def claim_and_confirm(
    kube: KubeClient, shard: str, agent_shard: str, published: frozenset[str]
) -> tuple[frozenset[str], frozenset[str]] | None:
    """Steps 1 and 2 of a batch side's safe point (the module docstring): publish ``nodesDesired`` minus the agent
    shard's ``nodesInUse`` as this shard's ``nodesInUse`` (when it differs from ``published``, or the status was
    never written), then read the agent shard again. Returns (what is now published, the nodes confirmed usable),
    or None while the shard does not exist. ``nodesToAdd`` lists the desired nodes the agent side still uses;
    ``nodesToRemove`` the nodes this publication gives up."""
    mine = await get_shard(kube, shard)
    if mine is None:
        return None
    agent = await get_shard(kube, agent_shard)
    agent_use = agent.nodes_in_use if agent is not None else frozenset()
    desired = frozenset(mine.nodes_desired)
    usable = desired - agent_use
    if usable != published or mine.last_update_time is None:
        body = bodies.status_patch(
            nodes_in_use=usable,
            nodes_to_add=desired & agent_use,
            nodes_to_remove=published - usable,
            now=datetime.now(UTC),
        )
        await kube.patch(bodies.status_path(shard), body)
    agent = await get_shard(kube, agent_shard)  # confirm after our own claim
    return usable, usable - (agent.nodes_in_use if agent is not None else frozenset())


@dataclass(slots=True)
class Release:
    """One batch pod released at a safe point: what it may use and when."""

    name: str
    queued: int  # the backlog index (the same pod in every configuration)
    released_at: float
    nodes: frozenset[str]
    withdrawn: bool = False  # deleted at the safe point for not being bound in time (it may still have bound)


@dataclass(slots=True)
class BatchSide:
    """The batch stand-in of one configuration. ``free`` reports (milli CPU, MiB) free per node from the
    run's pod tracker; ``bound`` tells whether a pod (by name) is bound."""

    kube: KubeClient
    namespace: str
    shard: str
    agent_shard: str
    backlog: deque[tuple[int, dict[str, Any]]]
    free: Callable[[str], tuple[int, int]]
    bound: Callable[[str], bool]
    pod_cpu_milli: int = 1000
    pod_mem_mib: int = 2048
    published: frozenset[str] = frozenset()
    releases: dict[str, Release] = field(default_factory=dict)
    withdrawn: int = 0
    safe_points: int = 0
    errors: list[str] = field(default_factory=list)
    _attempt: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Safe points until ``stop`` is set; the last step still waits for (or withdraws) its pods."""
        while not stop.is_set():
            try:
                await self.step()
            except ApiError as e:  # a transient API error: the next safe point retries from fresh reads
                self.errors.append(f"{type(e).__name__}: {e}")
                log.warning("batch side %s: %s", self.shard, e)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), POLL_S)

    async def step(self) -> None:
        claimed = await claim_and_confirm(self.kube, self.shard, self.agent_shard, self.published)
        if claimed is None:
            return
        self.published, confirmed = claimed
        self.safe_points += 1
        if confirmed and self.backlog:
            await self._wave(confirmed)

    def _room(self, nodes: frozenset[str]) -> dict[str, int]:
        room = {}
        for node in nodes:
            cpu, mem = self.free(node)
            fits = min(cpu // self.pod_cpu_milli, mem // self.pod_mem_mib)
            if fits > 0:
                room[node] = fits
        return room

    async def _wave(self, confirmed: frozenset[str]) -> None:
        room = self._room(confirmed)
        count = min(sum(room.values()), len(self.backlog))
        if count == 0:
            return
        targets = sorted(room)
        wave = [self.backlog.popleft() for _ in range(count)]
        self._attempt += 1
        now = time.monotonic()
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        names: list[str] = []
        gate = asyncio.Semaphore(CREATE_CONCURRENCY)

        async def create(index: int, pod: dict[str, Any]) -> None:
            body = restricted(pod, targets, attempt=self._attempt)
            name = body["metadata"]["name"]
            async with gate:
                await self.kube.post(path, body)
            self.releases[name] = Release(name, index, now, frozenset(targets))
            names.append(name)

        await asyncio.gather(*(create(i, p) for i, p in wave))
        deadline = time.monotonic() + BIND_WAIT_S
        pending = set(names)
        while pending and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
            pending = {n for n in pending if not self.bound(n)}
        by_name = {f"{p['metadata']['name']}-{self._attempt}": (i, p) for i, p in wave}
        for name in sorted(pending, reverse=True):  # not placed in time: withdraw, back to the queue's front
            with contextlib.suppress(NotFound):
                await self.kube.delete(f"{path}/{name}", {"gracePeriodSeconds": "0"})
            self.releases[name].withdrawn = True
            self.backlog.appendleft(by_name[name])
            self.withdrawn += 1


def restricted(pod: dict[str, Any], nodes: list[str], *, attempt: int) -> dict[str, Any]:
    """A copy of the backlog pod ``pod`` named for this release, allowed only on ``nodes``."""
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**pod["metadata"], "name": f"{pod['metadata']['name']}-{attempt}"},
        "spec": dict(pod["spec"]),
    }
    # matchFields takes exactly one value per requirement: one term per node (terms are ORed)
    terms = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n]}]} for n in nodes]
    body["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
    }
    return body
