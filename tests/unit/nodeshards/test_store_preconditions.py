"""``NodeShardStore`` writes carry the resourceVersion they were computed from: a write made from a stale copy
(a deposed leader's late status write) is refused with 409 and cannot shrink ``nodesInUse``; the store re-reads
and the next write, from the fresh copy, goes through."""

from __future__ import annotations

from typing import Any

import pytest

from common.kube import Conflict, NotFound
from coordinator.nodeshards.bodies import COLLECTION_PATH, new_nodeshard
from coordinator.nodeshards.store import NodeShardStore
from tests.unit.nodeshards.helpers import ns


class StrictApi:
    """NodeShards in a dict; a PATCH whose ``metadata.resourceVersion`` is not the stored one gets 409."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.rv = 10
        self.patches: list[dict[str, Any]] = []

    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[obj["metadata"]["name"]] = obj
        return obj

    async def patch(self, path: str, body: Any, *, kind: str = "merge") -> Any:
        self.patches.append(body)
        name = path.removeprefix(COLLECTION_PATH + "/").removesuffix("/status")
        obj = self.objects[name]
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != obj["metadata"]["resourceVersion"]:
            raise Conflict(409, "the object has been modified", "Conflict")
        for key in ("spec", "status"):
            if key in body:
                obj[key] = {**(obj.get(key) or {}), **body[key]}
        return self.put({**obj, "metadata": dict(obj["metadata"])})

    async def get(self, path: str, params: Any = None) -> Any:
        name = path.removeprefix(COLLECTION_PATH + "/")
        if name not in self.objects:
            raise NotFound(404, "gone")
        return {**self.objects[name], "metadata": dict(self.objects[name]["metadata"])}


def store_with(api: StrictApi, name: str = "agent") -> NodeShardStore:
    store = NodeShardStore(api)  # type: ignore[arg-type]
    store.available = True
    obj = api.put(dict(new_nodeshard(name, ["n1", "n2", "n3"])))
    store.replace([{**obj, "metadata": dict(obj["metadata"])}])
    return store


async def test_status_writes_carry_the_resource_version_they_were_computed_from() -> None:
    api = StrictApi()
    store = store_with(api)
    rv = store.shards["agent"].resource_version
    assert await store.write_status("agent", in_use=ns("n1"), to_add=(), to_remove=())
    assert api.patches[-1]["metadata"] == {"resourceVersion": rv}
    assert store.shards["agent"].nodes_in_use == ns("n1")


async def test_a_deposed_leaders_late_write_cannot_shrink_nodes_in_use() -> None:
    api = StrictApi()
    old_leader, new_leader = store_with(api), NodeShardStore(api)  # type: ignore[arg-type]
    new_leader.available = True
    new_leader.replace([await api.get(f"{COLLECTION_PATH}/agent")])
    # The new leader publishes a bigger claim; the old one, still holding its earlier copy, writes late.
    assert await new_leader.write_status("agent", in_use=ns("n1", "n2", "n3"), to_add=(), to_remove=())
    changed: list[int] = []
    old_leader.listeners.append(lambda: changed.append(1))
    with pytest.raises(Conflict):
        await old_leader.write_status("agent", in_use=ns("n1"), to_add=(), to_remove=())
    assert api.objects["agent"]["status"]["nodesInUse"] == ["n1", "n2", "n3"]
    # The refused writer re-read the shard and told its listeners, so its next pass starts from the truth.
    assert old_leader.shards["agent"].nodes_in_use == ns("n1", "n2", "n3") and changed
    assert await old_leader.write_status("agent", in_use=ns("n1", "n2", "n3", "n4"), to_add=(), to_remove=())
    assert api.objects["agent"]["status"]["nodesInUse"] == ["n1", "n2", "n3", "n4"]


async def test_spec_writes_are_conditional_too() -> None:
    api = StrictApi()
    store = store_with(api)
    api.put(api.objects["agent"])  # someone else wrote meanwhile
    with pytest.raises(Conflict):
        await store.write_spec("agent", ns("n1"))
    assert await store.write_spec("agent", ns("n1"))
    assert api.objects["agent"]["spec"]["nodesDesired"] == ["n1"]


async def test_a_shard_deleted_meanwhile_is_dropped_from_the_store() -> None:
    api = StrictApi()
    store = store_with(api)
    api.put(api.objects["agent"])
    stale = store.shards["agent"]
    api.objects.clear()
    api.objects["agent"] = {"metadata": {"name": "agent", "resourceVersion": "999"}}

    async def gone(path: str, params: Any = None) -> Any:
        raise NotFound(404, "gone")

    api.get = gone  # type: ignore[method-assign]
    with pytest.raises(Conflict):
        await store.write_status("agent", in_use=ns("n9"), to_add=(), to_remove=())
    assert "agent" not in store.shards and stale.resource_version
