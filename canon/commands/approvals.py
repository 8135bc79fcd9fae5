"""``canon approvals|approve|...|sweep-approvals``: operators govern side-effecting calls.

``canon approvals RUN_ID`` lists the run's governed calls that wait: for a decision, or
approved and not yet resumed; without a run, the calls waiting for a decision across the
latest runs, oldest first (read-only, from the run index and the runs' counts, never a
SCAN).
``canon approve RUN_ID TOOL_CALL_ID --reason TEXT`` and ``canon deny ...`` record an
operator's decision: the first decision wins, and a later one prints what was decided
(exit 1). ``canon pause RUN_ID --reason TEXT`` stops the run's new calls and dispatches
until ``canon unpause``; pausing a run paused already says by whom, since when and why
(exit 1, nothing changed), and a closed or unknown run is refused (exit 1). The operator
is the one your token names (``CANON_OPERATOR_TOKEN`` or ``--operator-token-file``) in
the operators file
(``CANON_OPERATORS`` or ``--operators-file``; ``canon operators add NAME`` makes an entry):
who, when and why are kept on the call or the run. ``canon sweep-approvals`` records the
expiry of every call of the latest runs left waiting past its approval's expiry (run it
from cron or a timer: otherwise an expiry is recorded when the call is next resumed or
decided).

Exit 0 when the decision or the pause was recorded, 1 when the call was already decided
(or is not waiting), the operator requested the call, the run is unknown or closed, or
it was paused (unpaused) already, 2 on usage errors (no credential, a token the
operators file does not name), 3 when Redis is unavailable.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from canon.commands.readonly import (
    bad_ids,
    fail,
    pause_note,
    print_json,
    run_read_only,
    stdout_console,
)
from canon.connection import add_connection_args, open_store
from canon.exitcodes import RET_OK, RET_PROBLEM
from canon.operator_credentials import NoBy, add_credential_args, authenticated_operator
from canon.service import add_logging_args, setup_logging
from eventstore.audit.run_calls import CallRow, run_calls
from eventstore.audit.waiting import pending_approvals, sweep_expired
from eventstore.decisions import (
    MAX_REASON_CHARS,
    Decision,
    NotAwaitingApproval,
    RequesterCannotApprove,
    Superseded,
    checked_text,
)
from eventstore.errors import InvalidArgument, Refused
from eventstore.runs import PauseOutcome, RunClosed
from eventstore.store import Store
from machine.codes import Stage
from projections.receipts.builder import iso_ms

_WAITING = (Stage.AWAITING_APPROVAL.value, Stage.APPROVED.value)


def _text(limit: int) -> Any:
    """An argparse type: the store's own check of an approver or a reason."""

    def check(value: str) -> str:
        try:
            return checked_text(value, limit, "the value")
        except InvalidArgument:
            raise argparse.ArgumentTypeError(f"printable text of 1 to {limit} characters") from None

    return check


def _print_decision(decision: Decision, asked: str) -> int:
    console = stdout_console()
    if decision.made_now:
        console.print(
            f"{decision.tool_call_id}: {decision.outcome} by {decision.decided_by} "
            f"(approval {decision.approval_id}, decision {decision.decision_id})"
        )
        return RET_OK
    by = f" by {decision.decided_by}" if decision.decided_by else ""
    fail(f"{decision.tool_call_id} was not {asked} here: it was already {decision.outcome}{by}")
    return RET_PROBLEM


def _decide(args: argparse.Namespace) -> int:
    setup_logging(args)
    if bad_ids(args.run_id, args.tool_call_id):
        return RET_PROBLEM
    args.by = authenticated_operator(args, os.environ)
    approve = args.command == "approve"
    if getattr(args, "edit", None) is not None:
        return _supersede(args)

    async def work() -> Decision:
        async with open_store(args) as store:
            return await store.decide(
                args.run_id,
                args.tool_call_id,
                approve=approve,
                by=args.by,
                reason=args.reason,
            )

    try:
        decision = asyncio.run(work())
    except NotAwaitingApproval as exc:
        fail(f"{args.tool_call_id}: {exc}")
        return RET_PROBLEM
    except RequesterCannotApprove:
        fail(f"{args.tool_call_id}: {args.by} requested this call and cannot approve it")
        return RET_PROBLEM
    if args.json:
        print_json(decision)
        return RET_OK if decision.made_now else RET_PROBLEM
    return _print_decision(decision, "approved" if approve else "denied")


def _supersede(args: argparse.Namespace) -> int:
    """``canon approve ... --edit JSON``: no approval; the edited call waits for its own."""

    async def work() -> Superseded:
        async with open_store(args) as store:
            return await store.decisions.supersede(
                args.run_id, args.tool_call_id, args.edit, by=args.by, reason=args.reason
            )

    try:
        done = asyncio.run(work())
    except (NotAwaitingApproval, InvalidArgument) as exc:
        fail(f"{args.tool_call_id}: {exc}")
        return RET_PROBLEM
    except Refused as refused:  # the run refused the edited call: the original still waits
        fail(f"{args.tool_call_id}: the run refused the edited call ({refused.code})")
        return RET_PROBLEM
    if args.json:
        print_json(done)
        return RET_OK if done.edited is not None else RET_PROBLEM
    if done.edited is None:
        return _print_decision(done.original, "edited")
    stdout_console().print(
        f"{args.tool_call_id}: denied as superseded by {done.edited}, which waits for its own "
        f"approval (canon approve {args.run_id} {done.edited} --reason ...)",
        highlight=False,
        soft_wrap=True,
    )
    return RET_OK


def _pause(args: argparse.Namespace) -> int:
    setup_logging(args)
    if bad_ids(args.run_id):
        return RET_PROBLEM
    args.by = authenticated_operator(args, os.environ)

    pausing = args.command == "pause"

    async def work() -> PauseOutcome | None:
        async with open_store(args) as store:
            return await store.decisions.set_run_paused(
                args.run_id, pausing, by=args.by, reason=args.reason
            )

    try:
        done = asyncio.run(work())
    except RunClosed:
        fail(f"run {args.run_id} is closed (or past its deadline): nothing of it runs to pause")
        return RET_PROBLEM
    if done is None:
        fail(f"no run {args.run_id} (unknown or expired)")
        return RET_PROBLEM
    if not done.changed:
        fail(
            f"run {args.run_id} is {'already paused' if pausing else 'not paused'}"
            + pause_note(done.by, done.reason, done.at_ms)
        )
        return RET_PROBLEM
    stdout_console().print(f"{args.run_id}: {args.command}d by {args.by}", highlight=False)
    return RET_OK


def _sweep(args: argparse.Namespace) -> int:
    setup_logging(args)

    async def work() -> int:
        async with open_store(args) as store:
            return await sweep_expired(store, runs=args.runs)

    expired = asyncio.run(work())
    stdout_console().print(f"{expired} expired approval(s) recorded")
    return RET_OK


def _waiting_row(call: CallRow) -> dict[str, Any]:
    return {
        "tool_call_id": call.tool_call_id,
        "invocation_id": call.invocation_id,
        "tool": call.tool,
        "stage": call.stage,
        "phase": call.phase,
        "requested_at": iso_ms(call.created_at_ms),
        "request_bytes": call.request_bytes,
    }


def _list(args: argparse.Namespace) -> int:
    setup_logging(args)
    if args.run_id is None:
        return run_read_only(args, _list_all(args))
    if bad_ids(args.run_id):
        return RET_PROBLEM

    async def work(store: Store) -> int:
        info = await store.run_info(args.run_id)
        if info is None:
            fail(f"no run {args.run_id} (unknown or expired)")
            return RET_PROBLEM
        waiting = [call for call in await run_calls(store, args.run_id) if call.stage in _WAITING]
        if args.json:
            print_json(
                {
                    "run_id": args.run_id,
                    "paused": info.paused,
                    "pause": info.pause,
                    "waiting": [_waiting_row(call) for call in waiting],
                }
            )
            return RET_OK
        console = stdout_console()
        pause = info.pause
        state = (
            f" (the run is paused{pause_note(pause.by, pause.reason, pause.at_ms)})"
            if pause is not None
            else ""
        )
        if not waiting:
            console.print(f"no governed call of {args.run_id} is waiting{state}")
            return RET_OK
        console.print(f"governed calls of {args.run_id} waiting, oldest first{state}:")
        for call in waiting:
            what = (
                "awaiting approval: for a decision"
                if call.stage == Stage.AWAITING_APPROVAL.value
                else "approved, for its resume: not dispatched yet"
            )
            console.print(
                f"  {iso_ms(call.created_at_ms)}  {call.tool_call_id}  {call.tool}  {what}",
                highlight=False,
            )
        return RET_OK

    return run_read_only(args, work)


def _list_all(args: argparse.Namespace) -> Any:
    """The listing across the latest runs: the calls waiting for a decision."""

    async def work(store: Store) -> int:
        waiting = await pending_approvals(store)
        if args.json:
            print_json(
                {
                    "runs_examined": waiting.runs_examined,
                    "complete": waiting.complete,
                    "waiting": [
                        {"run_id": item.run_id, **_waiting_row(item.call)} for item in waiting.calls
                    ],
                }
            )
            return RET_OK
        console = stdout_console()
        if not waiting.calls:
            console.print(
                f"no governed call waits for a decision in the latest {waiting.runs_examined} runs"
            )
            return RET_OK
        console.print("governed calls waiting for a decision, oldest first:")
        for item in waiting.calls:
            console.print(
                f"  {iso_ms(item.call.created_at_ms)}  {item.run_id}  "
                f"{item.call.tool_call_id}  {item.call.tool}"
            )
        return RET_OK

    return work


def _decision_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--reason",
        required=True,
        type=_text(MAX_REASON_CHARS),
        help=f"why (kept with the decision; at most {MAX_REASON_CHARS} characters)",
    )
    add_credential_args(parser)
    # Gone: the operator is the one the token names, never a name typed here.
    parser.add_argument("--by", action=NoBy, nargs="?", help=argparse.SUPPRESS)


def register(subparsers: Any) -> None:
    """Add ``approvals``, ``approve``, ``deny``, ``pause`` and ``unpause``."""
    listing = subparsers.add_parser(
        "approvals",
        help="list a run's governed calls waiting for a decision or a resume",
        description=__doc__,
    )
    listing.add_argument(
        "run_id", nargs="?", help="the run (without one: the calls waiting across the latest runs)"
    )
    listing.add_argument("--json", action="store_true", help="print one JSON document")
    add_connection_args(listing, writes=False)
    add_logging_args(listing)
    listing.set_defaults(handler=_list, log_level="WARNING")
    for name, help_text in (
        ("approve", "approve a governed call: it runs once, when it is resumed"),
        ("deny", "deny a governed call: it ends APPROVAL_DENIED and never runs"),
    ):
        parser = subparsers.add_parser(name, help=help_text, description=__doc__)
        parser.add_argument("run_id", help="the call's run")
        parser.add_argument("tool_call_id", help="the call")
        _decision_args(parser)
        parser.add_argument("--json", action="store_true", help="print the decision as JSON")
        if name == "approve":
            parser.add_argument(
                "--edit",
                metavar="JSON",
                help="approve with other arguments: this is no approval; the call is denied "
                "as superseded and the edited request (a JSON object) becomes a new call "
                "<call>.edit<n>, linked to it, that waits for its own approval",
            )
        add_connection_args(parser)
        add_logging_args(parser)
        parser.set_defaults(handler=_decide, log_level="WARNING")
    for name, help_text in (
        ("pause", "pause a run: no new call of it is recorded or dispatched"),
        ("unpause", "lift a run's pause"),
    ):
        parser = subparsers.add_parser(name, help=help_text, description=__doc__)
        parser.add_argument("run_id", help="the run")
        _decision_args(parser)
        add_connection_args(parser)
        add_logging_args(parser)
        parser.set_defaults(handler=_pause, log_level="WARNING")
    sweep = subparsers.add_parser(
        "sweep-approvals",
        help="record the expiry of governed calls left waiting past it",
        description=__doc__,
    )
    sweep.add_argument(
        "--runs",
        type=int,
        default=200,
        help="how many of the latest runs to look at (default 200)",
    )
    add_connection_args(sweep)
    add_logging_args(sweep)
    sweep.set_defaults(handler=_sweep, log_level="WARNING")
