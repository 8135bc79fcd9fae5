"""A run holding one call in every stage a door shows, and a paused run, for the door tests.

``run-st``: ``w1`` awaiting approval, ``a1`` approved and not dispatched, ``d1`` in flight
under a live process, ``t1`` a governed call attempted (its process died after the permit),
``b1`` an ungoverned call abandoned (its process died), ``r1`` ready, ``e1`` error, ``s1``
a governed call settled as not executed (reconciled). ``run-paused`` is paused by ana.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final

from eventstore.store import Store
from eventstore.writer import Head, head_of, now_ms
from machine.codes import ErrorCode, EvidenceStatus
from tests.support.left_calls import until_lapsed

RUN: Final = "run-st"
PAUSED: Final = "run-paused"
REQUEST: Final = b'{"amount":5}'
#: Each call of RUN and the stage every door must show it in.
STAGES: Final = {
    "w1": "awaiting_approval",
    "a1": "approved",
    "d1": "dispatching",
    "t1": "attempted",
    "b1": "abandoned",
    "r1": "ready",
    "e1": "error",
    "s1": "reconciled",
}
#: The lease of the calls left by a process that "died" (short, so the test waits little).
SHORT_LEASE: Final = timedelta(milliseconds=300)


async def _governed(store: Store, call: str, *, approve: bool = False) -> Head:
    head = await store.writer.request_approval(
        RUN,
        call,
        "refund",
        REQUEST,
        approval_id=f"{call}-approval".ljust(32, "0"),
        approval_expires_at_ms=now_ms() + 600_000,
        requested_by="agent",
    )
    if approve:
        head = await store.writer.approve(head, "ops", "checked", "d" * 32)
    return head


async def _dispatched(store: Store, call: str) -> Head:
    head = await _governed(store, call, approve=True)
    record = await store.reader.get(RUN, call)
    assert record is not None
    permit = await store.writer.dispatch(head, "refund", record.state.request_sha256)
    return permit.head


async def every_stage(make_store: Any) -> Store:
    """Write RUN and PAUSED; returns the store (its lease a long one) to read them with."""
    store: Store = make_store(shards=2, lease=timedelta(minutes=10))
    short: Store = make_store(shards=2, lease=SHORT_LEASE, namespace=store.keys.namespace)
    await store.open_run(RUN, deadline=timedelta(minutes=10))
    await store.open_run(PAUSED, deadline=timedelta(minutes=10))
    await _governed(store, "w1")
    await _governed(store, "a1", approve=True)
    await store.writer.create(RUN, "d1", "lookup", REQUEST)
    await _dispatched(short, "t1")
    await short.writer.create(RUN, "b1", "lookup", REQUEST)
    head = await store.writer.create(RUN, "r1", "lookup", REQUEST)
    head = await store.writer.start_projecting(head, b'{"raw":1}')
    await store.writer.complete(head, b'{"ok":1}', EvidenceStatus.EVIDENCE_FOUND, "docs")
    head = await store.writer.create(RUN, "e1", "lookup", REQUEST)
    await store.writer.fail(head, ErrorCode.EXECUTION_FAILED)
    await _dispatched(short, "s1")
    for call in ("t1", "b1", "s1"):
        await until_lapsed(short, RUN, call)
    record = await short.reader.get(RUN, "s1")
    assert record is not None
    await short.writer.settle(
        head_of(record.state, record.expires_at_ms),
        ErrorCode.RECONCILED_NOT_EXECUTED,
        "ana",
        b"no refund with this key",
    )
    await store.pause_run(PAUSED, by="ana", reason="incident 42")
    return store
