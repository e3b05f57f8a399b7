"""A JSON log formatter for the structured lines of :mod:`llm_budgets.events` (standard library
only). Each record becomes one JSON object: ``time``, ``level``, ``logger``, ``message``, then
every documented field the record carries (docs/operations.md has a ``LOGGING`` example)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from llm_budgets.events import FIELDS


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            if name in record.__dict__:
                data[name] = record.__dict__[name]
        if record.exc_info:
            data["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)
