from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from common.kube import Credentials, KubeClient
from tests.unit.dispatch.fakes import Rig


@pytest_asyncio.fixture
async def client() -> AsyncIterator[KubeClient]:
    """The client a ``Rig`` needs for its pending-pods reflector, which never runs in these tests."""
    kube = KubeClient(Credentials(server="http://127.0.0.1:9"))
    try:
        yield kube
    finally:
        await kube.close()


@pytest_asyncio.fixture
async def rig(client: KubeClient) -> Rig:
    return Rig(client)
