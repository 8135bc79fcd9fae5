"""The operator console: server-rendered pages under ``/console/`` (Jinja2, no scripts).

Every page needs the operator token: a ``Authorization: Bearer <token>`` header, or the
cookie the login form sets (HttpOnly, SameSite=Strict, Path=/console; a session of this
process, never the token itself, :mod:`.auth`). Without either, a page answers 401 with
``WWW-Authenticate: Bearer`` and the login form. Pages only read the store; the
harness-only payloads of a call have their own page, reached by an explicit link.
Nothing a page shows is logged: a failure is logged by exception type only.
"""

from __future__ import annotations

import re
from typing import Any, Final
from urllib.parse import parse_qs, quote

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.types import Receive, Scope, Send

from eventstore.errors import InvalidArgument, StoreUnavailable
from eventstore.logs import get_logger
from machine.ids import is_invocation_id, is_run_id
from projections.console import views
from projections.console.auth import OperatorAuth
from projections.console.timeline import LEGEND, duration_text
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
    "GET /console/runs/<run id>",
    "GET /console/runs/<run id>/invocations/<invocation id>",
    "GET /console/runs/<run id>/invocations/<invocation id>/payloads",
)
COOKIE: Final = "canon_console"
_RUN: Final = re.compile(r"/console/runs/([^/]+)")
_CALL: Final = re.compile(r"/console/runs/([^/]+)/invocations/([^/]+)(/payloads)?")
_MAX_FORM_BYTES: Final = 4096
_HEADERS: Final = {
    # No script, no frame, no outside resource: the pages are plain HTML and inline SVG.
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("projections.console", "templates"),
        autoescape=select_autoescape(default=True),
        undefined=StrictUndefined,
    )
    env.filters["iso"] = lambda ms: iso_ms(ms) if ms else "-"
    env.filters["duration"] = duration_text
    env.globals["legend"] = LEGEND
    return env


def _next_path(value: str | None) -> str:
    """Where a login goes on: a console page only (never another site or route)."""
    if value and value.startswith(CONSOLE_PREFIX + "/") and "//" not in value and "\\" not in value:
        return value
    return CONSOLE_PREFIX + "/"


class Console:
    """The console's ASGI app over one store, for one operator token."""

    def __init__(self, store: Any, auth: OperatorAuth, *, secure_cookie: bool = False) -> None:
        """Serve ``store`` to whoever holds the token ``auth`` checks.

        Args:
            store: the store to read (a :class:`~eventstore.store.Store`).
            auth: the operator token and sessions.
            secure_cookie: mark the login cookie ``Secure`` (behind HTTPS).

        """
        self._store = store
        self._auth = auth
        self._secure = secure_cookie
        self._env = _environment()

    def _page(self, template: str, code: int = 200, **context: Any) -> Response:
        html = self._env.get_template(template).render(**context)
        return HTMLResponse(html, status_code=code, headers=_HEADERS)

    def _login(self, status: int, next_path: str, error: str | None = None) -> Response:
        response = self._page("login.html", status, next_path=next_path, error=error)
        if status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="canon-console"'
        return response

    def _error(self, status: int, message: str) -> Response:
        return self._page("error.html", status, status=status, message=message)

    def _authorized(self, request: Request) -> bool:
        token = bearer_token(request)
        if token is not None:
            return self._auth.check_token(token)
        return self._auth.check_session(request.cookies.get(COOKIE))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer one request under ``/console``."""
        request = Request(scope, receive)
        try:
            response = await self._answer(request)
        except StoreUnavailable:
            response = self._error(503, "The store is unavailable; try again.")
        except Exception as exc:
            log.error("console_failed", error=type(exc).__name__)
            response = self._error(500, "Something went wrong; the server log names it.")
        await response(scope, receive, send)

    async def _form(self, request: Request) -> dict[str, str]:
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > _MAX_FORM_BYTES:
                return {}
        fields = parse_qs(body.decode("utf-8", "replace"), max_num_fields=8)
        return {name: values[0] for name, values in fields.items()}

    async def _log_in(self, request: Request) -> Response:
        form = await self._form(request)
        next_path = _next_path(form.get("next"))
        if not self._auth.check_token(form.get("token")):
            return self._login(401, next_path, "That is not the operator token.")
        response = RedirectResponse(next_path, status_code=303, headers=_HEADERS)
        response.set_cookie(
            COOKIE,
            self._auth.start_session(),
            httponly=True,
            samesite="strict",
            path=CONSOLE_PREFIX,
            secure=self._secure,
        )
        return response

    async def _answer(self, request: Request) -> Response:
        path: str = request.scope["path"]
        method = request.method
        if path == CONSOLE_PREFIX:
            return RedirectResponse(CONSOLE_PREFIX + "/", status_code=307, headers=_HEADERS)
        if path == "/console/login":
            if method == "POST":
                return await self._log_in(request)
            if method == "GET":
                return self._login(200, _next_path(request.query_params.get("next")))
            return self._error(405, "Method not allowed.")
        if not self._authorized(request):
            return self._login(401, _next_path(path))
        if path == "/console/logout" and method == "POST":
            self._auth.end_session(request.cookies.get(COOKIE))
            response = RedirectResponse("/console/login", status_code=303, headers=_HEADERS)
            response.delete_cookie(COOKIE, path=CONSOLE_PREFIX)
            return response
        if method != "GET":
            return self._error(405, "Method not allowed: the console only reads.")
        query = request.query_params
        if path == "/console/":
            if set(query) - {"cursor"}:
                return self._error(400, "The runs page takes only a cursor.")
            try:
                page = await views.runs_page(self._store, query.get("cursor"))
            except InvalidArgument:
                return self._error(400, "That cursor is not one a page of runs ended with.")
            return self._page("runs.html", page=page, quote=quote)
        if query:
            return self._error(400, "This page takes no query parameters.")
        return await self._run_pages(path)

    async def _run_pages(self, path: str) -> Response:
        run_match, call_match = _RUN.fullmatch(path), _CALL.fullmatch(path)
        if run_match is not None:
            run_id = run_match.group(1)
            view = await views.run_page(self._store, run_id) if is_run_id(run_id) else None
            if view is None:
                return self._error(404, "No such run (it may have expired).")
            return self._page("run.html", view=view)
        if call_match is None:
            return self._error(404, "No such page.")
        run_id, inv_id, payloads = call_match.groups()
        if not (is_run_id(run_id) and is_invocation_id(inv_id)):
            return self._error(404, "No such invocation.")
        if payloads:
            found = await views.payloads_page(self._store, run_id, inv_id)
            if found is None:
                return self._error(404, "No such invocation (it may have expired).")
            return self._page("payloads.html", run_id=run_id, call=found[0], payloads=found[1])
        invocation = await views.invocation_page(self._store, run_id, inv_id)
        if invocation is None:
            return self._error(404, "No such invocation (it may have expired).")
        return self._page("invocation.html", view=invocation)
