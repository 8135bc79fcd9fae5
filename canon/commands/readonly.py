"""What the read-only commands (replay, verify, export, inspect, status, runs) share.

:func:`read_only_command` registers one (its connection options, no ``--ttl-s``, its
handler); :func:`bad_ids` checks the ids named on its command line, one line on
standard error for a bad one; :func:`run_read_only` opens the store without writing a
byte, and connection failures become one line on standard error in ``canon.cli``
(:mod:`canon.failures`): exit code 2 for bad settings, 3 for a server that cannot be
reached. :func:`print_json` writes one JSON document a line; :func:`refuse_cluster` says
that a command that scans one server was pointed at a cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Final

import msgspec
from rich.console import Console

from canon.connection import add_connection_args, configured_url
from canon.failures import CommandError, fail
from eventstore.audit import open_read_only
from eventstore.store import Store
from machine.ids import is_run_id, is_tool_call_id

__all__ = [
    "bad_ids",
    "fail",
    "print_json",
    "read_only_command",
    "refuse_cluster",
    "run_read_only",
    "stdout_console",
]

#: What a run id on the command line must be (:func:`machine.ids.is_run_id`).
RUN_ID_RULE: Final = (
    "RUN_ID must be a safe id: 1-128 letters, digits, '.', '_' or '-', not starting with '.'"
)
#: What a tool call id on the command line must be (:func:`machine.ids.is_tool_call_id`).
TOOL_CALL_ID_RULE: Final = (
    "TOOL_CALL_ID must be a safe id: 1-512 UTF-8 bytes without whitespace or control characters"
)


def read_only_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    *,
    help: str,
    description: str | None,
    handler: Callable[[argparse.Namespace], int],
) -> argparse.ArgumentParser:
    """Add the read-only subcommand ``name``; the caller adds its own arguments."""
    parser = subparsers.add_parser(name, help=help, description=description)
    add_connection_args(parser, writes=False)
    parser.set_defaults(handler=handler)
    return parser


def bad_ids(run_id: str, tool_call_id: str | None = None) -> bool:
    """Whether an id named on the command line is unsafe; the first one is said in one line."""
    if not is_run_id(run_id):
        fail(RUN_ID_RULE)
        return True
    if tool_call_id is not None and not is_tool_call_id(tool_call_id):
        fail(TOOL_CALL_ID_RULE)
        return True
    return False


def print_json(document: object) -> None:
    """Write ``document`` as one line of JSON on standard output."""
    sys.stdout.write(msgspec.json.encode(document).decode() + "\n")


def refuse_cluster(store: Store, command: str) -> bool:
    """Whether ``store`` is a cluster, which ``command`` (a SCAN of one server) refuses."""
    if store.cluster is None:
        return False
    fail(
        f"{command} scans one server: run it against each primary's URL without "
        "--cluster (with --shards)"
    )
    return True


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
