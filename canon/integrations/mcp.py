"""MCP: serve tools through the boundary, and name each call the way canon needs.

An MCP ``tools/call`` carries no tool call id, so canon defines one convention: the host
puts its own ids in the request's ``_meta`` under :data:`TOOL_CALL_ID_KEY`
(``io.canon/tool_call_id``) and :data:`RUN_ID_KEY` (``io.canon/run_id``); :func:`call_tool`
does that on a ``ClientSession``. A host that sends none gets a stable fallback that never
collides across connections: the run id ``mcp-<connection id>`` and the tool call id
``mcp-<connection id>-<JSON-RPC request id>`` (a string id with an ``s`` before it, so ``502``
and ``"502"`` stay two calls: :func:`fallback_call_id`), where the connection id is the HTTP
``Mcp-Session-Id`` or, on stdio and in-process transports, a random id drawn once per
connection (a stateless HTTP request is its own connection). Every result's ``_meta``
tells the host which ids the call was recorded under (and its ``io.canon/invocation_id``).

A governed tool (``ToolSpec(read_only=False, approval=...)``) answers at once, before it
runs: a result that is not an error, whose text says the call waits for an operator and
whose ``_meta`` holds :data:`APPROVAL_ID_KEY` (and, with a ``console_url``, the console
page where an operator decides it, :data:`CONSOLE_URL_KEY`: :func:`pending_meta`). The
host resumes the call by sending the same ``tools/call`` again with the same ids: it gets
the pending result again while the call waits, the tool's result once an operator
approved it (the tool runs once, whatever the number of retries), or an ``isError``
result with the safe error APPROVAL_DENIED (or APPROVAL_EXPIRED). Nothing the host sends
approves a call: not an argument, not a ``_meta`` key, not an elicitation's "accept".

:func:`build_server` gives an MCP server (the SDK's low-level ``Server``) whose tools are
``ToolSpec``s (or the listing of another MCP server: see ``canon mcp-proxy``), and
:func:`serve_tools` runs one on stdio. Errors are ``isError: true`` results whose text is
the safe error JSON, except the tool's own error text of a ``ToolSpec`` with an
``error_result`` (scrubbed and bounded by the boundary), which is the result's text as it
is, as MCP servers answer their tools' errors; a call without ``arguments`` is a call
with ``{}``.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import datetime, timedelta
from typing import Any, Final, cast

import msgspec

from canon.integrations._shared import ANY_OBJECT, reply_content, require, tool_schema
from eventstore.boundary.contracts import (
    AgentReply,
    ApprovalPending,
    RunContext,
    ToolEnvelope,
    ToolError,
    ToolResult,
    ToolSpec,
)
from eventstore.boundary.tool_boundary import ToolBoundary
from eventstore.errors import CanonError, InvalidArgument, RunExists
from eventstore.runs import deadline_ms
from eventstore.store import Store
from machine.codes import ErrorCode, Stage

require("mcp", "mcp")

import mcp_types as types  # noqa: E402  (after the extra's check, on purpose)
from mcp.client.session import ClientSession  # noqa: E402
from mcp.server.context import ServerRequestContext  # noqa: E402
from mcp.server.lowlevel import Server  # noqa: E402
from mcp.server.stdio import stdio_server  # noqa: E402

#: ``_meta`` key of the host's own tool call id (any id canon accepts, used exactly).
TOOL_CALL_ID_KEY: Final = "io.canon/tool_call_id"
#: ``_meta`` key of the run the call belongs to.
RUN_ID_KEY: Final = "io.canon/run_id"
#: ``_meta`` key, on results, of the canonical record's public id.
INVOCATION_ID_KEY: Final = "io.canon/invocation_id"

#: ``_meta`` key, on the result of a governed call waiting for an operator, of its approval.
APPROVAL_ID_KEY: Final = "io.canon/approval_id"
#: ``_meta`` key, on the result of a governed call waiting for an operator, of the console
#: page where an operator decides it (only when a console URL is configured).
CONSOLE_URL_KEY: Final = "io.canon/console_url"

#: Prefix of the fallback run and tool call ids of hosts that send no ids.
FALLBACK_PREFIX: Final = "mcp"
__all__ = [
    "ANY_OBJECT",
    "APPROVAL_ID_KEY",
    "CONSOLE_URL_KEY",
    "FALLBACK_PREFIX",
    "INVOCATION_ID_KEY",
    "PAUSE_CODES",
    "RUN_ID_KEY",
    "TOOL_CALL_ID_KEY",
    "HeldByPause",
    "ResultOf",
    "RunOptions",
    "build_server",
    "call_ids",
    "call_meta",
    "call_tool",
    "console_base",
    "console_call_url",
    "fallback_call_id",
    "held_by_pause",
    "ids_of_call",
    "json_result",
    "pending_meta",
    "serve_tools",
    "tool_definitions",
]

# A session id the fallback run id may embed as it is (run ids are key-safe).
_SAFE_SESSION_ID = re.compile(r"[A-Za-z0-9_\-]{1,64}")
_SESSION_HEADER = "mcp-session-id"
# A string JSON-RPC id a fallback tool call id may embed as it is.
_SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9_.\-]{1,64}")

ResultOf = Callable[[ToolResult], types.CallToolResult]


class RunOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How a server opens the runs it sees, when it is the one that opens them.

    Attributes:
        deadline: how long each run accepts calls, from its first call: a ``timedelta``
            or a number of seconds.
        budget: most invocations per run (None: no run budget).

    Raises:
        InvalidArgument: ``deadline`` is neither (a ``datetime`` is a moment, not a span).

    """

    deadline: timedelta | float = timedelta(hours=1)
    budget: int | None = None

    def __post_init__(self) -> None:
        """Check the deadline now, not at a run's first call."""
        if isinstance(self.deadline, datetime):
            raise InvalidArgument("RunOptions.deadline is a span: a timedelta or seconds")
        deadline_ms(self.deadline, 0)


def call_meta(*, tool_call_id: str | None = None, run_id: str | None = None) -> dict[str, Any]:
    """The ``_meta`` entries that name a call's ids under canon's convention."""
    meta: dict[str, Any] = {}
    if tool_call_id is not None:
        meta[TOOL_CALL_ID_KEY] = tool_call_id
    if run_id is not None:
        meta[RUN_ID_KEY] = run_id
    return meta


async def call_tool(
    session: ClientSession,
    name: str,
    arguments: Mapping[str, Any] | None = None,
    *,
    tool_call_id: str | None = None,
    run_id: str | None = None,
    read_timeout_seconds: float | None = None,
) -> types.CallToolResult:
    """``session.call_tool`` with the host's tool call id and run id in ``_meta``."""
    meta = call_meta(tool_call_id=tool_call_id, run_id=run_id)
    return await session.call_tool(
        name,
        dict(arguments) if arguments is not None else None,
        read_timeout_seconds,
        meta=cast(types.RequestParamsMeta, meta) if meta else None,
    )


def tool_definitions(specs: Mapping[str, ToolSpec]) -> list[types.Tool]:
    """The MCP tool listing of ``specs``: names, descriptions and input schemas.

    The same description and schema every adapter derives from a ToolSpec (any JSON
    object, :data:`ANY_OBJECT`, for a spec that declares no schema).
    """
    listed = []
    for name, spec in specs.items():
        schema = tool_schema(spec)
        listed.append(
            types.Tool(
                name=name,
                description=schema["description"] or None,
                input_schema=schema["parameters"],
            )
        )
    return listed


def json_result(reply: ToolResult) -> types.CallToolResult:
    """The result a host sees for a ToolSpec's reply: the bounded result as JSON text."""
    return types.CallToolResult(content=[types.TextContent(type="text", text=reply_content(reply))])


def console_base(url: str) -> str:
    """The operator console's root URL, checked, for :func:`console_call_url`.

    ``url`` is where ``canon serve`` answers (``http://127.0.0.1:8000``) or its console
    (``http://127.0.0.1:8000/console/``), as an operator's browser reaches it.

    Raises:
        InvalidArgument: ``url`` is not an http or https URL with a host, or has a query
            or a fragment.

    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise InvalidArgument("the console URL must be an http(s) URL such as http://host:8000")
    path = parts.path.rstrip("/")
    path = path.removesuffix("/console")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def console_call_url(console_url: str, run_id: str, invocation_id: str) -> str:
    """The console's page of one call: ``<console>/console/runs/<run>/invocations/<id>``.

    Args:
        console_url: the console's address (see :func:`console_base`).
        run_id: the call's run.
        invocation_id: the call's public id (64 hex).

    Raises:
        InvalidArgument: ``console_url`` is not a console address.

    """
    run = urllib.parse.quote(run_id, safe="")
    return f"{console_base(console_url)}/console/runs/{run}/invocations/{invocation_id}"


def pending_meta(reply: ApprovalPending, run_id: str, console_url: str | None) -> dict[str, Any]:
    """The ``_meta`` of a governed call's pending result: its approval, and its console page.

    Args:
        reply: the boundary's answer for the waiting call.
        run_id: the run it was recorded under.
        console_url: the operator console's address, or None (then no page is named).

    """
    meta: dict[str, Any] = {APPROVAL_ID_KEY: reply.approval_id}
    if console_url is not None:
        meta[CONSOLE_URL_KEY] = console_call_url(console_url, run_id, reply.invocation_id)
    return meta


def build_server(
    boundary: ToolBoundary,
    tools: Mapping[str, ToolSpec] | Sequence[types.Tool],
    *,
    name: str = "canon",
    run_id: str | None = None,
    open_runs: tuple[Store, RunOptions] | None = None,
    result_of: ResultOf = json_result,
    console_url: str | None = None,
) -> Server[dict[str, Any]]:
    """Build an MCP server that lists ``tools`` and runs every call through ``boundary``.

    Args:
        boundary: runs the calls; it must know every listed tool.
        tools: the ToolSpecs to list (their descriptions and input schemas), or MCP tool
            definitions listed exactly as given (a proxy lists its upstream's).
        name: the server's name in the MCP handshake.
        run_id: the run of calls whose ``_meta`` names none (default: one run per
            connection, ``mcp-<connection id>``).
        open_runs: a store and options: open each run the server sees on its first call
            (a run opened beforehand is used as it is). Without it, the harness opens
            the runs.
        result_of: turns a successful reply into the host's result.
        console_url: the operator console's address (see :func:`console_base`): the
            pending result of a governed call names its page there. None: no page.

    Raises:
        InvalidArgument: ``console_url`` is not a console address.

    """
    if console_url is not None:
        console_url = console_base(console_url)
    listing = tool_definitions(tools) if isinstance(tools, Mapping) else list(tools)
    opener = _RunOpener(*open_runs) if open_runs is not None else None

    @asynccontextmanager
    async def connection(_: Server[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        # Entered once per served connection (stdio, in-process); HTTP enters it once
        # per session manager, so there the Mcp-Session-Id names the connection.
        yield {"connection_id": secrets.token_hex(8)}

    async def list_tools(
        ctx: ServerRequestContext[dict[str, Any]], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listing)

    async def call(
        ctx: ServerRequestContext[dict[str, Any]], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        call_run_id, tool_call_id = call_ids(ctx, params.meta, default_run_id=run_id)
        if opener is not None:
            await opener.ensure(call_run_id)
        envelope = ToolEnvelope(
            run_id=call_run_id,
            tool_call_id=tool_call_id,
            tool=params.name,
            arguments=params.arguments if params.arguments is not None else {},
        )
        reply = await boundary.invoke(RunContext(call_run_id), envelope)
        reply = await held_by_pause(boundary.store, call_run_id, reply)
        return _answer(reply, call_run_id, result_of, console_url)

    return Server(name, lifespan=connection, on_list_tools=list_tools, on_call_tool=call)


async def serve_tools(
    boundary: ToolBoundary,
    specs: Mapping[str, ToolSpec],
    *,
    run_id: str | None = None,
    name: str = "canon",
    open_runs: tuple[Store, RunOptions] | None = None,
    streams: tuple[Any, Any] | None = None,
    console_url: str | None = None,
) -> None:
    """Serve ``specs`` over MCP until the client goes away (options: :func:`build_server`).

    By default on this process's stdin and stdout (while it serves, the SDK points file
    descriptor 1 at stderr, so nothing but the protocol reaches stdout); ``streams`` serve
    one connection over any other transport's (read, write) pair instead.
    """
    server = build_server(
        boundary, specs, name=name, run_id=run_id, open_runs=open_runs, console_url=console_url
    )
    async with AsyncExitStack() as stack:
        read_stream, write_stream = (
            streams if streams is not None else await stack.enter_async_context(stdio_server())
        )
        await server.run(read_stream, write_stream, server.create_initialization_options())


def call_ids(
    ctx: ServerRequestContext[dict[str, Any]],
    meta: Mapping[str, Any] | None,
    *,
    default_run_id: str | None = None,
) -> tuple[str, str]:
    """The (run id, tool call id) of one call: the host's from ``_meta``, else the fallback.

    The rule is :func:`ids_of_call`'s, shared with ``canon mcp-proxy``.
    """
    return ids_of_call(
        meta,
        connection_id=_connection_id(ctx),
        request_id=ctx.request_id,
        default_run_id=default_run_id,
    )


def ids_of_call(
    meta: Mapping[str, Any] | None,
    *,
    connection_id: str,
    request_id: Any,
    default_run_id: str | None = None,
) -> tuple[str, str]:
    """The one call-id rule of canon's MCP side: (run id, tool call id) of a ``tools/call``.

    The host's ids from ``_meta`` (:data:`RUN_ID_KEY`, :data:`TOOL_CALL_ID_KEY`) are used
    exactly; without them, ``default_run_id`` (else ``mcp-<connection id>``) and
    :func:`fallback_call_id`. A ``_meta`` id that is not a string becomes ``""``, which
    the boundary refuses (INVALID_TOOL_CALL_ID or RUN_MISMATCH): an id is never replaced.
    Only the host's own tool call id makes a re-issued request the same call.
    """
    meta = meta or {}
    if RUN_ID_KEY in meta:
        run_id = _text(meta[RUN_ID_KEY])
    else:
        run_id = default_run_id or f"{FALLBACK_PREFIX}-{connection_id}"
    if TOOL_CALL_ID_KEY in meta:
        tool_call_id = _text(meta[TOOL_CALL_ID_KEY])
    else:
        request = request_id if is_request_id_value(request_id) else None
        tool_call_id = fallback_call_id(connection_id, request)
    return run_id, tool_call_id


def is_request_id_value(value: Any) -> bool:
    """Whether ``value`` is a JSON-RPC id MCP accepts: a string or an integer (not a bool)."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


#: The codes of a pause: a governed call refused one of them while it waits is held.
PAUSE_CODES: Final = frozenset({ErrorCode.RUN_PAUSED, ErrorCode.EXECUTION_PAUSED})


class HeldByPause(ApprovalPending, frozen=True, kw_only=True, tag="AWAITING_APPROVAL"):
    """A governed call that waits (for its decision, or approved) while execution is paused.

    A pause holds a call, never ends it: the host gets the same "still waiting" result as
    for a call awaiting approval, and sends the same call again once execution resumes.
    """

    @property
    def message(self) -> str:
        """The fixed text a model reads: held by a pause, not run, to be sent again later."""
        return (
            f"The tool call (approval {self.approval_id}) is held while tool execution is "
            "paused and has not run. Do not retry it now: it runs once execution resumes."
        )


async def held_by_pause(store: Store, run_id: str, reply: AgentReply) -> AgentReply:
    """``reply``, or the "still waiting" answer when a pause refused a governed call's resume.

    A call refused RUN_PAUSED or EXECUTION_PAUSED whose record waits undispatched (for
    its decision, or approved) is held, not failed: :class:`HeldByPause`. A new call
    refused by a pause (no record) keeps its error; so does anything else. Only a pause
    reply costs a read.
    """
    if not (
        isinstance(reply, ToolError)
        and reply.error_code in PAUSE_CODES
        and reply.tool_call_id is not None
    ):
        return reply
    try:
        record = await store.get(run_id, reply.tool_call_id)
    except CanonError:
        return reply
    approval_id = record.state.approval_id if record is not None else None
    if record is None or approval_id is None:
        return reply
    state = record.state
    if state.stage not in (Stage.AWAITING_APPROVAL, Stage.APPROVED):
        return reply
    return HeldByPause(
        tool_call_id=reply.tool_call_id,
        invocation_id=record.invocation_id,
        approval_id=approval_id,
    )


def fallback_call_id(connection_id: str, request_id: str | int | None) -> str:
    """The tool call id of a call whose ``_meta`` names none, unique per JSON-RPC id.

    An integer id is used as it is, a string one with an ``s`` before it (a hash when it
    is not a short safe token), so ``502`` and ``"502"`` are two calls.
    """
    if request_id is None or isinstance(request_id, int):
        return f"{FALLBACK_PREFIX}-{connection_id}-{request_id}"
    if _SAFE_REQUEST_ID.fullmatch(request_id):
        return f"{FALLBACK_PREFIX}-{connection_id}-s{request_id}"
    digest = hashlib.sha256(request_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{FALLBACK_PREFIX}-{connection_id}-x{digest}"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _connection_id(ctx: ServerRequestContext[dict[str, Any]]) -> str:
    """Name the connection a request came on, unique across connections and processes."""
    headers = getattr(ctx.request, "headers", None)
    if headers is None:
        return str(ctx.lifespan_context["connection_id"])
    session_id = headers.get(_SESSION_HEADER)
    if isinstance(session_id, str) and _SAFE_SESSION_ID.fullmatch(session_id):
        return session_id
    # Stateless HTTP: no session ties two requests together, so each is its own.
    return secrets.token_hex(8)


def _answer(
    reply: AgentReply, run_id: str, result_of: ResultOf, console_url: str | None
) -> types.CallToolResult:
    meta: dict[str, Any] = {RUN_ID_KEY: run_id}
    if reply.tool_call_id is not None:
        meta[TOOL_CALL_ID_KEY] = reply.tool_call_id
    if reply.invocation_id is not None:
        meta[INVOCATION_ID_KEY] = reply.invocation_id
    if isinstance(reply, ToolError):
        # The tool's own text as it is (what the model can correct); canon's safe JSON else.
        text = reply.message if reply.from_tool else reply_content(reply)
        result = types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], is_error=True
        )
    elif isinstance(reply, ApprovalPending):
        # Not an error: the call is recorded and waits; a retry with the same call id gets
        # this again, the recorded outcome or the denial.
        result = types.CallToolResult(
            content=[types.TextContent(type="text", text=reply.message)],
            is_error=False,
        ).model_copy(update={"meta": pending_meta(reply, run_id, console_url)})
    else:
        result = result_of(reply)
    return result.model_copy(update={"meta": {**(result.meta or {}), **meta}})


class _RunOpener:
    """Opens each run id once per server; a run registered elsewhere is used as it is."""

    #: Run ids remembered; past it the set starts over (a reopen is one RunExists).
    _REMEMBERED = 10_000

    def __init__(self, store: Store, options: RunOptions) -> None:
        self._store = store
        self._options = options
        self._opened: set[str] = set()

    async def ensure(self, run_id: str) -> None:
        if run_id in self._opened:
            return
        try:
            await self._store.open_run(
                run_id, deadline=self._options.deadline, budget=self._options.budget
            )
        except RunExists:
            pass
        except CanonError:
            # An unsafe id or Redis away: the boundary answers the call with the matching
            # safe error, so nothing is decided here.
            return
        if len(self._opened) >= self._REMEMBERED:
            self._opened.clear()
        self._opened.add(run_id)
