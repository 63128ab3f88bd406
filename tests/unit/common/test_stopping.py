"""SIGTERM's two handlers (``common.stopping``), in this process: the one that abandons a start, and the
hand-over to a loop's graceful stop. The whole command under SIGTERM is tested in tests/unit/install/test_cli.py."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import pytest

from common import stopping


@pytest.fixture(autouse=True)
def sigterm_kept() -> Iterator[None]:
    """Whatever a test does to SIGTERM's handler and the module's memory of one, put it back."""
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        stopping._state.terminated = False


def test_a_sigterm_while_starting_abandons_the_start_with_exit_0_and_ignores_the_next() -> None:
    signal.signal(signal.SIGTERM, stopping.terminated_while_starting)
    with pytest.raises(stopping.Terminated) as raised:
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()  # not reached: the handler raises once the signal is delivered
    assert isinstance(raised.value, SystemExit) and raised.value.code == 0
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # a second one changes nothing
    os.kill(os.getpid(), signal.SIGTERM)  # would end this process if it were not ignored
    assert stopping._state.terminated


async def test_once_the_loop_runs_sigterm_and_sigint_start_the_graceful_stop() -> None:
    loop, stop = asyncio.get_running_loop(), asyncio.Event()
    stopping.stop_on_signals(stop, loop)
    try:
        assert not stop.is_set()
        for sig in stopping.STOP_SIGNALS:
            stop.clear()
            os.kill(os.getpid(), sig)
            await asyncio.wait_for(stop.wait(), 10)  # a hang guard, never a speed requirement
    finally:
        for sig in stopping.STOP_SIGNALS:
            loop.remove_signal_handler(sig)


async def test_a_sigterm_whose_exception_was_lost_starts_the_graceful_stop_at_the_hand_over() -> None:
    # Raised inside a finalizer, the exception is only reported and the start goes on; the handler remembered it.
    stopping._state.terminated = True
    loop, stop = asyncio.get_running_loop(), asyncio.Event()
    stopping.stop_on_signals(stop, loop)
    try:
        assert stop.is_set()
    finally:
        for sig in stopping.STOP_SIGNALS:
            loop.remove_signal_handler(sig)
