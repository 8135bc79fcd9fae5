"""The operator console: server-rendered pages under ``/console/`` (Jinja2, no scripts).

Every page needs the operator token: a ``Authorization: Bearer <token>`` header, or the
cookie the login form sets (a session of this process, never the token itself,
:mod:`.auth`). The cookie is HttpOnly, SameSite=Strict, ``Path=/console/``, lives as long
as the session, is named for this console instance (``canon_console_<random>``: browsers
send a host's cookies to every port, and two consoles on one host never read each
other's), and is ``Secure`` when the request came over HTTPS (as uvicorn reports it, also
from a trusted proxy's ``X-Forwarded-Proto``) or when the console is told so. Without a
credential a page answers 401 with ``WWW-Authenticate: Bearer`` and the login form.

Failed token checks are limited per client address and overall (:class:`.LoginThrottle`):
past the limit a token is not even checked, the answer is 429 with ``Retry-After``.

Every change is a POST carrying the CSRF token of the login session (a hidden ``csrf``
field, compared in constant time): without it, or with a wrong one, 403 and nothing
changes. The changes are logging out and an operator's decisions on governed calls: one
call (from the approvals page or the call's page) or a batch of the calls ticked on the
approvals page, under one decision id, each recorded as decided by the console's operator
name. A decision answers 303 back to the page it came from, which then says once what
happened to each call. A form that cannot be read (too large, too many, repeated, unknown
or missing fields, not UTF-8, not ``application/x-www-form-urlencoded``) is 400 with one
``console_form_refused`` log line naming the reason, never what was posted.

Pages (every GET) only read the store; the harness-only payloads of a call have their own
page, reached by an explicit link, except a waiting call's frozen request, shown masked
beside the form that decides it. No page grows with the store (:mod:`.views`), and every text
shown goes through :func:`.views.visible`, so an id's bidi control is shown as an escape.
Nothing a page shows is logged: a failure is logged by exception type only.
"""

from __future__ import annotations

import importlib.resources
import re
import secrets
from collections import OrderedDict
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.types import Receive, Scope, Send

from eventstore.audit.run_index import RUNS_SHOWN, RunFilter
from eventstore.decisions import MAX_REASON_CHARS, new_approval_id
from eventstore.errors import AccessDenied, InvalidArgument, StoreUnavailable
from eventstore.logs import get_logger
from machine.ids import is_invocation_id, is_run_id
from projections.console import views
from projections.console.auth import MAX_SESSIONS, LoginThrottle, OperatorAuth, OperatorGate
from projections.console.timeline import LEGEND, duration_text
from projections.decisions import (
    MAX_BATCH_CALLS,
    CallDecision,
    checked_by,
    checked_reason,
    decide_invocation,
    notice,
)
from projections.http import CONSOLE_PREFIX, bearer_token
from projections.receipts.builder import iso_ms

log = get_logger("canon.console")

#: Every console route (kept apart from projections.http.ROUTES: these take the operator
#: token, not a run's).
CONSOLE_ROUTES: Final = (
    "GET /console/",
    "GET /console/login",
    "POST /console/login",
    "POST /console/logout",
    "GET /console/search",
    "GET /console/approvals",
    "POST /console/approvals",
    "GET /console/live.js",
    "GET /console/runs/<run id>",
    "GET /console/runs/<run id>/invocations/<invocation id>",
    "POST /console/runs/<run id>/invocations/<invocation id>/approval",
    "GET /console/runs/<run id>/invocations/<invocation id>/payloads",
)
#: Who the console's decisions are recorded as decided by, unless it is told a name.
DEFAULT_OPERATOR_NAME: Final = "console operator"
#: Every console's cookie name starts so; the rest is chosen when the console starts.
COOKIE_PREFIX: Final = "canon_console_"
#: The runs page; also the cookie's path: the console's pages, nothing else the host serves.
CONSOLE_HOME: Final = CONSOLE_PREFIX + "/"
_RUN: Final = re.compile(r"/console/runs/([^/]+)")
_CALL: Final = re.compile(r"/console/runs/([^/]+)/invocations/([^/]+)(/payloads)?")
_DECIDE: Final = re.compile(r"/console/runs/([^/]+)/invocations/([^/]+)/approval")
_PAGE_NUMBER: Final = re.compile(r"[1-9][0-9]{0,5}")
#: Longest value of a filter or search field (a tool name, a code, an id prefix).
_MAX_QUERY_VALUE: Final = 200
#: The script that refreshes a page of a run in progress (the only script the console has).
_LIVE_SCRIPT: Final = (
    importlib.resources.files("projections.console").joinpath("live.js").read_bytes()
)
_FORM_TYPE: Final = "application/x-www-form-urlencoded"
_MAX_FORM_BYTES: Final = 4096
_MAX_FORM_FIELDS: Final = 8
# A decision's reason may be 1,000 characters, each up to 9 bytes percent-encoded, and a
# batch lists up to 100 calls of about 200 bytes each: bounded, but more than a login.
_MAX_DECISION_FORM_BYTES: Final = 32 * 1024
_DECISION_FIELDS: Final = frozenset({"csrf", "decision", "reason", "next"})
_BATCH_FIELDS: Final = frozenset({"csrf", "decision", "reason", "call"})
_HEADERS: Final = {
    # No frame, no outside resource, no inline script: the pages are HTML and inline SVG,
    # and the one script is the console's own file, which only fetches console pages.
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "script-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


_RUNS_QUERY: Final = frozenset({"cursor", "status", "tool", "code", "q"})
_RUN_QUERY: Final = frozenset({"page", "status", "tool", "code"})


class FormRefused(InvalidArgument):
    """Raised when a posted console form cannot be read; ``reason`` is what is logged."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the form cannot be read ({reason})")
        self.reason = reason


def _shown(value: Any) -> Any:
    """Every ``{{ }}`` of a page: text through :func:`.views.visible`, the rest as is."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return views.visible(value)
    return value


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("projections.console", "templates"),
        autoescape=select_autoescape(default=True),
        undefined=StrictUndefined,
        finalize=_shown,
    )
    env.filters["iso"] = lambda ms: iso_ms(ms) if ms else "-"
    env.filters["duration"] = duration_text
    env.globals["legend"] = LEGEND
    env.globals["events_shown"] = views.EVENTS_SHOWN
    env.globals["detail_shown_chars"] = views.DETAIL_SHOWN_CHARS
    env.globals["max_reason_chars"] = MAX_REASON_CHARS
    env.globals["max_batch_calls"] = MAX_BATCH_CALLS
    return env


def _next_path(value: str | None) -> str:
    """Where a login goes on: a console page only (never another site or route)."""
    if (
        value
        and value.startswith(CONSOLE_HOME)
        and value.isascii()
        and value.isprintable()
        and "//" not in value
        and "\\" not in value
    ):
        return value
    return CONSOLE_HOME


def read_query(request: Request, allowed: frozenset[str]) -> dict[str, str] | None:
    """A page's query fields, each in ``allowed`` and given once; an empty one is left out.

    None when a field is unknown or repeated, or a value is longer than 200 characters or
    not printable (a filter's form sends its empty fields too: those mean "any").
    """
    query = request.query_params
    if set(query) - allowed:
        return None
    fields: dict[str, str] = {}
    for name in query:
        values = query.getlist(name)
        if len(values) != 1:
            return None
        value = values[0]
        if len(value) > _MAX_QUERY_VALUE or not value.isprintable():
            return None
        if value:
            fields[name] = value
    return fields


def _page_number(value: str | None) -> int | None:
    """A ``page`` field's number (1 without one), or None when it is not one."""
    if value is None:
        return 1
    return int(value) if _PAGE_NUMBER.fullmatch(value) else None


def _utf8_charset(parameters: str) -> bool:
    """Tell whether a content type's parameters name no charset other than UTF-8."""
    for parameter in parameters.split(";"):
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in (
            "utf-8",
            "utf8",
        ):
            return False
    return True


async def read_form(request: Request, allowed: frozenset[str]) -> dict[str, str]:
    """Read an urlencoded form of at most 4 KiB, each of its fields in ``allowed``, once.

    An empty body is an empty form, whatever its content type.

    Raises:
        FormRefused: the body is too large, not ``application/x-www-form-urlencoded``
            (UTF-8), not UTF-8 once decoded, holds more than 8 fields, a field without
            ``=``, a field twice or a field not allowed.

    """
    form = await read_form_values(request, allowed)
    return {name: values[0] for name, values in form.items()}


async def read_form_values(
    request: Request,
    allowed: frozenset[str],
    *,
    repeated: frozenset[str] = frozenset(),
    max_bytes: int = _MAX_FORM_BYTES,
    max_fields: int = _MAX_FORM_FIELDS,
) -> dict[str, list[str]]:
    """Read an urlencoded form: each field's values, in the order posted.

    As :func:`read_form`, with ``max_bytes`` and ``max_fields`` for its limits, and the
    fields of ``repeated`` (a form's checkboxes) allowed more than once.

    Raises:
        FormRefused: as :func:`read_form` says.

    """
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > max_bytes:
        raise FormRefused("too_large")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise FormRefused("too_large")
    if not body:
        return {}
    media_type, _, parameters = request.headers.get("content-type", "").partition(";")
    if media_type.strip().lower() != _FORM_TYPE or not _utf8_charset(parameters):
        raise FormRefused("content_type")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise FormRefused("encoding") from None
    if text.count("&") >= max_fields:
        raise FormRefused("too_many_fields")
    try:
        pairs = parse_qsl(
            text,
            keep_blank_values=True,
            strict_parsing=True,
            errors="strict",
            max_num_fields=max_fields,
        )
    except UnicodeDecodeError:
        raise FormRefused("encoding") from None
    except ValueError:
        raise FormRefused("malformed") from None
    form: dict[str, list[str]] = {}
    for name, value in pairs:
        if name not in allowed:
            raise FormRefused("unknown_field")
        if name in form and name not in repeated:
            raise FormRefused("repeated_field")
        form.setdefault(name, []).append(value)
    return form


def _one(form: dict[str, list[str]], name: str) -> str | None:
    """The one value of a form's field, or None without one."""
    values = form.get(name)
    return values[0] if values else None


_REASON_NEEDED: Final = (
    f"Nothing was decided: a decision needs a reason, one line of 1 to {MAX_REASON_CHARS} "
    "printable characters."
)


def _client(request: Request) -> str:
    """The client's address (a trusted proxy's X-Forwarded-For, as uvicorn applies it)."""
    return request.client.host if request.client is not None else ""


class Console:
    """The console's ASGI app over one store, for one operator token."""

    def __init__(
        self,
        store: Any,
        auth: OperatorAuth,
        *,
        secure_cookie: bool = False,
        cookie_name: str | None = None,
        throttle: LoginThrottle | None = None,
        operator_name: str = DEFAULT_OPERATOR_NAME,
    ) -> None:
        """Serve ``store`` to whoever holds the token ``auth`` checks.

        Args:
            store: the store to read (a :class:`~eventstore.store.Store`).
            auth: the operator token and sessions.
            secure_cookie: mark the login cookie ``Secure`` on every answer, also over
                plain HTTP (TLS ended by a proxy that does not say so); over HTTPS it
                always is.
            cookie_name: the login cookie's name (else ``canon_console_`` and a random
                suffix chosen now).
            throttle: the limit on failed logins (else a new one with the defaults).
            operator_name: who the console's decisions are recorded as decided by (one
                token, so one name: every holder of the token decides as it).

        Raises:
            InvalidArgument: ``operator_name`` is empty, not printable or over 200
                characters.

        """
        self._store = store
        self._auth = auth
        self._secure = secure_cookie
        self.cookie_name = cookie_name or COOKIE_PREFIX + secrets.token_hex(4)
        #: The operator token's check and its limit on failures; the HTTP API's decision
        #: routes take the same (``create_app(..., operator=console.gate)``).
        self.gate = OperatorGate(auth, throttle)
        self.operator_name = checked_by(operator_name)
        # What the next page of a session says after a decision it posted: one entry per
        # session (keyed by its CSRF token), taken by the page it was sent back to.
        self._notices: OrderedDict[str, tuple[str, list[str]]] = OrderedDict()
        self._env = _environment()
        self._env.globals["operator_name"] = self.operator_name

    def _cookie(self, request: Request) -> str | None:
        return request.cookies.get(self.cookie_name)

    def _page(self, request: Request, template: str, code: int = 200, **context: Any) -> Response:
        csrf = self._auth.csrf_token(self._cookie(request))
        notices = self._take_notices(csrf, request.scope["path"])
        html = self._env.get_template(template).render(csrf=csrf, notices=notices, **context)
        return HTMLResponse(html, status_code=code, headers=_HEADERS)

    def _take_notices(self, csrf: str | None, path: str) -> list[str]:
        """What the session was told to say on ``path`` (once), or nothing."""
        told = self._notices.get(csrf) if csrf is not None else None
        if csrf is None or told is None or told[0] != path:
            return []
        del self._notices[csrf]
        return told[1]

    def _tell(self, request: Request, path: str, notices: list[str]) -> None:
        """Keep what the session's next visit to ``path`` says (the page a POST goes back to)."""
        csrf = self._auth.csrf_token(self._cookie(request))
        if csrf is None:
            return
        self._notices.pop(csrf, None)
        self._notices[csrf] = (path, notices)
        while len(self._notices) > MAX_SESSIONS:
            self._notices.popitem(last=False)

    def _back(self, request: Request, to: str, notices: list[str]) -> Response:
        """303 to the console page ``to``, which then says ``notices`` once."""
        self._tell(request, urlsplit(to).path, notices)
        return RedirectResponse(to, status_code=303, headers=_HEADERS)

    def _login(
        self, request: Request, status: int, next_path: str, error: str | None = None
    ) -> Response:
        response = self._page(request, "login.html", status, next_path=next_path, error=error)
        if status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="canon-console"'
        return response

    def _error(self, request: Request, status: int, message: str) -> Response:
        return self._page(request, "error.html", status, status=status, message=message)

    def _throttled(self, request: Request, wait_s: int, next_path: str | None = None) -> Response:
        message = f"Too many failed logins: try again in {wait_s} s."
        if next_path is None:
            response = self._error(request, 429, message)
        else:
            response = self._login(request, 429, next_path, message)
        response.headers["Retry-After"] = str(wait_s)
        return response

    def _refused(self, request: Request, refused: FormRefused) -> Response:
        log.warning("console_form_refused", reason=refused.reason, route=request.scope["path"])
        return self._error(request, 400, "That form could not be read: use the console's own.")

    def _unauthorized(self, request: Request) -> Response | None:
        """401 or 429 when the request holds no valid credential; None when it does."""
        path: str = request.scope["path"]
        token = bearer_token(request)
        if token is None:
            if self._auth.check_session(self._cookie(request)):
                return None
            return self._login(request, 401, _next_path(path))
        client = _client(request)
        accepted, wait_s = self.gate.check(token, client)
        if wait_s:
            return self._throttled(request, wait_s)
        if accepted:
            return None
        self.gate.failed(client, token)  # a value too short to be the token is not counted
        return self._login(request, 401, _next_path(path))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer one request under ``/console``."""
        request = Request(scope, receive)
        try:
            response = await self._answer(request)
        except ClientDisconnect:
            return  # nobody is left to answer
        except StoreUnavailable:
            response = self._error(request, 503, "The store is unavailable; try again.")
        except Exception as exc:
            log.error("console_failed", error=type(exc).__name__)
            response = self._error(request, 500, "Something went wrong; the server log names it.")
        await response(scope, receive, send)

    def _set_cookie(self, request: Request, response: Response, value: str, max_age: int) -> None:
        response.set_cookie(
            self.cookie_name,
            value,
            max_age=max_age,
            path=CONSOLE_HOME,
            secure=self._secure or request.scope.get("scheme") == "https",
            httponly=True,
            samesite="strict",
        )

    async def _log_in(self, request: Request) -> Response:
        client = _client(request)
        wait_s = self.gate.retry_after_s(client)
        if wait_s:
            return self._throttled(request, wait_s, CONSOLE_HOME)
        try:
            form = await read_form(request, frozenset({"token", "next"}))
            if "token" not in form:
                raise FormRefused("missing_field")
        except FormRefused as refused:
            return self._refused(request, refused)
        next_path = _next_path(form.get("next"))
        token = form["token"]
        if not self._auth.check_token(token):
            self.gate.failed(client, token)
            return self._login(request, 401, next_path, "That is not the operator token.")
        response = RedirectResponse(next_path, status_code=303, headers=_HEADERS)
        session = self._auth.start_session()
        self._set_cookie(request, response, session, max(int(self._auth.session_ttl_s), 0))
        return response

    async def _log_out(self, request: Request) -> Response:
        try:
            form = await read_form(request, frozenset({"csrf"}))
        except FormRefused as refused:
            return self._refused(request, refused)
        cookie = self._cookie(request)
        if not self._auth.check_csrf(cookie, form.get("csrf")):
            log.warning("console_change_refused", reason="csrf", route=request.scope["path"])
            return self._error(
                request, 403, "Refused: a change needs your login session's form token."
            )
        self._auth.end_session(cookie)
        response = RedirectResponse("/console/login", status_code=303, headers=_HEADERS)
        self._set_cookie(request, response, "", 0)
        return response

    async def _reveal(self, request: Request, run_id: str, inv_id: str) -> Response:
        """The payloads page with nothing masked, for a POST with the session's CSRF token.

        Each reveal is logged (``payloads_revealed``, naming the run and the invocation
        only), so an audit of the console's log shows who could have seen what, when.
        """
        try:
            form = await read_form(request, frozenset({"csrf"}))
        except FormRefused as refused:
            return self._refused(request, refused)
        if not self._auth.check_csrf(self._cookie(request), form.get("csrf")):
            log.warning("console_change_refused", reason="csrf", route="payloads")
            return self._error(
                request, 403, "Refused: revealing needs your login session's form token."
            )
        if not (is_run_id(run_id) and is_invocation_id(inv_id)):
            return self._error(request, 404, "No such invocation.")
        found = await views.payloads_page(self._store, run_id, inv_id, reveal=True)
        if found is None:
            return self._error(request, 404, "No such invocation (it may have expired).")
        log.warning("payloads_revealed", run_id=run_id, invocation_id=inv_id)
        return self._page(request, "payloads.html", run_id=run_id, call=found[0], payloads=found[1])

    async def _decision_form(
        self, request: Request, allowed: frozenset[str], route: str
    ) -> tuple[dict[str, list[str]], bool, str | None] | Response:
        """A decision form read and its CSRF token checked, else the refusal to answer.

        Its fields, whether it approves, and its reason (None when it is not one a decision
        can keep: the page then says so and nothing is decided).
        """
        try:
            form = await read_form_values(
                request,
                allowed,
                repeated=frozenset({"call"}),
                max_bytes=_MAX_DECISION_FORM_BYTES,
                # A batch's calls are one field each; every other field comes once.
                max_fields=len(allowed) - 1 + MAX_BATCH_CALLS
                if "call" in allowed
                else len(allowed),
            )
            if not self._auth.check_csrf(self._cookie(request), _one(form, "csrf")):
                log.warning("console_change_refused", reason="csrf", route=route)
                return self._error(
                    request, 403, "Refused: a decision needs your login session's form token."
                )
            decision = _one(form, "decision")
            if decision not in ("approve", "deny"):
                # The page's own buttons always send one: this form is not the console's.
                raise FormRefused("missing_field")
        except FormRefused as refused:
            return self._refused(request, refused)
        try:
            reason: str | None = checked_reason(_one(form, "reason") or "")
        except InvalidArgument:
            reason = None
        return form, decision == "approve", reason

    async def _decide(
        self, request: Request, calls: list[tuple[str, str]], approve: bool, reason: str
    ) -> list[CallDecision] | Response:
        """Decide ``calls`` (run and invocation ids) as one decision: one decision id."""
        decision_id = new_approval_id()
        try:
            return [
                await decide_invocation(
                    self._store,
                    run_id,
                    inv_id,
                    approve=approve,
                    by=self.operator_name,
                    reason=reason,
                    decision_id=decision_id,
                    door="console",
                )
                for run_id, inv_id in calls
            ]
        except AccessDenied:
            return self._error(
                request,
                503,
                "The console's Redis user may only read: decisions need a user that writes.",
            )

    async def _decide_one(self, request: Request, run_id: str, inv_id: str) -> Response:
        """Approve or deny one waiting call, then go back to the page the form was on."""
        read = await self._decision_form(request, _DECISION_FIELDS, "approval")
        if isinstance(read, Response):
            return read
        form, approve, reason = read
        if not (is_run_id(run_id) and is_invocation_id(inv_id)):
            return self._error(request, 404, "No such invocation.")
        back = _next_path(
            _one(form, "next") or f"{CONSOLE_PREFIX}/runs/{run_id}/invocations/{inv_id}"
        )
        if reason is None:
            return self._back(request, back, [_REASON_NEEDED])
        decided = await self._decide(request, [(run_id, inv_id)], approve, reason)
        if isinstance(decided, Response):
            return decided
        return self._back(request, back, [notice(decided[0], approve)])

    async def _decide_batch(self, request: Request) -> Response:
        """One decision for every call ticked on the approvals page, and only those."""
        read = await self._decision_form(request, _BATCH_FIELDS, "approvals")
        if isinstance(read, Response):
            return read
        form, approve, reason = read
        calls: list[tuple[str, str]] = []
        for value in form.get("call", []):
            run_id, _, inv_id = value.partition("/")
            if not (is_run_id(run_id) and is_invocation_id(inv_id)) or (run_id, inv_id) in calls:
                return self._refused(request, FormRefused("malformed"))
            calls.append((run_id, inv_id))
        back = "/console/approvals"
        if not calls:
            return self._back(request, back, ["No call was ticked: nothing was decided."])
        if reason is None:
            return self._back(request, back, [_REASON_NEEDED])
        decided = await self._decide(request, calls, approve, reason)
        if isinstance(decided, Response):
            return decided
        return self._back(request, back, [notice(result, approve) for result in decided])

    async def _answer(self, request: Request) -> Response:
        path: str = request.scope["path"]
        method = request.method
        if path == CONSOLE_PREFIX:
            return RedirectResponse(CONSOLE_HOME, status_code=307, headers=_HEADERS)
        if path == "/console/login":
            if method == "POST":
                return await self._log_in(request)
            if method == "GET":
                return self._login(request, 200, _next_path(request.query_params.get("next")))
            return self._error(request, 405, "Method not allowed.")
        denied = self._unauthorized(request)
        if denied is not None:
            return denied
        if path == "/console/logout":
            if method == "POST":
                return await self._log_out(request)
            response = self._error(request, 405, "Log out with the console's button (a POST).")
            response.headers["Allow"] = "POST"
            return response
        if method == "POST" and (reveal := _CALL.fullmatch(path)) and reveal.group(3):
            return await self._reveal(request, reveal.group(1), reveal.group(2))
        if (decide := _DECIDE.fullmatch(path)) is not None:
            if method == "POST":
                return await self._decide_one(request, decide.group(1), decide.group(2))
            response = self._error(request, 405, "Decide with the page's form (a POST).")
            response.headers["Allow"] = "POST"
            return response
        if method == "POST" and path == "/console/approvals":
            return await self._decide_batch(request)
        if method != "GET":
            return self._error(
                request, 405, "Method not allowed: the console's only changes are its forms."
            )
        if path == CONSOLE_HOME:
            return await self._runs(request)
        if path == "/console/search":
            return await self._search(request)
        if path == "/console/approvals":
            if request.query_params:
                return self._error(request, 400, "This page takes no query parameters.")
            view = await views.approvals_page(self._store)
            return self._page(request, "approvals.html", view=view)
        if _RUN.fullmatch(path) is None and request.query_params:
            return self._error(request, 400, "This page takes no query parameters.")
        if path == "/console/live.js":
            return Response(
                _LIVE_SCRIPT,
                media_type="text/javascript",
                headers={**_HEADERS, "Cache-Control": "no-cache"},
            )
        return await self._run_pages(request, path)

    async def _runs(self, request: Request) -> Response:
        query = read_query(request, _RUNS_QUERY)
        if query is None:
            return self._error(
                request,
                400,
                "The runs page takes a cursor, status, tool, code and q (an id prefix), "
                "each once and at most 200 characters.",
            )
        status = query.get("status")
        if status is not None and status not in RUNS_SHOWN:
            return self._error(request, 400, "That status is not one the runs page filters by.")
        where = RunFilter(
            status=status,
            tool=query.get("tool"),
            code=query.get("code"),
            search=query.get("q"),
        )
        try:
            page = await views.runs_page(self._store, query.get("cursor"), where)
        except InvalidArgument:
            return self._error(request, 400, "That cursor is not one a page of runs ended with.")
        return self._page(
            request,
            "runs.html",
            page=page,
            where=where,
            statuses=RUNS_SHOWN,
            next_query=urlencode({**query, "cursor": page.cursor or ""}),
        )

    async def _search(self, request: Request) -> Response:
        query = read_query(request, frozenset({"tool", "code"}))
        if query is None or not query:
            return self._error(
                request, 400, "The search takes a tool and/or an error code, each once."
            )
        found = await views.calls_found(self._store, query.get("tool"), query.get("code"))
        return self._page(request, "search.html", found=found, query=query)

    async def _run_pages(self, request: Request, path: str) -> Response:
        run_match, call_match = _RUN.fullmatch(path), _CALL.fullmatch(path)
        if run_match is not None:
            run_id = run_match.group(1)
            query = read_query(request, _RUN_QUERY)
            number = _page_number(query.get("page")) if query is not None else None
            if query is None or number is None:
                return self._error(
                    request,
                    400,
                    "The run page takes a page number, a status, a tool and a code, each once.",
                )
            status = query.get("status")
            if status is not None and status not in views.CALL_STATUSES:
                return self._error(request, 400, "That status is not READY, ERROR or PROJECTING.")
            where = views.CallFilter(status=status, tool=query.get("tool"), code=query.get("code"))
            view = (
                await views.run_page(self._store, run_id, number, where)
                if is_run_id(run_id)
                else None
            )
            if view is None:
                return self._error(request, 404, "No such run or page (it may have expired).")
            return self._page(request, "run.html", view=view)
        if call_match is None:
            return self._error(request, 404, "No such page.")
        run_id, inv_id, payloads = call_match.groups()
        if not (is_run_id(run_id) and is_invocation_id(inv_id)):
            return self._error(request, 404, "No such invocation.")
        if payloads:
            found = await views.payloads_page(self._store, run_id, inv_id)
            if found is None:
                return self._error(request, 404, "No such invocation (it may have expired).")
            return self._page(
                request, "payloads.html", run_id=run_id, call=found[0], payloads=found[1]
            )
        invocation = await views.invocation_page(self._store, run_id, inv_id)
        if invocation is None:
            return self._error(request, 404, "No such invocation (it may have expired).")
        return self._page(request, "invocation.html", view=invocation)
