"""``canon status``: namespace health at a glance.

Records by status and by stage (where each stands: awaiting_approval, approved,
dispatching, attempted, abandoned, ready, error, reconciled), the paused runs (by whom,
why, since when) and the namespace's pause, feed entries, consumer-group lag and pending
counts, dead letters, memory used, the cost settings, and warnings for an eviction
policy other than ``noeviction`` or append-only persistence switched off. A setting the
user may not read (CONFIG GET is denied to the documented read-only ACL user) is shown
``unknown`` with one warning saying why. Exit 0 when it could report, warnings or not
(``--strict``: 1 with warnings), 2 on usage errors, 3 when Redis is unavailable.
Read-only.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from canon.commands.readonly import (
    elsewhere,
    pause_note,
    print_json,
    read_only_command,
    refuse_cluster,
    run_read_only,
    stdout_console,
)
from canon.exitcodes import RET_OK, RET_PROBLEM, RET_USAGE
from eventstore.audit import NamespaceStatus, namespace_status
from eventstore.store import Store


def print_status(console: Console, status: NamespaceStatus) -> None:
    """Print the health figures for a human.

    Consumer groups with nothing pending and no lag say nothing: one line counts them
    instead of a row each (48 shards make 96 such rows). ``--json`` keeps every row.
    """
    console.print(f"namespace {status.namespace} · {status.shards} shards")
    records = Table(title="records by status", title_justify="left")
    records.add_column("status")
    records.add_column("records", justify="right")
    for name, count in status.records_by_status.items():
        records.add_row(name, str(count))
    records.add_row("total", str(status.records))
    console.print(records)
    if status.records_by_stage:
        stages = Table(
            title="records by stage (where each stands beside its status)",
            title_justify="left",
        )
        stages.add_column("stage")
        stages.add_column("records", justify="right")
        for name, count in status.records_by_stage.items():
            stages.add_row(name, str(count))
        console.print(stages)
    if status.execution_paused:
        console.print("[yellow]execution is paused in the whole namespace[/yellow]")
    for paused in status.paused_runs:
        note = pause_note(paused.pause.by, paused.pause.reason, paused.pause.at_ms)
        console.print(f"paused: run {paused.run_id}{note}", highlight=False, soft_wrap=True)
    groups = Table(title="projections (consumer groups)", title_justify="left")
    for name in ("shard", "group", "consumers", "pending", "lag"):
        groups.add_column(name, justify="left" if name == "group" else "right")
    idle = 0
    for group in status.groups:
        if group.pending == 0 and group.lag == 0:
            idle += 1
            continue
        lag = "?" if group.lag is None else f"{'≥' if group.lag_capped else ''}{group.lag}"
        groups.add_row(str(group.shard), group.group, str(group.consumers), str(group.pending), lag)
    if not status.groups:
        groups.add_row("-", "no consumer groups yet", "", "", "")
    elif idle:
        caught_up = "every group" if idle == len(status.groups) else f"{idle} more groups"
        groups.add_row("-", f"{caught_up}: nothing pending, no lag", "", "", "")
    console.print(groups)
    console.print(f"feed entries (all shards): {status.feed_entries}")
    console.print(f"dead letters: {status.dead_letters}")
    console.print(f"memory used: {status.used_memory_human}")
    console.print(f"maxmemory-policy: {status.maxmemory_policy} · appendonly: {status.appendonly}")
    if status.server_settings:
        shown = " · ".join(f"{name}: {value}" for name, value in status.server_settings.items())
        console.print(f"cost settings: {shown}")
    for warning in status.warnings:
        console.print(f"[yellow]WARNING[/yellow] {warning}")
    if not status.warnings:
        console.print("[green]healthy[/green]")


def _handle(args: argparse.Namespace) -> int:
    async def work(store: Store) -> int:
        if refuse_cluster(store, "status"):
            return RET_USAGE
        status = await namespace_status(store)
        if args.json:
            print_json(status)
        else:
            console = stdout_console()
            print_status(console, status)
            hint = await elsewhere(store) if status.records == 0 else ""
            if hint:
                console.print(
                    f"no records in namespace {status.namespace}{hint}",
                    highlight=False,
                    soft_wrap=True,
                )
        return RET_PROBLEM if status.warnings and args.strict else RET_OK

    return run_read_only(args, work)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``status`` subcommand."""
    parser = read_only_command(
        subparsers,
        "status",
        help="namespace health: records, feeds, lag, dead letters, memory, settings",
        description=(
            "Count records by status (SCAN), sum the shard feeds, show each projection's "
            "lag and pending entries, dead letters and memory used, and warn when the "
            "server's maxmemory-policy is not noeviction or appendonly is off. Read-only. "
            "Exit 0 when it could report (warnings or not), 1 with warnings under --strict, "
            "2 usage, 3 Redis unavailable."
        ),
        handler=_handle,
    )
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 when there is any warning (for checks)"
    )
