"""``canon replay RUN_ID [TOOL_CALL_ID]``: what happened to each call, and is it intact.

A run is one line per call (created, call, tool, status and stage, evidence, duration,
code, verdict); ``--events`` (or naming one call) shows each call's whole timeline. The
stage says where a call stands beside its status: awaiting_approval, approved (not
dispatched), dispatching, attempted or abandoned (its process died), ready, error, or
reconciled (settled after its process died: by whom is shown).
"""

from __future__ import annotations

import argparse
from typing import Any, Final, NamedTuple

import msgspec
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from canon.commands.readonly import (
    add_archive_arg,
    archive_url,
    bad_ids,
    elsewhere,
    fail,
    print_json,
    read_only_command,
    run_on_archive,
    run_read_only,
    stdout_console,
)
from canon.exitcodes import RET_OK, RET_PROBLEM, RET_USAGE
from eventstore.audit import InvocationReplay, replay_invocation, replay_run
from eventstore.audit.source import AuditSource, source_of
from eventstore.runs import Refusal
from eventstore.store import Store
from machine.events import SCHEMA_VERSION
from projections.receipts.builder import iso_ms


def _when(at_ms: int | None) -> str:
    return "?" if at_ms is None else iso_ms(at_ms)


def _short(digest: str | None) -> str:
    return digest[:12] if digest else ""


#: Below this many columns the timeline stacks its cells so that none is cut.
WIDE_TIMELINE: Final = 150


class _Step(NamedTuple):
    """One timeline row's cells, before layout."""

    version: str
    event: str
    detail: str
    at: str
    delta: str
    #: (field, size, short digest) of each payload the event names; ("rejected", size,
    #: "") for a refused one.
    payloads: tuple[tuple[str, str, str], ...]
    hash_: str
    after: tuple[str, ...]


def _steps(replay: InvocationReplay) -> list[_Step]:
    first = next((step.at_ms for step in replay.timeline if step.at_ms is not None), None)
    rows = []
    for step in replay.timeline:
        payloads: list[tuple[str, str, str]] = []
        if step.payload_bytes is not None:
            field = step.payload_field or "rejected"
            payloads.append((field, f"{step.payload_bytes} B", _short(step.payload_sha256)))
        # A Failed event that kept both its detail and the agent result: one line each.
        payloads += [
            (more.payload_field, f"{more.payload_bytes} B", _short(more.payload_sha256))
            for more in step.more_payloads
        ]
        detail = []
        if step.stored_schema is not None and step.stored_schema != SCHEMA_VERSION:
            detail.append(f"(schema {step.stored_schema}, upcast)")
        if step.detail:
            detail.append(step.detail)
        after: tuple[str, ...] = ("not folded",)
        if step.state is not None:
            state = step.state
            after = (state.stage.value, state.status.value, state.evidence_status.value)
        if step.fold_error and step.state is not None:
            after += (f"[red]({step.fold_error}, folded relinked)[/red]",)
        elif step.fold_error:
            after = (f"[red]refused: {step.fold_error}[/red]",)
        hash_ = _short(step.event_hash)
        if step.event_hash != step.stored_hash:
            hash_ = f"[red]{hash_} ≠ stored {_short(step.stored_hash)}[/red]"
        delta = str(step.at_ms - first) if step.at_ms is not None and first is not None else ""
        rows.append(
            _Step(
                str(step.version or "?"),
                step.event_type or "undecodable",
                " ".join(detail),
                _when(step.at_ms),
                delta,
                tuple(payloads),
                hash_,
                after,
            )
        )
    return rows


def _timeline(replay: InvocationReplay) -> Table:
    """One line per event, every cell in its own column (a wide terminal or a file)."""
    table = Table(title="timeline", title_justify="left")
    for name in ("v", "event", "at (UTC)", "+ms", "payload", "sha256", "event hash", "after"):
        table.add_column(name, no_wrap=name != "after")
    for step in _steps(replay):
        table.add_row(
            step.version,
            f"{step.event} {step.detail}".rstrip(),
            step.at,
            step.delta,
            "\n".join(f"{field} {size}" for field, size, _ in step.payloads),
            "\n".join(sha for _, _, sha in step.payloads),
            step.hash_,
            " · ".join(step.after),
        )
    return table


def _narrow_timeline(replay: InvocationReplay) -> Table:
    """The same cells stacked within fewer columns, so 80 columns cut none of them."""
    steps = _steps(replay)
    first = next((step.at for step in steps if step.at != "?"), "?")
    table = Table(
        title=f"timeline (first event at {first}; +ms counts from it)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        caption="digests: sha256 of the event's payload, then the event's chain hash",
        caption_justify="left",
    )
    table.add_column("v", justify="right", no_wrap=True)
    table.add_column("event", no_wrap=True)
    table.add_column("+ms", justify="right", no_wrap=True)
    table.add_column("payload", no_wrap=True)
    table.add_column("digests", no_wrap=True)
    table.add_column("state after", overflow="fold")
    for step in steps:
        table.add_row(
            step.version,
            "\n".join(part for part in (step.event, step.detail) if part),
            step.delta,
            "\n".join(part for payload in step.payloads for part in payload[:2]),
            "\n".join(part for part in (*(sha for _, _, sha in step.payloads), step.hash_) if part),
            "\n".join(step.after),
        )
    return table


def _differences(replay: InvocationReplay) -> list[tuple[str, Any, Any]]:
    if replay.record is None or replay.folded is None:
        return []  # a missing side is already stated above the timeline
    record = msgspec.structs.asdict(replay.record)
    folded = msgspec.structs.asdict(replay.folded)
    return [
        (name, record.get(name), folded.get(name))
        for name in sorted(record.keys() | folded.keys())
        if record.get(name) != folded.get(name)
    ]


def print_erasure(console: Console, replay: InvocationReplay) -> None:
    """Say that the invocation's payloads were erased: by whom, when and why."""
    erasure = replay.erasure
    if erasure is None:
        console.print("payloads erased (the run's tombstone is not readable)", highlight=False)
        return
    console.print(
        f"payloads erased by {escape(erasure.by)} at {_when(erasure.at_ms)}: "
        f"{escape(erasure.reason)} (digests kept; the journal still verifies)",
        highlight=False,
    )


def print_failure_detail(console: Console, replay: InvocationReplay) -> None:
    """Print the record's harness-only failure detail, if it holds one."""
    if replay.failure_detail_bytes is None:
        return
    console.rule("failure detail (harness-only: never shown to the agent)", style="yellow")
    detail = replay.failure_detail
    if detail is None:
        console.print(f"{replay.failure_detail_bytes} B stored, not a failure detail")
        return
    cut = f", {detail.cut_bytes} B cut to fit its limit" if detail.cut_bytes else ""
    console.print(f"{replay.failure_detail_bytes} B stored{cut}", highlight=False)
    # Exception text is the tool's: printed as is, never read as rich markup.
    console.print(f"type     {detail.type}", markup=False, highlight=False)
    if detail.message:
        console.print(f"message  {detail.message}", markup=False, highlight=False)
    if detail.traceback:
        console.print(detail.traceback.rstrip("\n"), markup=False, highlight=False)
    if not (detail.message or detail.traceback):
        console.print("(type only: the boundary keeps no message or traceback)")


def print_replay(console: Console, replay: InvocationReplay) -> None:
    """Print one invocation's replay for a human."""
    state = replay.record or replay.folded
    console.rule(f"invocation {replay.invocation_id}")
    # A tool call id may hold "[", which rich would read as markup.
    line = f"run {replay.run_id} · call {escape(replay.tool_call_id)}"
    if state is not None:
        line += f" · tool {state.tool} · status {state.status.value}"
        if replay.phase:
            line += f" · stage {replay.phase}"
        line += f" · evidence {state.evidence_status.value}"
        if state.error_code is not None:
            line += f" · error {state.error_code.value}"
        if state.settled_by is not None:
            line += f" · settled by {escape(state.settled_by)}"
    console.print(line)
    if replay.archived:
        console.print(
            f"archived: record {'present' if replay.record_present else 'MISSING'}, "
            f"events {'present' if replay.stream_present else 'MISSING'}, "
            f"expired from Redis at {_when(replay.expires_at_ms)}"
        )
    else:
        console.print(
            f"record {'present' if replay.record_present else 'MISSING'}, "
            f"stream {'present' if replay.stream_present else 'MISSING'}, "
            f"expires {_when(replay.expires_at_ms)} "
            f"(PTTL record {replay.record_pttl_ms} ms, stream {replay.stream_pttl_ms} ms)"
        )
    if replay.verdict.payloads_erased:
        print_erasure(console, replay)
    wide = console.width >= WIDE_TIMELINE
    console.print(_timeline(replay) if wide else _narrow_timeline(replay))
    print_failure_detail(console, replay)
    differences = _differences(replay) if replay.verdict.record_matches_fold is False else []
    if differences:
        table = Table(title="record vs re-folded journal", title_justify="left")
        for name in ("field", "record", "re-folded"):
            table.add_column(name)
        for name, stored, folded in differences:
            table.add_row(name, str(stored), str(folded))
        console.print(table)
    verdict = replay.verdict
    marks = {True: "[green]✓[/green]", False: "[red]✗[/red]", None: "[yellow]?[/yellow]"}
    for ok, text in (
        (verdict.chain_intact, "hash chain intact, record and stream both present"),
        (verdict.transitions_legal, "every transition legal"),
        (verdict.record_matches_fold, "record equals the fold of its journal"),
        (verdict.payload_digests_match, "every payload digest matches"),
        (verdict.expiry_set, "record and stream expire together"),
    ):
        if replay.archived and ok is verdict.expiry_set:
            continue  # an archived invocation has no expiry left to judge
        note = " (not judged: no record, no stream, or the journal does not fold)"
        console.print(f"  {marks[ok]} {text}{note if ok is None else ''}")
    for problem in replay.problems:
        console.print(f"  problem: {problem}")
    console.print(_verdict_text(replay))


def run_table(replays: list[InvocationReplay]) -> Table:
    """One row per call of a run, in creation order: what happened and whether it holds."""
    table = Table(box=box.SIMPLE_HEAD, title="calls", title_justify="left")
    for name in ("created", "call", "tool", "status", "stage", "evidence", "ms", "code", "verdict"):
        table.add_column(name, justify="right" if name == "ms" else "left", overflow="fold")
    for replay in replays:
        state = replay.record or replay.folded
        times = [step.at_ms for step in replay.timeline if step.at_ms is not None]
        table.add_row(
            _when(times[0] if times else None),
            escape(replay.tool_call_id),
            "?" if state is None else escape(state.tool),
            "?" if state is None else state.status.value,
            replay.phase or "?",
            "?" if state is None else state.evidence_status.value,
            str(times[-1] - times[0]) if len(times) > 1 else "",
            "" if state is None or state.error_code is None else state.error_code.value,
            _verdict_text(replay),
        )
    return table


def _verdict_text(replay: InvocationReplay) -> str:
    """A run table's verdict cell: INTACT (ERASED when its payloads were), or NOT INTACT."""
    if not replay.verdict.intact:
        return "[red]NOT INTACT[/red]"
    return (
        "[green]INTACT[/green] (erased)"
        if replay.verdict.payloads_erased
        else "[green]INTACT[/green]"
    )


def print_refusals(console: Console, refusals: list[Refusal], counts: dict[str, int]) -> None:
    """The run's refusal counts per code, then its latest refusals, newest first."""
    total = sum(counts.values())
    per_code = ", ".join(f"{code} {count}" for code, count in sorted(counts.items()))
    console.print(
        f"refused before any record: {total} ({per_code}); the latest {len(refusals)}:",
        highlight=False,
        soft_wrap=True,
    )
    table = Table(box=box.SIMPLE_HEAD)
    for name in ("refused", "call", "tool", "code"):
        table.add_column(name, overflow="fold")
    for refusal in refusals:
        call = refusal.tool_call_id
        table.add_row(
            _when(refusal.at_ms),
            escape(call) if call is not None else f"(unsafe id, {refusal.tool_call_id_bytes} B)",
            escape(refusal.tool) if refusal.tool is not None else "(not a tool name)",
            refusal.code,
        )
    console.print(table)


def _handle(args: argparse.Namespace) -> int:
    if bad_ids(args.run_id, args.tool_call_id or None):
        return RET_USAGE

    async def work(store: Store | AuditSource) -> int:
        source = source_of(store)
        if args.tool_call_id:
            one = await replay_invocation(store, args.run_id, args.tool_call_id)
            replays = [one] if one is not None else []
        else:
            replays = await replay_run(store, args.run_id)
        refused: dict[str, int] = {}
        refusals: list[Refusal] = []
        if not args.tool_call_id:
            info = await source.run_info(args.run_id)
            refused = info.refused if info is not None else {}
            if refused:
                refusals = await source.refusals(args.run_id, limit=1000 if args.json else 20)
        intact = bool(replays) and all(replay.verdict.intact for replay in replays)
        if args.json:
            document = {
                "run_id": args.run_id,
                **({"archived": True} if source.archived else {}),
                "intact": intact,
                "invocations": replays,
                "refused": refused,
                "refusals": refusals,
            }
            print_json(document)
        else:
            console = stdout_console()
            if args.events or args.tool_call_id:
                for replay in replays:
                    print_replay(console, replay)
            elif replays:
                console.print(run_table(replays))
            broken = sum(not replay.verdict.intact for replay in replays)
            if replays:
                console.print(f"{len(replays)} invocation(s) replayed, {broken} not intact")
            if replays and not (args.events or args.tool_call_id):
                console.print(
                    "each call's events: add --events, or name one call after RUN_ID",
                    highlight=False,
                )
            if refused:
                print_refusals(console, refusals, refused)
        if not replays:
            namespace = source.namespace
            # The call id is not repeated: it may hold characters a terminal acts on.
            what = "no such invocation" if args.tool_call_id else "no invocation found"
            if source.archived:
                fail(f"{what} for run {args.run_id} in namespace {namespace} of the archive")
                return RET_PROBLEM
            assert isinstance(store, Store)
            # A run this namespace knows was looked for in the right place.
            hint = "" if await store.run_info(args.run_id) else await elsewhere(store, args.run_id)
            fail(f"{what} for run {args.run_id} in namespace {namespace} (absent or expired){hint}")
        return RET_OK if intact else RET_PROBLEM

    if archive_url(args) is not None:
        return run_on_archive(args, work)
    return run_read_only(args, work)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``replay`` subcommand."""
    parser = read_only_command(
        subparsers,
        "replay",
        help="re-fold a run's invocations from their journals and judge their records",
        description=(
            "List a run's calls, one line each (created, tool, status, stage, evidence, "
            "duration, error code, verdict); with --events, or for one named call, show each "
            "invocation's timeline (version, event, time, sizes, digests, state "
            "after each event), the state re-folded through the machine, and a verdict: "
            "chain intact, every transition legal, record equal to its fold, every payload "
            "digest matching, expiry set. A failed call's harness-only failure detail "
            "(exception type, message, traceback) is shown under its timeline. "
            "Read-only: never writes, never touches a TTL. With --archive, the run is read "
            "from the archive (after its TTL), with the same output. "
            "Exit 0 when intact, 1 when not (or nothing found), 2 on usage errors, 3 when "
            "Redis is unavailable."
        ),
        handler=_handle,
    )
    parser.add_argument("run_id", metavar="RUN_ID", help="the run to replay")
    parser.add_argument(
        "tool_call_id", metavar="TOOL_CALL_ID", nargs="?", help="replay only this call"
    )
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.add_argument(
        "--events", action="store_true", help="each call's whole timeline, not one line a call"
    )
    add_archive_arg(parser, "read the run from this archive instead of Redis (after its TTL)")
