"""``common.aiotools.run``: a process's coroutine runs to completion on the event loop it names."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from common import aiotools


async def _is_uvloop() -> bool:
    await asyncio.sleep(0)
    return isinstance(asyncio.get_running_loop(), uvloop.Loop)


def test_run_uses_the_loop_named() -> None:
    assert aiotools.run(_is_uvloop(), "uvloop") is True
    assert aiotools.run(_is_uvloop(), "asyncio") is False


def test_run_returns_what_main_returns_and_raises_what_it_raises() -> None:
    async def fails() -> None:
        raise LookupError("from main")

    for kind in aiotools.EVENT_LOOPS:
        with pytest.raises(LookupError, match="from main"):
            aiotools.run(fails(), kind)
