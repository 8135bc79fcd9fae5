"""Process-wide logging setup: configured once, at the entry point, never in libraries.

Library modules log through :mod:`eventstore.logs`, which follows the structlog
configuration made here. Output is JSON in production and readable key=value lines in a
terminal, on standard error; records of the stdlib ``logging`` module (uvicorn's own error
logger, asyncio) are rendered the same way, without tracebacks. Payloads, tokens and Redis
keys are never logged by our code; :func:`~eventstore.logs.drop_secrets` is a last guard
for fields that must never leave.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import MutableMapping
from typing import Any, Final

import msgspec
import structlog

from eventstore.logs import drop_secrets

_encode_json: Final = msgspec.json.Encoder(enc_hook=repr).encode


def render_json(_logger: object, _method: str, event_dict: MutableMapping[str, Any]) -> str:
    """Last processor of the JSON format: the event as one JSON line.

    Encoded with msgspec: the stdlib encoder costs several times more per event, and
    production logs one per tool call. Values JSON has no type for are written as their
    ``repr``, as structlog's own fallback does.
    """
    return _encode_json(event_dict).decode()


#: The last whole second stamped and its text: the date and time change once a second,
#: and formatting them costs more than the rest of a timestamp.
_stamped_second: tuple[int, str] = (-1, "")


def add_utc_timestamp(
    _logger: object, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Add ``timestamp``: now, in UTC, as ISO 8601 with microseconds and ``Z``.

    ``2026-12-02T04:30:00.123456Z``: the text structlog's ``TimeStamper(fmt="iso",
    utc=True)`` writes, except that the microseconds are always there (fixed width).
    """
    global _stamped_second
    second, nanoseconds = divmod(time.time_ns(), 1_000_000_000)
    stamped = _stamped_second
    if stamped[0] != second:
        # One tuple, replaced whole: a thread reading it meanwhile sees one or the other.
        stamped = _stamped_second = (
            second,
            time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)),
        )
    event_dict["timestamp"] = f"{stamped[1]}.{nanoseconds // 1000:06d}Z"
    return event_dict


#: Name of the root handler :func:`configure_logging` installs (replaced on each call).
_STDLIB_HANDLER: Final = "canon.stdlib"


def trace_to_type(
    _logger: object, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Replace a stdlib record's exception and stack by the exception's type name.

    Other libraries (uvicorn, asyncio) log tracebacks; a log line never carries one.
    """
    exc_info = event_dict.pop("exc_info", None)
    event_dict.pop("stack_info", None)
    if isinstance(exc_info, tuple) and exc_info and exc_info[0] is not None:
        event_dict["error"] = exc_info[0].__name__
    return event_dict


class _StandardError(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler writing to whatever ``sys.stderr`` is when a record comes.

    Not the one of when the handler was made: a process, or a test, may replace standard
    error meanwhile.
    """

    @property
    def stream(self) -> Any:
        """The current standard error."""
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def _route_stdlib_logging(renderer: Any, level: int) -> None:
    """Render stdlib records (uvicorn's error logger, asyncio, ...) like our events.

    One handler on the root logger, formatting with the same renderer, so every line the
    process writes follows the chosen format. Calling again replaces it.
    """
    handler = _StandardError()
    handler.set_name(_STDLIB_HANDLER)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[
                structlog.stdlib.add_logger_name,
                structlog.processors.add_log_level,
                add_utc_timestamp,
                trace_to_type,
                drop_secrets,
            ],
        )
    )
    handler.setLevel(level)
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _STDLIB_HANDLER]:
        root.removeHandler(old)
    # The root logger's own level is left as it is (WARNING unless the application says
    # otherwise): other libraries' INFO chatter stays out, their warnings come through.
    root.addHandler(handler)


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
        render_json if json else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    numeric_level = logging.getLevelNamesMapping()[level.upper()]
    _route_stdlib_logging(renderer, numeric_level)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            add_utc_timestamp,
            drop_secrets,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        # Not cached: a cached logger ignores later reconfiguration (tests, embedding
        # processes); the lazy proxy costs a few microseconds per event.
        cache_logger_on_first_use=False,
    )
