"""``canon runs``: recent runs, newest first, from the per-shard run indexes (no SCAN).

Each run with its status (active, closed, or expired: its deadline passed while open;
``paused`` beside it while it is paused, with who paused it, why and since when listed
under the table), its calls by outcome (READY, ERROR; those not ended split into the
governed calls waiting for a decision or their resume and those in flight), its budget
used out of its total and its deadline. ``--limit`` runs per page; the last line gives
the ``--cursor`` of the next page. Read-only. Exit 0, 2 on usage errors, 3 when Redis is
unavailable.
"""

from __future__ import annotations

import argparse
from typing import Any, cast

import msgspec
from rich.console import Console
from rich.table import Table

from canon.argtypes import bounded
from canon.commands.readonly import (
    elsewhere,
    pause_note,
    print_json,
    read_only_command,
    run_read_only,
    stdout_console,
)
from canon.exitcodes import RET_OK
from eventstore.audit.run_index import MAX_LIMIT, RunPage, list_runs, parse_cursor
from eventstore.errors import InvalidArgument
from eventstore.store import Store
from projections.receipts.builder import iso_ms


def _cursor(text: str) -> str:
    try:
        parse_cursor(text)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(
            f"{exc} (copy it from the last line of a canon runs page)"
        ) from None
    return text


def print_runs(console: Console, page: RunPage, namespace: str, hint: str = "") -> None:
    """Print one page of runs as a table, and how to get the next one.

    ``hint`` ends the line of an empty page (see :func:`canon.commands.readonly.elsewhere`).
    """
    if not page.runs:
        console.print(
            f"no runs in namespace {namespace} (none opened, or all expired){hint}",
            highlight=False,
            soft_wrap=True,
        )
        return
    table = Table(
        title=f"runs of namespace {namespace}, newest first",
        caption="calls: by status as they ended; waiting: governed calls awaiting approval "
        "(or approved, awaiting their resume); in flight: the rest not ended (dispatching, "
        "or left by a process that died); budget: used / total; refused: calls turned "
        "away before any record",
        caption_justify="left",
    )
    columns = (
        "run",
        "status",
        "opened",
        "deadline",
        "READY",
        "ERROR",
        "waiting",
        "in flight",
        "refused",
    )
    for column in (*columns, "budget"):
        right = column[0].isupper() or column in ("waiting", "in flight", "refused")
        table.add_column(column, no_wrap=True, justify="right" if right else "left")
    for run in page.runs:
        total = "-" if run.budget_total is None else str(run.budget_total)
        table.add_row(
            run.run_id,
            run.status + (" · paused" if run.pause is not None else ""),
            iso_ms(run.opened_at_ms)[:19].replace("T", " "),
            iso_ms(run.deadline_ms)[:19].replace("T", " "),
            str(run.calls.get("READY", 0)),
            str(run.calls.get("ERROR", 0)),
            str(run.awaiting_approval + run.approved),
            str(run.in_flight),
            str(sum(run.refused.values())),
            f"{run.budget_used}/{total}",
        )
    console.print(table)
    for run in page.runs:
        if run.pause is not None:
            note = pause_note(run.pause.by, run.pause.reason, run.pause.at_ms)
            console.print(f"paused: {run.run_id}{note}", highlight=False, soft_wrap=True)
    for run in page.runs:
        if run.refused:
            codes = ", ".join(f"{code} {count}" for code, count in sorted(run.refused.items()))
            console.print(f"refused in {run.run_id}: {codes}", highlight=False, soft_wrap=True)
    if page.cursor is not None:
        console.print(f"older runs: canon runs --cursor {page.cursor}", soft_wrap=True)


def runs_document(page: RunPage) -> dict[str, Any]:
    """A page of runs as ``--json`` prints it: each run with its count in flight too."""
    document = msgspec.to_builtins(page)
    for run, shown in zip(page.runs, document["runs"], strict=True):
        shown["in_flight"] = run.in_flight
    return cast(dict[str, Any], document)


def _handle(args: argparse.Namespace) -> int:
    async def work(store: Store) -> int:
        page = await list_runs(store, limit=args.limit, cursor=args.cursor)
        if args.json:
            print_json(runs_document(page))
        else:
            # Only a first page can be empty for want of runs; a later one is just the end.
            empty = not page.runs and args.cursor is None
            hint = await elsewhere(store) if empty else ""
            print_runs(stdout_console(), page, store.keys.namespace, hint)
        return RET_OK

    return run_read_only(args, work)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``runs`` subcommand."""
    parser = read_only_command(
        subparsers,
        "runs",
        help="list recent runs: status, calls by outcome, budget, deadline",
        description=__doc__,
        handler=_handle,
    )
    parser.add_argument(
        "--limit",
        type=bounded(1, MAX_LIMIT, f"a whole number from 1 to {MAX_LIMIT}"),
        default=20,
        help="runs per page (20)",
    )
    parser.add_argument(
        "--cursor", type=_cursor, default=None, help="where a page starts (a page's last line)"
    )
    parser.add_argument("--json", action="store_true", help="the page as one JSON document")
