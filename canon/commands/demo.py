"""``canon demo``: a simulated harness run end to end, with readable tables at the end.

With no ``REDIS_URL`` it starts an embedded Redis (append-only file under ``--data-dir``)
and stops it on exit. Projection workers run in the background while the harness calls
tools; the tables show runs, outcomes, progress views, a few receipts and one replay.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from canon.commands.replay import print_replay
from canon.connection import ConnectionSettingsError, add_connection_args, open_store
from canon.demo.harness import DemoRun, drive, planned_calls
from canon.exitcodes import RET_OK, RET_USAGE
from canon.logs import configure_logging
from eventstore.audit import replay_invocation
from eventstore.embedded import EmbeddedRedisError
from eventstore.errors import CanonError
from eventstore.store import Store
from machine.ids import invocation_id
from projections import ProgressWorker, ReceiptWorker, read_view
from projections.inspection import inspect_invocation
from projections.receipts import encode_receipt
from projections.runtime import Worker


def _runs_table(store_runs: list[tuple[DemoRun, int]]) -> Table:
    table = Table(title="Runs")
    for column in ("run", "budget", "used", "READY", "ERROR"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for demo_run, used in store_runs:
        ready = sum(n for label, n in demo_run.outcomes.items() if label.startswith("READY"))
        errors = sum(n for label, n in demo_run.outcomes.items() if label.startswith("ERROR"))
        table.add_row(demo_run.run_id, str(demo_run.budget), str(used), str(ready), str(errors))
    return table


def _outcomes_table(runs: list[DemoRun]) -> Table:
    total: Counter[str] = Counter()
    for demo_run in runs:
        total.update(demo_run.outcomes)
    table = Table(title="Calls by outcome (what the agent saw)")
    table.add_column("status")
    table.add_column("evidence status / error code")
    table.add_column("calls", justify="right")
    for label, count in sorted(total.items()):
        status, _, detail = label.partition("/")
        table.add_row(status, detail, str(count))
    return table


async def _views_table(store: Store, runs: list[DemoRun]) -> Table:
    table = Table(title="Progress views (built by the progress worker)")
    for column in ("run", "invocations", "by status", "by evidence", "facts"):
        table.add_column(column)
    for demo_run in runs:
        view = await read_view(store, demo_run.run_id)
        if view is None:
            table.add_row(demo_run.run_id, "-", "-", "-", "-")
            continue
        table.add_row(
            demo_run.run_id,
            str(view.invocations),
            ", ".join(f"{k} {v}" for k, v in sorted(view.by_status.items())),
            ", ".join(f"{k} {v}" for k, v in sorted(view.by_evidence.items())),
            str(len(view.facts)),
        )
    return table


async def _show_receipts(console: Console, store: Store, demo_run: DemoRun) -> None:
    for tool_call_id in demo_run.tool_call_ids[:1] + demo_run.tool_call_ids[-4:-2]:
        receipt = await inspect_invocation(
            store, demo_run.run_id, invocation_id(demo_run.run_id, tool_call_id)
        )
        console.rule(f"receipt of {demo_run.run_id}/{tool_call_id}")
        console.print_json(json.dumps(json.loads(encode_receipt(receipt))))


async def _demo(args: argparse.Namespace, console: Console) -> int:
    async with open_store(args, embedded=True) as store:
        workers: list[Worker] = [
            ReceiptWorker(store, block_ms=100),
            ProgressWorker(store, block_ms=100),
        ]
        tasks = [asyncio.create_task(worker.run()) for worker in workers]
        columns = (
            TextColumn("[bold]tool calls"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=console, transient=False) as progress:
            bar = progress.add_task("calls", total=planned_calls(args.runs, args.calls))
            runs = await drive(
                store,
                runs=args.runs,
                calls_per_run=args.calls,
                seed=args.seed,
                on_call=lambda: progress.advance(bar),
            )
        for worker in workers:
            worker.stop()
        await asyncio.gather(*tasks)
        for worker in workers:  # catch up with whatever arrived after the last blocking read
            await worker.run(burst=True)

        used = []
        for demo_run in runs:
            info = await store.run_info(demo_run.run_id)
            used.append((demo_run, info.used_total if info else 0))
        console.print(_runs_table(used))
        console.print(_outcomes_table(runs))
        console.print(await _views_table(store, runs))
        await _show_receipts(console, store, runs[0])
        replay = await replay_invocation(store, runs[0].run_id, runs[0].tool_call_ids[0])
        if replay is not None:
            console.rule(f"replay of {runs[0].run_id}/{runs[0].tool_call_ids[0]}")
            print_replay(console, replay)
    return RET_OK


def _handle(args: argparse.Namespace) -> int:
    configure_logging(json=True, level="WARNING")
    console = Console()
    if args.runs < 2 or args.calls < 2:
        console.print("canon demo: --runs and --calls must be at least 2", style="red")
        return RET_USAGE
    try:
        return asyncio.run(_demo(args, console))
    except (ConnectionSettingsError, EmbeddedRedisError, CanonError) as exc:
        console.print(f"canon demo: {type(exc).__name__}: the store is not usable", style="red")
        return RET_USAGE


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``canon demo``."""
    parser = subparsers.add_parser(
        "demo",
        help="drive a simulated agent harness through the store and show what happened",
        description=__doc__,
    )
    add_connection_args(parser, embedded=True)
    parser.add_argument("--runs", type=int, default=3, help="runs to open (default: 3)")
    parser.add_argument("--calls", type=int, default=40, help="searches per run (default: 40)")
    parser.add_argument("--seed", type=int, default=7, help="random seed (default: 7)")
    parser.set_defaults(handler=_handle, namespace="demo")
