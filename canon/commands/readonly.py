"""What the read-only commands (replay, verify, export, inspect, status, runs) share.

:func:`read_only_command` registers one (its connection options, no ``--ttl-s``, its
handler); :func:`bad_ids` checks the ids named on its command line, one line on
standard error for a bad one; :func:`run_read_only` opens the store without writing a
byte, and connection failures become one line on standard error in ``canon.cli``
(:mod:`canon.command_errors`): exit code 2 for bad settings, 3 for a server that cannot be
reached. :func:`print_json` writes one JSON document a line; :func:`refuse_cluster` says
that a command that scans one server was pointed at a cluster. :func:`elsewhere` ends a
"nothing found" line with the other namespaces that hold runs (or the run asked for).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Final

import msgspec
from rich.console import Console

from canon.command_errors import CommandError, fail
from canon.connection import add_connection_args, configured_url
from eventstore.audit import open_read_only
from eventstore.audit.namespaces import OtherNamespaces, other_namespaces
from eventstore.errors import CanonError
from eventstore.keyring import load_keyring
from eventstore.store import Store
from machine.ids import is_run_id, is_tool_call_id
from projections.archive.database import archive_at
from projections.archive.schema import check_schema
from projections.archive.source import ArchiveSource
from projections.receipts.builder import iso_ms

__all__ = [
    "ARCHIVE_ENV",
    "add_archive_arg",
    "archive_url",
    "bad_ids",
    "elsewhere",
    "fail",
    "print_json",
    "read_only_command",
    "refuse_cluster",
    "run_on_archive",
    "run_read_only",
    "stdout_console",
    "where_else",
]

#: The environment variable naming the archive database (``--archive`` overrides it).
ARCHIVE_ENV: Final = "CANON_ARCHIVE_URL"

#: Namespaces named in a hint before the rest are only counted.
NAMES_SHOWN: Final = 5

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


def _listed(names: tuple[str, ...]) -> str:
    shown = ", ".join(names[:NAMES_SHOWN])
    more = len(names) - NAMES_SHOWN
    return f"{shown} and {more} more" if more > 0 else shown


def _pointed(what: str, names: tuple[str, ...]) -> str:
    """``what`` is in the namespace(s) ``names``, and the flag that goes there."""
    if len(names) == 1:
        return f"{what} in namespace {names[0]}: add --namespace {names[0]}"
    return f"{what} in namespaces {_listed(names)}: add --namespace with one of them"


def where_else(found: OtherNamespaces, run_id: str | None = None) -> str:
    """The clause that ends a "nothing found" line: ``"; ..."``, or ``""`` to add nothing.

    The run's own namespaces first (``run R is in namespace demo: add --namespace demo``),
    else the namespaces that hold runs; and, when the bounded search stopped early, that
    it did.
    """
    if run_id is not None and found.holding_run:
        clause = _pointed(f"run {run_id} is", found.holding_run)
    elif run_id is not None and found.with_runs:
        clause = f"run {run_id} is in no other namespace either (runs exist in "
        clause += f"namespace{'s' if len(found.with_runs) > 1 else ''} {_listed(found.with_runs)})"
    elif found.with_runs:
        clause = _pointed("runs exist", found.with_runs)
    elif not found.complete:
        return f"; no other namespace with runs among the first {found.keys_bound} keys searched"
    else:
        return ""
    if not found.complete:
        clause += f" (searched the first {found.keys_bound} keys only)"
    return f"; {clause}"


async def elsewhere(store: Store, run_id: str | None = None) -> str:
    """Return :func:`where_else`'s clause after a search of the other namespaces.

    The search is bounded (see :mod:`eventstore.audit.namespaces`); ``""`` when it cannot
    run at all.
    """
    try:
        found = await other_namespaces(store, run_id)
    except CanonError:
        # A user that may not SCAN, or a server gone meanwhile: the line stays as it was.
        return ""
    return where_else(found, run_id)


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
            url,
            namespace=args.namespace,
            shards=args.shards,
            cluster=cluster,
            keys=load_keyring(),  # CANON_KEYS: encrypted payloads are read opened
        ) as store:
            return await work(store)

    return asyncio.run(main())


def add_archive_arg(parser: argparse.ArgumentParser, help: str) -> None:
    """Add ``--archive URL`` (default: ``$CANON_ARCHIVE_URL`` when the flag is given bare)."""
    parser.add_argument(
        "--archive",
        nargs="?",
        const=os.environ.get(ARCHIVE_ENV) or "",
        default=None,
        metavar="URL",
        help=f"{help} (sqlite:///FILE or postgresql://...; bare: ${ARCHIVE_ENV})",
    )


def archive_url(args: argparse.Namespace) -> str | None:
    """The archive the command reads, or None when it reads Redis.

    Raises:
        CommandError: ``--archive`` was given bare and ``$CANON_ARCHIVE_URL`` is unset.

    """
    url: str | None = getattr(args, "archive", None)
    if url is None:
        return None
    if not url:
        raise CommandError(f"--archive needs a URL, or set {ARCHIVE_ENV}")
    return url


def run_on_archive(
    args: argparse.Namespace, work: Callable[[ArchiveSource], Awaitable[int]]
) -> int:
    """Open the archive ``--archive`` names, check its schema, and run ``work`` on it.

    Raises:
        CommandError: no archive URL.
        InvalidArgument: the URL is not an archive URL.
        ArchiveSchemaError: the archive's schema is not this version's.
        ArchiveUnavailable: the database cannot be read.

    """
    url = archive_url(args)
    if url is None:
        raise CommandError(f"name the archive with --archive URL or {ARCHIVE_ENV}")

    async def main() -> int:
        async with archive_at(url) as database:
            await check_schema(database)
            # CANON_KEYS: encrypted payloads are read opened, with the archived data keys
            source = ArchiveSource(database, args.namespace, keys=load_keyring())
            return await work(source)

    return asyncio.run(main())


def pause_note(by: str, reason: str, at_ms: int | None) -> str:
    """`` by ana since <time>: why``, as far as the run recorded them."""
    note = f" by {by}" if by else ""
    if at_ms is not None:
        note += f" since {iso_ms(at_ms)}"
    return note + (f": {reason}" if reason else "")
