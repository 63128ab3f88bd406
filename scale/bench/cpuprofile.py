"""Run a Python module under cProfile timed by the process's CPU clock, the stats written when it exits.

``python -m scale.bench.cpuprofile OUT MODULE ARGS...`` is ``python -m cProfile -o OUT -m MODULE ARGS...`` with
``time.process_time`` as the timer: on a shared 2-core machine a wall-clock profile charges a function for the
time its process waited for a core, so the profile of a scheduler beside the API server says where the waiting
fell rather than where the CPU went. The stats are written on any exit the interpreter sees (a return,
``SystemExit`` from a SIGTERM handler, an exception); a SIGKILLed process writes none.
"""

from __future__ import annotations

import cProfile
import runpy
import sys
import time


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit("usage: python -m scale.bench.cpuprofile OUT MODULE [ARGS...]")
    out, module = sys.argv[1], sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    profile = cProfile.Profile(time.process_time)
    profile.enable()
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        profile.disable()
        profile.dump_stats(out)


if __name__ == "__main__":
    main()
