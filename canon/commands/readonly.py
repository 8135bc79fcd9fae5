"""Connection glue shared by the read-only commands (replay, verify, export, inspect, status).

:func:`run_read_only` opens the store without writing a byte and turns connection
failures into one line on standard error and exit code 2.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable

from rich.console import Console

from canon.connection import ACCESS_DENIED_MESSAGE, configured_url
from canon.exitcodes import RET_USAGE
from eventstore.audit import open_read_only
from eventstore.errors import AccessDenied, InvalidArgument, StoreUnavailable
from eventstore.store import Store


def fail(message: str) -> None:
    """Write one ``canon: error:`` line to standard error."""
    print(f"canon: error: {message}", file=sys.stderr)


def stdout_console() -> Console:
    """A console on standard output; wide when not a terminal so ids are never cut."""
    return Console(highlight=False, width=None if sys.stdout.isatty() else 240)


def run_read_only(args: argparse.Namespace, work: Callable[[Store], Awaitable[int]]) -> int:
    """Open the configured store read-only, run ``work`` on it, and return its exit code.

    No Redis configured, invalid settings, an unreachable server or an ACL denial give
    one line on standard error (never the URL or a password) and :data:`RET_USAGE`.
    """
    url = configured_url(args)
    if url is None:
        fail("no Redis configured: set REDIS_URL or --redis-url")
        return RET_USAGE

    cluster = bool(getattr(args, "cluster", False))

    async def main() -> int:
        async with open_read_only(
            url, namespace=args.namespace, shards=args.shards, cluster=cluster
        ) as store:
            return await work(store)

    try:
        return asyncio.run(main())
    except InvalidArgument as exc:
        fail(f"invalid connection settings: {exc}")
    except AccessDenied:
        fail(ACCESS_DENIED_MESSAGE)
    except StoreUnavailable as exc:
        fail(f"the Redis server is unavailable ({exc})")
    return RET_USAGE
