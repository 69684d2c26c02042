"""Logging: one JSON object per line, or plain text on a terminal.

Fields beyond the message come from ``extra=`` and from the request being served
(``observe.current``): a line logged while relaying a run carries its ``run_id``
and ``route`` without every call site repeating them. Nothing here adds content:
prompts and completions reach a log line only from ``observe`` and only when
``logging.content`` is on; keys never do.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from typing import Any, Literal

import orjson

from gateway.observe import current

Format = Literal["auto", "json", "text"]

# Attributes every LogRecord has: anything else on a record was passed as extra=.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
    "color_message",  # uvicorn's message with ANSI colours: the plain one is enough
}


def fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and v is not None}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        seconds = int(record.created)
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            "pid": record.process,  # which worker, with serve --workers N
        }
        line.update(fields(record))
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


class TextFormatter(logging.Formatter):
    """``12:00:01.234 INFO  gateway.access request status=200 duration_ms=812.4 ...``"""

    def format(self, record: logging.LogRecord) -> str:
        clock = time.strftime("%H:%M:%S", time.localtime(record.created))
        extras = " ".join(f"{k}={_text(v)}" for k, v in fields(record).items())
        line = f"{clock}.{int(record.msecs):03d} {record.levelname:<7} {record.name}: "
        line += record.getMessage() + (" " + extras if extras else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


_BARE = re.compile(r"[\w./*:@+-]+")


def _text(value: Any) -> str:
    """A value for a text line: strings quoted and escaped unless plainly safe (a path
    with an encoded newline must not forge a log line)."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str) and _BARE.fullmatch(value):
        return value
    return orjson.dumps(value, default=str).decode()


class RequestContext(logging.Filter):
    """Adds the run id and route of the request being served to lines that lack them."""

    def filter(self, record: logging.LogRecord) -> bool:
        request = current.get()
        if request is not None:
            if getattr(record, "run_id", None) is None:
                run = request.run
                run_id = run.id if run is not None else request.extra.get("run_id")
                if run_id is not None:
                    record.run_id = run_id
            if getattr(record, "route", None) is None:
                record.route = request.route
        return True


class RefusedUpgrades(logging.Filter):
    """Drops uvicorn's false alarm after a refused WebSocket upgrade.

    A 426 (``api/responses_ws.py``) is sent as the ASGI denial response; uvicorn 0.54's
    websockets-sansio protocol sends it, then logs "ASGI callable returned without
    completing handshake." at ERROR, because it marks the handshake complete for an
    accept or a close, not for a denial. The gateway completes or denies every
    handshake, so the line says nothing."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.name == "uvicorn.error"
            and record.msg == "ASGI callable returned without completing handshake."
        )


def formatter(format: Format = "auto") -> logging.Formatter:
    """The formatter for ``format``; ``auto`` picks text when stderr is a terminal."""
    if format == "auto":
        format = "text" if sys.stderr.isatty() else "json"
    return TextFormatter() if format == "text" else JsonFormatter()


def config(level: str, format: Format) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` for uvicorn's ``log_config`` (applied per worker)."""
    handler = {
        "class": "logging.StreamHandler",
        "formatter": "gateway",
        "filters": ["request", "refused_upgrades"],
        "stream": "ext://sys.stderr",
    }
    upper = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"gateway": {"()": "gateway.logs.formatter", "format": format}},
        "filters": {
            "request": {"()": "gateway.logs.RequestContext"},
            "refused_upgrades": {"()": "gateway.logs.RefusedUpgrades"},
        },
        "handlers": {"default": handler},
        "loggers": {
            "gateway": {"handlers": ["default"], "level": upper, "propagate": False},
            "uvicorn": {"handlers": ["default"], "level": upper, "propagate": False},
            # uvicorn's access log is off: gateway.access writes one richer line per request.
            "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": False},
            # httpx2 logs every upstream request at INFO: the request line covers it.
            "httpx2": {"handlers": ["default"], "level": "WARNING", "propagate": False},
        },
        "root": {"handlers": ["default"], "level": "WARNING"},
    }
