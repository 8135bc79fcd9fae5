"""``canon mcp-proxy``: record every tool call of any MCP server, without code.

``canon mcp-proxy [options] -- <command that starts an MCP server>`` starts the server as
a child process on stdio (or ``--upstream-url`` reaches one over streamable HTTP) and is
itself an MCP server that lists the upstream's tools and runs each ``tools/call`` through
the boundary: canonical records, receipts and replay for the upstream's calls. It speaks
MCP on stdio (standard output carries nothing but the protocol; logs go to standard
error), or with ``--http`` over streamable HTTP on ``--host``/``--port`` until SIGTERM or
SIGINT. Hosts name their calls with the ``_meta`` keys ``io.canon/tool_call_id`` and
``io.canon/run_id``; see docs/integrations.md for the fallback ids of hosts that don't.
An upstream ``isError`` result reaches the host as the safe error, or, with
``--forward-tool-errors``, as the upstream's own text (scrubbed, bounded, recorded).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import timedelta
from typing import Any

import structlog

from canon.connection import add_connection_args, open_store
from canon.failures import CommandError
from canon.service import add_logging_args, run_service
from eventstore.store import Store

log = structlog.get_logger("canon.mcp_proxy")


def register(subparsers: Any) -> None:
    """Add the ``mcp-proxy`` subcommand."""
    parser = subparsers.add_parser(
        "mcp-proxy",
        help="serve an MCP server's tools through canon, recording every call",
        description=__doc__,
    )
    add_connection_args(parser, embedded=True)
    parser.add_argument(
        "--upstream-url", default=None, help="reach the upstream over streamable HTTP here"
    )
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP, not stdio")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind with --http")
    parser.add_argument("--port", type=int, default=8000, help="port to bind with --http (8000)")
    parser.add_argument(
        "--run-id",
        default=None,
        help="run of calls whose _meta names none (default: mcp-<connection id>)",
    )
    parser.add_argument(
        "--deadline-s", type=int, default=3600, help="each run's deadline in seconds (3600)"
    )
    parser.add_argument(
        "--budget", type=int, default=None, help="most invocations per run (no limit)"
    )
    parser.add_argument(
        "--tool-timeout-s", type=float, default=None, help="most seconds per upstream call"
    )
    parser.add_argument(
        "--on-duplicate",
        choices=("replay", "refuse"),
        default="replay",
        help="a re-sent tool call id gets the recorded answer, or DUPLICATE_TOOL_CALL (replay)",
    )
    parser.add_argument(
        "--forward-tool-errors",
        action="store_true",
        help="show the host the upstream's own isError text (scrubbed, bounded, recorded) "
        "so its model can correct the call, instead of the safe error",
    )
    add_logging_args(parser)
    parser.add_argument(
        "upstream",
        nargs=argparse.REMAINDER,
        help="after --: the command that starts the upstream MCP server on stdio",
    )
    parser.set_defaults(handler=run)


def _upstream_command(args: argparse.Namespace) -> list[str]:
    command = list(args.upstream)
    if command[:1] == ["--"]:
        command = command[1:]
    return command


@asynccontextmanager
async def _proxy(args: argparse.Namespace, store: Store) -> AsyncIterator[Any]:
    # Imported here: the base install has no MCP SDK, and `canon --help` must not need it.
    from canon.integrations.mcp import RunOptions
    from canon.integrations.mcp_proxy import connect_upstream, proxy_server

    async with AsyncExitStack() as stack:
        session = await stack.enter_async_context(
            connect_upstream(_upstream_command(args), url=args.upstream_url)
        )
        server = await stack.enter_async_context(
            proxy_server(
                store,
                session,
                run_id=args.run_id,
                run_options=RunOptions(
                    deadline=timedelta(seconds=args.deadline_s), budget=args.budget
                ),
                on_duplicate=args.on_duplicate,
                timeout_s=args.tool_timeout_s,
                forward_tool_errors=args.forward_tool_errors,
            )
        )
        yield server


async def _serve_stdio(args: argparse.Namespace) -> None:
    from mcp.server.stdio import stdio_server

    # The protocol's streams first: from here on standard output belongs to MCP (the SDK
    # points fd 1 at stderr while it serves), so no child and no log can write to it.
    async with (
        stdio_server() as (read_stream, write_stream),
        open_store(args, embedded=True) as store,
        _proxy(args, store) as server,
    ):
        log.info("mcp_proxy_started", transport="stdio")
        await server.run(read_stream, write_stream, server.create_initialization_options())


async def _serve_http(args: argparse.Namespace) -> None:
    from projections.worker.supervisor import ReceiptServer

    async with open_store(args, embedded=True) as store, _proxy(args, store) as server:
        app = server.streamable_http_app()
        http = ReceiptServer(app, host=args.host, port=args.port)
        _stop_on_signals(http.stop)
        async with server.session_manager.run():
            serving = asyncio.create_task(http.serve())
            await _announce(http, serving)
            await serving
        log.info("server_stopped")


def _stop_on_signals(stop: Callable[[], None]) -> None:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop)


async def _announce(http: Any, serving: asyncio.Task[None]) -> None:
    """Log the bound address once the server listens (or give up when it stops first)."""
    while not http.started:
        if serving.done():
            return
        await asyncio.sleep(0.01)
    log.info("mcp_proxy_started", transport="http", host=http.config.host, port=http.port)


async def _serve(args: argparse.Namespace) -> None:
    if bool(_upstream_command(args)) == (args.upstream_url is not None):
        raise CommandError("name the upstream MCP server: -- <command>, or --upstream-url")
    try:
        import canon.integrations.mcp  # noqa: F401
    except ImportError as error:
        raise CommandError(str(error)) from None
    await (_serve_http(args) if args.http else _serve_stdio(args))


def run(args: argparse.Namespace) -> int:
    """Proxy until the host disconnects (stdio) or SIGTERM/SIGINT (HTTP); exit 0."""
    return run_service(args, _serve)
