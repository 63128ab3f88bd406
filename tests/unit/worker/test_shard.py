"""The worker shard's in-memory rules (``ShardState``): grants, catch-up, revocations, acks, fencing.

The etcd parts (registration, the assignment mirror, the lease) are covered by ``tests/integration/etcd``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest

from common.records import NodeName, PodRecord
from tests.builders import make_pod
from worker import shard as shard_module
from worker.shard import ShardChange, ShardState, WholeCluster

LEASE = 0x51


def nodes(*names: str) -> frozenset[NodeName]:
    return frozenset(NodeName(n) for n in names)


class FakePodWatch:
    """The pod watch as the catch-up sees it; a test moves its revision and relist time by hand."""

    def __init__(self, *, bound: dict[str, tuple[list[PodRecord], int]] | None = None) -> None:
        self.synced = asyncio.Event()
        self.synced.set()
        self.list_started_at = -1.0
        self.rev = 0
        self.bound = bound or {}
        self.listed: list[str] = []
        self.applied: list[PodRecord] = []
        self.fail_lists = 0

    async def wait_synced(self) -> None:
        await self.synced.wait()

    def listed_since(self, moment: float) -> bool:
        return self.list_started_at >= moment

    def revision(self) -> int:
        return self.rev

    async def list_bound(self, node: NodeName) -> tuple[list[PodRecord], int]:
        self.listed.append(node)
        if self.fail_lists:
            self.fail_lists -= 1
            raise ConnectionError("API server unreachable")
        return self.bound.get(node, ([], 0))

    def apply_direct(self, pods: list[PodRecord]) -> None:
        self.applied.extend(pods)


class Rig:
    def __init__(self) -> None:
        self.healthy = True
        self.acks: list[tuple[int, int, frozenset[NodeName]]] = []
        self.changes: list[ShardChange] = []
        self.released: list[frozenset[NodeName]] = []
        self.state = ShardState(name="w1", healthy=lambda: self.healthy, ack=self.ack)
        self.state.subscribe(self.changes.append)
        self.gate: asyncio.Event | None = None

    async def ack(self, lease: int, epoch: int, released: frozenset[NodeName]) -> None:
        self.acks.append((lease, epoch, released))

    async def on_release(self, released: frozenset[NodeName]) -> None:
        self.released.append(released)
        if self.gate is not None:
            await self.gate.wait()

    def usable(self, names: Iterable[str]) -> set[str]:
        """The usable ones of ``names``; asked both ways, node by node and with one decision's test, which must
        agree in every state the tests below put the shard in (granted, catching up, fenced, revoked)."""
        names = list(names)
        one_by_one = {n for n in names if self.state.usable(NodeName(n))}
        walk = self.state.usable_now()
        assert {n for n in names if walk(NodeName(n))} == one_by_one, "usable_now differs from usable"
        return one_by_one

    def published(self) -> frozenset[NodeName]:
        current: set[NodeName] = set()
        for change in self.changes:
            assert not change.added & current, "added a node that was already published"
            assert change.removed <= current, "removed a node that was not published"
            current |= change.added
            current -= change.removed
        return frozenset(current)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_whole_cluster_uses_every_node_and_never_changes() -> None:
    whole = WholeCluster()
    assert whole.usable(NodeName("any")) and whole.usable_now()(NodeName("any")) and whole.syncing() == 0
    whole.subscribe(lambda change: pytest.fail("the whole cluster never changes"))()


async def test_grant_without_a_cache_is_usable_at_once() -> None:
    rig = Rig()
    rig.state.start(pods=None, on_release=None)
    rig.state.assign(nodes("a", "b"), 1, ack_lease=0)
    assert rig.usable("abc") == {"a", "b"}
    assert rig.changes == [ShardChange(nodes("a", "b"), frozenset(), 1)]
    await rig.state.stop()


async def test_granted_node_is_unusable_until_the_watch_caught_up() -> None:
    rig = Rig()
    watch = FakePodWatch(bound={"a": ([make_pod("x").on("a").record()], 42)})
    watch.rev = 40
    rig.state.start(pods=watch, on_release=None)
    rig.state.assign(nodes("a", "b"), 1, ack_lease=0)
    await settle()
    assert rig.state.owns(NodeName("a")) and not rig.state.usable(NodeName("a"))
    # One grant becomes usable as a whole: b, with nothing to wait for, waits for a.
    assert rig.state.syncing() == 2 and rig.published() == frozenset() and not rig.usable("b")
    assert sorted(watch.listed) == ["a", "b"]
    watch.rev = 42
    await asyncio.sleep(shard_module.CATCH_UP_POLL * 3)
    assert rig.usable("ab") == {"a", "b"} and rig.state.syncing() == 0
    assert rig.published() == nodes("a", "b") and not watch.applied
    await rig.state.stop()


async def test_every_reevaluation_is_told_even_one_that_changes_no_usable_node() -> None:
    """What a worker's capacity summary reads of the shard (``syncing``, health) moves on a grant still
    catching up and on its end, not only when the usable set changes: each is told (``on_reevaluated``)."""
    rig = Rig()
    told: list[int] = []
    rig.state.on_reevaluated(lambda: told.append(rig.state.syncing()))
    watch = FakePodWatch(bound={"a": ([], 42)})
    watch.rev = 40
    rig.state.start(pods=watch, on_release=None)
    rig.state.assign(nodes("a"), 1, ack_lease=0)
    assert told == [1] and rig.changes == []  # syncing, nothing usable yet
    watch.rev = 42
    await asyncio.sleep(shard_module.CATCH_UP_POLL * 3)
    assert told == [1, 0] and rig.published() == nodes("a")
    await rig.state.stop()


async def test_relist_after_the_grant_needs_no_per_node_read() -> None:
    rig = Rig()
    watch = FakePodWatch()
    watch.synced.clear()
    rig.state.start(pods=watch, on_release=None)
    rig.state.assign(nodes("a"), 1, ack_lease=0)
    await settle()
    assert not rig.usable("a")  # the pod watch has not listed yet
    watch.list_started_at = float("inf")
    watch.synced.set()
    await settle()
    assert rig.usable("a") == {"a"} and not watch.listed


async def test_a_lagging_watch_gets_the_direct_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shard_module, "CATCH_UP_TIMEOUT", 0.05)
    pod = make_pod("x").on("a").record()
    rig = Rig()
    watch = FakePodWatch(bound={"a": ([pod], 99)})
    rig.state.start(pods=watch, on_release=None)
    rig.state.assign(nodes("a"), 1, ack_lease=0)
    await asyncio.sleep(0.2)
    assert watch.applied == [pod] and rig.usable("a") == {"a"}
    await rig.state.stop()


async def test_a_failed_read_keeps_the_node_unusable_and_is_retried() -> None:
    rig = Rig()
    watch = FakePodWatch()
    watch.fail_lists = 1
    rig.state.start(pods=watch, on_release=None)
    rig.state.assign(nodes("a"), 1, ack_lease=0)
    await settle()
    assert not rig.usable("a") and watch.listed == ["a"]
    await asyncio.sleep(0.5)  # the first API retry delay is 0.2 s
    assert rig.usable("a") == {"a"} and watch.listed == ["a", "a"]
    await rig.state.stop()


async def test_node_revoked_while_catching_up_is_never_published() -> None:
    rig = Rig()
    watch = FakePodWatch(bound={"a": ([], 5)})
    rig.state.start(pods=watch, on_release=None)
    rig.state.assign(nodes("a"), 1, ack_lease=0)
    await settle()
    rig.state.assign(frozenset(), 2, ack_lease=LEASE)
    watch.rev = 5
    await asyncio.sleep(shard_module.CATCH_UP_POLL * 3)
    assert not rig.usable("a") and rig.published() == frozenset() and not rig.changes
    assert rig.acks == [(LEASE, 2, nodes("a"))]
    await rig.state.stop()


async def test_revoked_node_stops_being_usable_before_the_release_and_acks_after_it() -> None:
    rig = Rig()
    rig.gate = asyncio.Event()
    rig.state.start(pods=None, on_release=rig.on_release)
    rig.state.assign(nodes("a", "b"), 1, ack_lease=0)
    rig.state.assign(nodes("b"), 2, ack_lease=LEASE)
    # Synchronously, before the release hook ran: a is gone from the usable set and from subscribers' view.
    assert rig.usable("ab") == {"b"} and rig.published() == nodes("b") and not rig.released
    await settle()
    assert rig.released == [nodes("a")] and not rig.acks  # bindings in flight: no ack yet
    rig.gate.set()
    await rig.state.releases_done()
    assert rig.acks == [(LEASE, 2, nodes("a"))]
    await rig.state.stop()


async def test_acks_follow_epoch_order_and_survive_a_failing_hook() -> None:
    rig = Rig()

    async def failing(released: frozenset[NodeName]) -> None:
        rig.released.append(released)
        raise RuntimeError("hook broke")

    rig.state.start(pods=None, on_release=failing)
    rig.state.assign(nodes("a", "b", "c"), 1, ack_lease=0)
    rig.state.assign(nodes("b", "c"), 2, ack_lease=LEASE)
    rig.state.assign(nodes("c"), 3, ack_lease=LEASE)
    await rig.state.releases_done()
    assert rig.released == [nodes("a"), nodes("b")]
    assert [(epoch, released) for _, epoch, released in rig.acks] == [(2, nodes("a")), (3, nodes("b"))]
    assert rig.state.releases == 2
    await rig.state.stop()


async def test_fenced_means_nothing_usable_and_the_stream_says_so() -> None:
    rig = Rig()
    rig.state.start(pods=None, on_release=None)
    rig.state.assign(nodes("a", "b"), 1, ack_lease=0)
    rig.healthy = False  # the lease keeper's health rule, read live
    assert not rig.usable("ab") and rig.state.owned() == frozenset()
    rig.state.publish()  # the keeper's health listener
    assert rig.changes[-1] == ShardChange(frozenset(), nodes("a", "b"), 1) and rig.published() == frozenset()
    rig.healthy = True
    rig.state.publish()
    assert rig.usable("ab") == {"a", "b"} and rig.published() == nodes("a", "b")
    assert not rig.released  # fencing releases nothing: the assignment still stands
    await rig.state.stop()


async def test_drop_all_publishes_the_loss_without_release_hooks() -> None:
    rig = Rig()
    rig.state.start(pods=None, on_release=rig.on_release)
    rig.state.assign(nodes("a"), 1, ack_lease=0)
    await rig.state.stop()
    rig.state.drop_all()
    assert rig.published() == frozenset() and not rig.released and not rig.acks


async def test_a_stopped_catch_up_never_makes_its_nodes_usable() -> None:
    rig = Rig()
    watch = FakePodWatch(bound={"a": ([], 5)})
    rig.state.start(pods=watch, on_release=None)
    rig.state.assign(nodes("a"), 1, ack_lease=0)
    await settle()
    await rig.state.stop()
    assert not rig.usable("a") and rig.state.syncing() == 1 and not rig.changes


def test_bind_deadline_is_the_fencing_deadline_of_a_usable_node_only() -> None:
    deadline = [42.0]
    healthy = [True]

    async def ack(lease: int, epoch: int, released: frozenset[NodeName]) -> None:
        return None

    state = ShardState(name="w", healthy=lambda: healthy[0], ack=ack, fence_deadline=lambda: deadline[0])
    state.assign(nodes("a"), 1, ack_lease=0)  # no pod watch: usable at once
    assert state.bind_deadline(NodeName("a")) == 42.0
    deadline[0] = 43.5  # a refresh succeeded: the deadline moves on
    assert state.bind_deadline(NodeName("a")) == 43.5
    assert state.bind_deadline(NodeName("b")) is None  # not granted
    healthy[0] = False
    assert state.bind_deadline(NodeName("a")) is None  # fenced
    assert WholeCluster().bind_deadline(NodeName("any")) == float("inf")


def test_a_decisions_usable_test_reads_the_lease_health_once() -> None:
    """``usable_now`` reads the health at the call (one clock read per decision, not per node): a test taken
    while healthy keeps its answers for that pass; the next call sees the fence."""
    reads = 0
    health = [True]

    def healthy() -> bool:
        nonlocal reads
        reads += 1
        return health[0]

    async def ack(lease: int, epoch: int, released: frozenset[NodeName]) -> None:
        pass

    state = ShardState(name="w", healthy=healthy, ack=ack)
    state.assign(nodes("a", "b"), 1, ack_lease=0)
    reads = 0
    walk = state.usable_now()
    assert [walk(NodeName(n)) for n in "abcab"] == [True, True, False, True, True] and reads == 1
    health[0] = False
    assert walk(NodeName("a")) and reads == 1  # this pass's answer, as at its call
    assert not state.usable_now()(NodeName("a")) and not state.usable(NodeName("a"))


async def test_a_catch_up_that_fails_unexpectedly_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not an API error (``_catch_up`` retries those node by node): the nodes stay syncing, not forever."""
    monkeypatch.setattr(
        shard_module, "CATCH_UP_TIMEOUT", 0.0
    )  # the watch lags: each read is applied directly
    rig = Rig()
    pod = make_pod("x").on("a").record()
    watch = FakePodWatch(bound={"a": ([pod], 5), "b": ([], 0)})
    failures = [RuntimeError("a bug in applying the read")]
    applied = watch.apply_direct

    def apply_direct(pods: list[PodRecord]) -> None:
        if failures:
            raise failures.pop()
        applied(pods)

    monkeypatch.setattr(watch, "apply_direct", apply_direct)
    rig.state.start(pods=watch, on_release=None)
    rig.state.assign(nodes("a", "b"), 1, ack_lease=0)
    await settle()
    assert not failures and not rig.usable(["a", "b"]) and rig.state.syncing() == 2
    await asyncio.sleep(0.5)  # the first retry delay is 0.2 s
    assert rig.usable(["a", "b"]) == {"a", "b"} and watch.applied == [pod] and rig.state.syncing() == 0
    await rig.state.stop()
