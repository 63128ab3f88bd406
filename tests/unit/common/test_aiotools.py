"""``common.aiotools.run``: a process's coroutine runs to completion on the event loop it names."""

from __future__ import annotations

import asyncio
import selectors
import socket

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


async def _selector_kind() -> type:
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    assert isinstance(loop, asyncio.SelectorEventLoop)
    return type(loop._selector)  # type: ignore[attr-defined]


def test_the_paced_loop_is_the_standard_loop_on_a_paced_selector() -> None:
    assert aiotools.run(_selector_kind(), "paced") is aiotools.PacedSelector


class _Clock:
    """A clock that moves only when the selector sleeps, or when the test moves it."""

    def __init__(self) -> None:
        self.now = 10.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 6))
        self.now += seconds + self.oversleep

    oversleep = 0.0  # a real sleep returns late


def test_a_poll_that_would_block_comes_no_sooner_than_the_pace_after_the_last() -> None:
    clock = _Clock()
    a, b = socket.socketpair()
    with a, b, aiotools.PacedSelector(0.005, clock=clock, sleep=clock.sleep) as sel:
        sel.register(a, selectors.EVENT_READ)
        b.send(b"x")
        assert [k.fileobj for k, _ in sel.select(None)] == [a]  # the first poll: nothing to wait for
        assert clock.slept == []
        clock.now += 0.001
        # busy within the pace: the next poll that would block waits for the rest of it, then reads
        assert [k.fileobj for k, _ in sel.select(None)] == [a]
        assert clock.slept == [0.004]
        clock.now += 0.010
        sel.select(1.0)  # idle for longer than the pace: at once
        assert clock.slept == [0.004]


def test_ready_callbacks_and_timers_keep_their_times() -> None:
    clock = _Clock()
    with aiotools.PacedSelector(0.005, clock=clock, sleep=clock.sleep) as sel:
        sel.select(0)
        sel.select(0)  # callbacks ready: the loop only collects what is there, never waits
        assert clock.slept == []
        clock.now += 0.001
        sel.select(0.002)  # a timer due in 2 ms: the wait stops there, and the poll does not block
        assert clock.slept == [0.002]
        assert clock.now == pytest.approx(10.003)
        sel.select(-0.001)  # a timer overdue: no wait
        assert clock.slept == [0.002]


def test_a_timer_due_after_the_pace_waits_only_what_is_left_of_it() -> None:
    polled: list[float | None] = []

    class Polls(selectors.DefaultSelector):
        """Below the paced selector: records the timeout of each poll, and polls without waiting."""

        def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
            polled.append(timeout)
            return super().select(0)

    class Recorded(aiotools.PacedSelector, Polls):
        pass

    clock = _Clock()
    clock.oversleep = 0.001
    with Recorded(0.005, clock=clock, sleep=clock.sleep) as sel:
        sel.select(0)
        clock.now += 0.001
        sel.select(0.010)  # 4 ms of the pace left, the timer due in 10 ms
    assert clock.slept == [0.004]
    # the sleep returned 1 ms late: the poll waits only for what is left until the timer, not 6 ms more
    assert polled == [0, pytest.approx(0.005)]
