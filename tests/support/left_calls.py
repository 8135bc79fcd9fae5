"""Calls left in flight by a process that "died": written as that process would have, then
left without their outcome, for the takeover, reconcile and settlement tests.

The crash-point matrix kills real processes (``tests/faults/test_crash_matrix.py``); these
helpers leave the same records without a subprocess, so each behaviour is tested quickly.
"""

from __future__ import annotations

import asyncio
from typing import Any

from eventstore import ApprovalPending, RunContext, ToolEnvelope
from eventstore.boundary.tool_boundary import ToolBoundary
from eventstore.store import Store
from eventstore.writer import Head, head_of
from machine.events import payload_digest


async def server_ms(store: Store) -> int:
    """The server's clock, in milliseconds (what a lease is judged by)."""
    seconds, micros = await store.client.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def until_lapsed(store: Store, run_id: str, call: str) -> None:
    """Wait until the call's lease has passed by the server's clock."""
    key = store.keys.record(run_id, call)
    while True:
        until = await store.client.hget(key, "lease_until_ms")
        assert until is not None, "the call holds no lease"
        if await server_ms(store) >= int(until):
            return
        await asyncio.sleep(0.02)


async def head(store: Store, run_id: str, call: str) -> Head:
    """Where the call stands now."""
    record = await store.reader.get(run_id, call)
    assert record is not None
    return head_of(record.state, record.expires_at_ms)


async def dispatched_and_left(
    boundary: ToolBoundary,
    run_id: str,
    call: str,
    tool: str,
    arguments: dict[str, Any],
    *,
    raw: bytes | None = None,
) -> None:
    """A governed call recorded, approved and dispatched by a process that then died.

    With ``raw``, that process also recorded the tool's raw response (it died in the
    projector). The call is left holding that process's lease, which nobody renews.
    """
    store = boundary.store
    reply = await boundary.invoke(
        RunContext(run_id),
        ToolEnvelope(run_id=run_id, tool_call_id=call, tool=tool, arguments=arguments),
    )
    assert isinstance(reply, ApprovalPending), reply
    await store.decide(run_id, call, approve=True, by="ops", reason="checked")
    record = await store.reader.get(run_id, call)
    assert record is not None
    permit = await store.writer.dispatch(
        head_of(record.state, record.expires_at_ms), tool, payload_digest(record.request)
    )
    if raw is not None:
        await store.writer.start_projecting(permit.head, raw)


async def started_and_left(
    store: Store, run_id: str, call: str, tool: str, request: bytes, *, raw: bytes | None = None
) -> None:
    """An ungoverned call created by a process that then died (with its raw response)."""
    first = await store.writer.create(run_id, call, tool, request)
    if raw is not None:
        await store.writer.start_projecting(first, raw)
