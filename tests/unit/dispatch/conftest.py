from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from common.kube import Credentials, KubeClient
from tests.unit.dispatch.fakes import Rig


@pytest_asyncio.fixture
async def rig() -> AsyncIterator[Rig]:
    # the pending-pods reflector needs a client; it never runs in these tests
    client = KubeClient(Credentials(server="http://127.0.0.1:9"))
    try:
        yield Rig(client)
    finally:
        await client.close()
