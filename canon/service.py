"""What several ``canon`` subcommands share, in one place.

Logging and worker options, building the projection workers, serving their metrics, and
running a long-lived command. ``canon workers`` and ``canon serve`` run the workers;
``canon rebuild`` logs like them; the lag benchmark starts its workers the way
``canon workers`` does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
from collections.abc import Callable, Coroutine
from typing import Any, Final

from canon.argtypes import log_level, non_negative, port_number, positive
from canon.command_errors import bind_errors
from canon.exitcodes import RET_OK
from canon.logging_setup import configure_logging
from eventstore.store import Store
from projections.metrics import Metrics, metrics_server
from projections.progress import ProgressWorker
from projections.receipts.projection import ReceiptWorker
from projections.worker.runtime import Worker, WorkerOptions

#: Pause before each entry, in ms: load shaping, and how fault tests slow a worker down.
THROTTLE_ENV: Final = "CANON_WORKER_THROTTLE_MS"


def add_logging_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--log-level`` and ``--log-format``."""
    parser.add_argument(
        "--log-level",
        type=log_level,
        default="INFO",
        help="lowest level logged: DEBUG, INFO, WARNING, ERROR or CRITICAL (INFO)",
    )
    parser.add_argument(
        "--log-format",
        choices=("auto", "json", "console"),
        default="auto",
        help="JSON lines, console lines, or JSON unless stderr is a terminal (auto)",
    )


def setup_logging(args: argparse.Namespace) -> None:
    """Configure structured logs from ``--log-level`` and ``--log-format``."""
    json = {"auto": None, "json": True, "console": False}[args.log_format]
    configure_logging(json=json, level=args.log_level)


def add_worker_args(parser: argparse.ArgumentParser) -> None:
    """Add the options of the projection workers."""
    parser.add_argument("--consumer", default=None, help="consumer name (default: host-pid)")
    parser.add_argument("--block-ms", type=positive, default=1000, help="XREADGROUP block (1000)")
    parser.add_argument("--batch", type=positive, default=64, help="entries per read (64)")
    parser.add_argument(
        "--min-idle-ms",
        type=non_negative,
        default=30_000,
        help="take over entries pending this long in any consumer (30000)",
    )
    parser.add_argument(
        "--max-deliveries",
        type=positive,
        default=5,
        help="deliveries after which an entry is dead-lettered (5)",
    )
    parser.add_argument(
        "--metrics-port",
        type=port_number,
        default=None,
        help="serve Prometheus metrics on this loopback port",
    )
    parser.add_argument(
        "--strict-durability",
        action="store_true",
        help="refuse to start when the server could lose or evict records "
        "(default: log a durability_warning)",
    )


def build_workers(store: Store, args: argparse.Namespace, metrics: Metrics) -> list[Worker]:
    """Build the receipt and progress workers the arguments describe."""
    options: WorkerOptions = {
        "consumer": args.consumer,
        "block_ms": args.block_ms,
        "batch": args.batch,
        "min_idle_ms": args.min_idle_ms,
        "max_deliveries": args.max_deliveries,
        "throttle_ms": int(os.environ.get(THROTTLE_ENV, "0")),
        "metrics": metrics,
    }
    return [ReceiptWorker(store, **options), ProgressWorker(store, **options)]


@contextlib.contextmanager
def serving_metrics(metrics: Metrics, port: int | None) -> Any:
    """Serve ``metrics`` on ``port`` for the block, when a port is given."""
    if port is None:
        yield None
        return
    with contextlib.ExitStack() as stack:
        with bind_errors("--metrics-port", "127.0.0.1", port):
            bound = stack.enter_context(metrics_server(metrics, port))
        yield bound


def freeze_startup_heap() -> None:
    """Keep the objects made while starting (modules, classes) out of every later GC pass.

    A long-lived worker's full collections otherwise walk the whole import-time heap again
    each time, and that pause lands on the projection lag's tail.
    """
    gc.collect()
    gc.freeze()


def run_service(
    args: argparse.Namespace, main: Callable[[argparse.Namespace], Coroutine[Any, Any, None]]
) -> int:
    """Run a long-lived command until it returns; exit 0.

    Store and settings errors propagate to ``canon.cli``, which prints them as one line
    with their exit code (:mod:`canon.command_errors`).
    """
    setup_logging(args)
    freeze_startup_heap()
    asyncio.run(main(args))
    return RET_OK
