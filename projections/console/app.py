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
changes. A POST a browser says came from another origin (``Sec-Fetch-Site`` other than
``same-origin``, or without one, an ``Origin`` that is not this console's) is 403 before
anything is read (:func:`cross_origin`): SameSite=Strict keeps the cookie from other
sites in the browsers that honour it, not from another port of this host, nor in the
others. A page that is sent back to after a POST (a login's ``next``, a decision's) is
normalised and kept under ``/console/`` (:func:`next_path`):
``/console/../v1/approvals`` goes to ``/console/``. Every answer forbids framing twice,
``frame-ancestors 'none'`` for browsers that read the CSP and ``X-Frame-Options: DENY``
for older ones. The changes are logging out and an operator's decisions on governed
calls: one call (from the approvals page or the call's page) or a batch of the calls
ticked on the approvals page, under one decision id, each recorded as decided by the
console's operator name; and an operator's settlement of a call whose process died (it
ran, it did not, or request it again), recorded as the console's operator name too. A
decision answers 303 back to the page it came from, which then says once what happened
to each call. A form that cannot be read (too large, too many, repeated, unknown or
missing fields, not UTF-8, not ``application/x-www-form-urlencoded``) is 400 with one
``console_form_refused`` log line naming the reason, never what was posted.

Pages (every GET) only read the store; the harness-only payloads of a call have their own
page, reached by an explicit link, except a waiting call's frozen request, shown masked
beside the form that decides it. No page grows with the store (:mod:`.views`), and every text
shown goes through :func:`.views.visible`, so an id's bidi control is shown as an escape.
Nothing a page shows is logged: a failure is logged by exception type only.
"""

from __future__ import annotations

import importlib.resources
import posixpath
import re
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Final
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Match, Router
from starlette.types import Receive, Scope, Send

from eventstore.audit.run_index import RUNS_SHOWN, RunFilter
from eventstore.decisions import MAX_REASON_CHARS, DecisionRequest, new_approval_id
from eventstore.errors import AccessDenied, InvalidArgument, StoreUnavailable
from eventstore.logs import get_logger
from eventstore.settlements import MAX_EVIDENCE_CHARS, SettlementRequest, checked_evidence
from machine.ids import is_invocation_id, is_run_id
from projections.archive.database import ArchiveDatabase
from projections.console import views
from projections.console.archived import SEARCH_FIELDS, SEARCH_USAGE, ArchivedPages
from projections.console.auth import MAX_SESSIONS, LoginThrottle, OperatorAuth, OperatorGate
from projections.console.timeline import LEGEND, duration_text
from projections.http_api import CONSOLE_PREFIX, bearer_token
from projections.operator_doors import (
    MAX_BATCH_CALLS,
    CallDecision,
    again_invocation,
    checked_reason,
    decide_invocation,
    notice,
    settle_invocation,
    settlement_notice,
)
from projections.receipts.builder import iso_ms
from projections.routing import ExactRoute, WrongMethod, described

log = get_logger("canon.console")

#: Where a request's scope keeps the operator its credential names.
_OPERATOR: Final = "canon.operator_credentials"
#: Every console's cookie name starts so; the rest is chosen when the console starts.
COOKIE_PREFIX: Final = "canon_console_"
#: The runs page; also the cookie's path: the console's pages, nothing else the host serves.
CONSOLE_HOME: Final = CONSOLE_PREFIX + "/"
#: Where a request's scope keeps the console answering it (for the routes' endpoints).
_CONSOLE: Final = "canon.console"
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
_SETTLEMENT_FIELDS: Final = frozenset({"csrf", "outcome", "evidence", "request_again", "next"})
#: What a settlement form may say: the call ran, it did not, or request it again.
_SETTLEMENT_OUTCOMES: Final = ("executed", "not_executed", "request_again")
_BATCH_FIELDS: Final = frozenset({"csrf", "decision", "reason", "call"})
_HEADERS: Final = {
    # No frame, no outside resource, no inline script: the pages are HTML and inline SVG,
    # and the one script is the console's own file, which only fetches console pages.
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "script-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # frame-ancestors for the browsers that read the CSP, this for those that do not.
    "X-Frame-Options": "DENY",
}
#: The Sec-Fetch-Site values of a request a console page made (or the operator typed).
_OWN_SITE: Final = frozenset({"same-origin", "none"})
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


_RUNS_QUERY: Final = frozenset({"cursor", "status", "tool", "code", "q"})
#: A run's calls filtered: by status, stage, tool, error code, exception type, call id
#: (start).
_FILTER_QUERY: Final = frozenset({"status", "stage", "tool", "code", "type", "q"})
_RUN_QUERY: Final = _FILTER_QUERY | {"page"}
_NO_QUERY: Final = "This page takes no query parameters."
_ONLY_FORMS: Final = "Method not allowed: the console's only changes are its forms."
#: What a route says to a method it does not serve (else :data:`_ONLY_FORMS`).
_WRONG_METHOD: Final = {
    "login": "Method not allowed.",
    "logout": "Log out with the console's button (a POST).",
    "settlement": "Settle with the page's form (a POST).",
    "approval": "Decide with the page's form (a POST).",
}


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
    env.globals["calls_per_page"] = views.CALLS_PER_PAGE
    env.globals["detail_shown_chars"] = views.DETAIL_SHOWN_CHARS
    env.globals["max_reason_chars"] = MAX_REASON_CHARS
    env.globals["max_evidence_chars"] = MAX_EVIDENCE_CHARS
    env.globals["call_stages"] = views.CALL_STAGES
    env.globals["max_batch_calls"] = MAX_BATCH_CALLS
    return env


def next_path(value: str | None) -> str:
    """Where a login or a decision goes on: a console page, normalised; else the runs page.

    The path is percent-decoded and its dot segments resolved as a browser would
    (``/console/%2e%2e/v1/approvals`` is ``/v1/approvals``), then kept only if it is still
    under ``/console/``; it goes back percent-encoded, with its query if it has one.
    Anything with a scheme, a host, a fragment, a backslash, an empty segment or a
    character that is not printable ASCII goes to ``/console/``.
    """
    if not value or not value.isascii() or not value.isprintable() or "\\" in value:
        return CONSOLE_HOME
    parts = urlsplit(value)
    if parts.scheme or parts.netloc or parts.fragment or "#" in value:
        return CONSOLE_HOME
    path = unquote(parts.path)
    if not path.startswith("/") or "//" in path or "\\" in path or not path.isprintable():
        return CONSOLE_HOME
    resolved = posixpath.normpath(path)
    if path.endswith("/") and resolved != "/":
        resolved += "/"
    if resolved != CONSOLE_HOME and not resolved.startswith(CONSOLE_HOME):
        return CONSOLE_HOME
    query = f"?{parts.query}" if parts.query else ""
    return quote(resolved, safe="/-._~!$&'()*+,;=:@") + query


def cross_origin(request: Request) -> str | None:
    """Why a POST is refused as coming from another origin, or None when it is not.

    A browser names where a request came from. ``Sec-Fetch-Site`` (every current browser)
    decides when it is there: ``same-origin`` from a console page (or ``none``, typed by
    the operator), ``same-site`` or ``cross-site`` from any other page, another port of
    this host included. Without it, ``Origin`` decides: the page's scheme, host and port
    must be this console's. ``Origin: null`` says nothing either way: the console's own
    ``Referrer-Policy: no-referrer`` makes a browser send it for the console's own forms.
    A client that sends neither (a script with a Bearer token) is not a browser, and
    still needs its session's CSRF token to change anything with a cookie.
    """
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return None if site.strip().lower() in _OWN_SITE else "sec_fetch_site"
    origin = request.headers.get("origin")
    if origin is None or origin.strip() == "null":
        return None
    host = request.headers.get("host", "")
    scheme = str(request.scope.get("scheme") or "http")
    return None if _same_host(origin, scheme, host) else "origin"


def _same_host(origin: str, scheme: str, host: str) -> bool:
    """Tell whether ``origin`` names the host (and port) the request was sent to."""
    try:
        named = urlsplit(origin.strip())
        here = urlsplit(f"{scheme}://{host}")
        ports = (
            named.port or _DEFAULT_PORTS.get(named.scheme),
            here.port or _DEFAULT_PORTS.get(scheme),
        )
    except ValueError:
        return False
    # The scheme is not compared: behind a proxy that ends TLS and does not say so, the
    # page is https and this request http, yet both are this console.
    return bool(named.hostname) and named.hostname == here.hostname and ports[0] == ports[1]


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


_EVIDENCE_NEEDED: Final = (
    f"Nothing was settled: a settlement needs evidence, one line of 1 to "
    f"{MAX_EVIDENCE_CHARS} printable characters."
)
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
        archive: ArchiveDatabase | None = None,
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
            archive: an archive of the store's namespace (opened and closed by the
                caller): the pages of a run or call Redis no longer holds are read from
                it, marked archived and read-only, and the search page searches it
                (:mod:`.archived`).

        """
        self._store = store
        self._auth = auth
        self._secure = secure_cookie
        self.cookie_name = cookie_name or COOKIE_PREFIX + secrets.token_hex(4)
        #: The operator token's check and its limit on failures; the HTTP API's decision
        #: routes take the same (``create_app(..., operator=console.gate)``).
        self.gate = OperatorGate(auth, throttle)
        # What the next page of a session says after a decision it posted: one entry per
        # session (keyed by its CSRF token), taken by the page it was sent back to.
        self._notices: OrderedDict[str, tuple[str, list[str]]] = OrderedDict()
        self._env = _environment()
        self._router = Router(CONSOLE_TABLE, redirect_slashes=False, default=self._no_page)
        self._archive = (
            ArchivedPages(
                archive,
                store.keys.namespace,
                store.settings,
                keys=store.seals.keyring if store.seals is not None else None,
            )
            if archive is not None
            else None
        )

    def _cookie(self, request: Request) -> str | None:
        return request.cookies.get(self.cookie_name)

    def _page(self, request: Request, template: str, code: int = 200, **context: Any) -> Response:
        csrf = self._auth.csrf_token(self._cookie(request))
        notices = self._take_notices(csrf, request.scope["path"])
        # Who is signed in (shown on every page, and named as the decisions' maker).
        operator = request.scope.get(_OPERATOR)
        html = self._env.get_template(template).render(
            csrf=csrf, notices=notices, operator_name=operator, **context
        )
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
        """401 or 429 when the request holds no valid credential; None when it does.

        The operator it names (its login session's, or its Bearer token's) is kept in the
        request's scope: the one name its pages show and its decisions are recorded as.
        """
        path: str = request.scope["path"]
        token = bearer_token(request)
        if token is None:
            operator = self._auth.session_operator(self._cookie(request))
            if operator is not None:
                request.scope[_OPERATOR] = operator
                return None
            return self._login(request, 401, next_path(path))
        client = _client(request)
        operator, wait_s = self.gate.check(token, client)
        if wait_s:
            return self._throttled(request, wait_s)
        if operator is not None:
            request.scope[_OPERATOR] = operator
            return None
        self.gate.failed(client, token)  # a value too short to be the token is not counted
        return self._login(request, 401, next_path(path))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer one request under ``/console``: its origin and credential, then its route."""
        request = Request(scope, receive)
        scope[_CONSOLE] = self
        try:
            response = self._refused_first(request)
            if response is None:
                await self._router(scope, receive, send)
                return
        except ClientDisconnect:
            return  # nobody is left to answer
        except WrongMethod as wrong:
            response = self._error(request, 405, _WRONG_METHOD.get(wrong.route, _ONLY_FORMS))
            response.headers["Allow"] = wrong.allow
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
        going = next_path(form.get("next"))
        token = form["token"]
        operator = self._auth.operator_of(token)
        if operator is None:
            self.gate.failed(client, token)
            return self._login(request, 401, going, "That token names no operator.")
        log.info("console_login", operator=operator)
        response = RedirectResponse(going, status_code=303, headers=_HEADERS)
        session = self._auth.start_session(operator)
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

    async def _reveal(self, request: Request) -> Response:
        """The payloads page with nothing masked, for a POST with the session's CSRF token.

        Each reveal is logged (``payloads_revealed``, naming the run and the invocation
        only), so an audit of the console's log shows who could have seen what, when.
        """
        run_id, inv_id = _call_ids(request)
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
        archived = False
        if found is None and self._archive is not None:
            found, archived = await self._archive.payloads_page(run_id, inv_id, reveal=True), True
        if found is None:
            return self._error(request, 404, "No such invocation (it may have expired).")
        log.warning("payloads_revealed", run_id=run_id, invocation_id=inv_id, archived=archived)
        return self._page(
            request,
            "payloads.html",
            run_id=run_id,
            call=found[0],
            payloads=found[1],
            archived=archived,
        )

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
        decision = DecisionRequest(
            approve=approve,
            by=request.scope[_OPERATOR],
            reason=reason,
            decision_id=new_approval_id(),
        )
        try:
            return [
                await decide_invocation(self._store, run_id, inv_id, decision, "console")
                for run_id, inv_id in calls
            ]
        except AccessDenied:
            return self._error(
                request,
                503,
                "The console's Redis user may only read: decisions need a user that writes.",
            )

    async def _decide_one(self, request: Request) -> Response:
        """Approve or deny one waiting call, then go back to the page the form was on."""
        run_id, inv_id = _call_ids(request)
        read = await self._decision_form(request, _DECISION_FIELDS, "approval")
        if isinstance(read, Response):
            return read
        form, approve, reason = read
        if not (is_run_id(run_id) and is_invocation_id(inv_id)):
            return self._error(request, 404, "No such invocation.")
        back = next_path(
            _one(form, "next") or f"{CONSOLE_PREFIX}/runs/{run_id}/invocations/{inv_id}"
        )
        if reason is None:
            return self._back(request, back, [_REASON_NEEDED])
        decided = await self._decide(request, [(run_id, inv_id)], approve, reason)
        if isinstance(decided, Response):
            return decided
        return self._back(request, back, [notice(decided[0], approve)])

    async def _settle_one(self, request: Request) -> Response:
        """Settle one call whose process died, as the operator signed in; then go back.

        The form says it ran (``executed``), it did not (``not_executed``, and maybe
        ``request_again``), or asks for a call settled as not executed to be requested
        again (``request_again``), with the evidence the answer rests on.
        """
        run_id, inv_id = _call_ids(request)
        try:
            form = await read_form(request, _SETTLEMENT_FIELDS)
            if not self._auth.check_csrf(self._cookie(request), form.get("csrf")):
                log.warning("console_change_refused", reason="csrf", route="settlement")
                return self._error(
                    request, 403, "Refused: a settlement needs your login session's form token."
                )
            outcome = form.get("outcome")
            if outcome not in _SETTLEMENT_OUTCOMES or form.get("request_again") not in (
                None,
                "1",
            ):
                raise FormRefused("missing_field")
        except FormRefused as refused:
            return self._refused(request, refused)
        if not (is_run_id(run_id) and is_invocation_id(inv_id)):
            return self._error(request, 404, "No such invocation.")
        back = next_path(form.get("next") or f"{CONSOLE_PREFIX}/runs/{run_id}/invocations/{inv_id}")
        operator = request.scope[_OPERATOR]
        try:
            if outcome == "request_again":
                result = await again_invocation(self._store, run_id, inv_id, operator, "console")
            else:
                try:
                    evidence = checked_evidence(form.get("evidence") or "")
                except InvalidArgument:
                    return self._back(request, back, [_EVIDENCE_NEEDED])
                settling = SettlementRequest(
                    executed=outcome == "executed", by=operator, evidence=evidence
                )
                again = outcome == "not_executed" and form.get("request_again") == "1"
                result = await settle_invocation(
                    self._store, run_id, inv_id, settling, again, "console"
                )
        except AccessDenied:
            return self._error(
                request,
                503,
                "The console's Redis user may only read: settlements need a user that writes.",
            )
        return self._back(request, back, [settlement_notice(result)])

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

    def _refused_first(self, request: Request) -> Response | None:
        """The answer before any route: a POST from another origin, or no credential.

        None when the request goes on to its route (the home redirect and the login page
        need no credential).
        """
        if request.method == "POST" and (why := cross_origin(request)) is not None:
            log.warning("console_change_refused", reason=why, route=request.scope["path"])
            return self._error(
                request, 403, "Refused: a change must come from the console's own pages."
            )
        if any(route.matches(request.scope)[0] is not Match.NONE for route in _BEFORE_LOGIN):
            return None
        return self._unauthorized(request)

    async def _no_page(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A path no console route has: 405 for a change, 400 for a query, else 404."""
        request = Request(scope, receive)
        if request.method != "GET":
            response = self._error(request, 405, _ONLY_FORMS)
        elif request.query_params:
            response = self._error(request, 400, _NO_QUERY)
        else:
            response = self._error(request, 404, "No such page.")
        await response(scope, receive, send)

    async def _home(self, request: Request) -> Response:
        return RedirectResponse(CONSOLE_HOME, status_code=307, headers=_HEADERS)

    async def _login_page(self, request: Request) -> Response:
        """The login form (GET), or a login (POST)."""
        if request.method == "POST":
            return await self._log_in(request)
        return self._login(request, 200, next_path(request.query_params.get("next")))

    async def _approvals(self, request: Request) -> Response:
        """The calls awaiting a decision (GET), or one decision on those ticked (POST)."""
        if request.method == "POST":
            return await self._decide_batch(request)
        if request.query_params:
            return self._error(request, 400, _NO_QUERY)
        view = await views.approvals_page(self._store)
        return self._page(request, "approvals.html", view=view)

    async def _live_script(self, request: Request) -> Response:
        if request.query_params:
            return self._error(request, 400, _NO_QUERY)
        return Response(
            _LIVE_SCRIPT,
            media_type="text/javascript",
            headers={**_HEADERS, "Cache-Control": "no-cache"},
        )

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
        if self._archive is not None:
            return await self._archive_search(request, self._archive)
        query = read_query(request, frozenset({"tool", "code"}))
        if query is None or not query:
            return self._error(
                request, 400, "The search takes a tool and/or an error code, each once."
            )
        found, failures = await views.calls_found(self._store, query.get("tool"), query.get("code"))
        return self._page(request, "search.html", found=found, failures=failures, query=query)

    def _filter(
        self, request: Request, allowed: frozenset[str]
    ) -> tuple[dict[str, str], views.CallFilter] | Response:
        """The query and filter of a page listing a run's calls (or opened from one).

        Or the 400 answer to a query that is not one.
        """
        query = read_query(request, allowed)
        number = _page_number(query.get("page")) if query is not None else None
        if query is None or number is None:
            return self._error(
                request,
                400,
                "A run's calls are listed by page number, status, stage, tool, error code, "
                "exception type and the start of a tool call id (q), each once.",
            )
        status = query.get("status")
        if status is not None and status not in views.CALL_STATUSES:
            return self._error(request, 400, "That status is not READY, ERROR or PROJECTING.")
        stage = query.get("stage")
        if stage is not None and stage not in views.CALL_STAGES:
            return self._error(request, 400, "That stage is not one a call stands in.")
        where = views.CallFilter(
            status=status,
            stage=stage,
            tool=query.get("tool"),
            code=query.get("code"),
            type=query.get("type"),
            q=query.get("q"),
        )
        return query, where

    async def _archive_search(self, request: Request, archive: ArchivedPages) -> Response:
        """The search across runs, read from the archive (:mod:`.archived`)."""
        query = read_query(request, SEARCH_FIELDS)
        if query is None:
            return self._error(request, 400, SEARCH_USAGE)
        try:
            view = await archive.search_page(query)
        except InvalidArgument as exc:  # its message never repeats the query
            return self._error(request, 400, f"That search cannot be read: {exc}.")
        return self._page(request, "archive_search.html", view=view)

    async def _run_page(self, request: Request) -> Response:
        """A run's page: its calls, a page at a time, filtered."""
        run_id: str = request.path_params["run_id"]
        read = self._filter(request, _RUN_QUERY)
        if isinstance(read, Response):
            return read
        query, where = read
        number = _page_number(query.get("page")) or 1
        view = (
            await views.run_page(self._store, run_id, number, where) if is_run_id(run_id) else None
        )
        archived = False
        if view is None and self._archive is not None and is_run_id(run_id):
            view, archived = await self._archive.run_page(run_id, number, where), True
        if view is None:
            return self._error(request, 404, "No such run or page (it may have expired).")
        if view.found is not None:
            # The lookup found its call: open it, its neighbours those of the rest of
            # the filter (the other calls listed with it).
            rest = where.query(q=None)
            target = f"{CONSOLE_PREFIX}/runs/{run_id}/invocations/{view.found.invocation_id}"
            return RedirectResponse(
                target + (f"?{rest}" if rest else ""), status_code=303, headers=_HEADERS
            )
        return self._page(request, "run.html", view=view, archived=archived)

    async def _invocation_page(self, request: Request) -> Response:
        """A call's page, its neighbours those of the filter it was opened from."""
        run_id, inv_id = _call_ids(request)
        if not (is_run_id(run_id) and is_invocation_id(inv_id)):
            return self._error(request, 404, "No such invocation.")
        read = self._filter(request, _FILTER_QUERY)
        if isinstance(read, Response):
            return read
        invocation = await views.invocation_page(self._store, run_id, inv_id, read[1])
        archived = False
        if invocation is None and self._archive is not None:
            invocation, archived = await self._archive.invocation_page(run_id, inv_id), True
        if invocation is None:
            return self._error(request, 404, "No such invocation (it may have expired).")
        return self._page(request, "invocation.html", view=invocation, archived=archived)

    async def _payloads(self, request: Request) -> Response:
        """A call's payloads, masked (GET), or shown unmasked (POST, :meth:`_reveal`)."""
        if request.method == "POST":
            return await self._reveal(request)
        if request.query_params:
            return self._error(request, 400, _NO_QUERY)
        run_id, inv_id = _call_ids(request)
        if not (is_run_id(run_id) and is_invocation_id(inv_id)):
            return self._error(request, 404, "No such invocation.")
        found = await views.payloads_page(self._store, run_id, inv_id)
        archived = False
        if found is None and self._archive is not None:
            found, archived = await self._archive.payloads_page(run_id, inv_id), True
        if found is None:
            return self._error(request, 404, "No such invocation (it may have expired).")
        return self._page(
            request,
            "payloads.html",
            run_id=run_id,
            call=found[0],
            payloads=found[1],
            archived=archived,
        )


def _call_ids(request: Request) -> tuple[str, str]:
    """The run id and invocation id a call's path names (checked by each page)."""
    return request.path_params["run_id"], request.path_params["invocation_id"]


def _on(
    page: Callable[[Console, Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """A route's endpoint: ``page`` of the console answering the request."""

    async def endpoint(request: Request) -> Response:
        return await page(request.scope[_CONSOLE], request)

    endpoint.__name__ = page.__name__
    return endpoint


_CALL_PATH: Final = CONSOLE_PREFIX + "/runs/{run_id}/invocations/{invocation_id}"
#: The routes answered before any credential: ``/console`` (to the runs page, whatever
#: the method) and the login page.
_BEFORE_LOGIN: Final = (
    ExactRoute(CONSOLE_PREFIX, _on(Console._home), name="home"),
    ExactRoute(
        CONSOLE_PREFIX + "/login", _on(Console._login_page), methods=["GET", "POST"], name="login"
    ),
)
#: Every console route (apart from projections.http_api's: these take the operator token).
CONSOLE_TABLE: Final = (
    *_BEFORE_LOGIN,
    ExactRoute(CONSOLE_HOME, _on(Console._runs), methods=["GET"], name="runs"),
    ExactRoute(CONSOLE_PREFIX + "/logout", _on(Console._log_out), methods=["POST"], name="logout"),
    ExactRoute(CONSOLE_PREFIX + "/search", _on(Console._search), methods=["GET"], name="search"),
    ExactRoute(
        CONSOLE_PREFIX + "/approvals",
        _on(Console._approvals),
        methods=["GET", "POST"],
        name="approvals",
    ),
    ExactRoute(
        CONSOLE_PREFIX + "/live.js", _on(Console._live_script), methods=["GET"], name="live_script"
    ),
    ExactRoute(
        CONSOLE_PREFIX + "/runs/{run_id}", _on(Console._run_page), methods=["GET"], name="run"
    ),
    ExactRoute(_CALL_PATH, _on(Console._invocation_page), methods=["GET"], name="invocation"),
    ExactRoute(
        _CALL_PATH + "/approval", _on(Console._decide_one), methods=["POST"], name="approval"
    ),
    ExactRoute(
        _CALL_PATH + "/settlement", _on(Console._settle_one), methods=["POST"], name="settlement"
    ),
    ExactRoute(
        _CALL_PATH + "/payloads", _on(Console._payloads), methods=["GET", "POST"], name="payloads"
    ),
)
#: Every console route, as ``canon serve --help`` lists them (read from the table).
CONSOLE_ROUTES: Final = described(CONSOLE_TABLE)
