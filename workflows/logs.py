"""Log records operators can use: every line carries the request id of the HTTP request it was
logged in (``-`` outside one), and ``AGENTOPS_LOG_FORMAT=json`` writes one JSON object per line with
the ``extra`` fields (``status``, ``reason``, ``source``, ``workflow_id``…) as keys and the traceback,
when there is one, under ``traceback``."""
from __future__ import annotations

import contextvars
import json
import logging
from datetime import UTC, datetime
from typing import Any

# Set by the request-id middleware (workflows/api/middleware.py) for the time of one request.
REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("agentops_request_id", default="-")

# The attributes every LogRecord has: what is left over came from ``extra``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "request_id"}


class RequestIdFilter(logging.Filter):
    """Puts the current request's id on every record (``%(request_id)s``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get()
        return True


class PlainFormatter(logging.Formatter):
    """``time level logger [request id] message key=value…``: the extra fields are shown, not dropped."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = " ".join(f"{k}={v!r}" for k, v in extra_fields(record).items())
        if not extras:
            return line
        head, sep, rest = line.partition("\n")  # a traceback stays below the line
        return f"{head} {extras}{sep}{rest}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``at``, ``level``, ``logger``, ``message``, ``request_id``, the extras,
    and ``traceback`` when the record carries an exception."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "at": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage(),
            "request_id": getattr(record, "request_id", REQUEST_ID.get()),
        }
        line.update(extra_fields(record))
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}
