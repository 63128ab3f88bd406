"""``common.heap``: a scheduler process freezes what its imports made, and both commands do it before their
event loop starts."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from agent_scheduler import cli
from common import aiotools, heap

ROOT = Path(__file__).resolve().parents[3]

# In a fresh interpreter (the test process's collector stays as it is): what a worker imports, then the call.
PROBE = """
import gc, json
import worker.command
from common import heap
before = {"threshold": gc.get_threshold(), "frozen": gc.get_freeze_count()}
heap.freeze_imports()
print(json.dumps({"before": before, "after": {"threshold": gc.get_threshold(), "frozen": gc.get_freeze_count()}}))
"""


def test_the_imports_are_frozen_and_the_thresholds_stay_cpythons() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True)
    seen = json.loads(out.stdout)
    assert seen["before"]["frozen"] == 0
    assert seen["after"]["threshold"] == seen["before"]["threshold"]  # CPython's, untouched
    # the imports of a worker: modules, classes, functions (about 72,000 when measured)
    assert seen["after"]["frozen"] > 20_000


def _parse(*argv: str) -> argparse.Namespace:
    parser = cli._build_parser(argv[0])
    return cli._apply_config(parser, parser.parse_args(list(argv)), list(argv))


@pytest.mark.parametrize(
    "argv",
    [
        ("worker", "--standalone"),
        ("worker", "--etcd-endpoints", "127.0.0.1:2379", "--insecure-dispatch"),
        ("coordinator", "--etcd-endpoints", "127.0.0.1:2379"),
    ],
)
def test_each_command_freezes_its_imports_before_its_loop_starts(
    monkeypatch: pytest.MonkeyPatch, argv: tuple[str, ...]
) -> None:
    calls: list[str] = []

    def loop(main: Coroutine[Any, Any, int], event_loop: str, *, pace_ms: float) -> int:
        main.close()  # never started: only the order of the calls is tested (and the pace passed on)
        calls.append(f"loop paced {pace_ms:g} ms")
        return 0

    monkeypatch.setattr(heap, "freeze_imports", lambda: calls.append("freeze"))
    monkeypatch.setattr(aiotools, "run", loop)
    module = __import__(f"{argv[0]}.command", fromlist=["run"])
    assert module.run(_parse(*argv)) == 0
    assert calls == ["freeze", f"loop paced {aiotools.PACE * 1000:g} ms"]
