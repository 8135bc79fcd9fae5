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

Three POST routes take an operator's word on governed calls, when the app has the
operators' credentials (``create_app(..., operator=...)``, the console's): ``POST
/v1/runs/<run id>/invocations/<invocation id>/approval`` decides one call (approve,
deny, or edit: the call superseded by one with the body's ``arguments``), ``POST
/v1/approvals`` one decision for up to 100 listed calls under one decision id, and
``POST /v1/runs/<run id>/invocations/<invocation id>/settlement`` settles a call whose
process died (``{"outcome": "executed" | "not_executed", "evidence": ...,
"request_again": bool}``: 200 with how it is settled; 409 ``call_still_running``,
``not_in_flight``, ``raw_response_recorded``, ``not_settled_not_executed`` or
``request_again_refused``). They take an operator's token only, and the decision is
recorded as made by the operator that token names (a ``by`` member of the body is
ignored): a run's token is 403 ``operator_token_required`` (an agent never decides, not
even its own call's fate), a wrong one 401 and counted against the console's allowance
of failed logins (429 past it); the operator who requested the call is refused (403
``requester_cannot_approve``). The body is one JSON object, 16 KiB at most (128 KiB for
a batch), checked whole before anything is decided; each problem is 400 with a stable
code (an object naming a member twice included). Without operators these routes do not
exist: a POST is answered as any other (401, or 404 with a run's token). Every other
route stays GET only, and no answer carries a payload.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, Protocol

import msgspec
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from eventstore.audit.run_calls import run_calls
from eventstore.boundary.contracts import RunContext
from eventstore.decisions import (
    MAX_REASON_CHARS,
    DecisionRequest,
    NotAwaitingApproval,
    new_approval_id,
)
from eventstore.errors import AccessDenied, InvalidArgument, Refused, StoreUnavailable
from eventstore.logs import get_logger
from eventstore.runs import RunInfo
from eventstore.settlements import MAX_EVIDENCE_CHARS, SettlementRequest, checked_evidence
from eventstore.store import Store
from eventstore.writer import now_ms
from machine.ids import invocation_id, is_invocation_id, is_run_id, is_tool_call_id
from machine.requests import DUPLICATE_MEMBER
from projections.facts import observed_facts
from projections.metrics import Metrics
from projections.operator_doors import (
    MAX_BATCH_CALLS,
    SETTLEMENT_PROBLEMS,
    CallDecision,
    CallSettlement,
    checked_reason,
    decide_call,
    decide_invocation,
    settle_invocation,
)
from projections.progress import read_view
from projections.receipts.builder import CAPABILITIES_SCHEMA, RECEIPT_SCHEMA, encode_receipt, iso_ms
from projections.receipts.inspection import (
    CapabilityChanged,
    InvocationNotFound,
    inspect_invocation,
)
from projections.routing import REST, RUN_ID, SEGMENT, ExactRoute, WrongMethod, described


class OperatorCheck(Protocol):
    """The operator token's check the decision routes need (the console's ``gate``).

    A protocol, so this module does not import the console's package (which imports it).
    """

    def check(self, token: str, client: str) -> tuple[str | None, int]:
        """The operator ``token`` names (None: none), and the seconds ``client`` must wait."""

    def failed(self, client: str, token: str) -> None:
        """Count a wrong ``token`` from ``client``."""


log = get_logger("canon.http")

CAPABILITIES_PATH: Final = "/v1/invocations/inspection-capabilities"
#: The batch decision route.
APPROVALS_PATH: Final = "/v1/approvals"
#: Where the scope keeps the run the request's token names (set before any route answers).
_RUN_SCOPE: Final = "canon.run"
SETTLEMENT_SCHEMA: Final = "canon.settlement.v1"
#: A settlement body's members: those it must hold, and the one it may.
_SETTLEMENT_FIELDS: Final = frozenset({"outcome", "evidence"})
_OPTIONAL_SETTLEMENT_FIELDS: Final = frozenset({"request_again", "by"})
PROGRESS_SCHEMA: Final = "canon.run-progress.v1"
DECISION_SCHEMA: Final = "canon.approval-decision.v1"
DECISIONS_SCHEMA: Final = "canon.approval-decisions.v1"
#: Largest decision body accepted (bytes): one call's, and a batch's of up to 100 calls.
MAX_DECISION_BYTES: Final = 16 * 1024
MAX_BATCH_BYTES: Final = 128 * 1024
#: A decision body's members: those it must hold, and those it may.
_DECISION_FIELDS: Final = frozenset({"decision", "reason"})
_OPTIONAL_DECISION_FIELDS: Final = frozenset({"by", "arguments"})
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
_OPERATOR_ONLY_MESSAGE: Final = "Only an operator's token decides; a run's token never does."
_REQUESTER_MESSAGE: Final = "The operator who requested the call cannot approve it."
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
    """Return every call of the run in order, as served: ids, tool, status, times, no payload.

    ``stage`` is where each stands beside its status (:class:`machine.phases.Phase`).
    """
    calls = [
        {
            "invocation_id": row.invocation_id,
            "tool_call_id": row.tool_call_id,
            "tool": row.tool,
            "status": row.status,
            "stage": row.phase,
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
            raise BadRequest(400, "invalid_json", f"The body is refused: {DUPLICATE_MEMBER}.")
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
    except BadRequest:
        raise  # a member named twice: said as every door says it
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BadRequest(400, "invalid_json", "The body is not a UTF-8 JSON document.") from None


def _fields(
    body: Any, required: frozenset[str], optional: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """``body`` as an object holding the ``required`` members and maybe ``optional`` ones."""
    if not isinstance(body, dict):
        raise BadRequest(400, "invalid_body", "The body must be a JSON object.")
    if set(body) - required - optional:
        raise BadRequest(400, "unknown_field", "The body holds a member this route does not take.")
    missing = sorted(required - set(body))
    if missing:
        raise BadRequest(400, "missing_field", f"The body needs {missing[0]}.")
    return body


def _decision_fields(body: dict[str, Any], operator: str, *, edits: bool) -> DecisionRequest:
    """The decision the body asks for, as ``operator`` makes it, each member checked.

    ``decision`` is ``approve`` or ``deny`` (or, where ``edits``, ``edit``: its
    ``arguments`` are then the edited request); a ``by`` member names no one (the
    operator the token names decides) and is ignored.
    """
    decision = body["decision"]
    choices = ("approve", "deny", "edit") if edits else ("approve", "deny")
    if not isinstance(decision, str) or decision not in choices:
        shown = " or ".join(f'"{choice}"' for choice in choices)
        raise BadRequest(400, "invalid_decision", f"decision is {shown}.")
    if (decision == "edit") != ("arguments" in body):
        raise BadRequest(
            400, "invalid_arguments", 'arguments come with "decision": "edit", and only then.'
        )
    reason = body["reason"]
    try:
        reason = checked_reason(reason if isinstance(reason, str) else "")
    except InvalidArgument:
        raise BadRequest(
            400,
            "invalid_reason",
            f"reason is printable text of 1 to {MAX_REASON_CHARS} characters.",
        ) from None
    return DecisionRequest(approve=decision == "approve", by=operator, reason=reason)


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
        approvals=decision.approvals,
        approvals_required=decision.approvals_required,
    )
    return document


async def _operator(store: Store, gate: OperatorCheck, request: Request) -> str | Response:
    """The operator the request's token names; else the 401, 403 or 429 to answer."""
    token = bearer_token(request)
    if token is None:
        return _unauthorized()
    client = request.client.host if request.client is not None else ""
    operator, wait_s = gate.check(token, client)
    if wait_s:
        response = _error(429, "too_many_attempts", f"Too many wrong tokens: retry in {wait_s} s.")
        response.headers["Retry-After"] = str(wait_s)
        return response
    if operator is not None:
        return operator
    run_id = await store.runs.authenticate(token)
    if run_id is not None:
        # A run's own token is no guess at the operator's: refused, never counted.
        log.warning("decision_refused", reason="run_token", run_id=run_id)
        return _error(403, "operator_token_required", _OPERATOR_ONLY_MESSAGE)
    gate.failed(client, token)
    return _unauthorized()


async def _approvals_answer(store: Store, request: Request, operator: str) -> Response:
    """Answer ``operator``'s one decision on a batch of listed calls."""
    if request.scope.get("query_string"):
        return _error(400, "invalid_request", _DECISION_QUERY_MESSAGE)
    body = _fields(await read_json_body(request, MAX_BATCH_BYTES), _BATCH_FIELDS, frozenset({"by"}))
    # One decision, whatever calls it covers: one decision id.
    decision = msgspec.structs.replace(
        _decision_fields(body, operator, edits=False), decision_id=new_approval_id()
    )
    calls = _listed_calls(body["calls"])
    results = [
        await decide_call(store, run_id, tool_call_id, decision, "http")
        for run_id, tool_call_id in calls
    ]
    return _json(
        200,
        {
            "schema_version": DECISIONS_SCHEMA,
            "decision_id": decision.decision_id,
            "decisions": [decision_document(result) for result in results],
        },
    )


async def _approval_answer(store: Store, request: Request, operator: str) -> Response:
    """Answer ``operator``'s decision on the one call the path names."""
    if request.scope.get("query_string"):
        return _error(400, "invalid_request", _DECISION_QUERY_MESSAGE)
    run_id, inv_id = request.path_params["run_id"], request.path_params["invocation_id"]
    if not is_invocation_id(inv_id):
        return _error(400, "invalid_request", _INVALID_ID_MESSAGE)
    body = _fields(
        await read_json_body(request, MAX_DECISION_BYTES),
        _DECISION_FIELDS,
        _OPTIONAL_DECISION_FIELDS,
    )
    decision = _decision_fields(body, operator, edits=True)
    if not is_run_id(run_id):
        return _error(404, "invocation_not_found", _DECISION_NOT_FOUND_MESSAGE)
    if body["decision"] == "edit":
        return await _edit_answer(store, run_id, inv_id, body["arguments"], decision)
    result = await decide_invocation(store, run_id, inv_id, decision, "http")
    if result.problem == "invocation_not_found":
        return _error(404, "invocation_not_found", _DECISION_NOT_FOUND_MESSAGE)
    if result.problem == "requester_cannot_approve":
        return _error(403, "requester_cannot_approve", _REQUESTER_MESSAGE)
    if result.problem == "not_awaiting_approval":
        body = {"error": "not_awaiting_approval", "message": _NOT_AWAITING_MESSAGE}
        return _json(409, {**body, "stage": result.stage})
    return _json(200, {"schema_version": DECISION_SCHEMA, **decision_document(result)})


async def _edit_answer(
    store: Store, run_id: str, inv_id: str, arguments: Any, decision: DecisionRequest
) -> Response:
    """Supersede one waiting call by an edited one, as the operator ``decision`` names."""
    tool_call_id = await store.runs.tool_call_id_of(run_id, inv_id)
    if tool_call_id is None:
        return _error(404, "invocation_not_found", _DECISION_NOT_FOUND_MESSAGE)
    if not isinstance(arguments, dict):
        return _error(400, "invalid_arguments", "arguments is the edited request: a JSON object.")
    try:
        edit = await store.decisions.supersede(
            run_id, tool_call_id, arguments, by=decision.by, reason=decision.reason
        )
    except NotAwaitingApproval as exc:
        if exc.stage is None:
            return _error(404, "invocation_not_found", _DECISION_NOT_FOUND_MESSAGE)
        body = {"error": "not_awaiting_approval", "message": _NOT_AWAITING_MESSAGE}
        return _json(409, {**body, "stage": exc.stage.value})
    except InvalidArgument as exc:
        return _error(400, "invalid_arguments", f"{str(exc).capitalize()}.")
    except Refused as refused:
        return _error(409, "edit_refused", f"The run refused the edited call: {refused.code}.")
    result = CallDecision(
        run_id=run_id, tool_call_id=tool_call_id, invocation_id=inv_id, decision=edit.original
    )
    document = {"schema_version": DECISION_SCHEMA, **decision_document(result)}
    document["edited"] = None
    if edit.edited is not None:
        document["edited"] = {
            "tool_call_id": edit.edited,
            "invocation_id": invocation_id(run_id, edit.edited),
        }
    return _json(200, document)


def settlement_document(result: CallSettlement) -> dict[str, Any]:
    """One call's answer to a settlement: how it is settled, and a call requested again."""
    done = result.settlement
    assert done is not None
    return {
        "schema_version": SETTLEMENT_SCHEMA,
        "run_id": result.run_id,
        "tool_call_id": result.tool_call_id,
        "invocation_id": result.invocation_id,
        "settled_as": done.settled_as,
        "settled_by": done.settled_by,
        "error_code": done.error_code,
        "made_now": done.made_now,
        "requested_again": None
        if done.requested_again is None
        else {
            "tool_call_id": done.requested_again,
            "invocation_id": invocation_id(result.run_id, done.requested_again),
        },
    }


async def _settlement_answer(store: Store, request: Request, operator: str) -> Response:
    """Answer ``operator``'s settlement of one call whose process died."""
    if request.scope.get("query_string"):
        return _error(400, "invalid_request", _DECISION_QUERY_MESSAGE)
    run_id, inv_id = request.path_params["run_id"], request.path_params["invocation_id"]
    if not is_invocation_id(inv_id):
        return _error(400, "invalid_request", _INVALID_ID_MESSAGE)
    body = _fields(
        await read_json_body(request, MAX_DECISION_BYTES),
        _SETTLEMENT_FIELDS,
        _OPTIONAL_SETTLEMENT_FIELDS,
    )
    outcome, again = body["outcome"], body.get("request_again", False)
    if outcome not in ("executed", "not_executed"):
        raise BadRequest(400, "invalid_outcome", 'outcome is "executed" or "not_executed".')
    if not isinstance(again, bool) or (again and outcome == "executed"):
        raise BadRequest(
            400, "invalid_request_again", 'request_again is true only with "not_executed".'
        )
    evidence = body["evidence"]
    try:
        evidence = checked_evidence(evidence if isinstance(evidence, str) else "")
    except InvalidArgument:
        raise BadRequest(
            400,
            "invalid_evidence",
            f"evidence is printable text of 1 to {MAX_EVIDENCE_CHARS} characters.",
        ) from None
    if not is_run_id(run_id):
        return _error(404, "invocation_not_found", _DECISION_NOT_FOUND_MESSAGE)
    settling = SettlementRequest(executed=outcome == "executed", by=operator, evidence=evidence)
    result = await settle_invocation(store, run_id, inv_id, settling, again, "http")
    problem = result.problem
    if problem == "invocation_not_found":
        return _error(404, "invocation_not_found", _DECISION_NOT_FOUND_MESSAGE)
    if problem is not None:
        document: dict[str, Any] = {"error": problem, "message": SETTLEMENT_PROBLEMS[problem]}
        if result.stage is not None:
            document["stage"] = result.stage
        if result.lease_until_ms is not None:
            document["lease_until"] = iso_ms(result.lease_until_ms)
        if result.refused_code is not None:
            document["code"] = result.refused_code
        return _json(409, document)
    return _json(200, settlement_document(result))


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


def _operators_only(
    answer: Callable[[Store, Request, str], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """A decision route's endpoint: the operator's token checked, then ``answer``.

    A request's problem (:class:`BadRequest`) is answered with its status and code; a
    Redis user that only reads says so.
    """

    async def endpoint(request: Request) -> Response:
        store: Store = request.app.state.store
        named = await _operator(store, request.app.state.operator, request)
        if isinstance(named, Response):
            return named
        try:
            return await answer(store, request, named)
        except BadRequest as bad:
            return _error(bad.status, bad.code, bad.message)
        except AccessDenied:
            # Served as a Redis user that only reads (canon-reader): say so, not "unavailable".
            return _error(503, "store_access_denied", _ACCESS_DENIED_MESSAGE)

    endpoint.__name__ = answer.__name__
    return endpoint


def _query_refused(request: Request) -> Response | None:
    """The 400 for a query string (no read route takes one), checked before any record."""
    if request.scope.get("query_string"):
        return _error(400, "invalid_request", _QUERY_MESSAGE)
    return None


def _run_of(request: Request) -> RunInfo:
    """The run the request's token names (checked before the route answered)."""
    run: RunInfo = request.scope[_RUN_SCOPE]
    return run


async def _capabilities(request: Request) -> Response:
    """``GET /v1/invocations/inspection-capabilities``."""
    return _query_refused(request) or _json(200, _CAPABILITIES)


async def _receipt(request: Request) -> Response:
    """``GET /v1/invocations/<invocation id>/receipt``, for the token's run only."""
    refused = _query_refused(request)
    if refused is not None:
        return refused
    segment: str = request.path_params["invocation_id"]
    if not is_invocation_id(segment):
        # Fixed message: the segment is never echoed back.
        return _error(400, "invalid_request", _INVALID_ID_MESSAGE)
    run = _run_of(request)
    status, body = await receipt_answer(request.app.state.store, run.run_id, segment, run=run)
    return _json(status, body)


async def _progress(request: Request) -> Response:
    """``GET /v1/runs/<run id>/progress``, the token's own run only."""
    refused = _query_refused(request) or _other_run(request)
    if refused is not None:
        return refused
    return _json(200, await progress_document(request.app.state.store, _run_of(request).run_id))


async def _invocations(request: Request) -> Response:
    """``GET /v1/runs/<run id>/invocations``, the token's own run only."""
    refused = _query_refused(request) or _other_run(request)
    if refused is not None:
        return refused
    document = await invocations_document(request.app.state.store, _run_of(request).run_id)
    return _json(200, document)


def _other_run(request: Request) -> Response | None:
    """404 ``run_not_found`` when the path names a run other than the token's."""
    if request.path_params["run_id"] != _run_of(request).run_id:
        return _error(404, "run_not_found", _RUN_NOT_FOUND_MESSAGE)
    return None


#: The routes a run's token reads (GET only: HEAD and the rest are paths not served).
READ_ROUTES: Final = (
    ExactRoute(CAPABILITIES_PATH, _capabilities, methods=["GET"], name="capabilities"),
    ExactRoute(
        f"/v1/invocations/{{invocation_id:{SEGMENT}}}/receipt",
        _receipt,
        methods=["GET"],
        name="receipt",
    ),
    ExactRoute(
        f"/v1/runs/{{run_id:{RUN_ID}}}/progress", _progress, methods=["GET"], name="progress"
    ),
    ExactRoute(
        f"/v1/runs/{{run_id:{RUN_ID}}}/invocations",
        _invocations,
        methods=["GET"],
        name="invocations",
    ),
)
#: The routes an operator's token decides on (they exist only with the operators').
# Any segment for the ids, so an operator's malformed id is told apart from another path.
OPERATOR_ROUTES: Final = (
    ExactRoute(
        f"/v1/runs/{{run_id:{SEGMENT}}}/invocations/{{invocation_id:{SEGMENT}}}/approval",
        _operators_only(_approval_answer),
        methods=["POST"],
        name="approval",
    ),
    ExactRoute(
        APPROVALS_PATH, _operators_only(_approvals_answer), methods=["POST"], name="approvals"
    ),
    ExactRoute(
        f"/v1/runs/{{run_id:{SEGMENT}}}/invocations/{{invocation_id:{SEGMENT}}}/settlement",
        _operators_only(_settlement_answer),
        methods=["POST"],
        name="settlement",
    ),
)
#: Every route served, as ``canon serve --help`` lists them (read from the tables; the
#: POST routes need the operator token).
ROUTES: Final = described((*READ_ROUTES, *OPERATOR_ROUTES))


def _matched(routes: Sequence[BaseRoute], scope: Scope) -> str | None:
    """The name of the route of ``routes`` that answers ``scope`` (path and method), if any."""
    for route in routes:
        if route.matches(scope)[0] is Match.FULL:
            return getattr(route, "name", None) or "other"
    return None


async def _not_served(request: Request, exc: Exception) -> Response:
    """A path no route has, or a method its route does not serve: 404 ``not_found``."""
    return _error(404, "not_found")


async def _console_off(request: Request) -> Response:
    return _error(404, "not_found", _CONSOLE_OFF_MESSAGE)


class _RunTokenFirst:
    """ASGI middleware: the run's token is checked before any route answers.

    The console (its own authentication) and the decision routes (an operator's token)
    pass on; any other request without a valid run token is 401, whatever its path or
    method. Each answer but the console's is timed under its route's name, and a store
    failure (503) or anything unexpected (500) is answered without details.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        store: Store,
        metrics: Metrics | None,
        console: Sequence[BaseRoute],
        routes: Sequence[BaseRoute],
        operators: Sequence[BaseRoute],
    ) -> None:
        self.app = app
        self._store, self._metrics = store, metrics
        self._console, self._routes, self._operators = console, routes, operators

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer an HTTP request past the token; pass the console's and lifespan on."""
        if scope["type"] != "http" or _matched(self._console, scope) is not None:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        route = _matched(self._routes, scope) or "other"
        status = 500
        answered = False

        async def timed_send(message: Message) -> None:
            nonlocal status, answered
            if message["type"] == "http.response.start":
                status, answered = message["status"], True
            await send(message)

        try:
            if _matched(self._operators, scope) is not None:
                await self.app(scope, receive, timed_send)
            else:
                run = await _open_run(self._store, Request(scope, receive))
                if run is None:
                    route = "unauthorized"
                    await _unauthorized()(scope, receive, timed_send)
                else:
                    scope[_RUN_SCOPE] = run
                    await self.app(scope, receive, timed_send)
        except StoreUnavailable:
            if answered:
                raise
            await _error(503, "store_unavailable")(scope, receive, timed_send)
        except Exception as exc:
            if answered:
                raise
            log.error("request_failed", error=type(exc).__name__)
            await _error(500, "internal_error")(scope, receive, timed_send)
        if self._metrics is not None:
            self._metrics.http_latency.labels(route, str(status)).observe(
                time.perf_counter() - started
            )


def create_app(
    store: Store,
    *,
    metrics: Metrics | None = None,
    console: ASGIApp | None = None,
    operator: OperatorCheck | None = None,
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
    # The console has its own authentication (the operator token) and routes.
    answer_console: Any = console if console is not None else _console_off
    console_routes = [
        ExactRoute(CONSOLE_PREFIX, answer_console, name="console"),
        ExactRoute(f"{CONSOLE_PREFIX}/{{page:{REST}}}", answer_console, name="console_pages"),
    ]
    operators = OPERATOR_ROUTES if operator is not None else ()
    routes = [*READ_ROUTES, *operators]
    app = Starlette(
        routes=[*console_routes, *routes],
        middleware=[
            Middleware(NoStoreMiddleware),
            Middleware(
                _RunTokenFirst,
                store=store,
                metrics=metrics,
                console=console_routes,
                routes=routes,
                operators=operators,
            ),
        ],
        exception_handlers={404: _not_served, WrongMethod: _not_served},
    )
    # A path with a slash more or less is another path, not a redirect.
    app.router.redirect_slashes = False
    app.state.store, app.state.operator = store, operator
    return app
