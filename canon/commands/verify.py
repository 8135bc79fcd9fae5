"""``canon verify``: prove a whole namespace intact, or list every integrity failure.

SCAN-based and batched (one pipeline per batch), holding one batch at a time; a progress
bar on standard error when it is a terminal; resumable with ``--cursor``. Exit 0 when
clean, 1 when a problem was found or the scan stopped early, 2 on usage or connection
errors. Read-only: never writes, never touches a TTL.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack

import msgspec
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from canon.commands.readonly import fail, run_read_only, stdout_console
from canon.connection import add_connection_args
from canon.exitcodes import RET_OK, RET_PROBLEM, RET_USAGE
from eventstore.audit import NamespaceVerifier, VerifyProblem, VerifySummary
from eventstore.audit.verify import DEFAULT_BATCH
from eventstore.store import Store


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be positive")
    return value


def _print_summary(console: Console, summary: VerifySummary) -> None:
    table = Table(title="invocations by status", title_justify="left")
    table.add_column("status")
    table.add_column("count", justify="right")
    for status, count in summary.by_status.items():
        table.add_row(status, str(count))
    console.print(table)
    console.print(
        f"{summary.keys_scanned} keys scanned, {summary.invocations} invocations checked, "
        f"{summary.problems} problem(s)"
    )
    if not summary.complete:
        console.print(f"stopped before the end: resume with --cursor {summary.next_cursor}")
    elif summary.problems == 0:
        console.print("[green]CLEAN[/green]: every record matches its journal")


def _handle(args: argparse.Namespace) -> int:
    console = stdout_console()

    def on_problem(problem: VerifyProblem) -> None:
        if args.json:
            line = {"kind": "problem", **msgspec.structs.asdict(problem)}
            sys.stdout.write(msgspec.json.encode(line).decode() + "\n")
        else:
            console.print(
                f"PROBLEM {problem.invocation_id or '-'} "
                f"run={escape(problem.run_id) or '-'} call={escape(problem.tool_call_id) or '-'} "
                f"reason={problem.reason}"
            )

    async def work(store: Store) -> int:
        if store.cluster is not None:
            fail(
                "verify scans one server: run it against each primary's URL without "
                "--cluster (with --shards)"
            )
            return RET_USAGE
        show = not args.no_progress and sys.stderr.isatty()
        with ExitStack() as stack:
            progress = Progress(
                SpinnerColumn(),
                TextColumn("verifying {task.fields[ns]}"),
                TextColumn("{task.completed} keys · {task.fields[inv]} invocations"),
                TextColumn("· {task.fields[bad]} problems"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                disable=not show,
                transient=True,
            )
            stack.enter_context(progress)
            task = progress.add_task("verify", total=None, ns=store.keys.namespace, inv=0, bad=0)

            def on_batch(verifier: NamespaceVerifier) -> None:
                progress.update(
                    task,
                    completed=verifier.keys_scanned,
                    inv=verifier.invocations,
                    bad=verifier.problems,
                )

            verifier = NamespaceVerifier(
                store,
                cursor=args.cursor,
                batch=args.batch,
                on_problem=on_problem,
                on_batch=on_batch,
            )
            try:
                summary = await verifier.run(max_keys=args.max_keys)
            except BaseException:
                # Interrupted (Ctrl-C) or failed: the cursor to resume from is still good.
                print(
                    f"canon: verify stopped: resume with --cursor {verifier.cursor}",
                    file=sys.stderr,
                )
                raise
        if args.json:
            line = {"kind": "summary", **msgspec.structs.asdict(summary)}
            sys.stdout.write(msgspec.json.encode(line).decode() + "\n")
        else:
            _print_summary(console, summary)
        return RET_OK if summary.complete and summary.problems == 0 else RET_PROBLEM

    try:
        return run_read_only(args, work)
    except KeyboardInterrupt:
        return RET_PROBLEM


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``verify`` subcommand."""
    parser = subparsers.add_parser(
        "verify",
        help="check every record of a namespace against its journal",
        description=(
            "SCAN the namespace's records and streams in batches and report every "
            "integrity failure with its invocation id and reason: tampered field, broken "
            "chain, hash mismatch, illegal transition, payload digest mismatch, record "
            "without stream, stream without record, key without TTL. Counts invocations "
            "by status. Read-only. Exit 0 clean, 1 problems or stopped early, 2 usage or "
            "connection errors. With --json: one JSON line per problem, then a summary line."
        ),
    )
    parser.add_argument(
        "--cursor", type=_non_negative, default=0, help="SCAN cursor to resume from"
    )
    parser.add_argument(
        "--max-keys",
        type=_positive,
        default=None,
        help="stop after about this many keys and print the cursor to resume with",
    )
    parser.add_argument(
        "--batch",
        type=_positive,
        default=DEFAULT_BATCH,
        help="keys per SCAN and pipeline (default: %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="JSON Lines on stdout")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_connection_args(parser)
    parser.set_defaults(handler=_handle)
