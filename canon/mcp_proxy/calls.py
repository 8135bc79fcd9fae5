"""The ``tools/call`` path of ``canon mcp-proxy``: each call through the boundary, fail closed.

:class:`ToolCalls` owns what the proxy knows of the upstream's tools and runs each host
``tools/call`` through a :class:`~eventstore.boundary.tool_boundary.ToolBoundary`: one
canonical record per call, the upstream's ``tools/call`` as the executor, its result as
the raw response, the recorded result as the host's answer
(:mod:`canon.mcp_proxy.answers`).

**Fail closed.** A call is forwarded only for a tool the proxy can record and govern: a
name it does not know triggers a fresh ``tools/list`` (with the host's 2026-07-28
``_meta`` envelope when the host speaks that protocol); a name still unknown, or a list
that cannot be read, is refused by the boundary (UNKNOWN_TOOL, on the run's refusal log)
and answered with an ``isError`` result that says why. It never reaches the upstream.

**Governed tools** (:class:`Governance`): a governed call is recorded with its request
frozen and answered at once with the pending result, never sent upstream; the host's
re-issue of the same call (same ids) gets the pending result again, the upstream's answer
once an operator approved it (the upstream runs it once), or the denial. A pause holds a
governed call: its re-issue gets the "still waiting" result
(:func:`~canon.integrations.mcp.held_by_pause`), never a final error.

**Re-issue.** With the host's own tool call id (``_meta`` ``io.canon/tool_call_id``), a
re-issued ``tools/call`` is the same call: it attaches to the first while it runs (a
bounded wait) or gets its recorded answer, and the upstream runs the tool once.

**InputRequiredResult** (2026-07-28): an upstream that needs the host's input mid-call
answers ``resultType: "input_required"``. The call stays open (its record PROJECTING): the
host gets the input request with a ``requestState`` of the proxy's own, and its next
``tools/call`` carrying that state continues the same call upstream (with the upstream's
own state); the record is completed with the final result. A host that does not come back
within the tool timeout ends the call Failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, TypeVar

import msgspec

from canon.integrations.mcp import (
    FALLBACK_PREFIX,
    INVOCATION_ID_KEY,
    RUN_ID_KEY,
    TOOL_CALL_ID_KEY,
    held_by_pause,
    ids_of_call,
    pending_meta,
)
from canon.mcp_proxy.messages import INTERNAL_ERROR, INVALID_PARAMS, Message, error_response
from eventstore.boundary.contracts import (
    AgentReply,
    ApprovalPending,
    Projection,
    RunContext,
    ToolCall,
    ToolEnvelope,
    ToolError,
    ToolResult,
    ToolSpec,
)
from eventstore.boundary.tool_boundary import OnDuplicate, ToolBoundary
from eventstore.errors import CanonError
from eventstore.logs import get_logger
from eventstore.store import Store
from machine.codes import ErrorCode
from machine.ids import is_tool_name

log = get_logger("canon.mcp_proxy")
_T = TypeVar("_T")

#: Most pages of ``tools/list`` the proxy reads when it looks a tool up itself.
MAX_LIST_PAGES: Final = 100
#: Most tool names the proxy keeps specs for (a hostile upstream cannot grow it forever).
MAX_TOOLS: Final = 10_000
# Most characters of an upstream error's text kept as (harness-only) failure detail.
_DETAIL_CHARS = 2000
# Most input rounds of one InputRequiredResult call, and open rounds at once.
_MAX_ROUNDS = 100
_MAX_OPEN_ROUNDS = 10_000

#: Sends one request to the upstream and returns its answer; the list collects the
#: upstream-facing ids it used (to cancel them).
Ask = Callable[[str, dict[str, Any], list[int]], Awaitable[Message]]
#: Answers one host request (its id, the answer message).
Answer = Callable[[Message], Awaitable[None]]


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


class UpstreamTimeout(UpstreamCallError):
    """Raised when the upstream (or the host, for its input) takes longer than the tool timeout."""


class UpstreamFault(UpstreamCallError):
    """Raised when a ``tools/call`` gets a JSON-RPC error (the upstream's, or the relay's).

    The host gets this JSON-RPC error as it is, not a tool result: the call failed at the
    protocol's level (a bad upstream message, a dead upstream, an error response).
    """

    def __init__(self, error: Mapping[str, Any]) -> None:
        """Keep the JSON-RPC ``error`` object for the host."""
        super().__init__(f"JSON-RPC error {error.get('code')}")
        self.error = dict(error)


def upstream_error_text(error: Exception) -> str:
    """The agent-facing text of an upstream's ``isError`` result (a ``ToolSpec.error_result``).

    Only the upstream's own tool errors are forwarded: any other failure of the call (the
    connection, a JSON-RPC error, a result that is not an object) gives ``""``, which leaves
    the host the safe error (or the JSON-RPC error).
    """
    return error.text if isinstance(error, UpstreamToolError) else ""


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

    @property
    def any(self) -> bool:
        """Whether anything is governed."""
        return self.annotations or bool(self.names)

    def governs(self, tool: Mapping[str, Any]) -> bool:
        """Whether the listed ``tool`` (an MCP tool definition) is governed."""
        if tool.get("name") in self.names:
            return True
        if not self.annotations:
            return False
        hints = tool.get("annotations")
        return not (isinstance(hints, dict) and hints.get("readOnlyHint") is True)


class CallOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How the proxy runs calls (see ``canon mcp-proxy --help`` for each flag).

    Attributes:
        on_duplicate: ``"replay"`` answers a re-issued tool call id from its record.
        timeout_s: most seconds one upstream ``tools/call`` (or the host's input for it)
            may take; None: no bound.
        forward_tool_errors: an upstream ``isError`` result's text reaches the host
            (scrubbed, bounded, recorded); False keeps it harness-only failure detail.
        govern: which upstream tools wait for an operator's approval.
        console_url: the console's address, named in a pending result's ``_meta``.

    """

    on_duplicate: OnDuplicate = "replay"
    timeout_s: float | None = None
    forward_tool_errors: bool = True
    govern: Governance = Governance()
    console_url: str | None = None


class _Round:
    """One call waiting for the host's input (InputRequiredResult): its host and state."""

    def __init__(self, host_id: Any) -> None:
        self.host_id = host_id
        self.upstream_state: Any = None
        self.next: asyncio.Future[tuple[Any, dict[str, Any]]] | None = None


class ToolCalls:
    """The proxy's ``tools/call`` path: what it knows of the tools, and each call's record.

    Args:
        store: where calls are recorded.
        ask: sends one request upstream and returns the answer.
        answer: sends one answer to the host.
        connection_id: names this host connection in fallback ids.
        run_id: the run of calls whose ``_meta`` names none.
        open_run: opens a run on its first call, or None.
        rolls_over: ``run_id`` is the proxy's own run: once its deadline passed, calls go
            to a new one (``<run_id>-2``, ``-3`` ...), opened as the first was.
        options: how calls run.
        result_of: turns a recorded reply into the host's ``tools/call`` result.
        error_of: turns a refused or failed call's reply into the host's result.

    """

    def __init__(
        self,
        store: Store,
        ask: Ask,
        answer: Answer,
        *,
        connection_id: str,
        run_id: str,
        open_run: Callable[[str], Awaitable[None]] | None,
        rolls_over: bool = False,
        options: CallOptions,
        result_of: Callable[[ToolResult], Message],
        error_of: Callable[[AgentReply], Message],
    ) -> None:
        self.store = store
        self._ask = ask
        self._answer = answer
        self.connection_id = connection_id
        self.run_id = run_id
        self._base_run_id = run_id
        self._rolls_over = rolls_over
        self._generation = 1
        self._open_run = open_run
        self.opened: set[str] = set()
        self._options = options
        self._result_of = result_of
        self._error_of = error_of
        # Tools named governed are known from the start: a call of one never bypasses
        # the approval, listed or not.
        self.specs: dict[str, ToolSpec] = {name: self._spec(True) for name in options.govern.names}
        self._boundary = ToolBoundary(store, self.specs, on_duplicate=options.on_duplicate)
        # tool call id -> (the host's params, the call's rounds, upstream ids).
        self._pending: dict[str, tuple[dict[str, Any], _Round, list[int]]] = {}
        # tool call id -> the JSON-RPC error its upstream call got.
        self._faults: dict[str, dict[str, Any]] = {}
        self._timed_out: set[str] = set()
        self._too_large: set[str] = set()
        #: The longest upstream line read (named when an answer is over it).
        self.line_bytes: int | None = None
        # the proxy's requestState -> the open call waiting for the host's input.
        self._rounds: dict[str, _Round] = {}
        self._skipped: set[str] = set()
        self._list_failed = False
        #: Each listed tool's input schema, as listed (the host's Mcp-Param-* are checked
        #: against it).
        self.schemas: dict[str, Any] = {}
        #: Told the tools of each listing learnt (the HTTP upstream keeps their schemas).
        self.on_learn: Callable[[list[Message]], None] | None = None
        #: host request key -> running call task and its upstream ids.
        self.running: dict[tuple[type, Any], tuple[asyncio.Task[None], list[int]]] = {}

    def close(self) -> None:
        """Release the boundary's threads."""
        self._boundary.close()

    # -- starting a call -------------------------------------------------------------------

    async def start(
        self, request_id: Any, params: Mapping[str, Any] | None, envelope: dict[str, Any] | None
    ) -> None:
        """Handle one host ``tools/call`` (answered later, by its own task)."""
        if (
            params is None
            or not isinstance(params.get("name"), str)
            or not isinstance(params.get("arguments", {}), dict)
        ):
            await self._answer(error_response(request_id, INVALID_PARAMS, "Invalid params"))
            return
        state = params.get("requestState")
        waiting = self._rounds.get(state) if isinstance(state, str) else None
        if waiting is not None and waiting.next is not None and not waiting.next.done():
            # The host's answer to an input request: the same call goes on.
            waiting.next.set_result((request_id, dict(params)))
            return
        key = (type(request_id), request_id)
        upstream_ids: list[int] = []
        task = asyncio.create_task(self._call(request_id, dict(params), envelope, upstream_ids))
        self.running[key] = (task, upstream_ids)
        task.add_done_callback(lambda _: self.running.pop(key, None))

    async def _call(
        self,
        request_id: Any,
        params: dict[str, Any],
        envelope: dict[str, Any] | None,
        upstream_ids: list[int],
    ) -> None:
        turn = _Round(request_id)
        try:
            result = await self._run(turn, params, envelope, upstream_ids)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every request with an id gets an answer
            log.warning("mcp_call_failed", error_type=type(exc).__name__)
            result = error_response(turn.host_id, INTERNAL_ERROR, "Internal error")
        await self._answer(result)

    async def _run(
        self,
        turn: _Round,
        params: dict[str, Any],
        envelope: dict[str, Any] | None,
        upstream_ids: list[int],
    ) -> Message:
        given = params.get("_meta")
        meta: dict[str, Any] = given if isinstance(given, dict) else {}
        run_id, tool_call_id = ids_of_call(
            meta,
            connection_id=self.connection_id,
            request_id=turn.host_id,
            default_run_id=self.run_id,
        )
        name = params["name"]
        if name not in self.specs and is_tool_name(name):
            # Not listed yet (or listed since): read the list, as the host would.
            await self.refresh(envelope)
        await self._ensure_open(run_id)
        call = ToolEnvelope(
            run_id=run_id,
            tool_call_id=tool_call_id,
            tool=name,
            arguments=params.get("arguments") or {},
        )
        known = name in self.specs
        self._pending[tool_call_id] = (params, turn, upstream_ids)
        try:
            reply = await self._boundary.invoke(RunContext(run_id), call)
            if self._rolled_over(run_id, reply):
                # Refused before any record: the same call, in the proxy's next run.
                run_id = self.run_id
                await self._ensure_open(run_id)
                call = msgspec.structs.replace(call, run_id=run_id)
                reply = await self._boundary.invoke(RunContext(run_id), call)
            reply = await held_by_pause(self.store, run_id, reply)
        finally:
            self._pending.pop(tool_call_id, None)
            fault = self._faults.pop(tool_call_id, None)
            timed_out = tool_call_id in self._timed_out
            self._timed_out.discard(tool_call_id)
            too_large = tool_call_id in self._too_large
            self._too_large.discard(tool_call_id)
        if fault is not None and not isinstance(reply, ToolResult):
            # Recorded as Failed; the host gets the JSON-RPC error it would get directly.
            return {"jsonrpc": "2.0", "id": turn.host_id, "error": fault}
        if isinstance(reply, ApprovalPending):
            # Recorded and waiting for an operator: not an error, and never sent upstream.
            result: Message = {
                "content": [{"type": "text", "text": reply.message}],
                "isError": False,
                "_meta": pending_meta(reply, run_id, self._options.console_url),
            }
        elif isinstance(reply, ToolResult):
            result = self._result_of(reply)
        else:
            result = self._error_of(reply)
            if isinstance(reply, ToolError) and reply.error_code is ErrorCode.UNKNOWN_TOOL:
                result = _with_reason(result, self._unknown_reason(name, known))
            elif too_large:
                reason = (
                    f"the upstream's answer is over {self.line_bytes} bytes, the most the proxy "
                    "reads: raise --max-raw-bytes"
                )
                result = _with_reason(result, reason)
            elif timed_out:
                reason = (
                    f"no answer within {self._options.timeout_s:g} s: raise --tool-timeout-s "
                    "(0 for no bound)"
                )
                result = _with_reason(result, reason)
        ids: dict[str, Any] = {RUN_ID_KEY: run_id}
        if reply.tool_call_id is not None:
            ids[TOOL_CALL_ID_KEY] = reply.tool_call_id
        if reply.invocation_id is not None:
            ids[INVOCATION_ID_KEY] = reply.invocation_id
        result["_meta"] = {**(result.get("_meta") or {}), **ids}
        if envelope is not None:
            # 2026-07-28 requires it on every result; canon's own results are complete.
            result.setdefault("resultType", "complete")
        return {"jsonrpc": "2.0", "id": turn.host_id, "result": result}

    async def _ensure_open(self, run_id: str) -> None:
        if self._open_run is not None and run_id not in self.opened:
            await self._open_run(run_id)
            if len(self.opened) < MAX_TOOLS:
                self.opened.add(run_id)

    def _rolled_over(self, run_id: str, reply: AgentReply) -> bool:
        """Whether the proxy's own run just passed its deadline (then: a new run id)."""
        if not (
            self._rolls_over
            and run_id == self.run_id
            and isinstance(reply, ToolError)
            and reply.error_code is ErrorCode.RUN_DEADLINE_EXPIRED
        ):
            return False
        self._generation += 1
        self.run_id = f"{self._base_run_id}-{self._generation}"
        log.info("mcp_run_rolled_over", run_id=self.run_id)
        return True

    def _unknown_reason(self, name: str, known: bool) -> str:
        if not is_tool_name(name):
            return "not a tool name (1-128 of A-Z a-z 0-9 _ - .); nothing was sent upstream"
        if self._list_failed:
            return "the upstream's tools/list could not be read; nothing was sent upstream"
        return "the upstream does not list this tool; nothing was sent upstream"

    # -- the tool list ---------------------------------------------------------------------

    async def refresh(self, envelope: dict[str, Any] | None) -> None:
        """Read the upstream's whole ``tools/list`` and learn it (failures: known as such)."""
        listed: list[Message] = []
        cursor: Any = None
        for _ in range(MAX_LIST_PAGES):
            params: dict[str, Any] = {}
            if envelope is not None:
                params["_meta"] = dict(envelope)
            if cursor is not None:
                params["cursor"] = cursor
            try:
                answer = await self._ask("tools/list", params, [])
            except UpstreamCallError:
                answer = {}
            result = answer.get("result")
            tools = result.get("tools") if isinstance(result, dict) else None
            if not isinstance(tools, list):
                self._list_failed = True
                log.warning("upstream_tools_list_failed", pages_read=_)
                return
            listed.extend(tool for tool in tools if self.listable(tool))
            cursor = result.get("nextCursor") if isinstance(result, dict) else None
            if not isinstance(cursor, str) or not cursor:
                break
        self._list_failed = False
        self.learn(listed)

    def learn(self, tools: list[Message]) -> None:
        """Know these listed tools, governed or not as :class:`Governance` says.

        A new name, or a known tool whose annotations changed what governs it, makes a new
        boundary (calls in flight keep theirs).
        """
        if self.on_learn is not None:
            self.on_learn(tools)
        for tool in tools:
            if tool["name"] in self.schemas or len(self.schemas) < MAX_TOOLS:
                self.schemas[tool["name"]] = tool.get("inputSchema")
        learnt: dict[str, ToolSpec] = {}
        govern = self._options.govern
        for tool in tools:
            name, governed = tool["name"], govern.governs(tool)
            if name in govern.names:
                continue
            known = self.specs.get(name, learnt.get(name))
            if known is None or (known.approval is not False) != governed:
                learnt[name] = self._spec(governed)
        fresh = [name for name in learnt if name not in self.specs]
        if fresh and len(self.specs) + len(fresh) > MAX_TOOLS:
            learnt = {name: spec for name, spec in learnt.items() if name in self.specs}
        if not learnt:
            return
        self.specs.update(learnt)
        self._boundary = ToolBoundary(
            self.store, self.specs, on_duplicate=self._options.on_duplicate
        )

    def listable(self, tool: Any) -> bool:
        """Whether a listed tool has a name canon can record (else: skipped, one warning)."""
        name = tool.get("name") if isinstance(tool, dict) else None
        if isinstance(name, str) and is_tool_name(name):
            return True
        shown = name if isinstance(name, str) else repr(name)
        if shown not in self._skipped and len(self._skipped) < MAX_TOOLS:
            self._skipped.add(shown)
            log.warning(
                "mcp_tool_skipped",
                tool=shown[:200],
                reason="its name is not 1-128 of A-Z a-z 0-9 _ - .",
            )
        return False

    def shown(self, tool: Message) -> Message:
        """A listed tool as the host sees it: a governed one without its ``outputSchema``.

        A governed call's first answer is the pending result, which has no structured
        content: a host that checks results against the tool's output schema (as the
        SDKs' clients do) would reject it. The upstream's answer, once approved, still
        carries its structured content.
        """
        if "outputSchema" in tool and self._options.govern.governs(tool):
            return {key: value for key, value in tool.items() if key != "outputSchema"}
        return tool

    def _spec(self, governed: bool) -> ToolSpec:
        """An upstream tool's spec: its ``tools/call`` is the executor; governed or not."""
        return ToolSpec(
            executor=self._execute,
            projector=project_upstream,
            error_result=upstream_error_text if self._options.forward_tool_errors else None,
            read_only=not governed,
            approval=governed,
        )

    # -- the executor: the upstream's tools/call -------------------------------------------

    async def _execute(self, arguments: Mapping[str, Any], call: ToolCall) -> Any:
        params, turn, upstream_ids = self._pending.get(call.tool_call_id, ({}, _Round(None), []))
        request = {**params, "name": call.tool, "arguments": dict(arguments)}
        for _ in range(_MAX_ROUNDS):
            answer = await self._bounded(
                call.tool_call_id, self._ask("tools/call", request, upstream_ids)
            )
            if answer.get("overlong") is True:
                self._too_large.add(call.tool_call_id)
                raise UpstreamCallError("the upstream's answer is over the line bound")
            if "error" in answer:
                error = answer.get("error")
                fault = UpstreamFault(
                    error if isinstance(error, dict) else {"code": INTERNAL_ERROR}
                )
                self._faults[call.tool_call_id] = fault.error
                raise fault
            result = answer.get("result")
            if not isinstance(result, dict):
                raise UpstreamCallError("the upstream's result is not an object")
            if result.get("resultType") != "input_required":
                break
            request = await self._input_round(call.tool_call_id, turn, request, result)
        else:
            raise UpstreamCallError("too many input rounds")
        if result.get("isError") is True:
            # The upstream's own error: its text reaches the host (forward_tool_errors,
            # through the ToolSpec's error_result), else it is harness-only detail.
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

    async def _bounded(self, tool_call_id: str, waiting: Awaitable[_T]) -> _T:
        if self._options.timeout_s is None:
            return await waiting
        try:
            async with asyncio.timeout(self._options.timeout_s):
                return await waiting
        except TimeoutError:
            self._timed_out.add(tool_call_id)
            raise UpstreamTimeout("no answer within the tool timeout") from None

    async def _input_round(
        self, tool_call_id: str, turn: _Round, request: dict[str, Any], result: Message
    ) -> dict[str, Any]:
        """Hand an InputRequiredResult to the host; return the upstream request that follows."""
        if turn.host_id is None or len(self._rounds) >= _MAX_OPEN_ROUNDS:
            raise UpstreamCallError("an input request the host cannot be asked")
        token = secrets.token_urlsafe(24)
        turn.upstream_state = result.get("requestState")
        turn.next = asyncio.get_running_loop().create_future()
        self._rounds[token] = turn
        shown = {**result, "requestState": token}
        try:
            await self._answer({"jsonrpc": "2.0", "id": turn.host_id, "result": shown})
            host_id, params = await self._bounded(tool_call_id, turn.next)
        finally:
            self._rounds.pop(token, None)
        turn.host_id = host_id
        following = {key: value for key, value in params.items() if key != "requestState"}
        following["name"], following["arguments"] = request["name"], request["arguments"]
        if turn.upstream_state is not None:
            following["requestState"] = turn.upstream_state
        return following

    def fault_of(self, tool_call_id: str, error: dict[str, Any]) -> None:
        """Remember the JSON-RPC error a call's upstream request got (for its host answer)."""
        self._faults[tool_call_id] = error


def _with_reason(result: Message, reason: str) -> Message:
    """A safe-error result whose JSON text also says why (``reason``)."""
    import json

    content = result.get("content")
    if not (isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict)):
        return result
    with contextlib.suppress(ValueError, TypeError):
        payload = json.loads(content[0].get("text", ""))
        if isinstance(payload, dict):
            payload = {**payload, "reason": reason}
            return {**result, "content": [{"type": "text", "text": json.dumps(payload)}]}
    return result


def project_upstream(raw: Any, call: ToolCall) -> Projection:
    """The bounded result: the upstream's result exactly; evidence if it returned content.

    Exactly, so the record stores its bytes once (the result is the raw response) and the
    host sees what the upstream sent, its ``_meta`` and ``isError: false`` included.
    """
    found = bool(raw.get("content")) or raw.get("structuredContent") is not None
    return Projection(
        result=raw,
        evidence_status="EVIDENCE_FOUND" if found else "NO_EVIDENCE",
        scope=f"mcp tool {call.tool}",
    )


__all__ = [
    "FALLBACK_PREFIX",
    "CallOptions",
    "Governance",
    "ToolCalls",
    "UpstreamCallError",
    "UpstreamFault",
    "UpstreamTimeout",
    "UpstreamToolError",
    "project_upstream",
    "upstream_error_text",
]
