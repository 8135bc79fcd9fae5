"""How the library logs: key/value events on stdlib loggers under ``canon.``, quiet by default.

Library modules (``eventstore``, ``projections``) take their logger from :func:`get_logger`
and never configure logging. Where an event goes is decided as it is logged:

- When structlog is configured (by the application, by the ``canon`` command's entry
  point, by a test's ``capture_logs``), the event runs through that configuration: the
  application gets canon's events in its own structlog format, fields and all.
- Otherwise the event becomes one record of the stdlib logger of the same name
  (``canon.boundary``, ``canon.durability`` ...), built only if that logger is enabled for
  its level. The message is ``event key=value ...``; each field is also an attribute of
  the record (``record.run_id``; a field named like a record attribute gets a ``canon_``
  prefix), so a handler or formatter of the application can use them. An application
  that configured nothing sees warnings and errors only, on standard error (the stdlib's
  last-resort handler); DEBUG and INFO events then cost one level check.

Nothing here ever writes to standard output, and :func:`drop_secrets` blanks fields that
must never leave the process on the stdlib path (the ``canon`` command adds it to its
own chain).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping
from typing import Any, Final

import structlog
import structlog.stdlib
from structlog.typing import Processor

_SECRET_FIELDS: Final = frozenset(
    {"token", "access_token", "password", "authorization", "payload", "raw", "request"}
)
#: Attributes every LogRecord has: a field with one of these names would overwrite it.
_RECORD_ATTRIBUTES: Final = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
}
_LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "exception": logging.ERROR,
    "critical": logging.CRITICAL,
    "fatal": logging.CRITICAL,
}


def drop_secrets(
    _logger: object, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Replace values of fields that must never be logged (a structlog processor)."""
    if _SECRET_FIELDS.isdisjoint(event_dict):  # the common case, without building a set
        return event_dict
    for name in _SECRET_FIELDS & event_dict.keys():
        event_dict[name] = "<redacted>"
    return event_dict


def _value(value: Any) -> str:
    """A field's value in a message: plain when unambiguous, else its ``repr``."""
    if isinstance(value, str) and value and not any(c in value for c in " =\"'"):
        return value
    return repr(value)


#: Files whose frames are logging machinery, not the place an event was logged from.
_MACHINERY: Final = (os.path.dirname(structlog.__file__), __file__)


def _caller_level() -> int:
    """The ``stacklevel`` that names the library code that logged (%(funcName)s ...).

    Counted from :func:`to_record` (1): structlog's ``_process_event`` (2) and the
    structlog method that calls the stdlib logger (3), which stacklevel 1 names.
    """
    frame, depth = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_MACHINERY):
        frame, depth = frame.f_back, depth + 1
    return max(depth - 2, 1)


def to_record(
    _logger: object, _method: str, event_dict: MutableMapping[str, Any]
) -> tuple[tuple[str], dict[str, Any]]:
    """Last processor of the stdlib path: the record's message and its ``extra`` fields."""
    event = str(event_dict.pop("event", ""))
    exc_info = event_dict.pop("exc_info", None)
    message = " ".join([event, *(f"{name}={_value(v)}" for name, v in event_dict.items())])
    extra = {
        (f"canon_{name}" if name in _RECORD_ATTRIBUTES else name): value
        for name, value in event_dict.items()
    }
    extra["event"] = event
    options: dict[str, Any] = {"extra": extra, "stacklevel": _caller_level()}
    if exc_info:
        options["exc_info"] = exc_info
    return (message,), options


_STDLIB_PROCESSORS: Final[list[Processor]] = [drop_secrets, to_record]


class StdlibBoundLogger(structlog.stdlib.BoundLogger):
    """A structlog stdlib logger that builds nothing for a level its logger ignores."""

    def _proxy_to_logger(
        self, method_name: str, event: str | None = None, *event_args: str, **event_kw: Any
    ) -> Any:
        if not self._logger.isEnabledFor(_LEVELS.get(method_name, logging.NOTSET)):
            return None
        return super()._proxy_to_logger(method_name, event, *event_args, **event_kw)


class CanonLogger:
    """A library logger: ``log.info("event_name", field=value)``; see the module docstring.

    Args:
        name: the stdlib logger name, under ``canon.``.

    """

    __slots__ = ("_configured", "_plain", "_same_as", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._plain = StdlibBoundLogger(logging.getLogger(name), _STDLIB_PROCESSORS, {})
        self._configured: Any = None
        self._same_as: tuple[Any, ...] = ()

    def bind(self, **fields: Any) -> Any:
        """Return a concrete logger for the configuration of now, carrying ``fields``.

        A caller that logs several events in a row (one tool call) binds once.
        """
        if not structlog.is_configured():
            return self._plain.bind(**fields) if fields else self._plain
        if fields:
            return structlog.get_logger(self.name).bind(**fields)
        # Building a logger from the configuration costs more than the line it logs; the
        # one built last is kept while the configuration's parts are the same objects.
        config = structlog.get_config()
        same = self._same_as
        if not (
            same
            and config["processors"] is same[0]
            and config["wrapper_class"] is same[1]
            and config["logger_factory"] is same[2]
            and config["context_class"] is same[3]
        ):
            self._configured = structlog.get_logger(self.name).bind()
            self._same_as = (
                config["processors"],
                config["wrapper_class"],
                config["logger_factory"],
                config["context_class"],
            )
        return self._configured

    def is_enabled_for(self, level: int) -> bool:
        """Tell whether an event at ``level`` would be emitted now."""
        enabled = getattr(self.bind(), "is_enabled_for", None)
        return enabled is None or bool(enabled(level))

    def debug(self, event: str, **fields: Any) -> None:
        """Log a DEBUG event."""
        self.bind().debug(event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        """Log an INFO event."""
        self.bind().info(event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        """Log a WARNING event."""
        self.bind().warning(event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        """Log an ERROR event."""
        self.bind().error(event, **fields)


def get_logger(name: str) -> CanonLogger:
    """Return the library logger ``name`` (a stdlib logger name under ``canon.``)."""
    return CanonLogger(name)
