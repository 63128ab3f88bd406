"""NodeShards (``shard.volcano.sh/v1alpha1``) as the coordinator sees and writes them.

``NodeShardStore`` is the watch handler of every NodeShard (cluster-scoped; a handful of objects) and the only
writer of them in this project:

- ``write_spec(name, nodes)`` creates the shard or merge-patches ``spec.nodesDesired`` (the sharding controller's
  half);
- ``write_status(name, ...)`` merge-patches the ``/status`` subresource (the scheduler's half; a plain update
  would drop status).

Bodies come from ``coordinator.nodeshards.bodies``. Writes skip when the stored object already says the same, and
update the local copy from the reply, so a write is visible to the next read at once, before its watch event arrives.

Writes to an existing shard are conditional: they carry the ``metadata.resourceVersion`` the decision was made
on (optimistic concurrency), so a write computed from a stale copy - a deposed leader's late status write that
would shrink ``nodesInUse``, or one racing another writer - fails with 409 instead of overwriting newer state.
On 409 the store re-reads the shard (listeners are told) and raises ``Conflict``; the caller recomputes from the
fresh copy on its next pass. Every failed write is counted by part and reason
(``agent_scheduler_coordinator_nodeshard_write_errors_total``, ``coordinator.metrics``).

Consistency: decisions use the watch cache, except where another scheduler's concurrent claim matters
(``confirm_in_use_except``, a quorum read after our own write).

Without the CRD (404 on the collection), or without permission to read it, interop is off: ``available`` is
False, the store is empty, nothing is written, and ``run`` probes again every ``PROBE_INTERVAL``. ``available``
turns True only once the first list is in, never on an empty store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from common.backoff import api_retry
from common.kube import ApiError, Conflict, KubeClient, NotFound, ServerError, TooManyRequests
from common.records import NodeName
from common.watching import Reflector
from coordinator.metrics import nodeshard_write_errors
from coordinator.nodeshards import bodies
from coordinator.nodeshards.bodies import NodeShard, NodeShardFormatError

log = logging.getLogger(__name__)

PROBE_INTERVAL = 30.0
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "agent-scheduler"


class NodeShardStore:
    """Local copy of all NodeShards plus their writes."""

    def __init__(
        self, client: KubeClient, *, clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    ) -> None:
        self._client = client
        self._clock = clock
        self.shards: dict[str, NodeShard] = {}
        self.available = False
        self.synced = asyncio.Event()
        """Set once the store is known: listed, or the CRD found missing."""
        self.listeners: list[Callable[[], None]] = []
        self.reflector = Reflector(client, bodies.COLLECTION_PATH, self, name="nodeshards")

    # ---- reading ----

    def holders(self, schedulers: Iterable[str]) -> dict[NodeName, str]:
        """Node -> the first of ``schedulers`` (in order) whose shard's ``spec.nodesDesired`` lists it."""
        out: dict[NodeName, str] = {}
        for name in schedulers:
            shard = self.shards.get(name)
            if shard is not None:
                for node in shard.nodes_desired:
                    out.setdefault(node, name)
        return out

    def in_use_except(self, name: str) -> frozenset[NodeName]:
        """Every node some *other* shard publishes in ``status.nodesInUse``."""
        used: set[NodeName] = set()
        for other, shard in self.shards.items():
            if other != name:
                used |= shard.nodes_in_use
        return frozenset(used)

    async def confirm_in_use_except(self, name: str) -> frozenset[NodeName]:
        """Like ``in_use_except``, from a consistent read of the API server rather than the watch cache.

        Read after our own claim was written, this closes the race with a scheduler that read our status just
        before that write: either it saw our claim, or we see its claim here. The store is refreshed with what
        was read (objects the watch already has in a later version are kept).
        """
        reply = await self._client.get(bodies.COLLECTION_PATH)
        for obj in reply.get("items") or ():
            shard = self._parse(obj)
            old = self.shards.get(shard.name) if shard is not None else None
            if shard is not None and not (
                old is not None and _newer(old.resource_version, shard.resource_version)
            ):
                self.shards[shard.name] = shard
        return self.in_use_except(name)

    # ---- WatchHandler ----

    def _parse(self, obj: Mapping[str, Any]) -> NodeShard | None:
        try:
            return bodies.parse_nodeshard(obj)
        except NodeShardFormatError as e:
            name = (obj.get("metadata") or {}).get("name")
            log.error("ignoring malformed NodeShard %s: %s", name, e)
            return None

    def _changed(self) -> None:
        for callback in self.listeners:
            callback()

    def replace(self, objects: list[dict[str, Any]]) -> None:
        fresh = {s.name: s for s in map(self._parse, objects) if s is not None}
        self.shards = fresh
        self._changed()

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            name = (obj.get("metadata") or {}).get("name")
            if self.shards.pop(str(name), None) is not None:
                self._changed()
            return
        shard = self._parse(obj)
        if shard is None:
            return
        old = self.shards.get(shard.name)
        if old is not None and old.resource_version and _newer(old.resource_version, shard.resource_version):
            return  # our own write's reply already applied a later version
        self.shards[shard.name] = shard
        self._changed()

    # ---- writing ----

    async def write_spec(self, name: str, nodes: Iterable[NodeName]) -> bool:
        """Make shard ``name`` desire exactly ``nodes``; True when a write happened."""
        with _counting_errors("spec"):
            return await self._write_spec(name, nodes)

    async def _write_spec(self, name: str, nodes: Iterable[NodeName]) -> bool:
        wanted = frozenset(nodes)
        if not self.available:
            return False
        shard = self.shards.get(name)
        if shard is not None and shard.nodes_desired == wanted:
            return False
        if shard is None:
            body = bodies.new_nodeshard(name, wanted, labels={MANAGED_BY_LABEL: MANAGED_BY})
            try:
                reply = await self._client.post(bodies.COLLECTION_PATH, body)
            except Conflict:
                reply = await self._client.patch(bodies.object_path(name), bodies.spec_patch(wanted))
        else:
            patch = bodies.spec_patch(wanted, resource_version=shard.resource_version or None)
            reply = await self._conditional(name, bodies.object_path(name), patch)
        self._apply_reply(reply)
        log.info("NodeShard %s: spec.nodesDesired = %d nodes", name, len(wanted))
        return True

    async def write_status(
        self,
        name: str,
        *,
        in_use: Iterable[NodeName],
        to_add: Iterable[NodeName],
        to_remove: Iterable[NodeName],
        first: bool = False,
    ) -> bool:
        """Publish shard ``name``'s status; True when a write happened (False also when the shard is missing).

        Skipped when the stored status already says the same, unless ``first`` (stamp ``lastUpdateTime`` once,
        so readers can tell "nothing in use" from "nobody publishes").
        """
        with _counting_errors("status"):
            return await self._write_status(
                name, frozenset(in_use), frozenset(to_add), frozenset(to_remove), first
            )

    async def _write_status(
        self,
        name: str,
        in_use: frozenset[NodeName],
        to_add: frozenset[NodeName],
        to_remove: frozenset[NodeName],
        first: bool,
    ) -> bool:
        shard = self.shards.get(name)
        if not self.available or shard is None:
            return False
        same = (shard.nodes_in_use, shard.nodes_to_add, shard.nodes_to_remove) == (in_use, to_add, to_remove)
        if same and not first:
            return False
        body = bodies.status_patch(
            nodes_in_use=in_use,
            nodes_to_add=to_add,
            nodes_to_remove=to_remove,
            now=self._clock(),
            resource_version=shard.resource_version or None,
        )
        reply = await self._conditional(name, bodies.status_path(name), body)
        self._apply_reply(reply)
        log.info(
            "NodeShard %s: status.nodesInUse = %d nodes (%d to add, %d to remove)",
            name,
            len(in_use),
            len(to_add),
            len(to_remove),
        )
        return True

    async def _conditional(self, name: str, path: str, body: Any) -> Any:
        """PATCH with a resourceVersion precondition; on 409 refresh the local copy, then re-raise."""
        try:
            return await self._client.patch(path, body)
        except Conflict:
            log.info("NodeShard %s changed since it was read; re-reading before the next write", name)
            try:
                fresh = await self._client.get(bodies.object_path(name))
            except NotFound:
                if self.shards.pop(name, None) is not None:
                    self._changed()
            else:
                if isinstance(fresh, dict):
                    self.event("MODIFIED", fresh)  # kept only if newer than what the watch delivered
            raise

    def _apply_reply(self, reply: Any) -> None:
        if isinstance(reply, dict):
            shard = self._parse(reply)
            if shard is not None:
                self.shards[shard.name] = shard

    # ---- running ----

    async def run(self) -> None:
        """Probe for the CRD, then list and watch; until cancelled."""
        backoff = api_retry()
        while True:
            try:
                await self._client.get(bodies.COLLECTION_PATH, {"limit": "1"})
                break
            except (ServerError, TooManyRequests) as e:
                log.warning("NodeShard probe failed (%s); retrying", e)
                await backoff.sleep()
                continue
            except NotFound:
                why = "the NodeShard CRD is not installed (manifests/crds/nodeshards.shard.volcano.sh.yaml)"
            except ApiError as e:
                why = f"NodeShards cannot be read ({e}; see manifests/rbac.yaml)"
            if not self.synced.is_set():
                log.warning(
                    "%s: running without NodeShard interop; probing again every %.0f s", why, PROBE_INTERVAL
                )
                self.synced.set()
            backoff.reset()
            await asyncio.sleep(PROBE_INTERVAL)
        watch = asyncio.create_task(self.reflector.run(), name="nodeshards")
        try:
            await self.reflector.synced.wait()
            self.available = (
                True  # only now: an empty store that is "available" would mean "nobody uses anything"
            )
            self.synced.set()
            self._changed()
            await watch
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)


def _newer(a: str, b: str) -> bool:
    """Whether resourceVersion ``a`` is later than ``b`` (numeric when both are; else never)."""
    return a.isdigit() and b.isdigit() and int(a) > int(b)


@contextlib.contextmanager
def _counting_errors(part: str) -> Iterator[None]:
    """Count a failed NodeShard write (``agent_scheduler_coordinator_nodeshard_write_errors_total``)."""
    try:
        yield
    except Conflict:
        nodeshard_write_errors.labels(part, "conflict").inc()
        raise
    except ApiError:
        nodeshard_write_errors.labels(part, "error").inc()
        raise
