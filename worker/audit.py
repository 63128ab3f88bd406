"""An optional binding audit trail: one JSON line per successful binding, for operators and for the
integration tests that prove no node was usable by two workers at once.

Each line: ``{"pod", "node", "worker", "epoch", "assumed_at", "bound_at", "via"}`` with wall-clock seconds;
``via`` says how the pod came to this worker: "dispatch" (the leader's DISPATCH), "claim" (claimed from its own
pod watch, ``worker.claims``), "sole" (taken from its own pod watch as the sole worker, ``worker.intake``), or
"" (none of these is owed an answer any more, e.g. the leader's stream changed). Two
workers' lines for the same node must never have overlapping ``[assumed_at, bound_at]`` intervals while the
handoff protocol holds. Lines are written through at once (line buffering), so a
trail read while the worker runs, or after it was killed, is complete up to its last binding.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import IO


class AuditLog:
    def __init__(self, path: str, *, worker: str, epoch: Callable[[], int]) -> None:
        self._file: IO[str] = open(path, "a", buffering=1)  # noqa: SIM115 - closed in close()
        self.worker = worker
        self.epoch = epoch

    def bound(self, pod: str, node: str, assumed_at: float, bound_at: float, *, via: str = "") -> None:
        line = {
            "pod": pod,
            "node": node,
            "worker": self.worker,
            "epoch": self.epoch(),
            "assumed_at": assumed_at,
            "bound_at": bound_at,
            "via": via,
        }
        self._file.write(json.dumps(line) + "\n")

    def close(self) -> None:
        self._file.close()
