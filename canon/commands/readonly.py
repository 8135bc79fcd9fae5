"""Connection glue shared by the read-only commands (replay, verify, export, inspect, status).

:func:`run_read_only` opens the store without writing a byte; connection failures become
one line on standard error in ``canon.cli`` (:mod:`canon.failures`): exit code 2 for bad
settings, 3 for a server that cannot be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable

from rich.console import Console

from canon.connection import configured_url
from canon.failures import CommandError, fail
from eventstore.audit import open_read_only
from eventstore.store import Store

__all__ = ["fail", "run_read_only", "stdout_console"]


def stdout_console() -> Console:
    """A console on standard output; wide when not a terminal so ids are never cut."""
    return Console(highlight=False, width=None if sys.stdout.isatty() else 240)


def run_read_only(args: argparse.Namespace, work: Callable[[Store], Awaitable[int]]) -> int:
    """Open the configured store read-only, run ``work`` on it, and return its exit code.

    Raises:
        CommandError: no Redis is configured (read-only commands start none).
        StoreUnavailable: the server cannot be reached (AccessDenied: the ACL user may
            not read).
        InvalidArgument: the namespace or shard count is not usable.

    """
    url = configured_url(args)
    if url is None:
        raise CommandError("no Redis configured: set REDIS_URL or --redis-url")

    cluster = bool(getattr(args, "cluster", False))

    async def main() -> int:
        async with open_read_only(
            url, namespace=args.namespace, shards=args.shards, cluster=cluster
        ) as store:
            return await work(store)

    return asyncio.run(main())
