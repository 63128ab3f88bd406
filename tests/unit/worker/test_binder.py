"""Binder outcomes for each answer of the binding POST, with a fake of the API client's ``post``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from common import aiotools
from common.kube import ApiError, Credentials, KubeClient, ServerError, _error_for
from common.records import NodeName, PodKey, PodRecord
from tests.builders import make_node, make_pod
from worker.binder import FENCE_MARGIN, MIN_ATTEMPT, Binder
from worker.cache import Cache
from worker.engine import Decision

NODE = NodeName("n1")
Reply = int | ApiError
HANG = 0  # a PATCH reply: none, ever


# A binding the API server applied although its client timed out (the reply never came back).
LANDED = ServerError(0, "POST binding: TimeoutError: (applied by the server)")


class FakeApi(KubeClient):
    """Answers each POST with the next scripted status (or raises the scripted error; ``LANDED`` binds the
    pod, then raises a timeout), and each GET of the pod with where the POSTs left it (``gone``: 404)."""

    def __init__(self, replies: list[Reply]) -> None:
        super().__init__(Credentials("http://127.0.0.1:9"))
        self.replies = list(replies)
        self.posts: list[tuple[str, Any]] = []
        self.bound_to = ""
        self.uid = ""
        self.gone = False
        self.reads = 0
        self.last_reply = asyncio.Event()  # the scripted replies have all been taken
        self.timeouts: list[float | None] = []  # each POST's deadline (``KubeClient`` sends it to the server)

    async def post(
        self, path: str, body: Any, params: dict[str, str] | None = None, *, timeout: float | None = None
    ) -> Any:
        self.posts.append((path, body))
        self.timeouts.append(timeout)
        reply = self.replies.pop(0)
        if not self.replies:
            self.last_reply.set()
        if reply is LANDED or reply == 201:
            self.bound_to = body["target"]["name"]
            self.uid = body["metadata"].get("uid", "")
        if isinstance(reply, ApiError):
            raise reply
        if reply >= 300:
            raise _error_for(reply, orjson.dumps({"reason": "Scripted", "message": f"status {reply}"}))
        return {"kind": "Status", "status": "Success"}

    async def get(self, path: str, params: dict[str, str] | None = None) -> Any:
        self.reads += 1
        name = path.rsplit("/", 1)[-1]
        if self.gone:
            raise _error_for(404, orjson.dumps({"reason": "NotFound", "message": "gone"}))
        uid = self.uid or (self.posts[-1][1]["metadata"].get("uid", "") if self.posts else "")
        return {"metadata": {"name": name, "uid": uid}, "spec": {"nodeName": self.bound_to}}


class Recorded:
    def __init__(self) -> None:
        self.bound: list[tuple[str, str]] = []
        self.unschedulable: list[str] = []
        self.rejected: list[tuple[str, str]] = []
        self.requeued: list[str] = []
        self.requeued_attempts: list[int] = []
        self.gone: list[str] = []
        self.waiting: list[tuple[str, str]] = []
        self.before_drain: list[str] = []  # pods requeued before the binder was drained (``provision_once``)

    def on_bound(self, pod: PodRecord, node: NodeName, *, assumed_at: float, bound_at: float) -> None:
        assert assumed_at <= bound_at
        self.bound.append((pod.key, node))

    def on_unschedulable(self, pod: PodRecord, decision: Decision) -> None:
        self.unschedulable.append(pod.key)

    def on_rejected(self, pod: PodRecord, message: str) -> None:
        self.rejected.append((pod.key, message))

    def on_gone(self, key: str, uid: str) -> None:
        self.gone.append(key)

    def on_waiting(self, pod: PodRecord, node: NodeName) -> None:
        self.waiting.append((pod.key, node))

    def requeue(self, pod: PodRecord, attempts: int) -> None:
        self.requeued.append(pod.key)
        self.requeued_attempts.append(attempts)


class Outcomes:
    """The ``worker.outcomes.Outcomes`` seam, recording into ``Recorded``."""

    def __init__(self, rec: Recorded) -> None:
        self.bound = rec.on_bound
        self.unschedulable = rec.on_unschedulable
        self.rejected = rec.on_rejected
        self.gone = rec.on_gone
        self.waiting = rec.on_waiting

    def retry(self, pod: PodRecord) -> bool:
        return True  # the binder gives a pod back through its ``requeue``, which the tests record


class FakeShard:
    """``ShardView.bind_deadline`` only: usable nodes and a fencing deadline on a fake clock."""

    def __init__(self, clock: list[float], *, usable: bool = True, deadline: float = float("inf")) -> None:
        self.clock = clock
        self.is_usable = usable
        self.deadline = deadline
        self.asked: list[float] = []

    def usable(self, node: NodeName) -> bool:
        return self.is_usable

    def usable_now(self) -> Callable[[NodeName], bool]:
        return self.usable

    def subscribe(self, callback: Any) -> Any:
        return lambda: None

    def syncing(self) -> int:
        return 0

    def bind_deadline(self, node: NodeName) -> float | None:
        self.asked.append(self.clock[0])
        return self.deadline if self.is_usable else None


async def bind_once(
    replies: list[Reply],
    *,
    retries: int = 2,
    shard: FakeShard | None = None,
    clock: list[float] | None = None,
    attempts: int = 1,
    requeue_rejected: bool = False,
    hold: float = 0.01,
    check_hold: bool = False,
    gone: bool = False,
) -> tuple[Cache, FakeApi, Recorded, Binder]:
    """Bind one pod through ``replies``. ``check_hold``: until ``hold`` has passed after the last attempt, the
    node stays in flight, the pod assumed (its capacity taken) and not handed back."""
    cache = Cache()
    cache.upsert_node(make_node(NODE).record())
    pod = make_pod("p").req(cpu="1").record()
    cache.assume(pod, NODE)
    api = FakeApi(replies)
    api.gone = gone
    rec = Recorded()
    now = clock if clock is not None else [0.0]
    binder = Binder(
        api,
        cache,
        Outcomes(rec),
        requeue=rec.requeue,
        shard=shard,
        requeue_rejected=requeue_rejected,
        retries=retries,
        concurrency=2,
        retry_backoff=0.001,
        clock=lambda: now[0],
        unanswered_hold=hold,
    )
    task = asyncio.create_task(binder.run())
    try:
        binder.submit(pod, NODE, queued_at=0.0, attempts=attempts)
        if check_hold:
            await asyncio.wait_for(api.last_reply.wait(), 5)
            await asyncio.sleep(hold / 3)
            assert binder.in_flight(NODE) == 1
            assert rec.requeued == [] and api.reads == 0
            assert "default/p" in cache.assumed and cache.nodes[NODE].requested.milli_cpu == 1000
        await asyncio.wait_for(binder.drain(), 5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()
    assert binder.in_flight() == 0
    return cache, api, rec, binder


async def test_201_is_bound_and_starts_the_assumption_ttl() -> None:
    cache, api, rec, binder = await bind_once([201])
    assert rec.bound == [("default/p", NODE)] and binder.bound == 1
    path, body = api.posts[0]
    assert path == "/api/v1/namespaces/default/pods/p/binding" and body["target"]["name"] == NODE
    assumed = cache.assumed[PodKey("default/p")]
    assert assumed.deadline is not None  # confirmed by the watch later, or expires
    assert not rec.rejected and not rec.requeued


async def test_404_forgets_the_pod() -> None:
    cache, api, rec, _ = await bind_once([404])
    assert not cache.assumed and not cache.pod_node
    assert cache.nodes[NODE].requested.milli_cpu == 0
    assert not rec.bound and not rec.rejected and not rec.requeued
    assert rec.gone == ["default/p"]  # no outcome follows: what is kept for one goes (worker.intake)
    assert len(api.posts) == 1


async def test_409_keeps_the_assumption_for_the_watch() -> None:
    cache, api, rec, _ = await bind_once([409])
    assert cache.is_assumed(PodKey("default/p"))
    assert cache.assumed[PodKey("default/p")].deadline is not None
    assert cache.nodes[NODE].requested.milli_cpu == 1000
    assert not rec.bound and not rec.rejected and not rec.requeued
    assert len(api.posts) == 1


@pytest.mark.parametrize("transient", [429, 500, 503])
async def test_transient_failure_is_retried_then_bound(transient: int) -> None:
    _, api, rec, _ = await bind_once([transient, transient, 201])
    assert rec.bound == [("default/p", NODE)] and len(api.posts) == 3


async def test_timeouts_retry_then_requeue() -> None:
    timeout = ServerError(0, "POST binding: TimeoutError: ")
    cache, api, rec, binder = await bind_once([timeout, timeout, timeout], retries=2)
    assert len(api.posts) == 3
    assert rec.requeued == ["default/p"] and not rec.bound and not rec.rejected
    assert not cache.assumed and cache.nodes[NODE].requested.milli_cpu == 0
    assert binder.bound == 0


async def test_server_errors_past_the_retries_requeue() -> None:
    cache, api, rec, _ = await bind_once([500, 502, 429], retries=2)
    assert rec.requeued == ["default/p"] and len(api.posts) == 3
    assert not cache.assumed


@pytest.mark.parametrize("status", [400, 403, 422])
async def test_other_errors_are_rejected_outcomes(status: int) -> None:
    cache, api, rec, _ = await bind_once([status])
    assert rec.rejected == [("default/p", f"binding rejected: status {status}")]
    assert not rec.bound and not rec.requeued and len(api.posts) == 1
    assert not cache.assumed and cache.nodes[NODE].requested.milli_cpu == 0


# ---- fencing: nothing is sent unless the node is usable and the lease's deadline leaves time ----


async def test_binding_to_a_node_no_longer_usable_is_not_sent_and_handed_back() -> None:
    shard = FakeShard([0.0], usable=False)
    cache, api, rec, binder = await bind_once([201], shard=shard)
    assert api.posts == []  # refused before sending
    assert rec.requeued == ["default/p"] and not rec.bound and not rec.rejected
    assert not cache.assumed and cache.nodes[NODE].requested.milli_cpu == 0  # forgotten, capacity back
    assert binder.fenced == 1


async def test_binding_too_close_to_the_fencing_deadline_is_not_sent() -> None:
    clock = [100.0]
    shard = FakeShard(clock, deadline=100.0 + FENCE_MARGIN + MIN_ATTEMPT / 2)
    cache, api, rec, binder = await bind_once([201], shard=shard, clock=clock)
    assert api.posts == [] and rec.requeued == ["default/p"] and binder.fenced == 1
    assert not cache.assumed


class SlowApi(FakeApi):
    """Never answers: the attempt's own deadline has to end it. The binder's fake clock advances by the real
    time the attempt took."""

    def __init__(self, clock: list[float]) -> None:
        super().__init__([])
        self.clock = clock

    async def post(
        self, path: str, body: Any, params: dict[str, str] | None = None, *, timeout: float | None = None
    ) -> Any:
        self.posts.append((path, body))
        start = time.monotonic()
        try:
            await asyncio.sleep(3600)
        finally:
            self.clock[0] += time.monotonic() - start


async def test_each_attempt_is_given_until_just_before_the_fencing_deadline() -> None:
    clock = [100.0]
    shard = FakeShard(clock, deadline=101.0)
    api = FakeApi([])
    binder = Binder(api, Cache(), Outcomes(Recorded()), requeue=lambda pod, attempts: None, shard=shard)
    binder.clock = lambda: clock[0]
    assert binder.budget(NODE) == pytest.approx(1.0 - FENCE_MARGIN)  # ends FENCE_MARGIN before it
    clock[0] = 100.5
    assert binder.budget(NODE) == pytest.approx(0.5 - FENCE_MARGIN)
    shard.deadline = 1000.0
    assert binder.budget(NODE) == binder.attempt_timeout  # a far deadline: the attempt timeout rules
    shard.is_usable = False
    assert binder.budget(NODE) == 0.0  # not usable: nothing may be sent
    await api.close()


async def test_an_attempt_cut_at_the_fencing_deadline_is_not_retried_and_the_binding_is_dropped() -> None:
    clock = [100.0]
    shard = FakeShard(clock, deadline=100.0 + FENCE_MARGIN + 0.2)  # 0.2 s to send and get an answer
    cache = Cache()
    cache.upsert_node(make_node(NODE).record())
    pod = make_pod("p").req(cpu="1").record()
    cache.assume(pod, NODE)
    api = SlowApi(clock)
    rec = Recorded()
    binder = Binder(
        api,
        cache,
        Outcomes(rec),
        requeue=rec.requeue,
        shard=shard,
        retries=5,
        retry_backoff=0.001,
        clock=lambda: clock[0],
        unanswered_hold=0.01,
    )
    task = asyncio.create_task(binder.run())
    try:
        binder.submit(pod, NODE, queued_at=0.0, attempts=1)
        await asyncio.wait_for(binder.drain(), 5)  # hang guard
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()
    # The first attempt ran out of time at the deadline; no later attempt was sent, since too little time
    # was left; the binding was forgotten and the pod handed back.
    assert len(api.posts) == 1
    assert rec.requeued == ["default/p"] and not rec.bound
    assert not cache.assumed and binder.fenced == 1


async def test_an_unanswered_attempt_keeps_its_node_in_flight_for_the_hold() -> None:
    timeout = ServerError(0, "POST binding: TimeoutError: ")
    _, api, rec, _ = await bind_once([timeout, 201], hold=0.3, check_hold=True)
    # The retry bound it: nothing waited for but the hold, which a release of the node respects.
    assert rec.bound == [("default/p", NODE)] and api.reads == 0


@pytest.mark.parametrize("landed_at", [0, 1, 2])
async def test_a_failed_binding_that_landed_unanswered_keeps_its_capacity(landed_at: int) -> None:
    """Every attempt timed out, but one of them was applied by the API server: the pod is bound to the node.
    Forgetting the assumption would give the node's capacity back to this worker's next decisions while the
    pod sits there (an overcommitted node). It stays assumed through the hold, and the read after it keeps
    it (the watch confirms it), without handing the pod back."""
    timeout = ServerError(0, "POST binding: TimeoutError: ")
    replies: list[Reply] = [timeout, timeout, timeout]
    replies[landed_at] = LANDED
    if landed_at < 2:
        replies[landed_at + 1 :] = [409] * (2 - landed_at)  # a retry after it landed: already bound
        replies[landed_at + 1] = timeout
    cache, api, rec, _ = await bind_once(replies, retries=2, hold=0.3, check_hold=True)
    assert api.bound_to == NODE
    assert rec.requeued == [] and not rec.bound
    assert (
        cache.assumed[PodKey("default/p")].deadline is not None
    )  # kept with its TTL running, as after a 409
    assert cache.nodes[NODE].requested.milli_cpu == 1000


async def test_a_failed_unanswered_binding_that_did_not_land_is_handed_back_after_the_hold() -> None:
    timeout = ServerError(0, "POST binding: TimeoutError: ")
    cache, api, rec, _ = await bind_once([timeout, timeout], retries=1, hold=0.3, check_hold=True)
    assert api.reads == 1 and rec.requeued == ["default/p"] and rec.requeued_attempts == [1]
    assert not cache.assumed and cache.nodes[NODE].requested.milli_cpu == 0


async def test_a_failed_unanswered_binding_of_a_deleted_pod_is_forgotten() -> None:
    api_gone = ServerError(504, "Timeout: request did not complete within requested timeout")
    cache, api, rec, _ = await bind_once([api_gone], retries=0, gone=True)
    assert api.reads == 1 and rec.requeued == [] and not cache.assumed
    assert rec.gone == ["default/p"]
    assert cache.nodes[NODE].requested.milli_cpu == 0


async def test_an_answered_server_error_is_also_settled_by_a_read() -> None:
    """A 5xx may come after the API server's storage write went through (its own timeout, 504): settled by a
    read like an unanswered attempt."""
    cache, api, rec, _ = await bind_once([500, 500], retries=1)
    assert api.reads == 1 and rec.requeued == ["default/p"] and not cache.assumed


async def test_the_binding_post_carries_its_deadline_for_the_api_server() -> None:
    _, api, _, _ = await bind_once([201])
    assert api.timeouts == [30.0]  # ATTEMPT_TIMEOUT: no fencing deadline closer on this shard


async def test_the_binding_deadline_is_cut_to_the_fencing_deadline() -> None:
    _, api, _, _ = await bind_once([201], shard=FakeShard([0.0], deadline=2.0))
    assert api.timeouts == [pytest.approx(2.0 - FENCE_MARGIN)]


async def test_retries_use_the_shared_backoff_and_check_the_shard_before_each_attempt() -> None:
    shard = FakeShard([0.0])
    _, api, rec, _ = await bind_once([500, 503, 201], shard=shard)
    assert rec.bound == [("default/p", NODE)] and len(api.posts) == 3
    assert len(shard.asked) == 3  # one check per attempt, immediately before it


async def test_a_requeued_pod_keeps_its_attempts_for_the_queues_backoff() -> None:
    _, _, rec, _ = await bind_once([500, 500, 500], retries=2, attempts=3)
    assert rec.requeued == ["default/p"] and rec.requeued_attempts == [3]


@pytest.mark.parametrize("status", [403, 422])
async def test_a_refused_binding_is_requeued_too_when_no_leader_retries_it(status: int) -> None:
    """Standalone: reported on the pod and back to the queue with its attempts, as kube-scheduler does."""
    cache, api, rec, _ = await bind_once([status], attempts=4, requeue_rejected=True)
    assert rec.rejected == [("default/p", f"binding rejected: status {status}")]
    assert rec.requeued == ["default/p"] and rec.requeued_attempts == [4]
    assert len(api.posts) == 1 and not cache.assumed and cache.nodes[NODE].requested.milli_cpu == 0


# ----- claims first (kube's PreBind) ------------------------------------------------------------------------------


class VolumeApi(FakeApi):
    """Also answers PATCHes (claims, PVs) with the next scripted status; records them."""

    def __init__(self, replies: list[Reply], patch_replies: list[Reply]) -> None:
        super().__init__(replies)
        self.patch_replies = list(patch_replies)
        self.patches: list[tuple[str, Any]] = []

    async def patch(self, path: str, body: Any, *, kind: str = "merge", timeout: float | None = None) -> Any:
        self.patches.append((path, body))
        self.timeouts.append(timeout)
        reply = self.patch_replies.pop(0)
        if reply == HANG:
            await asyncio.Event().wait()  # never answered; only the caller's deadline ends it
        if isinstance(reply, ApiError):
            raise reply
        if reply >= 300:
            raise _error_for(reply, orjson.dumps({"reason": "Scripted", "message": f"status {reply}"}))
        return {}


def _claim(annotations: dict[str, str] | None = None, volume: str = "") -> dict[str, Any]:
    return {
        "metadata": {
            "name": "data",
            "namespace": "default",
            "uid": "u1",
            "resourceVersion": "7",
            "annotations": annotations or {},
        },
        "spec": {
            "storageClassName": "wffc",
            "volumeName": volume,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


async def provision_once(
    patch_replies: list[Reply], *, then: list[dict[str, Any]], shard: FakeShard | None = None
) -> tuple[Cache, VolumeApi, Recorded, Binder]:
    """A pod with one WaitForFirstConsumer claim to provision on NODE; after the patch, ``then`` (claims and
    PVs, as the watch would deliver them) is applied to the store one by one."""
    cache = Cache()
    cache.upsert_node(make_node(NODE).record())
    store = cache.volumes
    store.upsert(
        "classes",
        {
            "metadata": {"name": "wffc"},
            "provisioner": "p.example",
            "volumeBindingMode": "WaitForFirstConsumer",
        },
    )
    store.upsert("claims", _claim())
    b = make_pod("p").req(cpu="1")
    b.spec["volumes"] = [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]
    pod = b.record()
    claims = store.pod_claims("default", "p", "", pod.claims)
    plan, reasons = store.find_pod_volumes(claims, NODE, {})
    assert plan is not None and not reasons and [c.name for c in plan.provision] == ["data"]
    cache.assume(pod, NODE)
    store.assume(plan)
    api = VolumeApi([201], patch_replies)
    rec = Recorded()
    binder = Binder(
        api,
        cache,
        Outcomes(rec),
        requeue=rec.requeue,
        shard=shard,
        concurrency=1,
        volume_bind_timeout=5.0,
        clock=time.monotonic if shard is None else lambda: shard.clock[0],
    )
    task = asyncio.create_task(binder.run())
    try:
        binder.submit(pod, NODE, queued_at=0.0, attempts=1, volumes=plan)
        for update in then:
            await asyncio.sleep(0.01)
            store.upsert("volumes" if "capacity" in update.get("spec", {}) else "claims", update)
        for _ in range(500):
            if rec.bound or rec.requeued:
                break
            await asyncio.sleep(0.01)
        rec.before_drain = list(rec.requeued)  # a drain cancels a volume binding under way
        await asyncio.wait_for(binder.drain(), 5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()
    return cache, api, rec, binder


PV = {
    "metadata": {"name": "pv-1", "resourceVersion": "9"},
    "spec": {
        "capacity": {"storage": "1Gi"},
        "storageClassName": "wffc",
        "claimRef": {"namespace": "default", "name": "data"},
    },
    "status": {"phase": "Bound"},
}


async def test_claim_annotated_under_its_resource_version_and_pod_bound_after_the_claim() -> None:
    annotated = _claim({"volume.kubernetes.io/selected-node": NODE})
    bound = _claim(
        {"volume.kubernetes.io/selected-node": NODE, "pv.kubernetes.io/bind-completed": "yes"}, volume="pv-1"
    )
    _, api, rec, _ = await provision_once([200], then=[annotated, PV, bound])
    path, body = api.patches[0]
    assert path == "/api/v1/namespaces/default/persistentvolumeclaims/data"
    assert body["metadata"] == {
        "resourceVersion": "7",
        "annotations": {"volume.kubernetes.io/selected-node": NODE},
    }
    assert rec.bound == [("default/p", NODE)] and len(api.posts) == 1  # the pod's binding, after the claim


async def test_conflicting_claim_write_reschedules_without_binding() -> None:
    cache, api, rec, _ = await provision_once([409], then=[])
    assert rec.requeued == ["default/p"] and not rec.bound and not api.posts
    assert not cache.assumed  # capacity back
    assert cache.volumes.claims["default/data"].selected_node is None  # the volume assumption reverted


async def test_provisioning_undone_reschedules() -> None:
    annotated = _claim({"volume.kubernetes.io/selected-node": NODE})
    cleared = _claim()  # the provisioner gave up on this node: annotation removed
    cleared["metadata"]["resourceVersion"] = "8"
    _, api, rec, _ = await provision_once([200], then=[annotated, cleared])
    assert rec.requeued == ["default/p"] and not rec.bound and not api.posts


class HolderApi(VolumeApi):
    """Also answers GETs of pods: ``alive`` holds the pods that exist."""

    def __init__(self, patch_replies: list[Reply], alive: dict[str, str]) -> None:
        super().__init__([201], patch_replies)
        self.alive = alive
        self.on_get: Callable[[], None] = lambda: None

    async def get(self, path: str, params: dict[str, str] | None = None) -> Any:
        self.on_get()
        name = path.rsplit("/", 1)[-1]
        if name not in self.alive:
            raise _error_for(404, orjson.dumps({"reason": "NotFound", "message": "gone"}))
        return {"metadata": {"name": name, "uid": self.alive[name]}, "status": {"phase": "Running"}}


async def exclusive_once(
    patch_replies: list[Reply],
    *,
    holder: str = "",
    alive: dict[str, str] | None = None,
    shard: FakeShard | None = None,
    on_get: Callable[[], None] | None = None,
) -> tuple[HolderApi, Recorded]:
    cache = Cache()
    cache.upsert_node(make_node(NODE).record())
    store = cache.volumes
    annotations = {"pv.kubernetes.io/bind-completed": "yes"}
    if holder:
        annotations["agent-scheduler.io/read-write-once-pod"] = holder
    solo = _claim(annotations, volume="pv-1")
    solo["spec"]["accessModes"] = ["ReadWriteOncePod"]
    store.upsert("claims", solo)
    store.upsert("volumes", PV)
    b = make_pod("p").req(cpu="1")
    b.spec["volumes"] = [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]
    pod = b.record()
    plan, _ = store.find_pod_volumes(store.pod_claims("default", "p", "", pod.claims), NODE, {})
    assert plan is not None and plan.all_bound and [c.name for c in plan.exclusive] == ["data"]
    cache.assume(pod, NODE)
    api = HolderApi(patch_replies, alive or {})
    if on_get is not None:
        api.on_get = on_get
    rec = Recorded()
    binder = Binder(api, cache, Outcomes(rec), requeue=rec.requeue, shard=shard, concurrency=1)
    task = asyncio.create_task(binder.run())
    try:
        binder.submit(pod, NODE, queued_at=0.0, attempts=1, volumes=plan)
        for _ in range(500):
            if rec.bound or rec.requeued:
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()
    return api, rec


async def test_read_write_once_pod_claim_is_taken_under_its_resource_version_before_binding() -> None:
    api, rec = await exclusive_once([200], holder="default/old/u-old")  # the old holder is gone
    assert api.patches == [
        (
            "/api/v1/namespaces/default/persistentvolumeclaims/data",
            {
                "metadata": {
                    "resourceVersion": "7",
                    "annotations": {"agent-scheduler.io/read-write-once-pod": "default/p/"},
                }
            },
        )
    ]
    assert rec.bound == [("default/p", NODE)]


async def test_read_write_once_pod_claim_taken_by_another_worker_reschedules() -> None:
    api, rec = await exclusive_once([409])
    assert rec.requeued == ["default/p"] and not rec.bound and not api.posts


async def test_read_write_once_pod_claim_held_by_a_live_pod_reschedules_without_writing() -> None:
    api, rec = await exclusive_once([], holder="default/other/u2", alive={"other": "u2"})
    assert rec.requeued == ["default/p"] and not api.patches and not api.posts


async def test_volume_writes_carry_the_node_budget_as_their_deadline() -> None:
    annotated = _claim({"volume.kubernetes.io/selected-node": NODE})
    bound = _claim(
        {"volume.kubernetes.io/selected-node": NODE, "pv.kubernetes.io/bind-completed": "yes"}, volume="pv-1"
    )
    shard = FakeShard([0.0], deadline=2.0)
    _, api, rec, _ = await provision_once([200], then=[annotated, PV, bound], shard=shard)
    assert rec.bound == [("default/p", NODE)]
    assert api.timeouts == [pytest.approx(2.0 - FENCE_MARGIN)] * 2  # the claim's PATCH, then the binding
    assert len(shard.asked) == 2  # one check before each write


async def test_a_volume_write_ends_within_the_node_budget() -> None:
    shard = FakeShard([0.0], deadline=FENCE_MARGIN + 0.2)  # 0.2 s to send and get an answer
    cache, api, rec, _ = await provision_once([HANG], then=[], shard=shard)
    assert len(api.patches) == 1 and not api.posts
    assert rec.before_drain == ["default/p"]  # given up at its deadline, not when the binder was drained
    assert not cache.assumed


async def test_no_volume_write_on_a_node_no_longer_usable() -> None:
    cache, api, rec, binder = await provision_once([], then=[], shard=FakeShard([0.0], usable=False))
    assert not api.patches and not api.posts and binder.fenced == 1
    assert rec.requeued == ["default/p"] and not cache.assumed
    assert cache.volumes.claims["default/data"].selected_node is None  # the volume assumption reverted


async def test_a_volume_write_is_fenced_when_the_node_is_lost_during_an_earlier_await() -> None:
    """The claim's last holder is read first (an await): the lease lapsing meanwhile stops the write that
    would have followed, although the node was usable when the volume binding began."""
    shard = FakeShard([0.0])

    def lapse() -> None:
        shard.is_usable = False

    api, rec = await exclusive_once([200], holder="default/old/u-old", shard=shard, on_get=lapse)
    assert shard.asked  # it was asked, after the read
    assert not api.patches and not api.posts and rec.requeued == ["default/p"]


async def test_a_pod_with_inter_pod_rules_is_bound_after_every_earlier_binding() -> None:
    """Its decision counted the pods assumed before it: their bindings must land first (``worker.binder``)."""
    rec = Recorded()
    api = FakeApi([201, 201, 201])
    cache = Cache()
    cache.upsert_node(make_node(NODE).record())
    binder = Binder(api, cache, Outcomes(rec), requeue=rec.requeue, concurrency=4, clock=lambda: 0.0)
    slow = make_pod("slow").req(cpu="1").record()
    lane = make_pod("lane").req(cpu="1").spread("zone", {"a": "b"}).record()
    plain = make_pod("plain").req(cpu="1").record()
    for pod in (slow, lane, plain):
        cache.assume(pod, NODE)
        binder.submit(pod, NODE, queued_at=0.0, attempts=1)
    release = asyncio.Event()
    sent: list[str] = []
    bind = binder._bind

    async def held(req: Any) -> None:
        sent.append(req.pod.name)
        if req.pod.name == "slow":
            await release.wait()
        await bind(req)

    binder._bind = held  # type: ignore[method-assign]
    task = asyncio.create_task(binder.run())
    try:
        for _ in range(20):
            await asyncio.sleep(0)
        assert sent == ["slow", "plain"]  # the lane pod waits for "slow"; the later plain pod does not
        release.set()
        await asyncio.wait_for(binder.drain(), 5)
        assert sent == ["slow", "plain", "lane"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()


async def test_each_binding_submitted_pokes_the_pacer(monkeypatch: pytest.MonkeyPatch) -> None:
    pokes: list[int] = []
    cache = Cache()
    cache.upsert_node(make_node(NODE).record())
    rec = Recorded()
    api = FakeApi([])
    binder = Binder(api, cache, Outcomes(rec), requeue=rec.requeue)
    monkeypatch.setattr(aiotools, "PACER", SimpleNamespace(poke=lambda: pokes.append(binder._queue.qsize())))
    for name in ("a", "b"):
        binder.submit(make_pod(name).record(), NODE, queued_at=0.0, attempts=1)
    await api.close()
    assert pokes == [1, 2]  # after the binding is queued: the pacer sees it


async def test_bindings_waiting_for_a_binding_task_count_in_the_pacers_backlog_while_the_binder_runs() -> (
    None
):
    cache = Cache()
    cache.upsert_node(make_node(NODE).record())
    api = FakeApi([201, 201, 201])
    rec = Recorded()
    binder = Binder(api, cache, Outcomes(rec), requeue=rec.requeue, concurrency=1)
    before = aiotools.PACER.backlog()
    task = asyncio.create_task(binder.run())
    try:
        await asyncio.sleep(0)
        for name in ("a", "b", "c"):
            pod = make_pod(name).req(cpu="1").record()
            cache.assume(pod, NODE)
            binder.submit(pod, NODE, queued_at=0.0, attempts=1)
        assert aiotools.PACER.backlog() == before + 3  # none taken by the binding task yet
        await asyncio.wait_for(binder.drain(), 5)
        assert aiotools.PACER.backlog() == before and len(rec.bound) == 3
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()
    binder.submit(make_pod("d").record(), NODE, queued_at=0.0, attempts=1)
    assert aiotools.PACER.backlog() == before  # a binder that no longer runs is not counted
