"""Run a Python module under cProfile timed by the process's CPU clock, the stats written when it exits.

``python -m scale.bench.cpuprofile OUT MODULE ARGS...`` is ``python -m cProfile -o OUT -m MODULE ARGS...`` with
``time.process_time`` as the timer: on a shared 2-core machine a wall-clock profile charges a function for the
time its process waited for a core, so the profile of a scheduler beside the API server says where the waiting
fell rather than where the CPU went. The stats are written on any exit the interpreter sees (a return,
``SystemExit`` from a SIGTERM handler, an exception); a SIGKILLed process writes none.

``python -m scale.bench.cpuprofile --window OUT MODULE ARGS...`` profiles only between a SIGUSR1 (on) and the
next SIGUSR2 (off), as often as they come: the bench sends them around each measured window
(``scale.bench.schedulers.Running.profile_window``), so the stats hold what the window's CPU figure holds, not
the start-up, the wait for a quiet host or the namespace's deletion after it. The profiler is per thread and
signal handlers run on the main thread, which is the one profiled. Time spent while no frame entered since
the window opened is running is charged to nothing: the event loop's own C code between callbacks (its frame
was entered before), and other threads' CPU (the gRPC client's) meanwhile; while such a frame runs, other
threads' CPU is charged to it (the timer is the process's). Only a process started this way may be sent those
signals: their default action ends a process. The bench runs this file by its path, with the standard library
only, so it profiles a contender from another checkout too.
"""

from __future__ import annotations

import cProfile
import runpy
import signal
import sys
import time
from pathlib import Path
from types import FrameType

USAGE = "usage: python -m scale.bench.cpuprofile [--window] OUT MODULE [ARGS...]"


def windowed(profile: cProfile.Profile) -> None:
    """SIGUSR1 turns ``profile`` on, SIGUSR2 off."""

    def on(signum: int, frame: FrameType | None) -> None:
        profile.enable()

    def off(signum: int, frame: FrameType | None) -> None:
        profile.disable()

    signal.signal(signal.SIGUSR1, on)
    signal.signal(signal.SIGUSR2, off)


def main() -> None:
    if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
        # Run by its path (``scale.bench.schedulers.PROFILER``): its folder leads ``sys.path``, where its
        # neighbours' names (``cluster``, ``report``, ...) would shadow what the profiled program imports.
        sys.path.pop(0)
    args = sys.argv[1:]
    window = bool(args) and args[0] == "--window"
    if window:
        args = args[1:]
    if len(args) < 2:
        raise SystemExit(USAGE)
    out, module = args[0], args[1]
    sys.argv = [module, *args[2:]]
    profile = cProfile.Profile(time.process_time)
    if window:
        windowed(profile)
    else:
        profile.enable()
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        profile.disable()
        profile.dump_stats(out)


if __name__ == "__main__":
    main()
