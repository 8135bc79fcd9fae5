"""Process-wide logging setup: configured once, at the entry point, never in libraries.

Library modules log through :mod:`eventstore.logs`, which follows the structlog
configuration made here. Output is JSON in production and readable key=value lines in a
terminal, on standard error. Payloads, tokens and Redis keys are never logged by our code;
:func:`~eventstore.logs.drop_secrets` is a last guard for fields that must never leave.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import msgspec
import structlog

from eventstore.logs import drop_secrets


def _json_line(event_dict: Any, **_options: Any) -> str:
    """Encode one event as a JSON line with msgspec.

    The stdlib encoder costs several times more per event, and production logs one per
    tool call. Values JSON has no type for are written as their ``repr``, as structlog's
    own fallback does.
    """
    return msgspec.json.encode(event_dict, enc_hook=repr).decode()


def configure_logging(*, json: bool | None = None, level: str = "INFO") -> None:
    """Configure structlog for this process.

    Args:
        json: JSON lines when True, console lines when False, and by default JSON unless
            standard error is a terminal.
        level: the lowest level written.
    """
    if json is None:
        json = not sys.stderr.isatty()
    renderer: Any = (
        structlog.processors.JSONRenderer(serializer=_json_line)
        if json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            drop_secrets,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        # Not cached: a cached logger ignores later reconfiguration (tests, embedding
        # processes); the lazy proxy costs a few microseconds per event.
        cache_logger_on_first_use=False,
    )
