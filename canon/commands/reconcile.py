"""``canon reconcile [RUN_ID] [--tools MODULE:NAME]``: end the calls dead processes left.

A call in flight is held by the lease of the process running it; a call whose lease
lapsed (``--grace`` seconds ago at least, default 300) was left by a process that died.
This command settles what can be settled of those calls, of one run or of the latest
runs (``--runs``, from the run index: never a SCAN):

- a call of a read-only tool that no retry took over ends ERROR ``ABANDONED``;
- a governed call whose raw response was recorded is projected (its journal proves
  it ran); with ``--tools``, the harness's tools (``MODULE:NAME``, a mapping of tool
  names to ``ToolSpec``, or a function returning one), each attempted call's tool's
  reconcile hook is asked what happened: executed (its raw response projected), not
  executed (ends ``RECONCILED_NOT_EXECUTED``), or unknown (left);
- what no hook can settle is listed, for an operator's ``canon settle``.

Nothing is dispatched again; every settlement is an event of the call's own chain. It
writes records, so it runs with the writer's credentials. Run it from cron or a timer.
Exit 0 when no call is left in flight, 1 when some are (listed: run ``canon settle`` for
them), 2 on usage errors (a ``--tools`` that cannot be loaded), 3 when Redis is
unavailable.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from rich.table import Table

from canon.argtypes import bounded
from canon.command_errors import CommandError
from canon.commands.readonly import bad_ids, print_json, stdout_console
from canon.connection import add_connection_args, open_store
from canon.exitcodes import RET_OK, RET_PROBLEM
from canon.service import add_logging_args, setup_logging
from eventstore import ReconcileReport, ToolBoundary, ToolSpec

#: What each outcome is called in the table.
_SHOWN = {
    "executed": "executed: its raw response projected",
    "not_executed": "not executed: ended RECONCILED_NOT_EXECUTED",
    "abandoned": "abandoned: ended ABANDONED",
    "unknown": "left: the hook could not tell",
    "hook_failed": "left: the hook failed",
    "hook_timed_out": "left: the hook timed out",
    "needs_operator": "left: needs an operator (no hook)",
    "still_running": "left: its process still holds it",
    "settled_elsewhere": "settled by someone else meanwhile",
}


def load_tools(spec: str) -> Mapping[str, ToolSpec]:
    """The harness's tools named ``MODULE:NAME`` (a mapping, or a function returning one).

    Raises:
        CommandError: it cannot be imported, is not there, or is not tools (one line,
            never a traceback of the harness's code).

    """
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise CommandError(f"--tools {spec}: write MODULE:NAME (my_harness.tools:TOOLS)")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise CommandError(
            f"--tools {spec}: cannot import {module_name} ({type(exc).__name__})"
        ) from None
    found: Any = getattr(module, name, None)
    if found is None:
        raise CommandError(f"--tools {spec}: {module_name} has no {name}")
    if callable(found) and not isinstance(found, Mapping):
        try:
            found = found()
        except Exception as exc:
            raise CommandError(f"--tools {spec}: {name}() raised {type(exc).__name__}") from None
    if not isinstance(found, Mapping) or not all(
        isinstance(tool, ToolSpec) for tool in found.values()
    ):
        raise CommandError(f"--tools {spec}: not a mapping of tool names to ToolSpec")
    return found


def print_report(report: ReconcileReport) -> None:
    """The calls a reconcile looked at, one row each, and what is left to an operator."""
    console = stdout_console()
    if not report.calls:
        console.print(
            f"no call left in flight in the {report.runs_examined} run(s) looked at",
            highlight=False,
        )
        return
    table = Table(title="calls left in flight by processes that died", title_justify="left")
    for name in ("run", "call", "tool", "kind", "what was done", "status"):
        table.add_column(name, overflow="fold")
    for call in report.calls:
        table.add_row(
            call.run_id,
            call.tool_call_id,
            call.tool,
            "attempted" if call.governed else "abandoned",
            _SHOWN[call.outcome],
            call.status + (f" {call.error_code}" if call.error_code else ""),
        )
    console.print(table)
    for call in report.left:
        console.print(
            f"settle it: canon settle {call.run_id} {call.tool_call_id} "
            "--executed|--not-executed --evidence TEXT",
            highlight=False,
            soft_wrap=True,
        )


def _handle(args: argparse.Namespace) -> int:
    setup_logging(args)
    if args.run_id is not None and bad_ids(args.run_id):
        return RET_PROBLEM
    tools = load_tools(args.tools) if args.tools else {}

    async def work() -> ReconcileReport:
        async with open_store(args) as store:
            boundary = ToolBoundary(store, tools)
            try:
                return await boundary.reconcile(
                    args.run_id, grace=timedelta(seconds=args.grace), runs=args.runs
                )
            finally:
                boundary.close()

    report = asyncio.run(work())
    if args.json:
        print_json({**_document(report), "left": len(report.left)})
    else:
        print_report(report)
    return RET_PROBLEM if report.left else RET_OK


def _document(report: ReconcileReport) -> dict[str, Any]:
    return {
        "calls": report.calls,
        "runs_examined": report.runs_examined,
        "complete": report.complete,
    }


def register(subparsers: Any) -> None:
    """Add ``reconcile``."""
    parser = subparsers.add_parser(
        "reconcile",
        help="end the calls processes left in flight when they died (from cron)",
        description=__doc__,
    )
    parser.add_argument("run_id", nargs="?", help="the run (without one: the latest runs)")
    parser.add_argument(
        "--tools",
        metavar="MODULE:NAME",
        help="your harness's tools (a mapping of names to ToolSpec, or a function returning "
        "one): their reconcile hooks settle the attempted calls",
    )
    parser.add_argument(
        "--grace",
        type=bounded(0, None, "a whole number of seconds, 0 or more"),
        default=300,
        help="how long past its lease a call must be (default 300 seconds)",
    )
    parser.add_argument(
        "--runs",
        type=bounded(1, 2000, "a whole number from 1 to 2000"),
        default=200,
        help="how many of the latest runs to look at, without a run (default 200)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    add_connection_args(parser)
    add_logging_args(parser)
    parser.set_defaults(handler=_handle, log_level="WARNING")
