"""How a worker or coordinator process stops on SIGTERM (and SIGINT), from the moment the CLI runs to its exit.

Two handlers, one after the other. From the start of ``agent_scheduler.cli.main`` (before the subcommand's
imports, most of a start) until the command hands the signals over, ``terminated_while_starting``: the start is
abandoned (``Terminated``, a ``SystemExit``, unwinds whatever runs, an event loop too) and the process exits 0.
Once the command's loop runs (and, coordinated, etcd has answered), ``stop_on_signals`` gives them to its
graceful stop (an ``asyncio.Event`` the command waits on: a drain). Nothing is registered in etcd before that hand-over (a worker
registers, a coordinator campaigns, after it), so an abandoned start leaves nothing behind in the cluster (a
worker's ``--audit-log`` file is created, empty, earlier).

Invariants: a second SIGTERM within ``UNWIND`` of the first changes nothing (the first is unwinding the start;
once the loop has them, a second only sets the event again); a later one raises again, in case the first's
exception was lost (it landed in a finalizer or weakref callback, where Python only reports it), and a lost
one also starts the graceful stop the moment the loop takes the signals over. Light on purpose: only the
standard library is imported, so installing the first handler costs nothing before the imports it protects. Not covered: the interpreter's own start (tens of ms) comes before any handler; on the
standard library's loop, closing it puts the default action back for a moment before the CLI ignores SIGTERM
for the process's exit (a second SIGTERM landing in those µs ends the process with the signal).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None  # what signal.signal returns


# A start unwinds in milliseconds; the slowest seen took seconds (an event loop's cleanup waiting for a thread).
UNWIND = 10.0


class _State:
    terminated_at: float | None = None  # when a SIGTERM came before the command handed the signals over


_state = _State()


class Terminated(SystemExit):
    """SIGTERM before the command handed it to its graceful stop (``stop_on_signals``): the start is abandoned.

    A ``SystemExit`` so that it unwinds through an event loop that runs (asyncio and uvloop re-raise it from a
    callback instead of logging it) and through ``except Exception`` retry loops."""

    def __init__(self) -> None:
        super().__init__(0)


def catch_while_starting() -> Handler:
    """Install ``terminated_while_starting`` for SIGTERM; returns the handler it replaced."""
    _state.terminated_at = None
    return signal.signal(signal.SIGTERM, terminated_while_starting)


def after_command(previous: Handler, *, program: bool) -> None:
    """The command has returned. Run as the program, the process exits now: SIGTERM is ignored (a stop is
    already under way; a closing asyncio loop put the default action back, which would end the process with
    the signal). Called as a function (tests), the handler ``catch_while_starting`` replaced comes back."""
    if program:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:  # None: a handler not installed from Python, which cannot be put back from here
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def terminated_while_starting(signum: int, frame: FrameType | None) -> None:
    """SIGTERM's handler until ``stop_on_signals``: abandon the start (once per ``UNWIND``)."""
    now = time.monotonic()
    if _state.terminated_at is not None and now - _state.terminated_at < UNWIND:
        return
    _state.terminated_at = now
    raise Terminated


def stop_on_signals(stop: asyncio.Event) -> None:
    """From now on SIGTERM and SIGINT set ``stop`` (the command's graceful stop), through the running loop
    (call it from the command's coroutine). Sets it at once when a SIGTERM came before and its exception was
    lost."""
    import asyncio  # already loaded by the caller's loop: the CLI imports this module before anything heavy

    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    if _state.terminated_at is not None:
        stop.set()
