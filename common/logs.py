"""Log setup for every process: plain text for people, or one JSON object per line for log pipelines.

Lines about a pod or a node carry them as fields (``extra={"pod": ..., "node": ...}``), so a JSON line can be
filtered by pod or node without parsing the message; the text format appends them as ``pod=... node=...``.

``configure`` also routes what Python would otherwise print as a raw traceback through the same handler:
uncaught exceptions (``sys.excepthook``), those of threads (``threading.excepthook``) and unraisable ones
(``sys.unraisablehook``: errors in ``__del__`` or finalizers). asyncio's own reports (a task's exception never
retrieved, a callback that raised) already go to the ``asyncio`` logger, so they come out in the same format.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from types import TracebackType

FIELDS = ("pod", "node", "worker", "epoch")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                out[name] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        extra = " ".join(f"{n}={record.__dict__[n]}" for n in FIELDS if record.__dict__.get(n) is not None)
        return f"{text} {extra}" if extra else text


def configure(level: str, fmt: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    _route_uncaught()


_uncaught = logging.getLogger("uncaught")


def _excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, value, tb)
        return
    _uncaught.critical("uncaught exception: %s", value or kind.__name__, exc_info=(kind, value, tb))


def _thread_excepthook(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is None or issubclass(args.exc_type, SystemExit):
        return
    name = args.thread.name if args.thread is not None else "?"
    _uncaught.error(
        "uncaught exception in thread %s: %s",
        name,
        args.exc_value,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )


def _unraisablehook(u: sys.UnraisableHookArgs) -> None:
    exc_info = (u.exc_type, u.exc_value, u.exc_traceback) if u.exc_value is not None else None
    _uncaught.error("%s: %r", u.err_msg or "exception ignored in", u.object, exc_info=exc_info)


def _route_uncaught() -> None:
    sys.excepthook = _excepthook
    threading.excepthook = _thread_excepthook
    sys.unraisablehook = _unraisablehook
