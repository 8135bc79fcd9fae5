"""The transparent MCP relay behind ``canon mcp-proxy``: the message pump.

:class:`Relay` sits between a host and an upstream MCP server and passes every JSON-RPC
message through unchanged, both ways: prompts, resources (and their subscriptions and
templates), completion, logging, progress, cancellation, list_changed notifications,
``instructions``, subscriptions, caching hints, InputRequiredResults of other requests,
and the upstream's own requests to the host (sampling, elicitation, roots). The host's
``initialize`` reaches the upstream as the host sent it, so the upstream sees the host's
real capabilities; the upstream's answer reaches the host with its own ``serverInfo``, the
proxy naming itself in ``_meta`` under :data:`PROXY_KEY`. A 2026-07-28 host (no
``initialize``; each request carries its ``_meta`` envelope) is relayed the same way, and
the proxy's own requests upstream carry that host's envelope.

Only ``tools/call`` takes another path: :mod:`canon.mcp_proxy.calls` (one canonical record
per call, fail closed).

Ids: the relay never forwards a peer's JSON-RPC id; it sends its own and maps the answer
back to the exact id (value and type) the peer used, so ``502`` and ``"502"`` stay two
requests. Every host request with an id gets an answer: messages that are not JSON-RPC
2.0 get -32600 (with the id when it is one MCP accepts, else ``null``), bad params -32602;
unknown methods reach the upstream, which answers -32601 itself. Cancelling an unknown or
finished request does nothing.

Upstream life: a bad upstream line is logged once (later ones are counted), and the
request it answered, when its id can be read, gets a JSON-RPC error; an answer over the
line bound fails its call RESULT_TOO_LARGE (named, recorded). When the upstream exits,
every request waiting on it gets an error, the in-flight calls' records are closed Failed,
and the upstream is restarted with backoff (and re-initialized with the host's own
``initialize``); calls made meanwhile get a JSON-RPC error saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from canon.integrations.mcp import FALLBACK_PREFIX, console_base
from canon.mcp_proxy.calls import (
    CallOptions,
    Governance,
    ToolCalls,
    UpstreamCallError,
    UpstreamFault,
    UpstreamTimeout,
    UpstreamToolError,
    project_upstream,
    upstream_error_text,
)
from canon.mcp_proxy.messages import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    TOO_LARGE,
    UPSTREAM_UNAVAILABLE,
    Message,
    envelope_of,
    error_response,
    is_request_id,
)
from canon.mcp_proxy.upstream import Upstream, UpstreamError, UpstreamGone
from eventstore.boundary.contracts import AgentReply, ToolResult
from eventstore.boundary.tool_boundary import OnDuplicate
from eventstore.errors import CanonError
from eventstore.logs import get_logger
from eventstore.store import Store

log = get_logger("canon.mcp_proxy")

#: ``_meta`` key, on the ``initialize`` result, naming the proxy (name and version).
PROXY_KEY: Final = "io.canon/proxy"
#: Longest wait between two restarts of a dead upstream, in seconds.
MAX_BACKOFF_S: Final = 30.0
# Most resource subscriptions remembered for a restarted upstream.
_MAX_SUBSCRIPTIONS = 10_000

#: Writes one message to the host; the second argument is the host request it belongs
#: to (its JSON-RPC id), or None.
Send = Callable[[Message, Any], Awaitable[None]]

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "PROXY_KEY",
    "TOO_LARGE",
    "UPSTREAM_UNAVAILABLE",
    "Governance",
    "Relay",
    "Send",
    "UpstreamCallError",
    "UpstreamFault",
    "UpstreamTimeout",
    "UpstreamToolError",
    "error_response",
    "is_request_id",
    "project_upstream",
    "upstream_error_text",
]


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
        forward_tool_errors: bool = True,
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
        self.start_timeout_s = start_timeout_s
        self._version = version
        self._ids = itertools.count(1)
        # upstream-facing id -> (host's id exactly, method) for forwarded host requests.
        self._forwarded: dict[int, tuple[Any, str]] = {}
        # upstream-facing id -> future, for the relay's own requests (tools/call, initialize).
        self._own: dict[int, asyncio.Future[Message]] = {}
        # host-facing id -> upstream's id exactly, for the upstream's requests to the host.
        self._reverse: dict[int, Any] = {}
        self.calls = ToolCalls(
            store,
            self._ask,
            self._to_host,
            connection_id=self.connection_id,
            run_id=self.run_id,
            open_run=open_run,
            rolls_over=self._own_run,
            options=CallOptions(
                on_duplicate=on_duplicate,
                timeout_s=timeout_s,
                forward_tool_errors=forward_tool_errors,
                govern=govern,
                console_url=console_base(console_url) if console_url is not None else None,
            ),
            result_of=result_of,
            error_of=error_of,
        )
        self.calls.on_learn = getattr(upstream, "learn_tools", None)
        # The host's requests still unanswered: key -> (its id, its progress token).
        self._inflight: dict[tuple[type, Any], tuple[Any, Any]] = {}
        self._overdue: asyncio.Task[None] | None = None
        # What the host set on the upstream, set again on a restarted one.
        self._log_level: dict[str, Any] | None = None
        self._subscriptions: set[str] = set()
        self._initialize: Message | None = None
        self._initialized_sent = False
        #: The 2026-07-28 ``_meta`` envelope of the host's latest request that had one
        #: (None for a host that speaks an earlier protocol): the proxy's own requests
        #: upstream carry it.
        self.envelope: dict[str, Any] | None = None
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
        calls = [task for task, _ in self.calls.running.values()]
        for task in calls:
            task.cancel()
        if calls:
            await asyncio.gather(*calls, return_exceptions=True)
        await self.upstream.stop()
        self.calls.close()
        # The proxy's own run (no --run-id) ends with it; a named run may be resumed.
        if self._own_run and self.calls.run_id in self.calls.opened:
            with contextlib.suppress(CanonError):
                await self.store.close_run(self.calls.run_id)

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
        envelope = envelope_of(params)
        if envelope is not None:
            self.envelope = envelope
        if has_id:
            # What the upstream sends while this request runs belongs to it (progress with
            # its token; logs, sampling, elicitation), so HTTP routes it to its stream.
            token = _progress_token(params)
            self._inflight[(type(request_id), request_id)] = (request_id, token)
        if not has_id:
            await self._notification_from_host(method, message)
        elif method == "tools/call":
            if not self.upstream.running:
                await self._to_host(self._unavailable(request_id))
                return
            await self.calls.start(request_id, params, envelope)
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
                call = self.calls.running.get((type(cancelled), cancelled))
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

    # -- the relay's own requests upstream ------------------------------------------------

    async def _ask(self, method: str, params: dict[str, Any], upstream_ids: list[int]) -> Message:
        """Send the relay's own request upstream and wait for its answer."""
        upstream_id = next(self._ids)
        upstream_ids.append(upstream_id)
        request: Message = {"jsonrpc": "2.0", "id": upstream_id, "method": method}
        if params:
            request["params"] = params
        return await self._ask_upstream(upstream_id, request)

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
            await self._bad_line(request_id, False)
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
                kept = [tool for tool in tools if self.calls.listable(tool)]
                self.calls.learn(kept)
                shown = [self.calls.shown(tool) for tool in kept]
                if shown != tools:
                    message = {**message, "result": {**result, "tools": shown}}
        return message

    async def _bad_line(self, request_id: Any, overlong: bool) -> None:
        if overlong:
            log.warning("upstream_message_too_large", note="over the line bound; dropped")
        else:
            self._bad_lines += 1
            if self._bad_lines == 1:
                log.warning(
                    "upstream_bad_message", note="not UTF-8 JSON-RPC; later ones are counted"
                )
        if not isinstance(request_id, int):
            return
        if overlong:
            failure = error_response(request_id, TOO_LARGE, "the upstream's answer is too large")
        else:
            failure = error_response(request_id, INTERNAL_ERROR, "bad upstream message")
        if request_id in self._own:
            future = self._own.pop(request_id)
            if not future.done():
                future.set_result({**failure, "overlong": overlong})
        elif request_id in self._forwarded:
            host_id, _ = self._forwarded.pop(request_id)
            said = "too large" if overlong else "an invalid message"
            await self._to_host(
                error_response(
                    host_id, TOO_LARGE if overlong else INTERNAL_ERROR, f"the upstream sent {said}"
                )
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
            if len(self._subscriptions) < _MAX_SUBSCRIPTIONS:
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
