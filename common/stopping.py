"""How a worker or coordinator process stops on SIGTERM (and SIGINT), from its first milliseconds to its exit.

Two handlers, one after the other. From the start of ``agent_scheduler.cli.main`` (before the subcommand's
imports, most of a start) until the command's event loop runs, ``terminated_while_starting``: the start is
abandoned (``Terminated``, a ``SystemExit``, unwinds whatever runs, the loop too) and the process exits 0.
Once the loop runs, ``stop_on_signals`` hands the signals to the command's graceful stop (an ``asyncio.Event``
the command waits on: a drain). Nothing is registered in etcd before that hand-over (a worker registers, a
coordinator campaigns, after it), so an abandoned start leaves nothing behind.

Invariants: a second SIGTERM while the first is being acted on changes nothing (ignored while a start unwinds;
the loop's handler only sets the event again); a SIGTERM whose exception Python could not raise (it landed in
a finalizer or weakref callback, which Python only reports) is remembered, and the loop's graceful stop begins
the moment it takes over. Light on purpose: only the standard library's ``signal`` is imported, so installing
the first handler costs nothing before the imports it protects.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _State:
    terminated = False  # a SIGTERM came before the loop took the signals over


_state = _State()


class Terminated(SystemExit):
    """SIGTERM before the command's event loop took it over: the start is abandoned.

    A ``SystemExit`` so that it unwinds through an event loop that runs (asyncio and uvloop re-raise it from a
    callback instead of logging it) and through ``except Exception`` retry loops."""

    def __init__(self) -> None:
        super().__init__(0)


def terminated_while_starting(signum: int, frame: FrameType | None) -> None:
    """SIGTERM's handler until ``stop_on_signals``: ignore any further one, abandon the start."""
    _state.terminated = True
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated


def stop_on_signals(stop: asyncio.Event, loop: asyncio.AbstractEventLoop) -> None:
    """From now on SIGTERM and SIGINT set ``stop`` (the command's graceful stop). Sets it at once when a
    SIGTERM came before and its exception was lost."""
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    if _state.terminated:
        stop.set()
