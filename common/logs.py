"""Log setup for every process: plain text for people, or one JSON object per line for log pipelines.

Lines about a pod or a node carry them as fields (``extra={"pod": ..., "node": ...}``), so a JSON line can be
filtered by pod or node without parsing the message; the text format appends them as ``pod=... node=...``.
"""

from __future__ import annotations

import json
import logging
import time

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
