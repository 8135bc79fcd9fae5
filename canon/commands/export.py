"""``canon export RUN_ID``: JSON Lines of a run's records and events, for an auditor.

Payload bytes (the failure detail too) only with ``--with-payloads``. Written to standard
output or ``--output``.
Exit 0 when the run or any of its invocations was found, 1 when nothing was, 2 on usage
errors, 3 when Redis is unavailable. Read-only: never writes to Redis, never touches a TTL.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from contextlib import ExitStack
from typing import IO

import msgspec

from canon.commands.readonly import (
    add_archive_arg,
    archive_url,
    bad_ids,
    elsewhere,
    fail,
    read_only_command,
    run_on_archive,
    run_read_only,
)
from canon.exitcodes import RET_OK, RET_PROBLEM, RET_USAGE
from eventstore.audit import export_run
from eventstore.audit.source import AuditSource
from eventstore.store import Store


def _handle(args: argparse.Namespace) -> int:
    if bad_ids(args.run_id):
        return RET_USAGE
    output: pathlib.Path | None = args.output

    async def work(store: Store | AuditSource) -> int:
        found = False
        encoder = msgspec.json.Encoder()
        with ExitStack() as stack:
            sink: IO[str] = sys.stdout
            if output is not None:
                sink = stack.enter_context(output.open("w", encoding="utf-8"))
            async for line in export_run(store, args.run_id, with_payloads=args.with_payloads):
                found = found or line.get("present") is True or line["kind"] == "record"
                sink.write(encoder.encode(line).decode() + "\n")
        if not found:
            if not isinstance(store, Store):
                fail(
                    f"no run or invocation found for run {args.run_id} in namespace "
                    f"{store.namespace} of the archive"
                )
                return RET_PROBLEM
            hint = await elsewhere(store, args.run_id)
            fail(
                f"no run or invocation found for run {args.run_id} in namespace "
                f"{store.keys.namespace} (absent or expired){hint}"
            )
            return RET_PROBLEM
        return RET_OK

    try:
        if archive_url(args) is not None:
            return run_on_archive(args, work)
        return run_read_only(args, work)
    except OSError as exc:
        fail(f"cannot write the output file ({exc.strerror or type(exc).__name__})")
        return RET_USAGE


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``export`` subcommand."""
    parser = read_only_command(
        subparsers,
        "export",
        help="write a run's records and events as JSON Lines for an auditor",
        description=(
            "Write JSON Lines: an export header, the run's registry entry, then for each "
            "invocation its record metadata (with any integrity problems) followed by its "
            "stored events, and an end line with counts. Payloads (request, raw response, "
            "agent result, and a failed call's harness-only failure detail) only with "
            "--with-payloads, as UTF-8 text or base64; without it, stored_payload_bytes "
            "gives their sizes. Read-only."
        ),
        handler=_handle,
    )
    parser.add_argument("run_id", metavar="RUN_ID", help="the run to export")
    parser.add_argument(
        "--with-payloads",
        action="store_true",
        help="include request, raw response, agent result and failure detail bytes",
    )
    parser.add_argument(
        "--output",
        type=pathlib.Path,
        default=None,
        metavar="FILE",
        help="write to FILE instead of stdout",
    )
    add_archive_arg(parser, "read the run from this archive instead of Redis (after its TTL)")
