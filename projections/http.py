"""The receipt HTTP API (Starlette; served by uvicorn), and the operators' decisions.

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

Two POST routes take an operator's decision on governed calls, when the app has the
operator token (``create_app(..., operator=...)``, the console's): ``POST
/v1/runs/<run id>/invocations/<invocation id>/approval`` decides one call, ``POST
/v1/approvals`` one decision for up to 100 listed calls under one decision id. They take
the operator token only: a run's token is 403 ``operator_token_required`` (an agent never
decides, not even its own call's fate), a wrong one 401 and counted against the console's
allowance of failed logins (429 past it). The body is one JSON object, 16 KiB at most
(128 KiB for a batch), checked whole before anything is decided; each problem is 400 with
a stable code. Without the operator token these routes do not exist: a POST is answered
as any other (401, or 404 with a run's token). Every other route stays GET only, and no
answer carries a payload.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

import msgspec
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from eventstore.audit.run_calls import run_calls
from eventstore.boundary.contracts import RunContext
from eventstore.decisions import MAX_APPROVER_CHARS, MAX_REASON_CHARS, new_approval_id
from eventstore.errors import AccessDenied, InvalidArgument, StoreUnavailable
from eventstore.logs import get_logger
from eventstore.runs import RunInfo
from eventstore.store import Store
from eventstore.writer import now_ms
from machine.ids import is_invocation_id, is_run_id, is_tool_call_id
from projections.decisions import (
    MAX_BATCH_CALLS,
    CallDecision,
    checked_by,
    checked_reason,
    decide_call,
    decide_invocation,
)
from projections.facts import observed_facts
from projections.metrics import Metrics
from projections.progress import read_view
from projections.receipts.builder import CAPABILITIES_SCHEMA, RECEIPT_SCHEMA, encode_receipt, iso_ms
from projections.receipts.inspection import (
    CapabilityChanged,
    InvocationNotFound,
    inspect_invocation,
)


class OperatorGate(Protocol):
    """The operator token's check the decision routes need (the console's ``gate``).

    A protocol, so this module does not import the console's package (which imports it).
    """

    def check(self, token: str, client: str) -> tuple[bool, int]:
        """Whether ``token`` is the operator token, and the seconds ``client`` must wait."""

    def failed(self, client: str, token: str) -> None:
        """Count a wrong ``token`` from ``client``."""


log = get_logger("canon.http")

CAPABILITIES_PATH: Final = "/v1/invocations/inspection-capabilities"
#: The batch decision route.
APPROVALS_PATH: Final = "/v1/approvals"
#: Every route served, as ``canon serve --help`` lists them (the POST routes need the
#: operator token).
ROUTES: Final = (
    f"GET {CAPABILITIES_PATH}",
    "GET /v1/invocations/<invocation id>/receipt",
    "GET /v1/runs/<run id>/progress",
    "GET /v1/runs/<run id>/invocations",
    "POST /v1/runs/<run id>/invocations/<invocation id>/approval",
    f"POST {APPROVALS_PATH}",
)
# Any one segment, so a malformed id is told apart (400) from a path of another shape
# (404); the segment is checked with is_invocation_id before any lookup.
_RECEIPT_PATH: Final = re.compile(r"/v1/invocations/([^/]*)/receipt")
_RUN_PATH: Final = re.compile(
    r"/v1/runs/([A-Za-z0-9_\-][A-Za-z0-9._\-]{0,127})/(progress|invocations)"
)
# Any two segments, so an operator's malformed id is told apart from another path.
_APPROVAL_PATH: Final = re.compile(r"/v1/runs/([^/]*)/invocations/([^/]*)/approval")
PROGRESS_SCHEMA: Final = "canon.run-progress.v1"
DECISION_SCHEMA: Final = "canon.approval-decision.v1"
DECISIONS_SCHEMA: Final = "canon.approval-decisions.v1"
#: Largest decision body accepted (bytes): one call's, and a batch's of up to 100 calls.
MAX_DECISION_BYTES: Final = 16 * 1024
MAX_BATCH_BYTES: Final = 128 * 1024
_DECISION_FIELDS: Final = frozenset({"decision", "reason", "by"})
_BATCH_FIELDS: Final = frozenset({*_DECISION_FIELDS, "calls"})
_CALL_FIELDS: Final = frozenset({"run_id", "tool_call_id"})
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
_OPERATOR_ONLY_MESSAGE: Final = "Only the operator token decides; a run's token never does."
_DECISION_NOT_FOUND_MESSAGE: Final = "No call with this id in this run (it may have expired)."
_NOT_AWAITING_MESSAGE: Final = "The call is not a governed call awaiting a decision."
_ACCESS_DENIED_MESSAGE: Final = (
    "The server's Redis user may not record a decision: serve with a writer user."
)
_DECISION_QUERY_MESSAGE: Final = "A decision does not accept query parameters."


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


class BadRequest(InvalidArgument):
    """Raised when a decision's request cannot be taken; the HTTP status, code and message.

    The message is fixed per problem: what was sent is never echoed.
    """

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's members, refusing a key given twice (which one would win is moot)."""
    document: dict[str, Any] = {}
    for name, value in pairs:
        if name in document:
            raise BadRequest(400, "invalid_json", "The body names a member twice.")
        document[name] = value
    return document


def _no_constant(name: str) -> Any:
    raise BadRequest(400, "invalid_json", "The body is not JSON (NaN and Infinity are not).")


def _json_media_type(content_type: str) -> bool:
    """Tell whether a Content-Type is ``application/json`` naming no charset but UTF-8."""
    media_type, *parameters = content_type.split(";")
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in (
            "utf-8",
            "utf8",
        ):
            return False
    return media_type.strip().lower() == "application/json"


async def read_json_body(request: Request, max_bytes: int) -> Any:
    """The request's body as JSON: at most ``max_bytes``, ``application/json``, UTF-8.

    Raises:
        BadRequest: 415 ``unsupported_media_type`` for another content type; 400
            ``body_too_large`` past ``max_bytes`` (read no further), ``invalid_json`` for
            bytes that are not UTF-8 JSON (a member named twice included).

    """
    if not _json_media_type(request.headers.get("content-type", "")):
        raise BadRequest(415, "unsupported_media_type", "The body must be application/json.")
    too_large = BadRequest(400, "body_too_large", f"The body must be at most {max_bytes} bytes.")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > max_bytes:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise too_large
    try:
        return json.loads(
            body.decode("utf-8"), object_pairs_hook=_reject_duplicates, parse_constant=_no_constant
        )
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BadRequest(400, "invalid_json", "The body is not a UTF-8 JSON document.") from None


def _fields(body: Any, allowed: frozenset[str]) -> dict[str, Any]:
    """``body`` as an object holding exactly the ``allowed`` members."""
    if not isinstance(body, dict):
        raise BadRequest(400, "invalid_body", "The body must be a JSON object.")
    if set(body) - allowed:
        raise BadRequest(400, "unknown_field", "The body holds a member this route does not take.")
    missing = sorted(allowed - set(body))
    if missing:
        raise BadRequest(400, "missing_field", f"The body needs {missing[0]}.")
    return body


def _decision_fields(body: dict[str, Any]) -> tuple[bool, str, str]:
    """Whether the body approves, its reason and its approver, each checked."""
    decision = body["decision"]
    if not isinstance(decision, str) or decision not in ("approve", "deny"):
        raise BadRequest(400, "invalid_decision", 'decision is "approve" or "deny".')
    reason, by = body["reason"], body["by"]
    try:
        reason = checked_reason(reason if isinstance(reason, str) else "")
    except InvalidArgument:
        raise BadRequest(
            400,
            "invalid_reason",
            f"reason is printable text of 1 to {MAX_REASON_CHARS} characters.",
        ) from None
    try:
        by = checked_by(by if isinstance(by, str) else "")
    except InvalidArgument:
        raise BadRequest(
            400, "invalid_by", f"by is printable text of 1 to {MAX_APPROVER_CHARS} characters."
        ) from None
    return decision == "approve", reason, by


def _listed_calls(calls: Any) -> list[tuple[str, str]]:
    """The batch's calls, each a valid run id and tool call id, none twice."""
    if not isinstance(calls, list) or not 1 <= len(calls) <= MAX_BATCH_CALLS:
        raise BadRequest(400, "invalid_calls", f"calls is a list of 1 to {MAX_BATCH_CALLS} calls.")
    listed: list[tuple[str, str]] = []
    for call in calls:
        if (
            not isinstance(call, dict)
            or set(call) != _CALL_FIELDS
            or not is_run_id(call["run_id"])
            or not is_tool_call_id(call["tool_call_id"])
        ):
            raise BadRequest(
                400,
                "invalid_calls",
                'Each call is {"run_id": ..., "tool_call_id": ...}, both valid ids.',
            )
        listed.append((call["run_id"], call["tool_call_id"]))
    if len(set(listed)) != len(listed):
        raise BadRequest(400, "invalid_calls", "A call is listed twice.")
    return listed


def decision_document(result: CallDecision) -> dict[str, Any]:
    """One call's answer to a decision: the decision it holds, or why it holds none.

    Ids, the outcome, who decided and why; never a payload.
    """
    document: dict[str, Any] = {
        "run_id": result.run_id,
        "tool_call_id": result.tool_call_id,
        "invocation_id": result.invocation_id,
    }
    decision = result.decision
    if decision is None:
        document["error"] = result.problem
        if result.stage is not None:
            document["stage"] = result.stage
        return document
    document.update(
        approval_id=decision.approval_id,
        outcome=decision.outcome,
        decided_by=decision.decided_by,
        reason=decision.reason,
        decision_id=decision.decision_id,
        made_now=decision.made_now,
    )
    return document


async def _operator_denied(store: Store, gate: OperatorGate, request: Request) -> Response | None:
    """401, 403 or 429 unless the request carries the operator token; None when it does."""
    token = bearer_token(request)
    if token is None:
        return _unauthorized()
    client = request.client.host if request.client is not None else ""
    accepted, wait_s = gate.check(token, client)
    if wait_s:
        response = _error(429, "too_many_attempts", f"Too many wrong tokens: retry in {wait_s} s.")
        response.headers["Retry-After"] = str(wait_s)
        return response
    if accepted:
        return None
    run_id = await store.runs.authenticate(token)
    if run_id is not None:
        # A run's own token is no guess at the operator's: refused, never counted.
        log.warning("decision_refused", reason="run_token", run_id=run_id)
        return _error(403, "operator_token_required", _OPERATOR_ONLY_MESSAGE)
    gate.failed(client, token)
    return _unauthorized()


async def _decision_answer(store: Store, request: Request, route: str) -> Response:
    """Answer an operator's POST to a decision route (the token already checked)."""
    if request.scope.get("query_string"):
        return _error(400, "invalid_request", _DECISION_QUERY_MESSAGE)
    if route == "approvals":
        body = _fields(await read_json_body(request, MAX_BATCH_BYTES), _BATCH_FIELDS)
        approve, reason, by = _decision_fields(body)
        calls = _listed_calls(body["calls"])
        decision_id = new_approval_id()  # one decision, whatever calls it covers
        results = [
            await decide_call(
                store,
                run_id,
                tool_call_id,
                approve=approve,
                by=by,
                reason=reason,
                decision_id=decision_id,
                door="http",
            )
            for run_id, tool_call_id in calls
        ]
        return _json(
            200,
            {
                "schema_version": DECISIONS_SCHEMA,
                "decision_id": decision_id,
                "decisions": [decision_document(result) for result in results],
            },
        )
    match = _APPROVAL_PATH.fullmatch(request.scope["path"])
    assert match is not None
    run_id, inv_id = match.groups()
    if not is_invocation_id(inv_id):
        return _error(400, "invalid_request", _INVALID_ID_MESSAGE)
    body = _fields(await read_json_body(request, MAX_DECISION_BYTES), _DECISION_FIELDS)
    approve, reason, by = _decision_fields(body)
    if not is_run_id(run_id):
        return _error(404, "invocation_not_found", _DECISION_NOT_FOUND_MESSAGE)
    result = await decide_invocation(
        store,
        run_id,
        inv_id,
        approve=approve,
        by=by,
        reason=reason,
        decision_id=new_approval_id(),
        door="http",
    )
    if result.problem == "invocation_not_found":
        return _error(404, "invocation_not_found", _DECISION_NOT_FOUND_MESSAGE)
    if result.problem == "not_awaiting_approval":
        body = {"error": "not_awaiting_approval", "message": _NOT_AWAITING_MESSAGE}
        return _json(409, {**body, "stage": result.stage})
    return _json(200, {"schema_version": DECISION_SCHEMA, **decision_document(result)})


def _decision_route(request: Request) -> str | None:
    """``approval`` or ``approvals`` for a POST to a decision route, else None."""
    if request.method != "POST":
        return None
    path: str = request.scope["path"]
    if path == APPROVALS_PATH:
        return "approvals"
    return "approval" if _APPROVAL_PATH.fullmatch(path) else None


async def _answer(
    store: Store, request: Request, operator: OperatorGate | None = None
) -> tuple[Response, str]:
    if operator is not None and (route := _decision_route(request)) is not None:
        denied = await _operator_denied(store, operator, request)
        if denied is not None:
            return denied, route
        try:
            return await _decision_answer(store, request, route), route
        except BadRequest as bad:
            return _error(bad.status, bad.code, bad.message), route
        except AccessDenied:
            # Served as a Redis user that only reads (canon-reader): say so, not "unavailable".
            return _error(503, "store_access_denied", _ACCESS_DENIED_MESSAGE), route
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
    store: Store,
    *,
    metrics: Metrics | None = None,
    console: ASGIApp | None = None,
    operator: OperatorGate | None = None,
) -> Starlette:
    """Build the receipt API over ``store`` (which the caller opens and closes).

    Args:
        store: the store to read; the app writes to it only an operator's decisions.
        metrics: where request latency is recorded, if anywhere.
        console: the operator console answering under ``/console`` (404 there without
            one; see :mod:`projections.console`).
        operator: the operator token's check (the console's ``gate``); with it the
            decision routes answer, without it they do not exist (404).

    """

    async def answer(request: Request) -> Response:
        started = time.perf_counter()
        route = "other"
        try:
            response, route = await _answer(store, request, operator)
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
