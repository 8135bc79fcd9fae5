"""``canon verify``: prove a whole namespace intact, or list every integrity failure.

SCAN-based and batched (one pipeline per batch), holding one batch at a time; a progress
bar on standard error when it is a terminal; resumable with ``--cursor``. Exit 0 when
clean, 1 when a problem was found, the scan stopped early or a resumed scan checked
nothing (a cursor past the end), 2 on usage errors, 3 when Redis is unavailable.
Read-only: never writes, never touches a TTL.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from contextlib import ExitStack

import msgspec
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from canon.argtypes import positive, scan_cursor
from canon.commands.readonly import (
    add_archive_arg,
    archive_url,
    elsewhere,
    fail,
    print_json,
    read_only_command,
    refuse_cluster,
    run_on_archive,
    run_read_only,
    stdout_console,
)
from canon.exitcodes import RET_OK, RET_PROBLEM, RET_USAGE
from eventstore.audit import NamespaceVerifier, VerifyProblem, VerifySummary
from eventstore.audit.verify import DEFAULT_BATCH
from eventstore.store import Store
from projections.archive.anchor import decode_anchor, load_public_key, verify_anchor
from projections.archive.compare import Mismatch, compare_live
from projections.archive.database import archive_at
from projections.archive.retention import DAY_MS, DEFAULT_RETENTION_DAYS
from projections.archive.schema import check_schema
from projections.archive.source import ArchiveSource
from projections.archive.store import Archive


def nothing_checked(summary: VerifySummary, cursor: int) -> bool:
    """Tell whether a resumed scan checked nothing: its cursor was past the end (exit 1)."""
    return cursor != 0 and summary.complete and summary.invocations == 0


def exit_code(summary: VerifySummary, cursor: int) -> int:
    """Return the exit code: 0 when everything scanned is intact.

    1 for a problem, an early stop, or a resumed scan that checked nothing (a cursor past
    the end proves nothing).
    """
    if not summary.complete or summary.problems or nothing_checked(summary, cursor):
        return RET_PROBLEM
    return RET_OK


def _print_summary(
    console: Console, summary: VerifySummary, cursor: int, namespace: str, hint: str = ""
) -> None:
    """Print the counts and the verdict; ``hint`` ends the line of an empty namespace."""
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
    elif summary.problems:
        return
    elif nothing_checked(summary, cursor):
        console.print(
            f"[yellow]NOTHING CHECKED[/yellow]: no key of namespace {namespace} after cursor "
            f"{cursor} (past the end, or not a cursor an earlier canon verify printed)"
        )
    elif summary.invocations == 0:
        console.print(
            f"nothing to check: namespace {namespace} holds no invocation records{hint}",
            highlight=False,
            soft_wrap=True,
        )
    elif cursor != 0:
        console.print(
            f"[green]no problem[/green] from cursor {cursor} to the end (the keys before it "
            "are the earlier run's to judge)"
        )
    else:
        console.print("[green]CLEAN[/green]: every record matches its journal")


def _check_anchor(args: argparse.Namespace, console: Console) -> int:
    """``--anchor FILE``: the archive against a signed checkpoint."""
    try:
        anchor = decode_anchor(args.anchor.read_bytes())
        trusted = load_public_key(args.public_key.read_bytes()) if args.public_key else None
    except OSError as exc:
        fail(f"cannot read the checkpoint or key file ({exc.strerror or type(exc).__name__})")
        return RET_USAGE

    async def work(source: ArchiveSource) -> int:
        report = await verify_anchor(
            Archive(source.archive.database, anchor.namespace),
            anchor,
            trusted=trusted,
            retention_ms=args.retention_days * DAY_MS if args.retention_days else None,
        )
        if args.json:
            for problem in report.problems:
                print_json({"kind": "problem", **msgspec.structs.asdict(problem)})
            summary = msgspec.structs.asdict(report)
            summary.pop("problems")
            print_json({"kind": "anchor", "intact": report.intact, **summary})
        else:
            for problem in report.problems:
                console.print(f"PROBLEM run={escape(problem.run_id)} reason={problem.reason}")
            who = "the trusted key" if report.trusted_key else f"the key it names ({anchor.key_id})"
            console.print(
                f"checkpoint of namespace {anchor.namespace} at {anchor.cutoff_ms}: signature by "
                f"{who} {'valid' if report.signature_valid else 'INVALID'}, root "
                f"{'valid' if report.root_valid else 'INVALID'}; {report.runs} run(s), "
                f"{report.pruned} pruned by retention, {len(report.problems)} problem(s)",
                highlight=False,
            )
            if not report.trusted_key:
                console.print(
                    "  (name the signer's public key with --public-key to prove who signed it)",
                    highlight=False,
                )
            console.print(
                "[green]ARCHIVE INTACT[/green] since the checkpoint"
                if report.intact
                else "[red]ARCHIVE CHANGED[/red] since the checkpoint"
            )
        return RET_OK if report.intact else RET_PROBLEM

    args.namespace = anchor.namespace
    return run_on_archive(args, work)


def _compare(args: argparse.Namespace, console: Console) -> int:
    """``--archive URL``: every live run against its archived copy."""

    def on_mismatch(mismatch: Mismatch) -> None:
        if args.json:
            print_json({"kind": "problem", **msgspec.structs.asdict(mismatch)})
        else:
            console.print(
                f"PROBLEM {mismatch.invocation_id} run={escape(mismatch.run_id)} "
                f"call={escape(mismatch.tool_call_id)} reason={mismatch.reason}"
            )

    async def work(store: Store) -> int:
        url = archive_url(args)
        assert url is not None
        async with archive_at(url) as database:
            await check_schema(database)
            found = await compare_live(
                store, Archive(database, store.keys.namespace), on_mismatch=on_mismatch
            )
        if args.json:
            print_json({"kind": "comparison", **msgspec.structs.asdict(found)})
        else:
            console.print(
                f"{found.runs} live run(s), {found.compared} archived invocation(s) compared, "
                f"{found.not_archived} not archived yet, {found.mismatches} problem(s)",
                highlight=False,
            )
            console.print(
                "[green]REDIS MATCHES THE ARCHIVE[/green]"
                if not found.mismatches
                else "[red]REDIS DIFFERS FROM THE ARCHIVE[/red]: rewritten after archiving"
            )
        return RET_PROBLEM if found.mismatches else RET_OK

    return run_read_only(args, work)


def _handle(args: argparse.Namespace) -> int:
    console = stdout_console()
    if args.anchor is not None:
        return _check_anchor(args, console)
    if archive_url(args) is not None:
        return _compare(args, console)

    def on_problem(problem: VerifyProblem) -> None:
        if args.json:
            line = {"kind": "problem", **msgspec.structs.asdict(problem)}
            print_json(line)
        else:
            console.print(
                f"PROBLEM {problem.invocation_id or '-'} "
                f"run={escape(problem.run_id) or '-'} call={escape(problem.tool_call_id) or '-'} "
                f"reason={problem.reason}"
            )

    async def work(store: Store) -> int:
        if refuse_cluster(store, "verify"):
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
            print_json(line)
        else:
            empty = summary.complete and summary.invocations == 0 and args.cursor == 0
            hint = await elsewhere(store) if empty else ""
            _print_summary(console, summary, args.cursor, store.keys.namespace, hint)
        return exit_code(summary, args.cursor)

    try:
        return run_read_only(args, work)
    except KeyboardInterrupt:
        return RET_PROBLEM


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``verify`` subcommand."""
    parser = read_only_command(
        subparsers,
        "verify",
        help="check every record of a namespace against its journal",
        description=(
            "SCAN the namespace's records and streams in batches and report every "
            "integrity failure with its invocation id and reason: tampered field, broken "
            "chain, hash mismatch, illegal transition, payload digest mismatch, record "
            "without stream, stream without record, key without TTL. Counts invocations "
            "by status. Read-only. Exit 0 clean, 1 problems, stopped early or nothing "
            "checked from --cursor, 2 usage, 3 Redis unavailable. With --json: one JSON "
            "line per problem, then a summary line. With --archive URL, every live run is "
            "compared with its archived copy instead (a rewrite of Redis after archiving, "
            "even a consistent one, shows); with --anchor FILE, the archive is checked "
            "against a signed checkpoint."
        ),
        handler=_handle,
    )
    parser.add_argument("--cursor", type=scan_cursor, default=0, help="SCAN cursor to resume from")
    parser.add_argument(
        "--max-keys",
        type=positive,
        default=None,
        help="stop after about this many keys and print the cursor to resume with",
    )
    parser.add_argument(
        "--batch",
        type=positive,
        default=DEFAULT_BATCH,
        help="keys per SCAN and pipeline (default: %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="JSON Lines on stdout")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_archive_arg(
        parser,
        "compare every live run with its archived copy (a rewrite of Redis shows); with "
        "--anchor, the archive to check",
    )
    parser.add_argument(
        "--anchor",
        type=pathlib.Path,
        default=None,
        metavar="FILE",
        help="check the archive against this signed checkpoint (canon archive anchor)",
    )
    parser.add_argument(
        "--public-key",
        type=pathlib.Path,
        default=None,
        metavar="FILE",
        help="with --anchor: the signer's public key (canon archive keygen's FILE.pub)",
    )
    parser.add_argument(
        "--retention-days",
        type=int,
        default=DEFAULT_RETENTION_DAYS,
        help="with --anchor: the archive's retention, so pruned runs are not problems "
        "(default: %(default)s; 0: none)",
    )
