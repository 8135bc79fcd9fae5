"""``canon mcp-proxy``: record every tool call of any MCP server, without code.

``canon mcp-proxy [options] -- <command that starts an MCP server>`` starts the server as
a child process on stdio (or ``--upstream-url`` reaches one over streamable HTTP) and is
itself that MCP server for the host: everything but ``tools/call`` passes through both
ways unchanged (prompts, resources, completion, logging, progress, cancellation,
sampling, elicitation, roots, notifications, instructions), and each ``tools/call`` runs
through the boundary: canonical records, receipts and replay for the upstream's calls.
It speaks MCP on stdio (standard output carries nothing but the protocol; logs go to
standard error), or with ``--http`` over streamable HTTP on ``--host``/``--port`` until
SIGTERM or SIGINT. Hosts name their calls with the ``_meta`` keys
``io.canon/tool_call_id`` and ``io.canon/run_id``; see docs/integrations.md for the
fallback ids of hosts that don't. Exit codes: 0 when the host goes away or on SIGTERM /
SIGINT, 2 for bad options, 3 when Redis is unavailable, 4 when the upstream cannot start,
exits before answering ``initialize`` or does not answer it within ``--start-timeout-s``.
An upstream ``isError`` result reaches the host as the upstream's own text (scrubbed,
bounded, recorded), so its model can correct the call; ``--hide-tool-errors`` shows the
safe error instead.

Governed tools: ``--govern`` chooses which upstream tools wait for an operator's
approval (``canon approve``, the console) before they run: ``--govern annotations``
governs every tool whose annotations lack ``readOnlyHint: true`` (for an upstream whose
annotations you trust), ``--govern NAME`` (repeatable) governs the tools named, and
``--govern none`` (the default) governs none: every call is recorded and runs at once.
A governed call is answered at once with a pending result (not an error; ``_meta`` holds
``io.canon/approval_id``, and with ``--console-url`` the console page where an operator
decides it, ``io.canon/console_url``); the host sends the same call again with the same
``io.canon/tool_call_id`` to get the upstream's answer once approved (the upstream runs
it once) or the denial.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import signal
from collections.abc import Callable
from datetime import timedelta
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import structlog

from canon.argtypes import positive, positive_float
from canon.command_errors import CommandError
from canon.connection import add_connection_args, open_store, user_data_dir
from canon.exitcodes import RET_UPSTREAM
from canon.service import add_logging_args, run_service
from eventstore.errors import InvalidArgument
from eventstore.store import Store
from machine.limits import Limits

#: Seconds one upstream tool call may take by default (0 on the command line: no bound).
DEFAULT_TOOL_TIMEOUT_S = 300.0
#: Seconds an HTTP session (or the 2026-07-28 requests' upstream) lives without a request.
DEFAULT_IDLE_TIMEOUT_S = 1800.0
#: Seconds the upstream may take to answer ``initialize``.
DEFAULT_START_TIMEOUT_S = 30.0
#: Size limits that suit MCP payloads: files, images, long documents.
DEFAULT_REQUEST_BYTES = 4 * 1024 * 1024
DEFAULT_RESULT_BYTES = 16 * 1024 * 1024
DEFAULT_RAW_BYTES = 16 * 1024 * 1024
#: Deepest nesting of tool call arguments (a host message may nest a few levels more).
DEFAULT_JSON_DEPTH = 64
# Levels a message adds around a call's arguments (message, params, arguments).
_ENVELOPE_DEPTH = 4

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
        "--idle-timeout-s",
        type=positive_float,
        default=DEFAULT_IDLE_TIMEOUT_S,
        help="with --http, seconds a session (and its upstream), or the 2026-07-28 "
        "requests' shared upstream, lives without a request (default: %(default)s)",
    )
    parser.add_argument(
        "--run-id",
        default=None,
        help="run of calls whose _meta names none (default: mcp-<connection id>)",
    )
    parser.add_argument(
        "--deadline-s",
        type=positive,
        default=None,
        help="each run's deadline in seconds (default: --ttl-s, one retention for the "
        "records and their run; the proxy's own run then rolls over to a new one)",
    )
    parser.add_argument(
        "--budget", type=int, default=None, help="most invocations per run (no limit)"
    )
    parser.add_argument(
        "--tool-timeout-s",
        type=float,
        default=DEFAULT_TOOL_TIMEOUT_S,
        help="most seconds per upstream tool call; 0 for none (default: %(default)s)",
    )
    parser.add_argument(
        "--start-timeout-s",
        type=float,
        default=DEFAULT_START_TIMEOUT_S,
        help="most seconds the upstream may take to answer initialize (default: %(default)s)",
    )
    parser.add_argument(
        "--max-request-bytes",
        type=positive,
        default=DEFAULT_REQUEST_BYTES,
        help="largest tool call arguments recorded, in bytes (default: %(default)s, 4 MiB)",
    )
    parser.add_argument(
        "--max-result-bytes",
        type=positive,
        default=DEFAULT_RESULT_BYTES,
        help="largest tool result the host gets, in bytes (default: %(default)s, 16 MiB)",
    )
    parser.add_argument(
        "--max-raw-bytes",
        type=positive,
        default=DEFAULT_RAW_BYTES,
        help="largest raw upstream response recorded, in bytes (default: %(default)s, 16 MiB)",
    )
    parser.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="with --upstream-url, an HTTP header to send; VALUE env:VAR or file:PATH reads "
        "it from there (repeatable; values are never printed)",
    )
    parser.add_argument(
        "--bearer-token-env",
        default=None,
        metavar="VAR",
        help="with --upstream-url, send Authorization: Bearer <the value of VAR>",
    )
    parser.add_argument(
        "--on-duplicate",
        choices=("replay", "refuse"),
        default="replay",
        help="a re-sent tool call id gets the recorded answer, or DUPLICATE_TOOL_CALL (replay)",
    )
    parser.add_argument(
        "--hide-tool-errors",
        action="store_true",
        help="show the host the safe error (EXECUTION_FAILED) instead of the upstream's own "
        "isError text (by default that text reaches the host scrubbed, bounded and recorded, "
        "so its model can correct the call)",
    )
    parser.add_argument(
        "--forward-tool-errors",
        action="store_true",
        help=argparse.SUPPRESS,  # the default now; kept so existing configs still start
    )
    parser.add_argument(
        "--max-json-depth",
        type=positive,
        default=DEFAULT_JSON_DEPTH,
        help="deepest nesting of a host message and of tool call arguments (default: %(default)s)",
    )
    parser.add_argument(
        "--govern",
        action="append",
        default=[],
        metavar="annotations|none|NAME",
        help="upstream tools whose calls wait for an operator's approval: 'annotations' "
        "(each tool without readOnlyHint: true; trust the upstream's annotations), a tool "
        "NAME (repeatable, also with 'annotations'), or 'none' (default: none)",
    )
    parser.add_argument(
        "--console-url",
        default=None,
        metavar="URL",
        help="the operator console's address (where canon serve answers, e.g. "
        "http://127.0.0.1:8000): a governed call's pending result names its page there",
    )
    add_logging_args(parser)
    # A desktop host starts the proxy from anywhere: the data folder must not depend on it.
    parser.set_defaults(data_dir=user_data_dir() / "data")
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


def limits_of(args: argparse.Namespace) -> Limits:
    """The store's limits for MCP payloads (files, images): the flags' sizes."""
    return Limits(
        request_bytes=args.max_request_bytes,
        raw_bytes=args.max_raw_bytes,
        result_bytes=args.max_result_bytes,
        record_bytes=args.max_request_bytes + args.max_raw_bytes + args.max_result_bytes + 65536,
        json_depth=args.max_json_depth,
    )


def upstream_headers(args: argparse.Namespace) -> dict[str, str]:
    """The HTTP headers of ``--header`` and ``--bearer-token-env``, read from env or files.

    Raises:
        CommandError: a header is malformed or its source is missing (named, never its value).

    """
    headers: dict[str, str] = {}
    for item in args.header:
        name, sep, value = item.partition(":")
        name = name.strip()
        if not sep or not name or any(c.isspace() for c in name):
            raise CommandError("--header takes NAME:VALUE")
        value = value.strip()
        if value.startswith("env:"):
            variable = value[4:]
            if variable not in os.environ:
                raise CommandError(f"--header {name}: ${variable} is not set")
            value = os.environ[variable]
        elif value.startswith("file:"):
            try:
                value = pathlib.Path(value[5:]).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise CommandError(
                    f"--header {name}: cannot read the file ({exc.strerror})"
                ) from None
        headers[name] = value
    if args.bearer_token_env:
        token = os.environ.get(args.bearer_token_env)
        if not token:
            raise CommandError(f"--bearer-token-env: ${args.bearer_token_env} is not set")
        headers["Authorization"] = f"Bearer {token}"
    return headers


def governance_of(values: list[str]) -> Any:
    """The :class:`~canon.mcp_proxy.relay.Governance` of the ``--govern`` flags.

    Raises:
        CommandError: ``none`` with another value, or a value that is no tool name.

    """
    from canon.mcp_proxy.calls import Governance
    from machine.ids import is_tool_name

    if "none" in values:
        if any(value != "none" for value in values):
            raise CommandError("--govern none governs nothing: give it alone")
        return Governance()
    names = {value for value in values if value != "annotations"}
    for name in sorted(names):
        if not is_tool_name(name):
            raise CommandError(
                f"--govern {name[:140]!r}: not 'annotations', 'none' or a tool name "
                "(1-128 of A-Z a-z 0-9 _ - .)"
            )
    return Governance(annotations="annotations" in values, names=frozenset(names))


def _run_options(args: argparse.Namespace) -> Any:
    from canon.integrations.mcp import RunOptions

    # One retention (--ttl-s): a run takes calls for as long as its records are kept, and
    # its entry expires with its last record; the proxy's own run then rolls over.
    deadline = timedelta(seconds=args.deadline_s if args.deadline_s else args.ttl_s)
    return RunOptions(deadline=deadline, budget=args.budget)


def _tool_timeout(args: argparse.Namespace) -> float | None:
    return args.tool_timeout_s if args.tool_timeout_s and args.tool_timeout_s > 0 else None


def _line_bytes(args: argparse.Namespace) -> int:
    """The longest protocol line either side may send: the largest payload and its envelope."""
    return int(max(args.max_request_bytes, args.max_raw_bytes) + 65536)


def _upstream(args: argparse.Namespace) -> Any:
    from canon.mcp_proxy.upstream import ChildUpstream, HttpUpstream

    if args.upstream_url is not None:
        return HttpUpstream(args.upstream_url, headers=upstream_headers(args))
    spare = getattr(args, "spare_child", None)
    return ChildUpstream(_upstream_command(args), max_line_bytes=_line_bytes(args), spare=spare)


def _relay(args: argparse.Namespace, store: Store, send: Any) -> Any:
    from canon.mcp_proxy.answers import error_result, host_result, open_runs_with
    from canon.mcp_proxy.relay import Relay

    relay = Relay(
        store,
        _upstream(args),
        send,
        run_id=args.run_id,
        open_run=open_runs_with(store, _run_options(args)),
        on_duplicate=args.on_duplicate,
        timeout_s=_tool_timeout(args),
        start_timeout_s=args.start_timeout_s,
        forward_tool_errors=not args.hide_tool_errors,
        result_of=host_result,
        error_of=lambda reply: error_result(reply, limits=args.limits),
        version=_version(),
        govern=args.governance,
        console_url=args.console_url,
    )
    relay.calls.line_bytes = _line_bytes(args)
    return relay


async def _serve_stdio(args: argparse.Namespace) -> None:
    from canon.mcp_proxy.stdio import HostStdio
    from canon.mcp_proxy.upstream import UpstreamError

    # The protocol's stream first: from here on standard output belongs to MCP alone.
    async with (
        HostStdio(
            max_line_bytes=_line_bytes(args), max_depth=args.max_json_depth + _ENVELOPE_DEPTH
        ) as host,
        open_store(args, embedded=True) as store,
    ):
        relay = _relay(args, store, host.send)
        try:
            await relay.start()
        except UpstreamError as exc:
            raise CommandError(str(exc), RET_UPSTREAM) from None
        log.info("mcp_proxy_started", transport="stdio", upstream_pid=relay.upstream.pid)
        stopped = asyncio.Event()
        _stop_on_signals(stopped.set)
        reading = asyncio.create_task(host.serve(relay.from_host))
        waits = [
            reading,
            asyncio.create_task(stopped.wait()),
            asyncio.create_task(relay.fatal.wait()),
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()
            await relay.stop()
        if relay.fatal.is_set():
            raise CommandError(relay.failed or "the upstream failed", RET_UPSTREAM)
        log.info("mcp_proxy_stopped", reason="signal" if stopped.is_set() else "host closed")


async def _serve_http(args: argparse.Namespace) -> None:
    from canon.mcp_proxy.http import RelayHttpApp
    from projections.worker.supervisor import ReceiptServer

    async with open_store(args, embedded=True) as store:
        if args.upstream_url is None:
            from canon.mcp_proxy.upstream import SpareChild

            # A child per session: the next one is started ahead, so a session opens at once.
            args.spare_child = SpareChild(_upstream_command(args), max_line_bytes=_line_bytes(args))
        app = RelayHttpApp(
            lambda send: _relay(args, store, send),
            host=args.host,
            idle_timeout_s=args.idle_timeout_s,
            max_body_bytes=_line_bytes(args),
            max_depth=args.max_json_depth + _ENVELOPE_DEPTH,
        )
        http = ReceiptServer(app, host=args.host, port=args.port)
        _stop_on_signals(http.stop)
        try:
            async with app.run():
                serving = asyncio.create_task(http.serve())
                await _announce(http, serving)
                await serving
        finally:
            if getattr(args, "spare_child", None) is not None:
                await args.spare_child.close()
        log.info("server_stopped")


def _version() -> str:
    try:
        return version("canon")
    except PackageNotFoundError:
        return "0"


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
    if (args.header or args.bearer_token_env) and args.upstream_url is None:
        raise CommandError("--header and --bearer-token-env need --upstream-url")
    args.limits = limits_of(args)
    try:
        from canon.integrations.mcp import console_base
    except ImportError as error:
        raise CommandError(str(error)) from None
    args.governance = governance_of(args.govern)
    if args.console_url is not None:
        try:
            args.console_url = console_base(args.console_url)
        except InvalidArgument as error:
            raise CommandError(f"--console-url: {error}") from None
    await (_serve_http(args) if args.http else _serve_stdio(args))


def run(args: argparse.Namespace) -> int:
    """Proxy until the host disconnects (stdio) or SIGTERM/SIGINT (HTTP); exit 0."""
    return run_service(args, _serve)
