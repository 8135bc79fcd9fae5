"""``canon bench``: the performance benchmark (see docs/performance.md).

Starts its own private Redis servers unless ``--redis-url`` or ``REDIS_URL`` names one,
prints the tables and the goals as PASS/SHORT lines, and writes the JSON report to
``--json FILE`` (``-`` for standard output). ``--archive`` adds the archive section
(opt-in: minutes, and about 20 GB of disk on a full run, :mod:`canon.bench.archive`);
``--archive-only`` runs it alone. The exit code is 0 whether goals pass or
not: the benchmark measures, it does not gate; 1 when it could not run, 3 when its Redis
cannot be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from typing import Any

import redis.exceptions
from rich.console import Console

from canon.bench import BenchOptions, render, run_archive_benchmark, run_benchmark
from canon.command_errors import check_url, explain
from canon.exitcodes import RET_OK, RET_PROBLEM
from eventstore.errors import StoreUnavailable


def register(subparsers: Any) -> None:
    """Add the ``bench`` subcommand."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "bench",
        help="measure throughput, latency, memory and scale against the Redis floor",
        description="Measure the store's throughput, latency, memory per record and scale "
        "against plain Redis commands on the same server (the floor), print the tables and "
        "each goal as PASS or SHORT, and optionally write the JSON report. Starts private "
        "Redis servers unless --redis-url or REDIS_URL names one. Exit 0 whether goals "
        "pass or not (it measures, it does not gate), 1 when it could not run, 3 when its "
        "Redis cannot be reached.",
    )
    parser.add_argument("--quick", action="store_true", help="CI-size run (well under a minute)")
    parser.add_argument("--json", metavar="FILE", help="write the JSON report here ('-': stdout)")
    parser.add_argument(
        "--redis-url",
        default=None,
        help="benchmark this server (default: $REDIS_URL, else private ones)",
    )
    parser.add_argument(
        "--redis-server",
        metavar="BINARY",
        default=None,
        help="redis-server binary for the private servers",
    )
    archive = parser.add_mutually_exclusive_group()
    archive.add_argument(
        "--archive",
        action="store_true",
        help="also run the archive section: its lag in SQLite and PostgreSQL at the "
        "boundary's rate, and search on 1,000,000 calls built in bulk (about 30 minutes and "
        "20 GB of disk; --quick: 20,000 calls)",
    )
    archive.add_argument(
        "--archive-only", action="store_true", help="run the archive section alone"
    )
    parser.add_argument(
        "--archive-postgres",
        metavar="URL",
        default=None,
        help="a PostgreSQL database the archive section may fill (default: a private "
        "server from Debian's postgresql binaries, removed at the end)",
    )
    parser.set_defaults(handler=run)


def _terminate(signum: int, frame: object) -> None:
    # SystemExit unwinds the with-blocks, so private servers are stopped on SIGTERM too.
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; returns RET_OK, or RET_PROBLEM when it could not run."""
    signal.signal(signal.SIGTERM, _terminate)
    preset = BenchOptions.quick_run() if args.quick else BenchOptions.full_run()
    url = args.redis_url or os.environ.get("REDIS_URL")
    if url:
        check_url(url)  # a bad scheme is a usage error (2), not a failed run
    options = preset.on(url, args.redis_server)
    if args.archive or args.archive_only:
        options = options.with_archive(only=args.archive_only, postgres_url=args.archive_postgres)
    to_stdout = args.json == "-"
    console = Console(file=sys.stderr if to_stdout else sys.stdout, width=160)

    def progress(message: str) -> None:
        console.print(f"[dim]{message}[/dim]")

    try:
        measure = run_archive_benchmark if options.archive_only else run_benchmark
        report = asyncio.run(measure(options, progress))
    except Exception as exc:  # one clear line, never a traceback
        if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
            raise StoreUnavailable(type(exc).__name__) from exc  # exit 3, with the reason
        if explain(exc) is not None:
            raise  # canon.cli prints it with its exit code
        console.print(f"canon bench: failed: {type(exc).__name__}: {exc}")
        return RET_PROBLEM
    render(report, console)
    if args.json:
        text = json.dumps(report, indent=2)
        if to_stdout:
            sys.stdout.write(text + "\n")
        else:
            with open(args.json, "w", encoding="utf-8") as handle:
                handle.write(text + "\n")
    return RET_OK
