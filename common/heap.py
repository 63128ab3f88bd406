"""What a long-running scheduler process (worker or coordinator) tells CPython's cyclic garbage collector.

Owns one call, ``freeze_imports``, which each process's command makes once, after its imports and before its
event loop starts: ``gc.freeze()`` moves every object alive then (modules, classes, functions, the settings:
72,000-74,000 tracked objects in a worker or a coordinator) to the permanent generation, which no collection
walks.

Why: those objects live as long as the process, yet every full collection walked them all again, and a full
collection stops the event loop (every pod waiting in a burst waits that much longer). Measured in one process
that imported what a worker and a coordinator import, and the cache and the workload generator (77,663
tracked objects frozen), with ``worker.cache.Cache`` holding the generator's bound pods (two runs; a full collection's time, best of three;
``docs/results/gc-2026-12-05/``, ``gcpause.py``):

| cache | without | imports frozen |
|---|---|---|
| 1,000 nodes, 10,000 pods | 20.5 ms, 42.8 ms | 2.4 ms, 2.7 ms |
| 5,000 nodes, 50,000 pods | 75.3 ms, 84.0 ms | 36.7 ms, 42.0 ms |

Not done, measured: collecting the youngest generation less often (``gc.set_threshold(10_000, 10, 10)``). It
cut the collector's share of the processes' on-CPU samples in bursts from up to 8.2 % to at most 0.5 %
(``perf``), but no change in CPU per pod could be shown: in paired runs coordinator + 2 workers used less in 6
of 10 pairs, the standalone worker more in 8 of 12. What a burst spends in the collector is in the young
generations, which the freeze does not change (the same results directory).

Invariants: a full collection runs first, so the garbage the imports and the argument parsing left in
reference cycles is freed instead of frozen for good (126 unreachable objects after a coordinated worker's imports when
this was written); what is frozen then lives as long as the process. A frozen object that is released later
is still freed by reference counting; only a reference cycle among frozen objects would stay. The
collector's thresholds stay CPython's.
"""

from __future__ import annotations

import gc


def freeze_imports() -> None:
    """Collect, then move every object alive to the permanent generation (see the module docstring). Call it
    once, from the process's command, after its imports and right before its event loop starts."""
    gc.collect()
    gc.freeze()
