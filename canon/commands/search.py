"""``canon search``: find archived calls across runs.

Filters: ``--tool``, ``--code`` (error code), ``--exception`` (exception type of a
failed call), ``--stage``, ``--approver``, ``--run``, ``--since`` / ``--until`` (ISO
8601 times, or ms since the epoch), and ``--where`` conditions on a JSON path of the
request or result (``request.amount>500``, ``result.status="timeout"``, repeatable).
Every filter given must hold. Newest first, ``--limit`` a page; the next page with the
``--cursor`` printed last. ``--json``: one JSON line per call, then one with the cursor.
Reads the archive (``--archive URL`` or ``$CANON_ARCHIVE_URL``). Exit 0 when calls were
found, 1 when none, 2 on usage errors, 3 when the archive is unavailable.
"""

from __future__ import annotations

import argparse
import asyncio
import os

import msgspec
from rich import box
from rich.markup import escape
from rich.table import Table

from canon.command_errors import CommandError, fail
from canon.commands.readonly import (
    ARCHIVE_ENV,
    add_archive_arg,
    print_json,
    stdout_console,
)
from canon.connection import add_connection_args
from canon.exitcodes import RET_OK, RET_PROBLEM, RET_USAGE
from eventstore.errors import InvalidArgument
from projections.archive.database import archive_at
from projections.archive.schema import check_schema
from projections.archive.search import SearchQuery, parse_condition, parse_time, search
from projections.archive.store import Archive
from projections.receipts.builder import iso_ms


def when(text: str) -> int:
    """A time given on the command line, as ms since the epoch (ISO 8601, or ms).

    Raises:
        argparse.ArgumentTypeError: neither.

    """
    try:
        return parse_time(text)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``search`` subcommand."""
    parser = subparsers.add_parser(
        "search",
        help="find archived calls across runs (tool, code, JSON paths...)",
        description=__doc__,
    )
    parser.add_argument("--tool", default=None, help="tool name")
    parser.add_argument("--code", default=None, help="error code")
    parser.add_argument("--exception", default=None, help="exception type of a failed call")
    parser.add_argument("--stage", default=None, help="stage (READY, ERROR, APPROVED...)")
    parser.add_argument("--approver", default=None, help="who decided a governed call")
    parser.add_argument("--run", default=None, help="one run")
    parser.add_argument("--since", type=when, default=None, help="created at or after")
    parser.add_argument("--until", type=when, default=None, help="created before")
    parser.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="CONDITION",
        help='a JSON-path condition: request.amount>500, result.status="timeout"',
    )
    parser.add_argument("--limit", type=int, default=50, help="calls a page (1-1000, 50)")
    parser.add_argument("--cursor", default=None, help="the next page's cursor")
    parser.add_argument("--json", action="store_true", help="JSON Lines on stdout")
    add_archive_arg(parser, "the archive to search (default: $CANON_ARCHIVE_URL)")
    add_connection_args(parser, writes=False)
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    try:
        query = SearchQuery(
            tool=args.tool,
            error_code=args.code,
            exception_type=args.exception,
            stage=args.stage,
            approver=args.approver,
            run_id=args.run,
            since_ms=args.since,
            until_ms=args.until,
            conditions=tuple(parse_condition(text) for text in args.where),
            limit=args.limit,
            cursor=args.cursor,
        )
    except InvalidArgument as exc:
        fail(str(exc))
        return RET_USAGE
    url = args.archive or os.environ.get(ARCHIVE_ENV)
    if not url:
        raise CommandError(f"name the archive with --archive URL or {ARCHIVE_ENV}")

    async def main() -> int:
        async with archive_at(url) as database:
            await check_schema(database)
            page = await search(Archive(database, args.namespace), query)
        if args.json:
            for hit in page.hits:
                print_json({"kind": "call", **_document(hit)})
            print_json({"kind": "page", "calls": len(page.hits), "cursor": page.cursor})
        else:
            console = stdout_console()
            table = Table(box=box.SIMPLE_HEAD, title="archived calls, newest first")
            for name in ("created", "run", "call", "tool", "stage", "code", "exception"):
                table.add_column(name, overflow="fold")
            for hit in page.hits:
                table.add_row(
                    iso_ms(hit.created_at_ms),
                    escape(hit.run_id),
                    escape(hit.tool_call_id),
                    escape(hit.tool),
                    hit.stage,
                    hit.error_code or "",
                    escape(hit.exception_type or ""),
                )
            console.print(table)
            more = f"; next page: --cursor {page.cursor}" if page.cursor else ""
            console.print(f"{len(page.hits)} call(s){more}", highlight=False)
        return RET_OK if page.hits else RET_PROBLEM

    return asyncio.run(main())


def _document(hit: object) -> dict[str, object]:
    document = msgspec.to_builtins(hit)
    assert isinstance(document, dict)
    return document
