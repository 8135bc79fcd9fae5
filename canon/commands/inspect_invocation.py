"""``canon inspect INVOCATION_ID``: print one invocation's read-only receipt as JSON.

The invocation is looked up through its run, named by the run's access token
(``--run-token``, or ``CANON_RUN_TOKEN``) as the HTTP API does, or by ``--run-id`` for an
operator. Nothing is written: the store is opened read-only and the receipt is the
materialized one when it is current, else built from the record and its journal.
With ``--with-failure-detail`` (operators, with ``--run-id`` only), the output is one
document holding the receipt and, labelled harness-only, the record's failure detail.
Exit 0 with the receipt, 1 when it cannot be shown, 2 on usage errors, 3 when Redis is unavailable.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Final

import msgspec

from canon.commands.readonly import (
    add_archive_arg,
    archive_url,
    elsewhere,
    fail,
    read_only_command,
    run_on_archive,
    run_read_only,
)
from canon.exitcodes import RET_OK, RET_PROBLEM, RET_USAGE
from eventstore.store import Store
from machine.failure_detail import decode_failure_detail
from machine.ids import is_invocation_id, is_run_id
from projections.archive.source import ArchiveSource, archived_receipt
from projections.receipts.builder import encode_receipt
from projections.receipts.inspection import (
    CapabilityChanged,
    InvocationNotFound,
    inspect_invocation,
)

TOKEN_ENV: Final = "CANON_RUN_TOKEN"  # noqa: S105 (the variable's name, not a secret)


async def _run_id(store: Store, args: argparse.Namespace) -> str | None:
    if args.run_id is not None:
        return str(args.run_id)
    run_id = await store.runs.authenticate(args.run_token or os.environ.get(TOKEN_ENV, ""))
    if run_id is None:
        return None
    run = await store.runs.info(run_id)
    return run_id if run is not None and run.active else None


async def _with_failure_detail(
    store: Store, run_id: str, tool_call_id: str, receipt: bytes
) -> bytes:
    """The receipt and, apart from it and labelled harness-only, the failure detail."""
    stored = await store.reader.select(run_id, tool_call_id, ("failure_detail",))
    data = stored.get("failure_detail")
    detail = decode_failure_detail(data) if data is not None else None
    document = {
        "receipt": msgspec.Raw(receipt),
        "harness_only": {
            "failure_detail": detail,
            "failure_detail_bytes": len(data) if data is not None else None,
        },
    }
    return msgspec.json.encode(document)


def _archived(args: argparse.Namespace) -> int:
    """The receipt of an archived invocation, built from its archived record and journal."""

    async def work(source: ArchiveSource) -> int:
        archive = source.archive
        run_id = str(args.run_id)
        tool_call_id = await archive.tool_call_id_of(run_id, args.invocation_id)
        found = await archive.invocation(run_id, tool_call_id) if tool_call_id is not None else None
        if found is None:
            fail(
                "invocation_not_found: no invocation with this id is archived for this run "
                f"in namespace {source.namespace}"
            )
            return RET_PROBLEM
        receipt = archived_receipt(found.fields, found.events)
        document = encode_receipt(receipt)
        if args.with_failure_detail:
            data = found.fields.get(b"failure_detail")
            detail = decode_failure_detail(data) if data is not None else None
            document = msgspec.json.encode(
                {
                    "receipt": msgspec.Raw(document),
                    "harness_only": {
                        "failure_detail": detail,
                        "failure_detail_bytes": len(data) if data is not None else None,
                    },
                }
            )
        sys.stdout.write(msgspec.json.format(document, indent=2).decode() + "\n")
        return RET_OK

    return run_on_archive(args, work)


def _handle(args: argparse.Namespace) -> int:
    if not is_invocation_id(args.invocation_id):
        fail("INVOCATION_ID must be 64 lowercase hex digits")
        return RET_USAGE
    if args.run_id is None and not (args.run_token or os.environ.get(TOKEN_ENV)):
        fail(f"name the run with --run-token (or {TOKEN_ENV}) or --run-id")
        return RET_USAGE
    if args.with_failure_detail and args.run_id is None:
        fail("--with-failure-detail is for operators: name the run with --run-id")
        return RET_USAGE
    if archive_url(args) is not None:
        if args.run_id is None:
            fail("--archive is for operators: name the run with --run-id")
            return RET_USAGE
        return _archived(args)

    async def work(store: Store) -> int:
        run_id = await _run_id(store, args)
        if run_id is None:
            fail("unauthorized: the run token is not valid for an open run")
            return RET_PROBLEM
        try:
            receipt = await inspect_invocation(store, run_id, args.invocation_id)
        except InvocationNotFound:
            hint = ""
            # Only an operator's run id is looked for elsewhere: a token names its own run.
            if args.run_id is not None and is_run_id(run_id) and not await store.run_info(run_id):
                hint = await elsewhere(store, run_id)
            fail(
                "invocation_not_found: no invocation with this id is visible to this run "
                f"in namespace {store.keys.namespace}{hint}"
            )
            return RET_PROBLEM
        except CapabilityChanged:
            fail("capability_changed: the invocation's tool is no longer authorized")
            return RET_PROBLEM
        document = encode_receipt(receipt)
        if args.with_failure_detail:
            document = await _with_failure_detail(store, run_id, receipt.tool_call_id, document)
        sys.stdout.write(msgspec.json.format(document, indent=2).decode() + "\n")
        return RET_OK

    return run_read_only(args, work)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``inspect`` subcommand."""
    parser = read_only_command(
        subparsers,
        "inspect",
        help="print one invocation's read-only receipt (JSON)",
        description=__doc__,
        handler=_handle,
    )
    parser.add_argument("invocation_id", metavar="INVOCATION_ID", help="64 lowercase hex")
    who = parser.add_mutually_exclusive_group()
    who.add_argument("--run-token", default=None, help=f"the run's access token (${TOKEN_ENV})")
    who.add_argument("--run-id", default=None, help="the run, for an operator")
    add_archive_arg(
        parser, "with --run-id: build the receipt from this archive (after the record's TTL)"
    )
    parser.add_argument(
        "--with-failure-detail",
        action="store_true",
        help="with --run-id: also print the failed call's harness-only failure detail",
    )
