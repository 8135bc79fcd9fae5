"""``canon demo``: a simulated harness run end to end, with readable tables at the end.

With no ``REDIS_URL`` it starts an embedded Redis (append-only file under ``--data-dir``)
and stops it on exit. Projection workers run in the background while the harness calls
tools; the tables show runs, outcomes, progress views, a few receipts and one replay, and
the last block says how to look at what it wrote with the other commands (each as it
runs from any shell: ``canon`` when this one is on ``PATH``, else its path). With
``--serve`` the embedded Redis and the operator console keep running after the demo (its
URL, the Redis URL and an operator token are printed) until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import socket
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TextIO, cast

import structlog
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from canon.argtypes import bounded, port_number
from canon.commands.replay import print_replay
from canon.connection import add_connection_args, open_store
from canon.demo.harness import WAITING, DemoRun, drive, planned_calls
from canon.demo.look import Where, canon_command, print_look
from canon.demo.serving import demo_token, keep_serving, listen
from canon.exitcodes import RET_OK
from canon.logging_setup import configure_logging
from canon.operator_credentials import add_console_args, add_operator
from eventstore.audit import replay_invocation
from eventstore.audit.run_calls import run_calls
from eventstore.runs import RunInfo
from eventstore.server.embedded import EmbeddedRedis
from eventstore.store import Store
from machine.ids import invocation_id
from machine.phases import Phase
from projections import ProgressWorker, ReceiptWorker, read_view
from projections.receipts.builder import encode_receipt
from projections.receipts.inspection import inspect_invocation
from projections.worker.runtime import Worker

#: The phases a call not ended and not waiting for an operator may be in.
_IN_FLIGHT = (Phase.DISPATCHING, Phase.ATTEMPTED, Phase.ABANDONED)
REFUSALS_NOTE = (
    "READY and ERROR count every answer the agent got. Refusals (a duplicate call id, "
    "a call naming another run, a spent budget, a tool that is not read-only) are "
    "answers, not invocations: they use no budget and leave no invocation record; the "
    "run's refusal log keeps them (refused). budget: used / total. waiting: governed "
    "calls awaiting an operator's approval (or approved, awaiting their resume): "
    "recorded, not run; in flight: calls recorded and not ended otherwise."
)
FACTS_NOTE = (
    "facts: what the run's READY calls established, as the agent may cite them (one per "
    "READY call, bounded; NO_EVIDENCE gives a negative observation within its scope). "
    "by status is the public status: PROJECTING counts every call not ended, the "
    "governed calls waiting for an operator included (the runs table tells them apart)."
)


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at the time of the write.

    While the progress bar runs, rich puts a proxy there that prints above the bar; a
    logger bound to the real stream would write over the bar instead.
    """

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_demo_logging() -> None:
    """Warnings only, JSON unless standard error is a terminal, and never over the bar."""
    configure_logging(json=None, level="WARNING")
    stream = cast(TextIO, _CurrentStderr())  # PrintLogger only writes and flushes
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=stream))


async def _runs_table(store: Store, store_runs: list[tuple[DemoRun, RunInfo | None]]) -> Table:
    table = Table(title="Runs", caption=REFUSALS_NOTE, caption_justify="left")
    for column in ("run", "budget", "READY", "ERROR", "waiting", "in flight", "refused"):
        table.add_column(
            column, justify="left" if column == "run" else "right", no_wrap=column == "run"
        )
    for demo_run, info in store_runs:
        ready = sum(n for label, n in demo_run.outcomes.items() if label.startswith("READY"))
        errors = sum(n for label, n in demo_run.outcomes.items() if label.startswith("ERROR"))
        used = info.used_total if info else 0
        refused = sum(info.refused.values()) if info else 0
        phases = Counter(row.phase for row in await run_calls(store, demo_run.run_id))
        waiting = phases[Phase.AWAITING_APPROVAL.value] + phases[Phase.APPROVED.value]
        in_flight = sum(phases[phase.value] for phase in _IN_FLIGHT)
        table.add_row(
            demo_run.run_id,
            f"{used}/{demo_run.budget}",
            str(ready),
            str(errors),
            str(waiting),
            str(in_flight),
            str(refused),
        )
    return table


def _outcomes_table(runs: list[DemoRun]) -> Table:
    total: Counter[str] = Counter()
    for demo_run in runs:
        total.update(demo_run.outcomes)
    table = Table(
        title="Calls by outcome (what the agent saw)",
        caption="READY: evidence status of the result; ERROR: the error code. "
        "RUN_MISMATCH, DUPLICATE_TOOL_CALL, NOT_READ_ONLY and RUN_BUDGET_EXHAUSTED are "
        "refusals; EXECUTION_FAILED and RESULT_TOO_LARGE are invocations that failed; "
        "AWAITING_APPROVAL: a refund recorded and waiting for an operator's approval.",
        caption_justify="left",
    )
    table.add_column("status", no_wrap=True)
    table.add_column("evidence status / error code", no_wrap=True)
    table.add_column("calls", justify="right", no_wrap=True)
    for label, count in sorted(total.items()):
        status, _, detail = label.partition("/")
        table.add_row(status, detail, str(count))
    return table


async def _views_table(store: Store, runs: list[DemoRun]) -> Table:
    table = Table(
        title="Progress views (built by the progress worker)",
        caption=FACTS_NOTE,
        caption_justify="left",
    )
    table.add_column("run", no_wrap=True)
    table.add_column("invocations", justify="right", no_wrap=True)
    table.add_column("by status")
    table.add_column("by evidence")
    table.add_column("facts", justify="right", no_wrap=True)
    for demo_run in runs:
        view = await read_view(store, demo_run.run_id)
        if view is None:
            table.add_row(demo_run.run_id, "-", "-", "-", "-")
            continue
        table.add_row(
            demo_run.run_id,
            str(view.invocations),
            "\n".join(f"{k} {v}" for k, v in sorted(view.by_status.items())),
            "\n".join(f"{k} {v}" for k, v in sorted(view.by_evidence.items())),
            str(len(view.facts)),
        )
    return table


async def _show_receipts(console: Console, store: Store, demo_run: DemoRun) -> None:
    # A READY call, the call whose tool failed, and the refund waiting for an operator.
    shown = (
        demo_run.tool_call_ids[0],
        demo_run.first_call_with("ERROR/EXECUTION_FAILED"),
        demo_run.first_call_with(WAITING),
    )
    for tool_call_id in (call for call in shown if call is not None):
        receipt = await inspect_invocation(
            store, demo_run.run_id, invocation_id(demo_run.run_id, tool_call_id)
        )
        console.rule(f"receipt of {demo_run.run_id}/{tool_call_id}")
        console.print_json(json.dumps(json.loads(encode_receipt(receipt))))


#: The operator the demo names for its printed ``canon approve``.
DEMO_OPERATOR = "demo-operator"


def demo_operator(directory: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """The demo operator's operators file and token file in ``directory`` (made once).

    So that the printed ``canon approve`` works as printed: a decision is recorded as the
    operator a token names, never a name typed on the command line.
    """
    operators, token = directory / "operators.txt", directory / "demo-operator.token"
    directory.mkdir(parents=True, exist_ok=True)
    if not (operators.exists() and token.exists()):
        operators.unlink(missing_ok=True)
        token.unlink(missing_ok=True)
        add_operator(DEMO_OPERATOR, operators, token)
    return operators, token


async def _settle(workers: list[Worker], tasks: list[asyncio.Task[None]]) -> None:
    for worker in workers:
        worker.stop()
    await asyncio.gather(*tasks)
    for worker in workers:  # catch up with whatever arrived after the last blocking read
        await worker.run(burst=True)


async def run_demo(
    args: argparse.Namespace,
    console: Console,
    then: Callable[[Store, Where], Awaitable[None]] | None = None,
) -> Where:
    """Drive the demo and print its tables; returns where it wrote, for the last block.

    ``then`` runs with the store still open (and the embedded Redis still running).
    """
    where = Where(namespace=args.namespace, redis_url=args.redis_url, canon=canon_command())

    def announce(server: EmbeddedRedis, data_dir: pathlib.Path) -> None:
        where.embedded_url, where.data_dir = server.url, data_dir
        console.print(
            f"Redis: an embedded server at {server.url} (data in {data_dir}); "
            "it stops when the demo ends",
            highlight=False,
        )

    async with open_store(args, embedded=True, announce=announce) as store:
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
        console.print(
            "[dim]The harness logs the failures the demo provokes on purpose as warnings "
            "(standard error).[/dim]"
        )
        await _settle(workers, tasks)

        infos = [(demo_run, await store.run_info(demo_run.run_id)) for demo_run in runs]
        console.print(await _runs_table(store, infos))
        console.print(_outcomes_table(runs))
        console.print(await _views_table(store, runs))
        await _show_receipts(console, store, runs[0])
        replay = await replay_invocation(store, runs[0].run_id, runs[0].tool_call_ids[0])
        if replay is not None:
            console.rule(f"replay of {runs[0].run_id}/{runs[0].tool_call_ids[0]}")
            print_replay(console, replay)
        where.run_id = runs[0].run_id
        where.failed_call = runs[0].first_call_with("ERROR/EXECUTION_FAILED")
        # The last run's budget is the one that binds (see drive).
        where.budget_run = runs[-1].run_id
        where.waiting_call = runs[0].first_call_with(WAITING)
        if where.waiting_call is not None:
            where.operator_files = demo_operator(where.data_dir or pathlib.Path(".canon"))
        where.runs = [demo_run.run_id for demo_run in runs]
        if then is not None:
            await then(store, where)
    return where


def _handle(args: argparse.Namespace) -> int:
    configure_demo_logging()
    console = Console()
    if not args.serve:
        where = asyncio.run(run_demo(args, console))
        print_look(console, where)
        return RET_OK
    token = demo_token(args)
    listener: socket.socket = listen(args.port)

    async def keep(store: Store, where: Where) -> None:
        await keep_serving(store, where, console, listener, token)

    try:
        asyncio.run(run_demo(args, console, then=keep))
    finally:
        listener.close()
    return RET_OK


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``canon demo``."""
    parser = subparsers.add_parser(
        "demo",
        help="drive a simulated agent harness through the store and show what happened",
        description=__doc__,
    )
    add_connection_args(parser, embedded=True)
    at_least_2 = bounded(2, None, "a whole number of at least 2")
    parser.add_argument("--runs", type=at_least_2, default=3, help="runs to open (default: 3)")
    parser.add_argument(
        "--calls", type=at_least_2, default=40, help="searches per run (default: 40)"
    )
    parser.add_argument("--seed", type=int, default=7, help="random seed (default: 7)")
    parser.add_argument(
        "--serve",
        action="store_true",
        help="keep the embedded Redis and the operator console running after the demo "
        "(prints the console URL and an operator token; Ctrl-C stops them)",
    )
    parser.add_argument(
        "--port",
        type=port_number,
        default=8080,
        help="with --serve: the console's loopback port; 0 picks a free one (8080)",
    )
    add_console_args(parser)
    parser.set_defaults(handler=_handle, namespace="demo")
