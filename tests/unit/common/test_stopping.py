"""SIGTERM's two handlers (``common.stopping``), in this process: the one that abandons a start, the hand-over
to a loop's graceful stop, and what the CLI leaves behind. The whole command under SIGTERM is tested in
tests/unit/install/test_cli.py."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from types import FrameType

import pytest

from agent_scheduler import cli
from common import stopping


class Unexpected(Exception):
    pass


def _unexpected(signum: int, frame: FrameType | None) -> None:
    raise Unexpected(f"signal {signum} reached the test's own handler")


@pytest.fixture(autouse=True)
def signals_kept() -> Iterator[None]:
    """SIGTERM and SIGINT go to a handler of the test's while it runs (one that reaches it fails the test
    instead of ending the session) and come back as they were, as does the module's memory of a SIGTERM."""
    previous = {sig: signal.signal(sig, _unexpected) for sig in stopping.STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stopping._state.terminated_at = None


def test_a_sigterm_while_starting_abandons_the_start_with_exit_0_then_the_next_changes_nothing() -> None:
    assert stopping.catch_while_starting() is _unexpected
    with pytest.raises(stopping.Terminated) as raised:
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()  # not reached: the handler raises once the signal is delivered
    assert isinstance(raised.value, SystemExit) and raised.value.code == 0
    os.kill(os.getpid(), signal.SIGTERM)  # the first is unwinding the start: nothing raised
    assert stopping._state.terminated_at is not None


def test_a_sigterm_long_after_a_lost_one_raises_again() -> None:
    stopping.catch_while_starting()
    assert stopping._state.terminated_at is None  # installing forgets an earlier one
    stopping._state.terminated_at = -stopping.UNWIND  # one came long ago and its exception was lost
    with pytest.raises(stopping.Terminated):
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()


async def test_once_the_loop_has_them_sigterm_and_sigint_start_the_graceful_stop() -> None:
    loop, stop = asyncio.get_running_loop(), asyncio.Event()
    stopping.stop_on_signals(stop)
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
    # Raised inside a finalizer, the exception is only reported and the start goes on; the handler noted it.
    stopping._state.terminated_at = 0.0
    loop, stop = asyncio.get_running_loop(), asyncio.Event()
    stopping.stop_on_signals(stop)
    try:
        assert stop.is_set()
    finally:
        for sig in stopping.STOP_SIGNALS:
            loop.remove_signal_handler(sig)


def test_after_the_command_a_program_ignores_sigterm_and_a_caller_gets_its_handler_back() -> None:
    stopping.after_command(_unexpected, program=True)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    stopping.after_command(_unexpected, program=False)
    assert signal.getsignal(signal.SIGTERM) is _unexpected
    stopping.after_command(None, program=False)  # not from Python: the default is what can be put back
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["worker", "--lease-ttl", "ten"], 2),  # argparse's SystemExit
        (["coordinator", "--help"], 0),  # argparse's SystemExit too
        (["worker", "--kubeconfig", "/nonexistent/kubeconfig"], 1),  # returned
    ],
)
def test_main_called_in_process_leaves_sigterm_as_it_was(
    argv: list[str], expected: int, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = int(e.code or 0)
    assert code == expected
    capsys.readouterr()
    assert signal.getsignal(signal.SIGTERM) is _unexpected


def test_the_cli_imports_nothing_heavy_before_its_handler() -> None:
    # What main() protects is everything imported after the handler; the CLI module itself must stay light.
    code = (
        "import sys, agent_scheduler.cli; "
        "print(sorted(m for m in ('yaml', 'importlib.metadata', 'common.logs', 'agent_scheduler.config', "
        "'uvloop', 'kubernetes', 'grpc') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
