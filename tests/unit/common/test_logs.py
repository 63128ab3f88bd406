"""JSON logs: every line a process writes to stderr is one JSON object, uncaught exceptions included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _run(body: str) -> list[dict[str, object]]:
    code = "from common import logs\nlogs.configure('INFO', 'json')\n" + textwrap.dedent(body)
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines, done
    return [json.loads(line) for line in lines]  # a raw traceback line would not parse


def test_an_uncaught_exception_is_one_json_line() -> None:
    (line,) = _run("raise ValueError('boom')")
    assert line["level"] == "CRITICAL" and line["logger"] == "uncaught"
    assert "boom" in str(line["msg"]) and "ValueError: boom" in str(line["exc"])


def test_a_thread_exception_is_json() -> None:
    (line,) = _run(
        """
        import threading
        def fail() -> None:
            raise RuntimeError('in a thread')
        t = threading.Thread(target=fail, name='helper')
        t.start()
        t.join()
        """
    )
    assert line["logger"] == "uncaught" and "helper" in str(line["msg"])
    assert "RuntimeError: in a thread" in str(line["exc"])


def test_asyncio_reports_are_json() -> None:
    lines = _run(
        """
        import asyncio, gc
        async def fail() -> None:
            raise KeyError('lost')
        async def main() -> None:
            task = asyncio.create_task(fail())
            await asyncio.sleep(0.01)
            del task
            gc.collect()
        asyncio.run(main())
        """
    )
    assert any(line["logger"] == "asyncio" and "KeyError" in str(line.get("exc")) for line in lines)
