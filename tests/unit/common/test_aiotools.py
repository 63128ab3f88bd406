"""``common.aiotools.run``: a process's coroutine runs to completion on the event loop it names."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable

import pytest
import uvloop
from prometheus_client import REGISTRY

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


def test_run_attaches_the_pacer_for_the_run_only() -> None:
    async def attached() -> tuple[object, float]:
        return aiotools.PACER._loop, aiotools.PACER.pace

    for kind in aiotools.EVENT_LOOPS:
        loop, pace = aiotools.run(attached(), kind, pace_ms=5)
        assert loop is not None and pace == 0.005
        assert aiotools.PACER._loop is None  # detached when the run ends
        assert aiotools.run(attached(), kind, pace_ms=0) == (None, 0.0)  # 0: never paced


def test_pace_is_a_usage_error_outside_0_to_20_ms() -> None:
    p = argparse.ArgumentParser()
    aiotools.add_pace_argument(p)
    assert p.parse_args([]).pace == aiotools.PACE * 1000
    assert p.parse_args(["--pace", "0"]).pace == 0
    assert p.parse_args(["--pace", "12.5"]).pace == 12.5
    assert p.parse_args(["--pace", "20"]).pace == 20
    for bad in ("-1", "21", "soon", "nan", "inf"):
        with pytest.raises(SystemExit) as e:
            p.parse_args(["--pace", bad])
        assert e.value.code == 2
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ValueError, match="0 \\(off\\) to"):
            aiotools.Pacer().attach(loop, 0.021)
    finally:
        loop.close()


class _Clock:
    """A clock that moves only when the pacer sleeps, or when a callback says it worked."""

    def __init__(self) -> None:
        self.now = 10.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    oversleep = 0.0

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 6))
        self.now += seconds + self.oversleep


def _pacer(clock: _Clock, backlog: list[int]) -> aiotools.Pacer:
    pacer = aiotools.Pacer(min_backlog=32, clock=clock, sleep=clock.sleep)
    pacer._sources.append(lambda: backlog[0])
    return pacer


def _paced(clock: _Clock, backlog: list[int]) -> aiotools.Pacer:
    """A pacer attached to the running loop at 5 ms and poked once: armed when ``backlog`` reaches 32."""
    pacer = _pacer(clock, backlog)
    pacer.attach(asyncio.get_running_loop(), 0.005)
    pacer.poke()
    return pacer


async def _passes(n: int, work: Callable[[], None] = lambda: None) -> None:
    for _ in range(n):
        work()
        await asyncio.sleep(0)


async def test_below_the_backlog_the_loop_is_not_paced() -> None:
    clock = _Clock()
    pacer = _paced(clock, [31])
    assert not pacer._armed  # no pacer callback queued
    await _passes(20)
    assert clock.slept == [] and not pacer._armed
    pacer.detach()


async def test_idle_passes_sleep_until_a_pace_after_the_last_sleep_then_stop_with_the_backlog() -> None:
    clock, backlog = _Clock(), [32]
    sleeps = REGISTRY.get_sample_value("agent_scheduler_paced_sleeps_total") or 0.0
    pacer = _paced(clock, backlog)
    pacer.poke()  # already armed: no second callback
    await _passes(6)
    # the first pass has no previous one to compare with, the second finds no sleep due (none before it);
    # every idle pass after sleeps until 5 ms after the previous sleep ended
    assert clock.slept == [0.005] * 4 and pacer.sleeps == 4
    assert REGISTRY.get_sample_value("agent_scheduler_paced_sleeps_total") == sleeps + 4
    clock.now += (
        0.002  # a pass that worked for 2 ms: it does not sleep, and the next idle one sleeps the rest
    )
    await _passes(2)
    assert clock.slept[-2:] == [0.005, 0.003]
    backlog[0] = 31
    await _passes(5)
    assert len(clock.slept) == 5 and not pacer._armed  # below the backlog: the callback stopped
    backlog[0] = 40
    await _passes(3)
    assert len(clock.slept) == 5  # nothing queued anew: not paced again by itself
    pacer.poke()  # work queued with the backlog back up: paced again
    await _passes(4)
    assert len(clock.slept) > 5 and pacer._armed
    pacer.detach()


async def test_a_pass_that_did_work_never_sleeps() -> None:
    clock = _Clock()
    pacer = _paced(clock, [1000])

    def work() -> None:
        clock.now += 0.0001  # 100 µs of a pass's callbacks, as a burst's decisions between two yields

    await _passes(50, work)
    assert clock.slept == []  # work split over many passes is not slowed
    await _passes(4)
    assert clock.slept != []  # and once the passes are idle, they sleep

    def little() -> None:
        clock.now += 0.00001  # 10 µs: what the pacer cannot tell from an idle pass (module docstring)

    before = len(clock.slept)
    await _passes(6, little)
    assert len(clock.slept) > before
    pacer.detach()


async def test_a_backlog_source_that_raises_counts_as_nothing_and_fails_no_caller(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = _Clock()
    pacer = aiotools.Pacer(min_backlog=40, clock=clock, sleep=clock.sleep)
    pacer.attach(asyncio.get_running_loop(), 0.005)

    def broken() -> int:
        raise RuntimeError("source broke")

    with pacer.backlog_of(broken), pacer.backlog_of(lambda: 39):
        for _ in range(100):
            pacer.poke()  # no exception into the caller, whose work was already queued
        assert pacer.backlog() == 39 and not pacer._armed  # the others still count
    failures = [r for r in caplog.records if "a pacing backlog source failed" in r.getMessage()]
    assert len(failures) == 1  # logged once, not per pod
    pacer.detach()


async def test_what_a_sleep_took_is_counted_not_what_was_asked() -> None:
    clock = _Clock()
    clock.oversleep = 0.001  # a real sleep returns late
    pacer = _paced(clock, [32])
    await _passes(5)
    assert pacer.sleeps == len(clock.slept) > 0
    assert pacer.slept == pytest.approx(sum(clock.slept) + 0.001 * len(clock.slept))
    pacer.detach()


async def test_detached_the_pacer_does_nothing() -> None:
    clock = _Clock()
    pacer = _paced(clock, [1000])
    await _passes(4)
    assert clock.slept  # paced while attached
    pacer.detach()
    n = len(clock.slept)
    pacer.poke()
    await _passes(6)
    assert len(clock.slept) == n and not pacer._armed


def test_a_backlog_source_counts_only_inside_its_block() -> None:
    pacer = aiotools.Pacer()
    with pacer.backlog_of(lambda: 7):
        with pytest.raises(LookupError), pacer.backlog_of(lambda: 40):
            assert pacer.backlog() == 47
            raise LookupError
        assert pacer.backlog() == 7
    assert pacer.backlog() == 0


@pytest.mark.parametrize("kind", aiotools.EVENT_LOOPS)
def test_on_a_real_loop_a_paced_sleep_never_exceeds_the_pace_and_work_is_not_held_back(kind: str) -> None:
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.sleep(seconds)

    pacer = aiotools.Pacer(min_backlog=1, sleep=sleep)

    async def main() -> tuple[int, int]:
        pacer.attach(asyncio.get_running_loop(), 0.005)
        with pacer.backlog_of(lambda: 1):
            pacer.poke()

            def work() -> None:
                end = time.perf_counter() + 0.0002
                while time.perf_counter() < end:
                    pass

            await _passes(200, work)  # a chain of passes each doing 200 µs of work
            during_work = len(slept)
            await asyncio.sleep(0.05)  # idle with a backlog: paced
            return during_work, len(slept)

    during_work, after_idle = (uvloop.run if kind == "uvloop" else asyncio.run)(main())
    assert during_work == 0
    assert after_idle > 0 and all(0 < s <= 0.005 for s in slept)
