"""The transparent MCP relay behind ``canon mcp-proxy``: only ``tools/call`` is recorded.

:class:`Relay` sits between a host and an upstream MCP server and passes every JSON-RPC
message through unchanged, both ways: prompts, resources (and their subscriptions and
templates), completion, logging, progress, cancellation, list_changed notifications,
``instructions``, and the upstream's own requests to the host (sampling, elicitation,
roots). The host's ``initialize`` reaches the upstream as the host sent it, so the
upstream sees the host's real capabilities; the upstream's answer reaches the host with
its own ``serverInfo``, the proxy naming itself in ``_meta`` under :data:`PROXY_KEY`.

Each ``tools/call`` goes through the :class:`~eventstore.boundary.tool_boundary.ToolBoundary`
instead: one canonical record per call, the upstream's result as its raw response, and the
host sees the recorded result (see :mod:`canon.integrations.mcp_proxy` for its shape). An
upstream ``isError: true`` result fails the call (:class:`UpstreamToolError`); with
``forward_tool_errors`` each tool's ``ToolSpec`` has :func:`upstream_error_text` as its
``error_result``, so the upstream's own text is recorded and shown to the host.

Governed tools: :class:`Governance` says which upstream tools wait for an operator's
approval (by their annotations, by name, or none: the default). A governed tool's call is
recorded with its request frozen and answered at once with a pending result, never sent
upstream (its listing shows the host no ``outputSchema``, which the pending result could
not match); the host's retry of the same ``tools/call`` with the same ids gets the pending
result again, the upstream's answer once an operator approved it (the upstream's
``tools/call`` is the executor, so it is sent once, whatever the number of retries), or
the denial. Nothing the host sends approves a call: an elicitation's "accept" is passed
to the upstream as its answer and means nothing to the proxy.

Ids: the relay never forwards a peer's JSON-RPC id; it sends its own and maps the answer
back to the exact id (value and type) the peer used, so ``502`` and ``"502"`` stay two
requests. Messages that are not JSON-RPC 2.0 get the standard errors: -32700 (not JSON),
-32600 (not a request), -32602 (bad ``initialize`` or ``tools/call`` params); unknown
methods reach the upstream, which answers -32601 itself.

Upstream life: a bad upstream line is logged once (later ones are counted), and the
request it answered, when its id can be read, gets a JSON-RPC error. When the upstream
exits, every request waiting on it gets an error, the in-flight calls' records are closed
Failed, and the upstream is restarted with backoff (and re-initialized with the host's
own ``initialize``); calls made meanwhile get a JSON-RPC error saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import msgspec
import structlog

from canon.integrations.mcp import (
    FALLBACK_PREFIX,
    INVOCATION_ID_KEY,
    RUN_ID_KEY,
    TOOL_CALL_ID_KEY,
    console_base,
    fallback_call_id,
    pending_meta,
)
from canon.integrations.mcp_upstream import Message, Upstream, UpstreamError, UpstreamGone
from eventstore.boundary.contracts import (
    AgentReply,
    ApprovalPending,
    Projection,
    RunContext,
    ToolCall,
    ToolEnvelope,
    ToolResult,
    ToolSpec,
)
from eventstore.boundary.tool_boundary import OnDuplicate, ToolBoundary
from eventstore.errors import CanonError
from eventstore.store import Store
from machine.ids import is_tool_name

log = structlog.get_logger("canon.mcp_proxy")

#: ``_meta`` key, on the ``initialize`` result, naming the proxy (name and version).
PROXY_KEY: Final = "io.canon/proxy"
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
#: The upstream is not running (it exited, or is being restarted).
UPSTREAM_UNAVAILABLE: Final = -32001
#: A message over one of the proxy's size limits.
TOO_LARGE: Final = -32002
#: Longest wait between two restarts of a dead upstream, in seconds.
MAX_BACKOFF_S: Final = 30.0
#: Most pages of ``tools/list`` the relay reads when it looks a tool up itself.
MAX_LIST_PAGES: Final = 100
# Most characters of an upstream error's text kept as (harness-only) failure detail.
_DETAIL_CHARS = 2000
# Most tool names the relay keeps specs for (a hostile host cannot grow it forever).
_MAX_TOOLS = 10_000

#: Writes one message to the host; the second argument is the host request it belongs
#: to (its JSON-RPC id), or None.
Send = Callable[[Message, Any], Awaitable[None]]


class UpstreamCallError(CanonError):
    """Raised when the upstream answers a ``tools/call`` with an error or not at all."""


class UpstreamToolError(UpstreamCallError):
    """Raised when the upstream answers a ``tools/call`` with an ``isError: true`` result.

    Attributes:
        text: the result's ``text`` blocks, one per line, whole (the message keeps at most
            2,000 characters of it, for the harness-only failure detail).

    """

    def __init__(self, text: str) -> None:
        """Keep the whole ``text``; the message is its start."""
        super().__init__(text[:_DETAIL_CHARS])
        self.text = text


def upstream_error_text(error: Exception) -> str:
    """The agent-facing text of an upstream's ``isError`` result (a ``ToolSpec.error_result``).

    Only the upstream's own tool errors are forwarded: any other failure of the call (the
    connection, a JSON-RPC error, a result that is not an object) gives ``""``, which leaves
    the host the safe error (or the JSON-RPC error).
    """
    return error.text if isinstance(error, UpstreamToolError) else ""


class UpstreamFault(UpstreamCallError):
    """Raised when a ``tools/call`` gets a JSON-RPC error (the upstream's, or the relay's).

    The host gets this JSON-RPC error as it is, not a tool result: the call failed at the
    protocol's level (a bad upstream message, a dead upstream, an error response).
    """

    def __init__(self, error: Mapping[str, Any]) -> None:
        """Keep the JSON-RPC ``error`` object for the host."""
        super().__init__(f"JSON-RPC error {error.get('code')}")
        self.error = dict(error)


class Governance(msgspec.Struct, frozen=True, kw_only=True):
    """Which upstream tools are governed: their calls wait for an operator's approval.

    A governed tool is registered as ``ToolSpec(read_only=False, approval=True)``: each
    call is recorded with its request frozen and runs upstream only once an operator
    approved it. Other tools are recorded and run at once. The default governs nothing.

    Attributes:
        annotations: govern every tool whose ``annotations`` lack ``readOnlyHint: true``
            (as MCP reads a tool without annotations: it may change things). Only for an
            upstream whose annotations you trust: the upstream decides what is governed.
        names: govern these tools, whatever their annotations; a call of one is governed
            even when the upstream does not list it.

    """

    annotations: bool = False
    names: frozenset[str] = frozenset()

    def governs(self, tool: Mapping[str, Any]) -> bool:
        """Whether the listed ``tool`` (an MCP tool definition) is governed."""
        if tool.get("name") in self.names:
            return True
        if not self.annotations:
            return False
        hints = tool.get("annotations")
        return not (isinstance(hints, dict) and hints.get("readOnlyHint") is True)


def is_request_id(value: Any) -> bool:
    """Whether ``value`` is a JSON-RPC id MCP accepts: a string or an integer (not a bool)."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def error_response(request_id: Any, code: int, message: str) -> Message:
    """A JSON-RPC error response."""
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


class Relay:
    """One host connection relayed to one upstream, every ``tools/call`` recorded.

    Args:
        store: where calls are recorded.
        upstream: the upstream connection (not started yet).
        send_to_host: writes one message to the host.
        run_id: the run of calls whose ``_meta`` names none (default: one run for this
            relay, ``mcp-<connection id>``).
        open_run: opens a run on its first call (a run opened beforehand is used as it
            is); None leaves the runs to the harness.
        on_duplicate: ``"replay"`` answers a re-sent tool call id with the recorded result.
        timeout_s: most seconds one upstream ``tools/call`` may take (None: no bound).
        forward_tool_errors: an upstream ``isError`` result's text becomes the failed
            call's agent result (scrubbed, bounded, recorded), which ``error_of`` may show
            the host; False keeps it harness-only failure detail.
        start_timeout_s: most seconds the upstream may take to answer ``initialize``.
        result_of: turns a recorded reply into the host's ``tools/call`` result.
        error_of: turns a refused or failed call's reply into the host's result.
        version: the proxy's version, named in the ``initialize`` result's ``_meta``.
        govern: which upstream tools wait for an operator's approval (default: none).
        console_url: the operator console's address: a governed call's pending result
            names its page there (see :func:`~canon.integrations.mcp.console_base`).

    Raises:
        InvalidArgument: ``console_url`` is not a console address.

    """

    def __init__(
        self,
        store: Store,
        upstream: Upstream,
        send_to_host: Send,
        *,
        run_id: str | None = None,
        open_run: Callable[[str], Awaitable[None]] | None = None,
        on_duplicate: OnDuplicate = "replay",
        timeout_s: float | None = None,
        forward_tool_errors: bool = False,
        start_timeout_s: float = 30.0,
        result_of: Callable[[ToolResult], Message],
        error_of: Callable[[AgentReply], Message],
        version: str = "",
        govern: Governance = Governance(),  # noqa: B008  (frozen, so shared safely)
        console_url: str | None = None,
    ) -> None:
        self.store = store
        self.upstream = upstream
        self._send_host = send_to_host
        self.connection_id = secrets.token_hex(8)
        self.run_id = run_id or f"{FALLBACK_PREFIX}-{self.connection_id}"
        self._own_run = run_id is None and open_run is not None
        self._open_run = open_run
        self._opened: set[str] = set()
        self._on_duplicate: OnDuplicate = on_duplicate
        self._timeout_s = timeout_s
        self._forward_tool_errors = forward_tool_errors
        self.start_timeout_s = start_timeout_s
        self._result_of = result_of
        self._error_of = error_of
        self._version = version
        self._ids = itertools.count(1)
        # upstream-facing id -> (host's id exactly, method) for forwarded host requests.
        self._forwarded: dict[int, tuple[Any, str]] = {}
        # upstream-facing id -> future, for the relay's own requests (tools/call, initialize).
        self._own: dict[int, asyncio.Future[Message]] = {}
        # host-facing id -> upstream's id exactly, for the upstream's requests to the host.
        self._reverse: dict[int, Any] = {}
        # host's request id (type, value) -> running tools/call task and its upstream ids.
        self._calls: dict[tuple[type, Any], tuple[asyncio.Task[None], list[int]]] = {}
        self._govern = govern
        self._console_url = console_base(console_url) if console_url is not None else None
        # Tools named governed are known from the start: a call of one never bypasses
        # the approval, listed or not.
        self._specs: dict[str, ToolSpec] = {name: self._spec(True) for name in govern.names}
        # tool call id -> (the host's params, upstream ids): what the executor forwards.
        self._pending_params: dict[str, tuple[dict[str, Any], list[int]]] = {}
        # tool call id -> the JSON-RPC error its upstream call got.
        self._faults: dict[str, dict[str, Any]] = {}
        self._boundary: ToolBoundary | None = None
        self._skipped: set[str] = set()
        # The host's requests still unanswered: key -> (its id, its progress token).
        self._inflight: dict[tuple[type, Any], tuple[Any, Any]] = {}
        self._overdue: asyncio.Task[None] | None = None
        # What the host set on the upstream, set again on a restarted one.
        self._log_level: dict[str, Any] | None = None
        self._subscriptions: set[str] = set()
        self._initialize: Message | None = None
        self._initialized_sent = False
        #: Why the upstream could not serve this host at all (then :attr:`fatal` is set).
        self.failed: str | None = None
        self._stopping = False
        self._restarting: asyncio.Task[None] | None = None
        self._bad_lines = 0
        self._backoff_s = 0.5
        #: Set once the upstream answered the host's ``initialize``.
        self.initialized = asyncio.Event()
        #: Set when the upstream failed before it ever served (see :attr:`failed`).
        self.fatal = asyncio.Event()

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Start the upstream.

        Raises:
            UpstreamError: it cannot be started.

        """
        await self.upstream.start(self._from_upstream, self._bad_line, self._ended)

    async def stop(self) -> None:
        """Close every in-flight call's record (Failed) and stop the upstream."""
        self._stopping = True
        if self._restarting is not None:
            self._restarting.cancel()
        calls = [task for task, _ in self._calls.values()]
        for task in calls:
            task.cancel()
        if calls:
            await asyncio.gather(*calls, return_exceptions=True)
        await self.upstream.stop()
        if self._boundary is not None:
            self._boundary.close()
        # The proxy's own run (no --run-id) ends with it; a named run may be resumed.
        if self._own_run and self.run_id in self._opened:
            with contextlib.suppress(CanonError):
                await self.store.close_run(self.run_id)

    # -- from the host -----------------------------------------------------------------

    async def from_host(self, message: Any) -> None:
        """Handle one decoded message from the host (any JSON value)."""
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            request_id = message.get("id") if isinstance(message, dict) else None
            await self._to_host(
                error_response(
                    request_id if is_request_id(request_id) else None,
                    INVALID_REQUEST,
                    "Invalid Request: not a JSON-RPC 2.0 message",
                )
            )
            return
        method = message.get("method")
        has_id = "id" in message
        request_id = message.get("id")
        if method is None and has_id and ("result" in message or "error" in message):
            await self._answer_upstream(message)
            return
        if not isinstance(method, str) or (has_id and not is_request_id(request_id)):
            await self._to_host(
                error_response(
                    request_id if is_request_id(request_id) else None,
                    INVALID_REQUEST,
                    "Invalid Request",
                )
            )
            return
        params = message.get("params")
        if params is not None and not isinstance(params, dict):
            if has_id:
                await self._to_host(
                    error_response(request_id, INVALID_PARAMS, "Invalid params: not an object")
                )
            return
        if has_id:
            # What the upstream sends while this request runs belongs to it (progress with
            # its token; logs, sampling, elicitation), so HTTP routes it to its stream.
            token = _progress_token(params)
            self._inflight[(type(request_id), request_id)] = (request_id, token)
        if not has_id:
            await self._notification_from_host(method, message)
        elif method == "tools/call":
            await self._start_call(request_id, params)
        else:
            if method == "initialize":
                if params is None or not isinstance(params.get("protocolVersion"), str):
                    await self._to_host(
                        error_response(request_id, INVALID_PARAMS, "Invalid params: initialize")
                    )
                    return
                self._initialize = message
            self._remember_session_state(method, params or {})
            await self._forward(request_id, method, message)

    async def _forward(self, request_id: Any, method: str, message: Message) -> None:
        upstream_id = next(self._ids)
        self._forwarded[upstream_id] = (request_id, method)
        try:
            await self.upstream.send({**message, "id": upstream_id})
        except UpstreamGone:
            self._forwarded.pop(upstream_id, None)
            await self._to_host(self._unavailable(request_id))
            return
        if method == "initialize":
            asyncio.get_running_loop().call_later(
                self.start_timeout_s, self._initialize_overdue, upstream_id
            )

    def _initialize_overdue(self, upstream_id: int) -> None:
        if upstream_id in self._forwarded and not self.initialized.is_set():
            self.failed = (
                f"the upstream did not answer initialize within {self.start_timeout_s:g} s"
            )
            host_id, _ = self._forwarded.pop(upstream_id)
            overdue = error_response(host_id, UPSTREAM_UNAVAILABLE, self.failed)
            self._overdue = asyncio.create_task(self._to_host(overdue))
            self.fatal.set()

    async def _notification_from_host(self, method: str, message: Message) -> None:
        if method == "notifications/cancelled":
            params = message.get("params") or {}
            cancelled = params.get("requestId")
            if is_request_id(cancelled):
                call = self._calls.get((type(cancelled), cancelled))
                if call is not None:
                    task, upstream_ids = call
                    for upstream_id in upstream_ids:
                        await self._send_upstream_quietly(_cancelled(upstream_id, params))
                    task.cancel()
                    # A cancelled request is never answered: it runs no longer.
                    self._inflight.pop((type(cancelled), cancelled), None)
                    return
                for upstream_id, (host_id, _) in list(self._forwarded.items()):
                    if type(host_id) is type(cancelled) and host_id == cancelled:
                        await self._send_upstream_quietly(_cancelled(upstream_id, params))
                        return
            return
        if method == "notifications/initialized":
            self._initialized_sent = True
        await self._send_upstream_quietly(message)

    async def _answer_upstream(self, message: Message) -> None:
        """The host's answer to a request the upstream made (sampling, roots, ...)."""
        host_facing = message.get("id")
        if not isinstance(host_facing, int) or host_facing not in self._reverse:
            return
        upstream_id = self._reverse.pop(host_facing)
        await self._send_upstream_quietly({**message, "id": upstream_id})

    # -- tools/call through the boundary -------------------------------------------------

    async def _start_call(self, request_id: Any, params: Mapping[str, Any] | None) -> None:
        if (
            params is None
            or not isinstance(params.get("name"), str)
            or not isinstance(params.get("arguments", {}), dict)
        ):
            await self._to_host(error_response(request_id, INVALID_PARAMS, "Invalid params"))
            return
        if not self.upstream.running:
            await self._to_host(self._unavailable(request_id))
            return
        key = (type(request_id), request_id)
        upstream_ids: list[int] = []
        task = asyncio.create_task(self._call(request_id, dict(params), upstream_ids))
        self._calls[key] = (task, upstream_ids)
        task.add_done_callback(lambda _: self._calls.pop(key, None))

    async def _call(self, request_id: Any, params: dict[str, Any], upstream_ids: list[int]) -> None:
        given = params.get("_meta")
        meta: dict[str, Any] = given if isinstance(given, dict) else {}
        run_id, tool_call_id = self._call_ids(request_id, meta)
        name = params["name"]
        boundary = await self._boundary_for(name)
        if name not in self._specs:
            # A tool the upstream does not list: it answers as it would without the proxy
            # (an unknown tool's error); nothing ran, so there is nothing to record.
            request = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
            await self._forward(request_id, "tools/call", request)
            return
        if self._open_run is not None and run_id not in self._opened:
            await self._open_run(run_id)
            if len(self._opened) < _MAX_TOOLS:
                self._opened.add(run_id)
        envelope = ToolEnvelope(
            run_id=run_id,
            tool_call_id=tool_call_id,
            tool=name,
            arguments=params.get("arguments") or {},
        )
        self._pending_params[tool_call_id] = (params, upstream_ids)
        try:
            reply = await boundary.invoke(RunContext(run_id), envelope)
        finally:
            self._pending_params.pop(tool_call_id, None)
            fault = self._faults.pop(tool_call_id, None)
        if fault is not None and not isinstance(reply, ToolResult):
            # Recorded as Failed; the host gets the JSON-RPC error it would get directly.
            await self._to_host({"jsonrpc": "2.0", "id": request_id, "error": fault})
            return
        if isinstance(reply, ApprovalPending):
            # Recorded and waiting for an operator: not an error, and never sent upstream.
            result: Message = {
                "content": [{"type": "text", "text": reply.message}],
                "isError": False,
                "_meta": pending_meta(reply, run_id, self._console_url),
            }
        elif isinstance(reply, ToolResult):
            result = self._result_of(reply)
        else:
            result = self._error_of(reply)
        ids: dict[str, Any] = {RUN_ID_KEY: run_id}
        if reply.tool_call_id is not None:
            ids[TOOL_CALL_ID_KEY] = reply.tool_call_id
        if reply.invocation_id is not None:
            ids[INVOCATION_ID_KEY] = reply.invocation_id
        result["_meta"] = {**(result.get("_meta") or {}), **ids}
        await self._to_host({"jsonrpc": "2.0", "id": request_id, "result": result})

    def _call_ids(self, request_id: Any, meta: Mapping[str, Any]) -> tuple[str, str]:
        run_id = meta.get(RUN_ID_KEY, self.run_id)
        tool_call_id = (
            meta[TOOL_CALL_ID_KEY]
            if TOOL_CALL_ID_KEY in meta
            else fallback_call_id(self.connection_id, request_id)
        )
        # A _meta id that is not a string is refused by the boundary, never replaced.
        return (
            run_id if isinstance(run_id, str) else "",
            tool_call_id if isinstance(tool_call_id, str) else "",
        )

    async def _boundary_for(self, name: str) -> ToolBoundary:
        if name not in self._specs and is_tool_name(name):
            # Not listed yet (or listed since): ask the upstream once, as the host would.
            await self._refresh_tools()
        if self._boundary is None:
            self._boundary = ToolBoundary(self.store, self._specs, on_duplicate=self._on_duplicate)
        return self._boundary

    async def _refresh_tools(self) -> None:
        listed: list[Message] = []
        cursor: Any = None
        for _ in range(MAX_LIST_PAGES):
            upstream_id = next(self._ids)
            request: Message = {"jsonrpc": "2.0", "id": upstream_id, "method": "tools/list"}
            if cursor is not None:
                request["params"] = {"cursor": cursor}
            try:
                answer = await self._ask_upstream(upstream_id, request)
            except UpstreamCallError:
                return
            result = answer.get("result")
            tools = result.get("tools") if isinstance(result, dict) else None
            if not isinstance(tools, list):
                return
            listed.extend(tool for tool in tools if self._listable(tool))
            cursor = result.get("nextCursor") if isinstance(result, dict) else None
            if not isinstance(cursor, str) or not cursor:
                break
        self._learn(listed)

    def _learn(self, tools: list[Message]) -> None:
        """Know these listed tools, governed or not as :class:`Governance` says.

        A new name, or a known tool whose annotations changed what governs it, makes a new
        boundary (calls in flight keep theirs).
        """
        learnt: dict[str, ToolSpec] = {}
        for tool in tools:
            name, governed = tool["name"], self._govern.governs(tool)
            known = self._specs.get(name, learnt.get(name))
            if known is None or (known.approval is not False) != governed:
                learnt[name] = self._spec(governed)
        fresh = [name for name in learnt if name not in self._specs]
        if fresh and len(self._specs) + len(fresh) > _MAX_TOOLS:
            learnt = {name: spec for name, spec in learnt.items() if name in self._specs}
        if not learnt:
            return
        self._specs.update(learnt)
        self._boundary = ToolBoundary(self.store, self._specs, on_duplicate=self._on_duplicate)

    def _spec(self, governed: bool) -> ToolSpec:
        """An upstream tool's spec: its ``tools/call`` is the executor; governed or not."""
        return ToolSpec(
            executor=self._execute,
            projector=project_upstream,
            timeout_s=self._timeout_s,
            error_result=upstream_error_text if self._forward_tool_errors else None,
            read_only=not governed,
            approval=governed,
        )

    async def _execute(self, arguments: Mapping[str, Any], call: ToolCall) -> Any:
        params, upstream_ids = self._pending_params.get(call.tool_call_id, ({}, []))
        upstream_id = next(self._ids)
        upstream_ids.append(upstream_id)
        request = {
            "jsonrpc": "2.0",
            "id": upstream_id,
            "method": "tools/call",
            "params": {**params, "name": call.tool, "arguments": dict(arguments)},
        }
        answer = await self._ask_upstream(upstream_id, request)
        if "error" in answer:
            error = answer.get("error")
            fault = UpstreamFault(error if isinstance(error, dict) else {"code": INTERNAL_ERROR})
            self._faults[call.tool_call_id] = fault.error
            raise fault
        result = answer.get("result")
        if not isinstance(result, dict):
            raise UpstreamCallError("the upstream's result is not an object")
        if result.get("isError") is True:
            # Its text is harness-only failure detail, unless forward_tool_errors asks the
            # ToolSpec's error_result for it (upstream_error_text).
            content = result.get("content")
            raise UpstreamToolError(
                "\n".join(
                    block["text"]
                    for block in (content if isinstance(content, list) else [])
                    if isinstance(block, dict)
                    and block.get("type") == "text"
                    and isinstance(block.get("text"), str)
                )
            )
        return result

    async def _ask_upstream(self, upstream_id: int, request: Message) -> Message:
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._own[upstream_id] = future
        try:
            await self.upstream.send(request)
            return await future
        except UpstreamGone:
            return self._unavailable(upstream_id)
        except asyncio.CancelledError:
            if not future.done():
                await self._send_upstream_quietly(
                    _cancelled(upstream_id, {"reason": "cancelled by the proxy"})
                )
            raise
        finally:
            self._own.pop(upstream_id, None)

    # -- from the upstream ---------------------------------------------------------------

    async def _from_upstream(self, message: Message) -> None:
        request_id = message.get("id")
        method = message.get("method")
        if method is None and ("result" in message or "error" in message):
            if isinstance(request_id, int) and request_id in self._own:
                future = self._own.pop(request_id)
                if not future.done():
                    future.set_result(message)
                return
            if isinstance(request_id, int) and request_id in self._forwarded:
                host_id, host_method = self._forwarded.pop(request_id)
                await self._to_host(self._answered(host_method, {**message, "id": host_id}))
            return
        if not isinstance(method, str):
            await self._bad_line(request_id)
            return
        if "id" in message:
            # The upstream's request to the host (sampling, elicitation, roots, ping).
            host_facing = next(self._ids)
            self._reverse[host_facing] = request_id
            await self._to_host({**message, "id": host_facing}, self._related(message))
            return
        if method == "notifications/cancelled":
            params = message.get("params") or {}
            for host_facing, upstream_id in list(self._reverse.items()):
                if type(upstream_id) is type(params.get("requestId")) and upstream_id == params.get(
                    "requestId"
                ):
                    del self._reverse[host_facing]
                    await self._to_host({**message, "params": {**params, "requestId": host_facing}})
            return
        await self._to_host(message, self._related(message))

    def _related(self, message: Message) -> Any:
        """The host request an upstream message belongs to, or None.

        A progress notification belongs to the request with its token; anything else to
        the latest request still running (none running: it is the session's own).
        """
        if message.get("method") == "notifications/progress":
            params = message.get("params")
            token = params.get("progressToken") if isinstance(params, dict) else None
            for request_id, request_token in self._inflight.values():
                if (
                    request_token is not None
                    and type(request_token) is type(token)
                    and request_token == token
                ):
                    return request_id
        if self._inflight:
            return next(reversed(self._inflight.values()))[0]
        return None

    def _answered(self, method: str, message: Message) -> Message:
        result = message.get("result")
        if method == "initialize" and isinstance(result, dict):
            self.initialized.set()
            self._backoff_s = 0.5
            given = result.get("_meta")
            meta: dict[str, Any] = given if isinstance(given, dict) else {}
            proxy = {"name": "canon-mcp-proxy", "version": self._version}
            message = {**message, "result": {**result, "_meta": {**meta, PROXY_KEY: proxy}}}
        elif method == "tools/list" and isinstance(result, dict):
            tools = result.get("tools")
            if isinstance(tools, list):
                kept = [tool for tool in tools if self._listable(tool)]
                self._learn(kept)
                shown = [self._shown(tool) for tool in kept]
                if shown != tools:
                    message = {**message, "result": {**result, "tools": shown}}
        return message

    def _shown(self, tool: Message) -> Message:
        """A listed tool as the host sees it: a governed one without its ``outputSchema``.

        A governed call's first answer is the pending result, which has no structured
        content: a host that checks results against the tool's output schema (as the
        SDKs' clients do) would reject it. The upstream's answer, once approved, still
        carries its structured content.
        """
        if "outputSchema" in tool and self._govern.governs(tool):
            return {key: value for key, value in tool.items() if key != "outputSchema"}
        return tool

    def _listable(self, tool: Any) -> bool:
        name = tool.get("name") if isinstance(tool, dict) else None
        if isinstance(name, str) and is_tool_name(name):
            return True
        shown = name if isinstance(name, str) else repr(name)
        if shown not in self._skipped and len(self._skipped) < _MAX_TOOLS:
            self._skipped.add(shown)
            log.warning(
                "mcp_tool_skipped",
                tool=shown[:200],
                reason="its name is not 1-128 of A-Z a-z 0-9 _ - .",
            )
        return False

    async def _bad_line(self, request_id: Any) -> None:
        self._bad_lines += 1
        if self._bad_lines == 1:
            log.warning("upstream_bad_message", note="not UTF-8 JSON-RPC; later ones are counted")
        if isinstance(request_id, int):
            if request_id in self._own:
                future = self._own.pop(request_id)
                if not future.done():
                    future.set_result(
                        error_response(request_id, INTERNAL_ERROR, "bad upstream message")
                    )
            elif request_id in self._forwarded:
                host_id, _ = self._forwarded.pop(request_id)
                await self._to_host(
                    error_response(host_id, INTERNAL_ERROR, "the upstream sent an invalid message")
                )

    async def _ended(self, reason: str) -> None:
        for upstream_id, future in list(self._own.items()):
            if not future.done():
                future.set_result(self._unavailable(upstream_id))
        self._own.clear()
        forwarded = list(self._forwarded.values())
        self._forwarded.clear()
        self._reverse.clear()
        for host_id, _ in forwarded:
            await self._to_host(self._unavailable(host_id))
        if self._stopping:
            return
        if not self.initialized.is_set():
            self.failed = f"{reason} before answering initialize"
            self.fatal.set()
            return
        log.warning("upstream_ended", reason=reason, restart_in_s=self._backoff_s)
        self._restarting = asyncio.create_task(self._restart())

    async def _restart(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self._backoff_s)  # backoff between restarts, by design
            self._backoff_s = min(self._backoff_s * 2, MAX_BACKOFF_S)
            try:
                await self.upstream.start(self._from_upstream, self._bad_line, self._ended)
                if self._initialize is not None:
                    upstream_id = next(self._ids)
                    answer = await asyncio.wait_for(
                        self._ask_upstream(upstream_id, {**self._initialize, "id": upstream_id}),
                        self.start_timeout_s,
                    )
                    if "result" not in answer:
                        raise UpstreamError("the restarted upstream refused initialize")
                    if self._initialized_sent:
                        await self.upstream.send(
                            {"jsonrpc": "2.0", "method": "notifications/initialized"}
                        )
                    await self._restore_session_state()
                log.info("upstream_restarted", pid=self.upstream.pid)
                return
            except (UpstreamError, UpstreamCallError, TimeoutError):
                log.warning("upstream_restart_failed", restart_in_s=self._backoff_s)
                await self.upstream.stop()

    # -- what a restarted upstream must be told again ------------------------------------

    def _remember_session_state(self, method: str, params: Mapping[str, Any]) -> None:
        """Keep what the host set on the upstream, to set it again on a restarted one."""
        uri = params.get("uri")
        if method == "logging/setLevel":
            self._log_level = dict(params)
        elif method == "resources/subscribe" and isinstance(uri, str):
            if len(self._subscriptions) < _MAX_TOOLS:
                self._subscriptions.add(uri)
        elif method == "resources/unsubscribe" and isinstance(uri, str):
            self._subscriptions.discard(uri)

    async def _restore_session_state(self) -> None:
        """The host's log level and subscriptions, on a restarted upstream (answers unread)."""
        requests: list[tuple[str, dict[str, Any]]] = []
        if self._log_level is not None:
            requests.append(("logging/setLevel", self._log_level))
        requests.extend(
            ("resources/subscribe", {"uri": uri}) for uri in sorted(self._subscriptions)
        )
        for method, params in requests:
            upstream_id = next(self._ids)
            request = {"jsonrpc": "2.0", "id": upstream_id, "method": method, "params": params}
            await asyncio.wait_for(self._ask_upstream(upstream_id, request), self.start_timeout_s)

    # -- helpers -------------------------------------------------------------------------

    def _unavailable(self, request_id: Any) -> Message:
        return error_response(
            request_id,
            UPSTREAM_UNAVAILABLE,
            "the upstream MCP server is not running; the proxy is restarting it",
        )

    async def _to_host(self, message: Message, related: Any = None) -> None:
        if "method" not in message:
            request_id = message.get("id")
            self._inflight.pop((type(request_id), request_id), None)
        await self._send_host(message, related)

    async def _send_upstream_quietly(self, message: Message) -> None:
        with contextlib.suppress(UpstreamGone):
            await self.upstream.send(message)


def _progress_token(params: Mapping[str, Any] | None) -> Any:
    meta = params.get("_meta") if params is not None else None
    return meta.get("progressToken") if isinstance(meta, dict) else None


def _cancelled(upstream_id: int, params: Mapping[str, Any]) -> Message:
    return {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {**params, "requestId": upstream_id},
    }


def project_upstream(raw: Any, call: ToolCall) -> Projection:
    """The bounded result: the upstream's result, evidence if it returned any content."""
    result = {key: value for key, value in raw.items() if key not in ("_meta", "isError")}
    found = bool(result.get("content")) or result.get("structuredContent") is not None
    return Projection(
        result=result,
        evidence_status="EVIDENCE_FOUND" if found else "NO_EVIDENCE",
        scope=f"mcp tool {call.tool}",
    )
