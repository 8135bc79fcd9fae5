"""``canon serve``: the receipt HTTP API, optionally with the workers.

Serves the route tables of :mod:`projections.http_api` with uvicorn, each GET answering only
for the run named by the request's Bearer token. With ``--with-workers`` the receipt and
progress workers run in the same process. SIGTERM or SIGINT stops the server and lets the
workers settle their batches; the process then exits 0. The listening socket is bound
before anything else runs, so a port in use is one line and exit 2. With operators (an
operators file, ``CANON_OPERATORS`` or ``--operators-file``; or one operator token,
``CANON_OPERATOR_TOKEN`` or ``--operator-token-file``) it also serves the operator console
at ``/console/`` (:mod:`canon.operator_credentials`) and takes operators' decisions on
governed calls (the POST routes, under an operator's token, recorded as that operator's). With
``--archive URL`` the console shows a run or call Redis no longer holds from that archive
(marked archived, read-only) and its search page searches the archive across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import AsyncIterator
from typing import Any

import structlog

from canon.argtypes import port_number
from canon.command_errors import CommandError, bind_errors
from canon.commands.readonly import add_archive_arg, archive_url
from canon.connection import add_connection_args, open_store
from canon.operator_credentials import add_console_args, console_app, served_operators
from canon.service import (
    add_logging_args,
    add_worker_args,
    build_workers,
    run_service,
    serving_metrics,
)
from projections.archive.database import ArchiveDatabase, archive_at
from projections.archive.schema import check_schema
from projections.connections import (
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    ConnectionLimits,
)
from projections.console import CONSOLE_ROUTES
from projections.http_api import ROUTES, create_app
from projections.metrics import Metrics
from projections.worker.supervisor import ReceiptServer

log = structlog.get_logger("canon.serve")


def register(subparsers: Any) -> None:
    """Add the ``serve`` subcommand."""
    parser = subparsers.add_parser(
        "serve",
        help="serve the receipt HTTP API and the operator console (optionally the workers)",
        description="Serve the receipt HTTP API; every GET answers for the run named by the "
        "request's Bearer token (Authorization: Bearer <run token>). Routes: "
        + "; ".join(ROUTES)
        + ". With --with-workers the receipt and progress workers run in the same process. "
        "With operators ($CANON_OPERATORS or --operators-file; or one token, "
        "$CANON_OPERATOR_TOKEN or --operator-token-file) the POST routes take operators' "
        "decisions on governed calls (Authorization: Bearer <operator token>, recorded as "
        "that operator's; a run's token is refused) and it serves the operator console: "
        + "; ".join(CONSOLE_ROUTES)
        + ". SIGTERM or SIGINT stops it gracefully (exit 0).",
    )
    add_connection_args(parser, embedded=True)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    parser.add_argument(
        "--port", type=port_number, default=8080, help="port to bind; 0 picks a free one (8080)"
    )
    parser.add_argument(
        "--with-workers", action="store_true", help="also run the projection workers"
    )
    parser.add_argument(
        "--header-timeout-s",
        type=float,
        default=DEFAULT_HEADER_TIMEOUT_S,
        help="seconds a request may take to arrive whole, else its connection is closed "
        "(%(default)s)",
    )
    parser.add_argument(
        "--idle-timeout-s",
        type=float,
        default=DEFAULT_IDLE_TIMEOUT_S,
        help="seconds a kept-alive connection may wait for its next request (%(default)s)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        help="open connections at most; past it the longest-waiting idle one is closed "
        "(%(default)s)",
    )
    add_console_args(parser)
    add_archive_arg(
        parser,
        "the console reads a run or call Redis no longer holds from this archive (marked "
        "archived, read-only), and its search page searches it",
    )
    parser.add_argument(
        "--secure-cookies",
        action="store_true",
        help="mark the console's login cookie Secure on every answer, also over plain HTTP "
        "(behind a TLS proxy that sends no X-Forwarded-Proto); over HTTPS it always is",
    )
    add_worker_args(parser)
    add_logging_args(parser)
    parser.set_defaults(handler=run)


def _listen(host: str, port: int) -> socket.socket:
    """Bind the HTTP socket now: a port in use is a clear error before any server starts."""
    with bind_errors("--host/--port", host, port):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        return socket.create_server((host, port), family=family, reuse_port=False)


async def _serve(args: argparse.Namespace) -> None:
    # A bad operators file or token fails before binding.
    args.operators = served_operators(args, dict(os.environ))
    if archive_url(args) is not None and args.operators is None:
        raise CommandError(
            "--archive serves the console's archived pages: it needs operators "
            "(receipts are never served from the archive)"
        )
    listener = _listen(args.host, args.port)
    try:
        await _serve_on(args, listener)
    finally:
        listener.close()


@contextlib.asynccontextmanager
async def _archive(args: argparse.Namespace) -> AsyncIterator[ArchiveDatabase | None]:
    """The archive ``--archive`` names, its schema checked, closed at the end; else None."""
    url = archive_url(args)
    if url is None:
        yield None
        return
    async with archive_at(url) as database:
        await check_schema(database)
        yield database


async def _serve_on(args: argparse.Namespace, listener: socket.socket) -> None:
    # Without workers the process only reads: it may run as the reader ACL user.
    async with (
        open_store(args, embedded=True, read_only=not args.with_workers) as store,
        _archive(args) as archive,
    ):
        if args.strict_durability:
            await store.check_durability("strict")
        metrics = Metrics()
        console = console_app(
            store,
            args.operators,
            args.host,
            secure_cookies=args.secure_cookies,
            archive=archive,
        )
        server = ReceiptServer(
            create_app(
                store,
                metrics=metrics,
                console=console,
                operator=console.gate if console is not None else None,
            ),
            host=args.host,
            port=args.port,
            limits=ConnectionLimits(
                header_timeout_s=args.header_timeout_s,
                idle_timeout_s=args.idle_timeout_s,
                max_connections=args.max_connections,
            ),
        )
        workers = build_workers(store, args, metrics) if args.with_workers else []

        def stop(signum: signal.Signals) -> None:
            log.info("shutdown_requested", signal=signum.name)
            server.stop()
            for worker in workers:
                worker.stop()

        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop, signum)
        with serving_metrics(metrics, args.metrics_port):
            async with asyncio.TaskGroup() as group:
                for worker in workers:
                    group.create_task(worker.run())
                group.create_task(_announce(server))
                await server.serve(sockets=[listener])
                log.info("server_stopped")
                for worker in workers:
                    worker.stop()


async def _announce(server: ReceiptServer) -> None:
    """Log the bound address once the server listens (or give up when it stops first)."""
    while not server.started:
        if server.should_exit:
            return
        await asyncio.sleep(0.01)
    log.info("server_started", host=server.config.host, port=server.port)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT; exit 0 after a graceful stop."""
    return run_service(args, _serve)
