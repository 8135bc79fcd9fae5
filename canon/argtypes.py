"""Argument types of the ``canon`` command: a bad value is one line naming what is wanted.

argparse turns the :class:`argparse.ArgumentTypeError` these raise into
``canon: error: argument --port: must be a port number from 0 to 65535 (got '99999')``
and exit code 2.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable

#: The levels ``--log-level`` accepts.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: Redis SCAN cursors are unsigned 64-bit numbers.
MAX_CURSOR = 2**64 - 1


def _integer(text: str, wanted: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {wanted} (got {text!r})") from None


def bounded(low: int, high: int | None, wanted: str) -> Callable[[str], int]:
    """An integer type accepting ``low <= value <= high`` (no upper bound when None)."""

    def parse(text: str) -> int:
        value = _integer(text, wanted)
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {wanted} (got {text!r})")
        return value

    parse.__name__ = wanted  # argparse names the type in some messages
    return parse


#: A count of at least one (shards, batch sizes, seconds of TTL).
positive = bounded(1, None, "a whole number of at least 1")
#: Zero or more.
non_negative = bounded(0, None, "a whole number of at least 0")
#: A TCP port; 0 asks the system for a free one.
port_number = bounded(0, 65535, "a port number from 0 to 65535")
#: A SCAN cursor, as printed by an earlier ``canon verify``.
scan_cursor = bounded(0, MAX_CURSOR, "a SCAN cursor printed by an earlier canon verify")


def log_level(text: str) -> str:
    """A logging level name, any case."""
    level = text.upper()
    if level not in LOG_LEVELS or level not in logging.getLevelNamesMapping():
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(LOG_LEVELS)} (got {text!r})")
    return level


def positive_float(text: str) -> float:
    """A finite number of seconds above zero (``0.5``, ``1800``)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0 (got {text!r})")
    return value
