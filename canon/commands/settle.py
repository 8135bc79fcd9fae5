"""``canon settle RUN_ID TOOL_CALL_ID --executed|--not-executed --evidence TEXT``.

An operator's settlement of a call whose process died while it was in flight (an
*attempted* governed call, its tool may have run; or an *abandoned* one): ``--executed``
ends it ERROR ``RECONCILED_EXECUTED`` (it ran; its result is not recorded),
``--not-executed`` ends it ERROR ``RECONCILED_NOT_EXECUTED`` (it did not run; nothing runs
it again by itself). The settlement is an event of the call's chain: the operator your
token names (``CANON_OPERATOR_TOKEN`` or ``--operator-token-file``, in the operators file,
``CANON_OPERATORS`` or ``--operators-file``), when, and the digest of ``--evidence`` (kept
beside it). A call whose process still renews its lease is still running: nothing is
written. ``--request-again`` (with ``--not-executed``, or for a call settled so already)
records the call again as a new governed call ``<call>.again<n>``, linked to it, which
waits for its own approval.

Exit 0 when the settlement (and the request) was recorded, 1 when the call was settled
already (what, by whom), is still running, is not in flight, or its raw response is
recorded and it was said not to have run, or the run refused the call requested again, 2
on usage errors (no credential, a token the operators file does not name), 3 when Redis
is unavailable.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

import msgspec

from canon.commands.readonly import bad_ids, fail, print_json, stdout_console
from canon.connection import add_connection_args, open_store
from canon.exitcodes import RET_OK, RET_PROBLEM, RET_USAGE
from canon.operator_credentials import add_credential_args, authenticated_operator
from canon.service import add_logging_args, setup_logging
from eventstore.errors import InvalidArgument, Refused
from eventstore.settlements import (
    MAX_EVIDENCE_CHARS,
    CallStillRunning,
    NotInFlight,
    NotSettledNotExecuted,
    RawResponseRecorded,
    Settlement,
    SettlementRequest,
    checked_evidence,
)
from projections.receipts.builder import iso_ms


def _evidence(value: str) -> str:
    try:
        return checked_evidence(value)
    except InvalidArgument:
        raise argparse.ArgumentTypeError(
            f"printable text of 1 to {MAX_EVIDENCE_CHARS} characters (one line)"
        ) from None


def how_settled(done: Settlement) -> str:
    """How a call was settled and by whom (``settled as not executed (...), by ana``)."""
    how = {
        "executed": "settled as executed (it ran; its result is not recorded)",
        "not_executed": "settled as not executed (it did not run; it is not run again)",
        "abandoned": "ended as abandoned (no retry took it over)",
        "reconciled": "reconciled (found to have run; its outcome recorded)",
    }[done.settled_as]
    line = f"{how}, by {done.settled_by}"
    return line + (f" ({done.error_code})" if done.error_code else "")


def settled_line(done: Settlement) -> str:
    """One line saying how a call was settled, and what was requested in its place."""
    line = f"{done.tool_call_id}: {how_settled(done)}"
    if done.requested_again:
        line += f"; requested again as {done.requested_again}, which waits for its own approval"
    return line


def _handle(args: argparse.Namespace) -> int:
    setup_logging(args)
    if bad_ids(args.run_id, args.tool_call_id):
        return RET_PROBLEM
    if args.request_again and args.executed:
        fail("--request-again: only a call that did not run is requested again")
        return RET_USAGE
    if (args.executed or args.not_executed) != (args.evidence is not None):
        fail("--executed or --not-executed goes with --evidence TEXT (what your answer rests on)")
        return RET_USAGE
    if not (args.executed or args.not_executed or args.request_again):
        fail("say what happened: --executed or --not-executed, with --evidence TEXT")
        return RET_USAGE
    by = authenticated_operator(args, os.environ)
    settling = args.executed or args.not_executed

    async def work() -> Settlement:
        async with open_store(args) as store:
            done: Settlement | None = None
            if settling:
                request = SettlementRequest(
                    executed=args.executed, by=by, evidence=args.evidence or ""
                )
                done = await store.settlements.settle(args.run_id, args.tool_call_id, request)
            if args.request_again and (done is None or done.settled_as == "not_executed"):
                again = await store.settlements.request_again(args.run_id, args.tool_call_id, by=by)
                if done is None:
                    return again
                return msgspec.structs.replace(done, requested_again=again.requested_again)
            assert done is not None
            return done

    try:
        done = asyncio.run(work())
    except NotInFlight as exc:
        fail(f"{args.tool_call_id}: {exc}")
        return RET_PROBLEM
    except CallStillRunning as running:
        fail(
            f"{args.tool_call_id}: still running: its process renews its lease (until "
            f"{iso_ms(running.lease_until_ms)} unless renewed); nothing was settled"
        )
        return RET_PROBLEM
    except RawResponseRecorded:
        fail(
            f"{args.tool_call_id}: its raw response is recorded, so it ran: settle it "
            "--executed, or let canon reconcile --tools project it"
        )
        return RET_PROBLEM
    except NotSettledNotExecuted as exc:
        fail(f"{args.tool_call_id}: {exc}")
        return RET_PROBLEM
    except Refused as refused:
        fail(f"{args.tool_call_id}: the run refused the call requested again ({refused.code})")
        return RET_PROBLEM
    if args.json:
        print_json(done)
    elif done.made_now or done.requested_again:
        stdout_console().print(settled_line(done), highlight=False, soft_wrap=True)
    else:
        fail(f"{args.tool_call_id} was not settled here: it was already {how_settled(done)}")
    return RET_OK if done.made_now or (args.request_again and done.requested_again) else RET_PROBLEM


def register(subparsers: Any) -> None:
    """Add ``settle``."""
    parser = subparsers.add_parser(
        "settle",
        help="settle a call whose process died: it ran, or it did not",
        description=__doc__,
    )
    parser.add_argument("run_id", help="the call's run")
    parser.add_argument("tool_call_id", help="the call")
    outcome = parser.add_mutually_exclusive_group()
    outcome.add_argument("--executed", action="store_true", help="it ran: ends RECONCILED_EXECUTED")
    outcome.add_argument(
        "--not-executed",
        action="store_true",
        help="it did not run: ends RECONCILED_NOT_EXECUTED, never run again by itself",
    )
    parser.add_argument(
        "--evidence",
        type=_evidence,
        help=f"what your answer rests on (required with --executed or --not-executed; "
        f"at most {MAX_EVIDENCE_CHARS} characters; its digest goes in the call's journal)",
    )
    parser.add_argument(
        "--request-again",
        action="store_true",
        help="record the call again as a new governed call <call>.again<n> that waits for "
        "its own approval (a call settled as not executed)",
    )
    parser.add_argument("--json", action="store_true", help="print the settlement as JSON")
    add_credential_args(parser)
    add_connection_args(parser)
    add_logging_args(parser)
    parser.set_defaults(handler=_handle, log_level="WARNING")
