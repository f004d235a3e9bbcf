"""One JSON object per log line, for every tessera process (what log pipelines parse)."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any


def json_log_record(record: logging.LogRecord) -> str:
    """One JSON object per line: time, level, logger, message and any ``extra`` fields."""
    skip = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
    out: dict[str, Any] = {"ts": round(time.time(), 3), "level": record.levelname,
                           "logger": record.name, "msg": record.getMessage()}
    out.update({k: v for k, v in vars(record).items() if k not in skip})
    if record.exc_info:
        out["exc"] = logging.Formatter().formatException(record.exc_info)
    return json.dumps(out, default=str)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json_log_record(record)


def setup_logging(level: int = logging.INFO, quiet: tuple[str, ...] = ()) -> None:
    """JSON lines on stderr; the loggers in ``quiet`` only say warnings and worse."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in quiet:
        logging.getLogger(name).setLevel(logging.WARNING)
