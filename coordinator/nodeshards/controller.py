"""``ShardingController``: the leader's shard policy loop - evaluate, write NodeShards, hand nodes over safely.

Runs inside one leadership term (``coordinator.leadership.term.run_term``) beside the shard map, and feeds it
through ``PolicyPool`` (the nodes) and the ``AssignmentPolicy`` (the ``rebalance`` settings in force). Each pass
of the loop (on a change, and at least every ``RECONCILE_INTERVAL``; without a policy, once a pass has run
and published its record, every ``LABEL_POOL_INTERVAL``, as what it reads wakes it):

1. Evaluate, when due: on a new policy, every ``shardSyncPeriod``, and on node changes when
   ``enableNodeEventTrigger`` (at most once per ``MIN_EVENT_INTERVAL``). ``EffectivePolicy.evaluate`` over the
   managed nodes, with holders read from the NodeShards' ``spec.nodesDesired`` (hysteresis and the move budget
   live in the policy). Every scheduler of the policy gets its NodeShard ``spec.nodesDesired``, compared on
   every pass and rewritten when it differs (a NodeShard deleted or edited by hand is restored). The controller
   remembers when each node last moved and to which scheduler (in this term, at the evaluation that moved it)
   and passes the nodes that moved less than that scheduler's residence ago (``minResidenceSeconds``, or its
   entry in ``minResidenceSecondsByScheduler``) as resting, so they stay put; a new term starts with none
   resting (a failover can let a node move early once, which costs a handoff, never safety).
2. Hand over (Volcano's rule): the agent shard may use ``its nodesDesired - every other shard's
   status.nodesInUse``. Those are the *candidates*.
3. Claim, confirm, then offer: ``status.nodesInUse`` of the agent shard is published as ``held | candidates``,
   where ``held`` is what workers hold or may be granted (``ShardMapLeader.nodes_in_use``); once that write
   succeeded, a fresh (quorum) read of the other shards confirms nobody claimed the new candidates meanwhile, and
   only then do they enter the pool the shard map grants from. Removing a node from the pool needs no write
   first; the node stays published until its worker released it (it is ``held`` until then).

   Claim-then-confirm makes the handoff safe against a batch scheduler that decides on a stale read of our
   status: of two schedulers that both claim a node and then read the other's claim, at least one sees it and
   keeps off (and a scheduler following Volcano's protocol never claims a node outside its nodesDesired).

Invariants:
- A node enters the pool only after it was published in the agent shard's ``status.nodesInUse`` and a read
  made after that publication showed no other shard publishing it: a batch scheduler following the protocol
  never sees a node free that an agent worker may be using, and no agent worker is granted a node the batch
  side still publishes.
- A node leaves the published set only when no worker holds it and no round of the shard map can still grant it.
  Before the shard map's mirror has listed (``held`` unknown), nothing published is withdrawn.
- With no policy (no ConfigMap seen, and not told to use the default) the pool is the label-selected node set,
  computed as ``coordinator.workershards.pools.LabelPool`` computes it, no NodeShard is written, and the bound
  pods are not watched (their requests matter only to a policy; the first pass with a policy starts that watch
  and evaluates once it has listed). Once a
  policy is in force it stays: an invalid edit or a deleted ConfigMap keeps it (``configsource``).
- Every API and etcd write is skipped once the term is no longer active.
- Once a policy is in force, the worker-shard assignment runs on its ``rebalance`` settings; a new policy reaches
  the assignment in the pass that sees it, so the shard map's next round uses it. Before, the assignment keeps
  the configuration it was built with (the defaults).

When the pool is empty, ``why_empty`` says why (for ``coordinator.leadership.emptypool``): no node selected, the
policy giving the agent shard none, or its nodes still in another shard's ``status.nodesInUse``.

What it does not do: grant nodes to workers (``coordinator.workershards.shardmap``), or judge the ConfigMap
(``coordinator.nodeshards.configsource``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from etcd3aio import Etcd3Client
from etcd3aio.kv import KVService

from common.backoff import api_retry
from common.etcd.keys import KeyLayout
from common.etcd.kv import DEFAULT_TIMEOUT, ETCD_FAILURES, describe, kv_service
from common.events import ObjectRef
from common.kube import ApiError, KubeClient
from common.records import NodeName
from common.watching import Reflector
from common.wellknown import DEFAULT_SCHEDULER_NAME
from coordinator.leadership.election import LeaderTerm
from coordinator.nodeshards.configsource import PolicySource
from coordinator.nodeshards.eventsender import EventSender
from coordinator.nodeshards.policy import (
    DEFAULT_CONFIGMAP_NAME,
    DEFAULT_CONFIGMAP_NAMESPACE,
    EffectivePolicy,
    ShardEvaluation,
)
from coordinator.nodeshards.published import PolicyRecord, policy_key
from coordinator.nodeshards.store import NodeShardStore
from coordinator.nodeshards.usage import BOUND_LIVE_PODS, RequestTable, views
from coordinator.workershards.assignment import AssignmentPolicy
from coordinator.workershards.pools import NodeTable, PolicyPool, label_pool_reason, pool_weights

log = logging.getLogger(__name__)

HeldNodes = Callable[[], frozenset[NodeName] | None]
"""Nodes workers hold or may be granted before the next shard-map round; None while unknown."""

RECONCILE_INTERVAL = 0.25  # re-check held nodes this often (an in-memory comparison unless something changed)
# With no policy in force, a pass that ran and published its record waits this long unless woken: what it
# reads wakes it (the node table, the ConfigMap, the NodeShards), so the timer is a backstop, not a poll. A pass
# skipped (the term not active) or whose record etcd did not take is retried at RECONCILE_INTERVAL, one that
# failed on an API error after its backoff.
LABEL_POOL_INTERVAL = 5.0
MIN_EVENT_INTERVAL = 1.0  # node events trigger at most one evaluation per this many seconds
DEBOUNCE = 0.05  # let a burst of watch events land before acting


@dataclass(frozen=True, slots=True)
class ShardingOptions:
    """Where the sharding ConfigMap is and whom this coordinator schedules for."""

    configmap: str = DEFAULT_CONFIGMAP_NAME
    namespace: str = DEFAULT_CONFIGMAP_NAMESPACE
    use_default: bool = False
    """Apply ``default_policy()`` until the ConfigMap appears (the operator named it explicitly); otherwise
    keep the label-selected pool until then."""
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    """Picks the ``agent`` entry of the policy (the only one is used when none has this name)."""
    node_selector: str = ""
    """Label selector of the nodes the coordinator manages (evaluated by the policy, or the label pool)."""
    component: str = "agent-scheduler-coordinator"


class ShardingController:
    """One term's shard policy loop. ``run()`` until cancelled; ``ready`` once the pool is first set."""

    def __init__(
        self,
        client: KubeClient,
        etcd: Etcd3Client,
        term: LeaderTerm,
        options: ShardingOptions,
        *,
        pool: PolicyPool,
        held: HeldNodes,
        keys: KeyLayout,
        assignment: AssignmentPolicy,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._etcd = etcd
        self._term = term
        self._options = options
        self._keys = keys
        self._clock = clock
        self.pool = pool
        self._held = held
        self._assignment_policy = assignment
        self.events = EventSender(client, component=options.component, instance=term.record.candidate_id)
        self.source = PolicySource(
            options.namespace,
            options.configmap,
            scheduler_name=options.scheduler_name,
            use_default=options.use_default,
            events=self.events,
        )
        self.nodes = NodeTable()
        self.requests = RequestTable()
        self.shards = NodeShardStore(client)
        selector = {"labelSelector": options.node_selector} if options.node_selector else {}
        self._reflectors = (
            Reflector(
                client,
                f"/api/v1/namespaces/{options.namespace}/configmaps",
                self.source,
                params={"fieldSelector": f"metadata.name={options.configmap}"},
                name="sharding-configmap",
            ),
            Reflector(client, "/api/v1/nodes", self.nodes, params=selector, name="sharding-nodes"),
        )
        # Only a policy's evaluation reads the requests: the bound pods are watched from the first pass that
        # has a policy in force, so a coordinator without one does not watch every pod a second time.
        self._pods = Reflector(
            client,
            "/api/v1/pods",
            self.requests,
            params={"fieldSelector": BOUND_LIVE_PODS},
            name="sharding-pods",
        )
        self._watch_pods = asyncio.Event()
        self._pooled = -1  # the node table's version the label pool was last set from
        self.source.listeners.append(self._wake_now)
        self.nodes.listeners.append(self._node_changed)
        self.shards.listeners.append(self._wake_now)
        self.ready = asyncio.Event()
        self._wake = asyncio.Event()
        self._evaluated: EffectivePolicy | None = None
        self._evaluation: ShardEvaluation | None = None
        self._owners: Mapping[NodeName, str] = {}
        # node -> when an evaluation of this term last moved it, and to whom (None: to no scheduler)
        self._moved_at: dict[NodeName, tuple[float, str | None]] = {}
        self._next_eval = 0.0
        self._last_eval = float("-inf")
        self._node_event = False
        self._record: PolicyRecord | None = None  # the record etcd took last (this term)
        self._record_current = False  # the last pass's record is the one etcd took
        self._waiting = 0

    # ---- triggers ----

    def _wake_now(self) -> None:
        self._wake.set()

    def _node_changed(self) -> None:
        self._node_event = True
        self._wake.set()

    # ---- running ----

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for reflector in self._reflectors:
                tg.create_task(reflector.run(), name=reflector.name)
            tg.create_task(self.shards.run(), name="nodeshards")
            tg.create_task(self._run_pods(), name=self._pods.name)
            tg.create_task(self.events.run(), name="sharding-events")
            for reflector in self._reflectors:
                await reflector.synced.wait()
            await self.shards.synced.wait()
            tg.create_task(self._loop(), name="sharding-loop")

    async def _run_pods(self) -> None:
        await self._watch_pods.wait()
        await self._pods.run()

    async def _loop(self) -> None:
        backoff = api_retry()
        while True:
            delay = RECONCILE_INTERVAL
            if self._term.active:
                try:
                    await self._pass()
                    self.ready.set()
                    backoff.reset()
                    if self.source.current is None and self._record_current:
                        # nothing left to write: the next pass waits for its inputs
                        delay = LABEL_POOL_INTERVAL
                except ApiError as e:
                    log.warning("shard policy pass failed: %s; retrying", e)
                    delay = backoff.next()
            # a timeout scope, not ``wait_first``: two tasks started and cancelled per pass
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            await asyncio.sleep(DEBOUNCE)
            self._wake.clear()

    async def _pass(self) -> None:
        policy = self.source.current
        agent = self.source.agent
        self._apply_rebalance(policy)
        if policy is None or agent is None:
            if self._pooled != self.nodes.version:  # the label pool: only the node table changes it
                self.pool.set(pool_weights(self.nodes.nodes, self.nodes.nodes))
                self._pooled = self.nodes.version
        else:
            self._pooled = -1  # the pool is the policy's now: a later label pool is set afresh
            if not self._pods.synced.is_set():
                self._watch_pods.set()
                await self._pods.synced.wait()  # once per term: the requests are complete from then on
            if self._due(policy):
                self._evaluate(policy)
            await self._write_specs(policy)  # compares first: writes only what differs (or was lost)
            await self._hand_over(agent.name)
        await self._publish_record()

    def _apply_rebalance(self, policy: EffectivePolicy | None) -> None:
        """Hand the ``rebalance`` settings in force to the assignment (it keeps its own until a policy is)."""
        if policy is None:
            return
        config = policy.settings.rebalance.assignment_config()
        if config != self._assignment_policy.config:
            log.info("worker rebalancing: %s", config.describe())
            self._assignment_policy.configure(config)

    # ---- 1. evaluate ----

    def _due(self, policy: EffectivePolicy) -> bool:
        now = self._clock()
        if self._evaluated is None or policy.version != self._evaluated.version or now >= self._next_eval:
            return True
        triggered = self._node_event and policy.sharding.enable_node_event_trigger
        return triggered and now >= self._last_eval + MIN_EVENT_INTERVAL

    def _evaluate(self, policy: EffectivePolicy) -> None:
        now = self._clock()
        names = [s.name for s in policy.sharding.schedulers]
        if self.shards.available:
            holders = self.shards.holders(names)
        else:
            holders = {n: s for n, s in self._owners.items() if s in names}
        shards = policy.settings.shards
        self._moved_at = {
            n: (t, to) for n, (t, to) in self._moved_at.items() if now - t < shards.residence(to)
        }
        result = policy.evaluate(views(self.nodes.nodes, self.requests, holders), frozenset(self._moved_at))
        self._moved_at.update(
            (move.node, (now, move.target)) for move in result.moves if shards.residence(move.target)
        )
        self._evaluation, self._owners = result, result.owners
        self._evaluated, self._last_eval = policy, now
        self._next_eval = now + policy.sharding.shard_sync_period_seconds
        self._node_event = False
        if result.moves or result.deferred:
            log.info(
                "shard policy %s: %d nodes move (%s), %d deferred; sizes %s",
                policy.version,
                len(result.moves),
                ", ".join(f"{m.node} {m.source}->{m.target or '-'}" for m in result.moves[:10]),
                len(result.deferred),
                {name: len(nodes) for name, nodes in result.desired.items()},
            )

    async def _write_specs(self, policy: EffectivePolicy) -> None:
        if self._evaluation is None:
            return
        for scheduler in policy.sharding.schedulers:
            if not self._term.active:
                return
            await self.shards.write_spec(scheduler.name, self._evaluation.desired.get(scheduler.name, ()))

    # ---- 2 and 3. hand over: claim, then offer ----

    def desired(self, name: str) -> frozenset[NodeName]:
        """The latest evaluation's nodes for scheduler ``name``."""
        if self._evaluation is None:
            return frozenset()
        return frozenset(self._evaluation.desired.get(name, ()))

    async def _hand_over(self, agent: str) -> None:
        desired = self.desired(agent)
        others = self.shards.in_use_except(agent)
        candidates = (desired & frozenset(self.nodes.nodes)) - others
        self._waiting = len(desired & others)
        if not self.shards.available:
            self.pool.set(pool_weights(self.nodes.nodes, candidates))  # nobody to tell: no NodeShards here
            return
        shard = self.shards.shards.get(agent)
        published = shard.nodes_in_use if shard is not None else frozenset()
        held = self._held()
        if held is None:
            held = published | self.pool.nodes()
        claim = held | candidates
        if shard is not None and self._term.active:
            try:
                await self.shards.write_status(
                    agent,
                    in_use=claim,
                    to_add=desired & others,
                    to_remove=claim - desired,
                    first=shard.last_update_time is None,
                )
                published = claim
            except ApiError as e:
                log.warning("NodeShard %s: status write failed (%s); offering only published nodes", agent, e)
        offer = candidates & published
        if offer - self.pool.nodes():
            # New nodes: confirm after our claim that no other scheduler claimed them meanwhile.
            offer -= await self.shards.confirm_in_use_except(agent)
        self.pool.set(pool_weights(self.nodes.nodes, offer))

    # ---- saying why the pool is empty ----

    def why_empty(self) -> str:
        """Why the pool is empty, for ``coordinator.leadership.emptypool`` (read-only)."""
        policy, agent = self.source.current, self.source.agent
        selector = self._options.node_selector
        managed = f"nodes matching {selector!r}" if selector else "nodes"
        if not self.nodes.nodes:
            return label_pool_reason(selector)
        if policy is None or agent is None:
            return f"none of the {len(self.nodes.nodes)} {managed} is offered yet"
        desired = self.desired(agent.name)
        if not desired:
            return (
                f"the shard policy ({self.source.origin}) gives the agent shard {agent.name!r} none of the "
                f"{len(self.nodes.nodes)} {managed}"
            )
        return (
            f"the {len(desired)} nodes the shard policy gives the agent shard {agent.name!r} are still in use by "
            "other shards (their NodeShard status.nodesInUse)"
        )

    def policy_configmap(self) -> ObjectRef | None:
        """The ConfigMap whose policy is in force, or None when no policy from a ConfigMap is."""
        if self.source.current is None or not self.source.origin.startswith("configmap"):
            return None
        return ObjectRef("v1", "ConfigMap", self.source.namespace, self.source.name)

    # ---- the record for `status` ----

    async def _publish_record(self) -> None:
        policy, agent = self.source.current, self.source.agent
        verdict = self.source.last_verdict
        record = PolicyRecord(
            mode="policy" if policy is not None else "label-pool",
            version=policy.version if policy is not None else "",
            summary=policy.summary() if policy is not None else "",
            origin=self.source.origin,
            configmap=self.source.where,
            configmap_present=self.source.present,
            agent_shard=agent.name if agent is not None else "",
            last_rejected=(
                f"resourceVersion {verdict.resource_version}: {verdict.message}"
                if verdict is not None and not verdict.accepted
                else ""
            ),
            desired=(
                {name: len(nodes) for name, nodes in self._evaluation.desired.items()}
                if self._evaluation is not None and policy is not None
                else {}
            ),
            in_use=len(self.shards.shards[agent.name].nodes_in_use)
            if agent is not None and agent.name in self.shards.shards
            else 0,
            pool=len(self.pool()),
            waiting=self._waiting,
            deferred=len(self._evaluation.deferred) if self._evaluation is not None else 0,
            nodeshards=self.shards.available,
            rebalance=self._assignment_policy.config.describe(),
        )
        # Compared before it is encoded: with a policy a pass runs every RECONCILE_INTERVAL, and the encoding (a
        # deep copy of the record through ``dataclasses.asdict``) was most of a pass at rest.
        self._record_current = record == self._record
        if self._record_current or not self._term.active:
            return
        raw = record.encode()
        try:
            resp = await kv_service(self._etcd).txn(
                [self._term.guard()],
                [KVService.txn_op_put(policy_key(self._keys), raw)],
                [],
                timeout=DEFAULT_TIMEOUT,
            )
        except ETCD_FAILURES as e:
            log.warning("could not publish the policy record: %s", describe(e))
            return
        if resp.succeeded:
            self._record = record
            self._record_current = True
