"""``canon rebuild receipts|progress``: recompute a projection from the records, then switch.

The projection is rebuilt into a new generation beside the one readers use, while live
workers go on; one step then switches every reader to it, following workers move to it
within about a second, and the previous generation is removed once no worker uses it.
Exit 0 when switched, 1 when another rebuild holds the
claim or took it over, 2 on usage errors, 3 when Redis is unavailable.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from contextlib import ExitStack
from typing import Any

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from canon.commands.readonly import fail, print_json, stdout_console
from canon.connection import add_connection_args, open_store
from canon.exitcodes import RET_OK, RET_PROBLEM
from canon.service import add_logging_args, setup_logging
from eventstore.errors import RebuildLost
from projections.rebuild import (
    PROJECTIONS,
    Rebuild,
    RebuildInProgress,
    RebuildReport,
)


def _print_report(console: Console, report: RebuildReport) -> None:
    records = sum(report.records.values())
    console.print(
        f"{report.projection}: generation {report.previous_generation} → "
        f"{report.generation} in {report.seconds:.1f} s; readers now use generation "
        f"{report.generation}"
    )
    console.print(
        f"{records} records projected "
        f"({', '.join(f'{k} {v}' for k, v in report.records.items()) or 'none'}); "
        f"{sum(report.drained.values())} feed entries settled during the rebuild"
    )
    if report.old_generation_removed:
        console.print(
            f"generation {report.previous_generation} removed "
            f"({report.old_keys_deleted} output keys deleted)"
        )
    else:
        console.print(
            f"generation {report.previous_generation} kept: its outputs expire with their "
            "records; run the rebuild again later to remove it sooner"
        )


def _handle(args: argparse.Namespace) -> int:
    setup_logging(args)

    async def work() -> RebuildReport:
        async with open_store(args) as store:
            show = not args.no_progress and sys.stderr.isatty()
            with ExitStack() as stack:
                progress = Progress(
                    SpinnerColumn(),
                    TextColumn(f"rebuilding {args.projection}"),
                    TextColumn("{task.completed} records"),
                    TimeElapsedColumn(),
                    console=Console(stderr=True),
                    disable=not show,
                    transient=True,
                )
                stack.enter_context(progress)
                task = progress.add_task("rebuild", total=None)
                rebuild = Rebuild(
                    store,
                    args.projection,
                    takeover=args.takeover,
                    keep_old=args.keep_old,
                    grace_s=args.grace_s,
                    on_record=lambda done: progress.update(task, completed=done),
                )
                return await rebuild.run()

    try:
        report = asyncio.run(work())
    except (RebuildInProgress, RebuildLost) as exc:
        fail(str(exc))
        return RET_PROBLEM
    if args.json:
        print_json(report)
    else:
        _print_report(stdout_console(), report)
    return RET_OK


def _grace(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError("must be between 0 and 3600 seconds")
    return value


def register(subparsers: Any) -> None:
    """Add the ``rebuild`` subcommand."""
    parser = subparsers.add_parser(
        "rebuild",
        help="recompute a projection from the records and switch readers to it",
        description=__doc__,
    )
    parser.add_argument("projection", choices=sorted(PROJECTIONS), help="what to rebuild")
    parser.add_argument(
        "--takeover",
        action="store_true",
        help="replace the claim of another rebuild of this projection (one that died)",
    )
    parser.add_argument(
        "--keep-old",
        action="store_true",
        help="leave the previous generation in place (it expires with its records)",
    )
    parser.add_argument(
        "--grace-s",
        type=_grace,
        default=10.0,
        help="how long to wait for workers to leave the previous generation (10)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_connection_args(parser, writes=False)
    add_logging_args(parser)
    # The report is the output; log lines only for what needs attention.
    parser.set_defaults(handler=_handle, log_level="WARNING")
