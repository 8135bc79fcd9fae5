"""The read-only receipt HTTP API (Starlette; served by uvicorn).

``GET /v1/invocations/inspection-capabilities``,
``GET /v1/invocations/<64 lowercase hex>/receipt``, ``GET /v1/runs/<run id>/progress`` and
``GET /v1/runs/<run id>/invocations`` (every call of the run in order, READY and ERROR
alike, without payloads; both run routes answer for the token's own run only, another id
is 404 ``run_not_found``).

Checks run in this order: every answer carries ``Cache-Control: no-store``; the run's
Bearer token (from the Authorization header only) must name a run whose token was not
revoked, else 401; the method must be GET and the path one of the four shapes (the
receipt's being ``/v1/invocations/<one path segment>/receipt``), else 404 ``not_found``;
any query string is refused with 400; a receipt segment that is not 64 lowercase hex is
refused with 400 (the last two before any record is read, so a malformed id never reaches
storage); the invocation is looked up through the token's run only (404
``invocation_not_found`` for absent, expired and other runs' invocations alike); a tool
revoked since the call gives 409. A store failure is 503, anything unexpected 500, neither
with details. There is no pause check: inspection works while execution is paused. A 401
carries ``WWW-Authenticate: Bearer`` (RFC 6750).
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from eventstore.audit.run_calls import run_calls
from eventstore.boundary.contracts import RunContext
from eventstore.errors import StoreUnavailable
from eventstore.logs import get_logger
from eventstore.runs import RunInfo
from eventstore.store import Store
from eventstore.writer import now_ms
from machine.ids import is_invocation_id
from projections.facts import observed_facts
from projections.metrics import Metrics
from projections.progress import read_view
from projections.receipts.builder import CAPABILITIES_SCHEMA, RECEIPT_SCHEMA, encode_receipt, iso_ms
from projections.receipts.inspection import (
    CapabilityChanged,
    InvocationNotFound,
    inspect_invocation,
)

log = get_logger("canon.http")

CAPABILITIES_PATH: Final = "/v1/invocations/inspection-capabilities"
#: Every route served, as ``canon serve --help`` lists them.
ROUTES: Final = (
    f"GET {CAPABILITIES_PATH}",
    "GET /v1/invocations/<invocation id>/receipt",
    "GET /v1/runs/<run id>/progress",
    "GET /v1/runs/<run id>/invocations",
)
# Any one segment, so a malformed id is told apart (400) from a path of another shape
# (404); the segment is checked with is_invocation_id before any lookup.
_RECEIPT_PATH: Final = re.compile(r"/v1/invocations/([^/]*)/receipt")
_RUN_PATH: Final = re.compile(
    r"/v1/runs/([A-Za-z0-9_\-][A-Za-z0-9._\-]{0,127})/(progress|invocations)"
)
PROGRESS_SCHEMA: Final = "canon.run-progress.v1"
INVOCATIONS_SCHEMA: Final = "canon.run-invocations.v1"
_MAX_TOKEN_CHARS: Final = 512
_CAPABILITIES: Final = msgspec.json.encode(
    {"schema_version": CAPABILITIES_SCHEMA, "receipt_schema": RECEIPT_SCHEMA, "read_only": True}
)
_QUERY_MESSAGE: Final = "Invocation inspection does not accept query parameters."
_INVALID_ID_MESSAGE: Final = "An invocation id is 64 lowercase hexadecimal characters."
_NOT_FOUND_MESSAGE: Final = "No invocation with this id is visible to this run."
_CHANGED_MESSAGE: Final = "The invocation's tool is no longer authorized for this run."
_CONSOLE_OFF_MESSAGE: Final = "The console is off: no operator token is configured."
#: Where the operator console answers (its routes: projections.console.CONSOLE_ROUTES).
CONSOLE_PREFIX: Final = "/console"
_RUN_NOT_FOUND_MESSAGE: Final = "No run with this id is visible to this token."


def _json(status: int, body: bytes | dict[str, Any]) -> Response:
    content = body if isinstance(body, bytes) else msgspec.json.encode(body)
    return Response(content, status_code=status, media_type="application/json")


def _error_body(code: str, message: str | None = None) -> bytes:
    body = {"error": code} if message is None else {"error": code, "message": message}
    return msgspec.json.encode(body)


def _error(status: int, code: str, message: str | None = None) -> Response:
    return _json(status, _error_body(code, message))


def _unauthorized() -> Response:
    """401 with the challenge RFC 6750 asks for: the client learns to send a Bearer token."""
    response = _error(401, "unauthorized")
    response.headers["WWW-Authenticate"] = 'Bearer realm="canon"'
    return response


class NoStoreMiddleware:
    """Adds ``Cache-Control: no-store`` to every response, whatever produced it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; rewrite the response headers as they go out."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_no_store(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (name, value)
                    for name, value in message.get("headers", [])
                    if name.lower() != b"cache-control"
                ]
                headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_no_store)


def bearer_token(request: Request) -> str | None:
    """Return the Bearer token of the one Authorization header, or None."""
    values = request.headers.getlist("authorization")
    if len(values) != 1:
        return None
    scheme, _, token = values[0].partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > _MAX_TOKEN_CHARS:
        return None
    return token


async def _open_run(store: Store, request: Request) -> RunInfo | None:
    token = bearer_token(request)
    if token is None:
        return None
    run_id = await store.runs.authenticate(token)
    if run_id is None:
        return None
    # A closed run stays readable: its calls ended, its evidence did not. Only
    # revoke_token withdraws read access.
    return await store.runs.info(run_id)


async def progress_document(store: Store, run_id: str) -> dict[str, Any]:
    """Return the run's progress as served (read-only).

    The progress worker's view when it exists; before that, the facts resolved from the
    records, with counts unknown and left empty.
    """
    view = await read_view(store, run_id)
    if view is not None:
        source, facts = "view", view.facts
        counts: dict[str, Any] = {
            "invocations": view.invocations,
            "by_status": view.by_status,
            "by_evidence": view.by_evidence,
            "updated_at": iso_ms(view.updated_at_ms) if view.updated_at_ms else None,
        }
    else:
        source = "records"
        facts = msgspec.to_builtins(await observed_facts(store, RunContext(run_id)))
        counts = {"invocations": None, "by_status": {}, "by_evidence": {}, "updated_at": None}
    return {
        "schema_version": PROGRESS_SCHEMA,
        "read_only": True,
        "run_id": run_id,
        "observed_at": iso_ms(now_ms()),
        "source": source,
        **counts,
        "facts": facts,
    }


async def invocations_document(store: Store, run_id: str) -> dict[str, Any]:
    """Return every call of the run in order, as served: ids, tool, status, times, no payload."""
    calls = [
        {
            "invocation_id": row.invocation_id,
            "tool_call_id": row.tool_call_id,
            "tool": row.tool,
            "status": row.status,
            "evidence_status": row.evidence_status if row.status == "READY" else None,
            "error_code": row.error_code,
            "created_at": iso_ms(row.created_at_ms),
            "finished_at": iso_ms(row.finished_at_ms) if row.finished_at_ms else None,
        }
        for row in await run_calls(store, run_id)
    ]
    return {
        "schema_version": INVOCATIONS_SCHEMA,
        "read_only": True,
        "run_id": run_id,
        "observed_at": iso_ms(now_ms()),
        "invocations": calls,
    }


async def _answer(store: Store, request: Request) -> tuple[Response, str]:
    run = await _open_run(store, request)
    if run is None:
        return _unauthorized(), "unauthorized"
    path: str = request.scope["path"]
    match = _RECEIPT_PATH.fullmatch(path)
    run_route = _RUN_PATH.fullmatch(path)
    route = (
        "receipt"
        if match
        else run_route.group(2)
        if run_route
        else "capabilities"
        if path == CAPABILITIES_PATH
        else "other"
    )
    if request.method != "GET" or route == "other":
        return _error(404, "not_found"), "other"
    if request.scope.get("query_string"):
        return _error(400, "invalid_request", _QUERY_MESSAGE), route
    if run_route is not None:
        if run_route.group(1) != run.run_id:
            return _error(404, "run_not_found", _RUN_NOT_FOUND_MESSAGE), route
        if route == "invocations":
            return _json(200, await invocations_document(store, run.run_id)), route
        return _json(200, await progress_document(store, run.run_id)), route
    if match is None:
        return _json(200, _CAPABILITIES), route
    if not is_invocation_id(match.group(1)):
        # Fixed message: the segment is never echoed back.
        return _error(400, "invalid_request", _INVALID_ID_MESSAGE), route
    status, body = await receipt_answer(store, run.run_id, match.group(1), run=run)
    return _json(status, body), route


async def receipt_answer(
    store: Store, run_id: str, invocation_id: str, *, run: RunInfo | None = None
) -> tuple[int, bytes]:
    """The receipt route's HTTP status and JSON body for one invocation of a run.

    The console shows this same answer, so an operator reads what the run's holder reads.
    """
    try:
        receipt = await inspect_invocation(store, run_id, invocation_id, run=run)
    except InvocationNotFound:
        return 404, _error_body("invocation_not_found", _NOT_FOUND_MESSAGE)
    except CapabilityChanged:
        return 409, _error_body("capability_changed", _CHANGED_MESSAGE)
    return 200, encode_receipt(receipt)


class _Endpoint:
    """ASGI middleware that answers every HTTP request itself, whatever its path or method.

    Starlette's router never sees a request: it answers a path holding a line feed with a
    plain-text 404 before authentication, and every request must get the same checks.
    """

    def __init__(
        self,
        app: ASGIApp,
        answer: Callable[[Request], Awaitable[Response]],
        console: ASGIApp | None = None,
    ) -> None:
        self.app = app
        self._answer = answer
        self._console = console

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer an HTTP request; pass anything else (lifespan) on."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path == CONSOLE_PREFIX or path.startswith(CONSOLE_PREFIX + "/"):
            # The console has its own authentication (the operator token) and routes.
            if self._console is None:
                response = _error(404, "not_found", _CONSOLE_OFF_MESSAGE)
                await response(scope, receive, send)
            else:
                await self._console(scope, receive, send)
            return
        response = await self._answer(Request(scope, receive))
        await response(scope, receive, send)


def create_app(
    store: Store, *, metrics: Metrics | None = None, console: ASGIApp | None = None
) -> Starlette:
    """Build the receipt API over ``store`` (which the caller opens and closes).

    Args:
        store: the store to read; the app never writes to it.
        metrics: where request latency is recorded, if anywhere.
        console: the operator console answering under ``/console`` (404 there without
            one; see :mod:`projections.console`).

    """

    async def answer(request: Request) -> Response:
        started = time.perf_counter()
        route = "other"
        try:
            response, route = await _answer(store, request)
        except StoreUnavailable:
            response = _error(503, "store_unavailable")
        except Exception as exc:
            log.error("request_failed", error=type(exc).__name__)
            response = _error(500, "internal_error")
        if metrics is not None:
            metrics.http_latency.labels(route, str(response.status_code)).observe(
                time.perf_counter() - started
            )
        return response

    return Starlette(
        middleware=[
            Middleware(NoStoreMiddleware),
            Middleware(_Endpoint, answer=answer, console=console),
        ],
    )
