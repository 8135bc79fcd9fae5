"""Operators of the command-line tests: their tokens, and the environment that names one.

A decision on the command line is recorded as the operator its token names in the
operators file; :func:`credentials` is that environment for one of these operators.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import structlog

from canon.operator_credentials import OPERATORS_ENV, TOKEN_ENV
from projections.console.auth import operator_line

#: The operators, each with a token of their own.
TOKENS = {name: f"{name}-token-{'x' * 20}" for name in ("ana", "bo", "cy", "ops", "dpo")}
#: The operators file's lines, as ``CANON_OPERATORS`` holds them.
OPERATORS = ";".join(operator_line(name, token) for name, token in TOKENS.items())


def credentials(operator: str, token: str | None = None) -> dict[str, str]:
    """The environment of a ``canon`` command run as ``operator`` (or with ``token``)."""
    return {OPERATORS_ENV: OPERATORS, TOKEN_ENV: token or TOKENS[operator]}


def without_credentials(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` without any operator credential."""
    return {k: v for k, v in environ.items() if k not in (OPERATORS_ENV, TOKEN_ENV)}


@contextmanager
def logging_kept() -> Iterator[None]:
    """Put back the logging set-up a command run in this process replaces.

    ``canon`` configures structlog and the root logger for its process; run in a test's
    process, it would leave them writing to that test's captured (then closed) streams.
    """
    saved = structlog.get_config()
    handlers = list(logging.getLogger().handlers)
    try:
        yield
    finally:
        structlog.configure(**saved)
        logging.getLogger().handlers[:] = handlers
