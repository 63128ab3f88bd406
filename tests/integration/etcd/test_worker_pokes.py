"""A coordinated worker's capacity check at rest waits for a poke (``worker.intake.Intake.poke``): the wiring of
``CoordinatedWorker`` pokes it when the election changes and when its shard is looked at again, on a real etcd."""

from __future__ import annotations

import asyncio

import pytest
from etcd3aio import Etcd3Client

from common.etcd.keys import KeyLayout
from common.etcd.kv import kv_service
from common.kube import Credentials, KubeClient
from tests.integration.etcd.etcd_harness import eventually
from worker.coordinated import CoordinatedOptions, CoordinatedWorker
from worker.intake import Intake
from worker.settings import WorkerSettings


async def test_the_election_and_the_shard_poke_the_capacity_check(
    etcd: Etcd3Client, etcd_endpoint: str, keys: KeyLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    pokes = [0]

    def poke(self: Intake) -> None:
        pokes[0] += 1

    monkeypatch.setattr(Intake, "poke", poke)  # before the worker is built: its wiring binds this
    options = CoordinatedOptions(etcd_endpoints=[etcd_endpoint], etcd_prefix=keys.prefix, lease_ttl=5)
    client = KubeClient(Credentials("http://127.0.0.1:9"))  # never called: nothing here reads the cluster
    worker = CoordinatedWorker(WorkerSettings(worker_id="w-poke"), options, client, etcd)
    mirror = asyncio.create_task(worker.election.run())
    try:
        await asyncio.wait_for(worker.election.synced.wait(), 10)
        await asyncio.sleep(0.2)
        before = pokes[0]
        await kv_service(etcd).put(f"{keys.election_prefix}0000000000000001", b"x")
        await eventually(lambda: pokes[0] > before, 10, "a poke for the election's change")

        before = pokes[0]
        await worker.shard.start()  # registers; the lease turning healthy re-evaluates the shard
        await eventually(lambda: pokes[0] > before, 10, "a poke for the shard's re-evaluation")
    finally:
        mirror.cancel()
        await asyncio.gather(mirror, return_exceptions=True)
        await worker.shard.close()
        worker.listener.close()
        await client.close()
