"""A run for the console tests: READY calls, a failed call with a failure detail, one in flight;
serving the console, and reading its login cookie and CSRF token from its answers."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

import httpx
import msgspec

from eventstore.store import Store
from eventstore.writer import now_ms
from machine.codes import ErrorCode, EvidenceStatus
from machine.ids import invocation_id
from projections import create_app
from projections.console import Console, OperatorAuth
from projections.console.auth import Operators
from projections.worker.supervisor import ReceiptServer
from tests.support.waiting import wait_for

RUN = "run-console"
#: The console tests' operators, each with a token of their own; ana's is OPERATOR_TOKEN.
OPERATOR_TOKEN = "operator-secret-token-for-tests"
OPERATOR_TOKENS = {
    "ana": OPERATOR_TOKEN,
    "bo": "bo-operator-secret-token-for-tests",
    "cy": "cy-operator-secret-token-for-tests",
}


def bearer(operator: str) -> dict[str, str]:
    """The Authorization header of ``operator``'s token."""
    return {"Authorization": f"Bearer {OPERATOR_TOKENS[operator]}"}


FAILED_CALL = "c-failed"
#: The failure detail of the failed call (the shape the boundary keeps).
DETAIL = {
    "type": "ConnectionResetError",
    "message": "the search backend hung up",
    "traceback": 'Traceback (most recent call last):\n  File "tool.py", line 3\n'
    "ConnectionResetError: the search backend hung up",
    "cut_bytes": 0,
}
SECRET_REQUEST = b'{"q":"REQUEST-PAYLOAD-MARKER"}'
SECRET_RAW = b'{"raw":"RAW-PAYLOAD-MARKER"}'
SECRET_RESULT = b'{"answer":"RESULT-PAYLOAD-MARKER"}'


async def next_millisecond() -> None:
    """Wait until the writer's clock moves on, so the next call is created strictly later."""
    started = now_ms()
    await wait_for(lambda: now_ms() > started)


async def populate(store: Store) -> str:
    """Open the run and write its calls, each created in its own millisecond (so their
    order is their creation order); returns the run's access token."""
    token = (await store.open_run(RUN, deadline=timedelta(minutes=5), budget=10)).access_token
    for call in ("c1", "c2"):
        await next_millisecond()
        head = await store.writer.create(RUN, call, "search", SECRET_REQUEST)
        head = await store.writer.start_projecting(head, SECRET_RAW)
        await store.writer.complete(head, SECRET_RESULT, EvidenceStatus.EVIDENCE_FOUND, "s")
    await next_millisecond()
    head = await store.writer.create(RUN, FAILED_CALL, "fetch", SECRET_REQUEST)
    # As the boundary keeps it: the detail in the record, its digest in the Failed event.
    await store.writer.fail(
        head, ErrorCode.EXECUTION_FAILED, failure_detail=msgspec.json.encode(DETAIL)
    )
    await next_millisecond()
    await store.writer.create(RUN, "c-flight", "search", SECRET_REQUEST)
    return token


def failed_invocation() -> str:
    """The invocation id of the failed call."""
    return invocation_id(RUN, FAILED_CALL)


def session_cookie(response: httpx.Response) -> tuple[str, str]:
    """The name and value of the login cookie a login answer sets."""
    name, _, value = response.headers["set-cookie"].split(";", 1)[0].partition("=")
    assert name.startswith("canon_console_") and value, response.headers["set-cookie"]
    return name, value


def csrf_of(html: str) -> str:
    """The CSRF token a console page carries in its logout form."""
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None, "the page has no CSRF field"
    return found.group(1)


@asynccontextmanager
async def serving(
    store: Store, *, console: bool = True, app: Console | None = None
) -> AsyncIterator[str]:
    """Serve the store's API with the console (``app``, else one for the operators of
    OPERATOR_TOKENS; none when ``console`` is false) and, as ``canon serve`` does, the
    decision routes under the operators' tokens; yields the base URL."""
    if app is None and console:
        app = Console(store, OperatorAuth(Operators.from_tokens(OPERATOR_TOKENS)))
    gate = app.gate if app is not None else None
    server = ReceiptServer(create_app(store, console=app, operator=gate))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not task.done(), "the server did not start"
            await asyncio.sleep(0.005)
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()
        await asyncio.wait_for(task, 10)
