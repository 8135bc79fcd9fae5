"""``canon erase RUN_ID --reason TEXT``: erase a run's payloads from Redis and the archive.

The run is closed; every payload of its calls (request, raw response, agent result,
failure detail) is deleted from Redis in one atomic step per run, then from the archive
(``--archive URL`` or ``$CANON_ARCHIVE_URL``, when one is named); so is the run's data key
(payloads encrypted at rest), in Redis and in the archive. A tombstone stays on the
run: who (the operator your token names: ``CANON_OPERATOR_TOKEN`` or
``--operator-token-file``, in the operators file, ``CANON_OPERATORS`` or
``--operators-file``), when and why. Events, digests
and the chain stay, so replay and verify still prove the run intact and say it was
erased; a governed call of the run never runs (``RUN_ERASED``). A run Redis no longer
holds is erased from the archive only. Exit 0 when erased, 1 when the run was found
nowhere or a call was still running, 2 on usage errors, 3 when a server is unavailable.
"""

from __future__ import annotations

import argparse
import asyncio
import os

from canon.argtypes import non_negative
from canon.command_errors import fail
from canon.commands.readonly import ARCHIVE_ENV, bad_ids
from canon.connection import add_connection_args, open_store
from canon.exitcodes import RET_OK, RET_PROBLEM, RET_USAGE
from canon.operator_credentials import NoBy, add_credential_args, authenticated_operator
from eventstore.erasure import CallsInFlight, Erasure, RunNotFound, checked_text
from eventstore.errors import InvalidArgument
from projections.archive.database import archive_at
from projections.archive.schema import check_schema
from projections.archive.store import Archive, now_ms


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``erase`` subcommand."""
    parser = subparsers.add_parser(
        "erase",
        help="erase a run's payloads from Redis and the archive, leaving a tombstone",
        description=__doc__,
    )
    parser.add_argument("run_id", metavar="RUN_ID", help="the run to erase")
    parser.add_argument("--reason", required=True, help="why (recorded in the tombstone)")
    add_credential_args(parser)
    parser.add_argument("--by", action=NoBy, nargs="?", help=argparse.SUPPRESS)
    parser.add_argument(
        "--archive",
        default=os.environ.get(ARCHIVE_ENV),
        metavar="URL",
        help=f"erase the archive's copy too (default: ${ARCHIVE_ENV})",
    )
    parser.add_argument(
        "--wait-s",
        type=non_negative,
        default=30,
        help="wait this long for calls still running (default: %(default)s)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="erase calls still running too (one may write its response after)",
    )
    add_connection_args(parser)
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    if bad_ids(args.run_id):
        return RET_USAGE
    by = authenticated_operator(args, os.environ)
    try:
        reason = checked_text(args.reason, "--reason", 1000)
    except InvalidArgument as exc:
        fail(str(exc))
        return RET_USAGE

    async def main() -> int:
        erased: Erasure | None = None
        async with open_store(args) as store:
            try:
                erased = await store.erase_run(
                    args.run_id, by=by, reason=reason, wait_s=args.wait_s, force=args.force
                )
                print(
                    f"erased the payloads of {erased.records} record(s) of run {args.run_id} "
                    "in Redis; the run is closed"
                )
            except RunNotFound:
                if not args.archive:
                    fail(
                        f"run {args.run_id} is not in Redis (absent or expired), and no "
                        f"archive is named (--archive or {ARCHIVE_ENV})"
                    )
                    return RET_PROBLEM
            except CallsInFlight as exc:
                fail(f"{exc}; retry, or add --force")
                return RET_PROBLEM
        if args.archive:
            async with archive_at(args.archive) as database:
                await check_schema(database)
                archive = Archive(database, args.namespace)
                at_ms = erased.at_ms if erased is not None else now_ms()
                if erased is None and await archive.run(args.run_id) is None:
                    fail(f"run {args.run_id} is neither in Redis nor in the archive")
                    return RET_PROBLEM
                count = await archive.erase(args.run_id, by=by, reason=reason, at_ms=at_ms)
            print(f"erased the payloads of {count} archived invocation(s) of run {args.run_id}")
        return RET_OK

    return asyncio.run(main())
