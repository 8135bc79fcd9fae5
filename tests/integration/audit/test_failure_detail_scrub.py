"""A failed call's failure detail is scrubbed of secrets before it is written.

The record keeps, for operators, what a raising tool left behind; a password, token or
key in the exception's text never reaches Redis. The scrubber is the store's setting:
the default, the default plus a deployment's patterns, or a callable of its own.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from eventstore import RunContext, Store, ToolBoundary
from eventstore.audit import export_run
from eventstore.errors import InvalidArgument
from machine.codes import ErrorCode
from machine.failure_detail import decode_failure_detail
from tests.support.calls import RUN, TOOL, assert_safe_error, envelope
from tests.support.tools import FakeTool

pytestmark = pytest.mark.backends("single", "cluster")

SECRET = "sk-live-9f8e7d6c5b4a39281706"


async def failed_detail(store: Store, error: BaseException, call: str = "c1") -> str:
    """Run a tool that raises ``error``; return the stored detail's message and traceback."""
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    tool = FakeTool(raise_in_executor=error)
    reply = await ToolBoundary(store, {TOOL: tool.spec()}).invoke(RunContext(RUN), envelope(call))
    assert_safe_error(reply, ErrorCode.EXECUTION_FAILED)
    data = (await store.reader.fields(RUN, call)).get(b"failure_detail")
    assert data is not None
    detail = decode_failure_detail(data)
    assert detail is not None
    return detail.message + detail.traceback


async def test_the_record_never_holds_the_secret(make_store: Any) -> None:
    """A token, a URL password and a bearer header in the message are stored filtered."""
    store = make_store()
    error = ConnectionError(
        f"GET https://bob:{SECRET}@billing.internal/v1 failed "
        f"(token={SECRET}, Authorization: Bearer {SECRET})"
    )
    text = await failed_detail(store, error)
    assert SECRET not in text
    assert "token=[Filtered]" in text and "bob:[Filtered]@billing.internal" in text
    assert SECRET.encode() not in await store.client.hget(
        store.keys.record(RUN, "c1"), "failure_detail"
    )


async def test_the_export_shows_the_scrubbed_detail(make_store: Any) -> None:
    """What an auditor exports with payloads is what was stored: no secret."""
    store = make_store()
    await failed_detail(store, RuntimeError(f"password={SECRET}"))
    lines = [line async for line in export_run(store, RUN, with_payloads=True)]
    assert lines and SECRET not in repr(lines)


async def test_a_deployment_adds_its_own_patterns(make_store: Any) -> None:
    """``scrub=[patterns]`` filters what they match, beside the default key names."""
    store = make_store(scrub=[r"acct-\d{6}"])
    text = await failed_detail(store, ValueError(f"acct-123456 refused, api_key={SECRET}"))
    assert "acct-123456" not in text and SECRET not in text
    assert "[Filtered] refused, api_key=[Filtered]" in text


async def test_a_callable_scrubber_is_used_as_given(make_store: Any) -> None:
    """``scrub=callable`` replaces the default (here: keep only the first word)."""
    store = make_store(scrub=lambda text: text.split(" ")[0])
    text = await failed_detail(store, ValueError(f"refused {SECRET}"))
    assert SECRET not in text


@pytest.mark.parametrize("setting", ["token", 42])
def test_a_bad_scrub_setting_is_refused_at_once(redis_url: str, setting: Any) -> None:
    """One string (not a list) or a number is a clear error when the store is built."""
    with pytest.raises((TypeError, InvalidArgument)):
        Store.from_url(redis_url, scrub=setting)
