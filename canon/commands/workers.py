"""``canon workers``: run the receipt and progress projection workers.

Both workers consume every shard feed through their consumer groups until SIGTERM or
SIGINT (each finishes and acknowledges its batch, then the process exits 0), or, with
``--burst``, until nothing is left to do.
"""

from __future__ import annotations

import argparse
from typing import Any

from canon.connection import add_connection_args, open_store
from canon.service import (
    add_logging_args,
    add_worker_args,
    build_workers,
    run_service,
    serving_metrics,
)
from projections.metrics import Metrics
from projections.worker.supervisor import run_workers


def register(subparsers: Any) -> None:
    """Add the ``workers`` subcommand."""
    parser = subparsers.add_parser(
        "workers",
        help="run the projection workers (receipts, run progress)",
        description=__doc__,
    )
    add_connection_args(parser, embedded=True)
    add_worker_args(parser)
    parser.add_argument(
        "--burst", action="store_true", help="drain what is available now, then exit"
    )
    add_logging_args(parser)
    parser.set_defaults(handler=run)


async def _work(args: argparse.Namespace) -> None:
    async with open_store(args, embedded=True) as store:
        if args.strict_durability:
            await store.check_durability("strict")
        metrics = Metrics()
        with serving_metrics(metrics, args.metrics_port):
            await run_workers(build_workers(store, args, metrics), burst=args.burst)


def run(args: argparse.Namespace) -> int:
    """Run the workers; exit 0 after a burst or a graceful stop."""
    return run_service(args, _work)
