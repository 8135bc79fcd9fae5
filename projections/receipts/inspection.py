"""Read-only inspection of one invocation through its run: the receipt API's core.

The lookup goes through the run's own registry entry (``inv:<invocation id>``), so an
invocation of another run is exactly as invisible as one that never existed. A
materialized receipt is served when it is as new as the record, its journal state can
no longer change with time, and the record still agrees with its journal (the cheap
check of :mod:`projections.receipts.agreement`); otherwise the receipt is built from the
record and stream.
Nothing here writes: no record, no expiry, no counter.
"""

from __future__ import annotations

from typing import Any, Final, cast

import msgspec

from eventstore.errors import CanonError, redis_errors
from eventstore.runs import RunInfo
from eventstore.store import Store
from eventstore.writer import now_ms
from machine.ids import is_invocation_id, is_run_id
from projections.generations import current_generation
from projections.receipts.agreement import STREAM_READ_COUNT, disagreement
from projections.receipts.builder import Receipt, decode_receipt, iso_ms
from projections.receipts.journal import JournalState
from projections.receipts.projection import RECEIPT_PROJECTION
from projections.receipts.snapshot import (
    RECEIPT_FIELDS,
    receipt_of,
    receipt_snapshot_of,
    with_shared_result,
)

#: Journal states that do not turn into ``uncertain`` as time passes.
_SETTLED: Final = frozenset(
    {JournalState.COMPLETED, JournalState.EVIDENCE_DEGRADED, JournalState.UNKNOWN}
)


class InvocationNotFound(CanonError):
    """Raised when the run has no such invocation, or its record has expired."""


class CapabilityChanged(CanonError):
    """Raised when the invocation's tool was revoked from the run since the call."""


async def _current_receipt(
    store: Store, run_id: str, invocation_id: str, tool_call_id: str
) -> Receipt | None:
    """Return the invocation's receipt as of now, or None when its record is absent.

    One MULTI reads the materialized receipt, the record's receipt fields and the start of
    its stream (enough for :func:`disagreement`). The materialized receipt is served only
    when it is as new as the record, its journal state can no longer change with time, and
    the record still agrees with its journal; otherwise the receipt is built from what was
    read, so a record tampered with after its receipt was stored is judged as it is now.
    """
    keys = store.keys
    generation = await current_generation(store, RECEIPT_PROJECTION)
    async with redis_errors(), store.client.pipeline(transaction=True) as pipe:
        pipe.hmget(keys.receipt(run_id, invocation_id, generation), ["version", "receipt"])
        pipe.hmget(keys.record(run_id, tool_call_id), list(RECEIPT_FIELDS))
        pipe.xrange(keys.stream(run_id, tool_call_id), count=STREAM_READ_COUNT)
        (stored_version, body), values, entries = cast(
            tuple[list[bytes | None], list[bytes | None], list[Any]], await pipe.execute()
        )
    snapshot = receipt_snapshot_of(values, entries, now_ms())
    if not snapshot.fields:
        return None
    snapshot = await with_shared_result(store, run_id, tool_call_id, snapshot)
    if (
        body is not None
        and stored_version == snapshot.fields.get("version")
        and disagreement(snapshot.fields, snapshot.events) is None
    ):
        try:
            receipt = decode_receipt(body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass
        else:
            if receipt.journal_state in _SETTLED:
                return msgspec.structs.replace(receipt, observed_at=iso_ms(snapshot.observed_at_ms))
    return receipt_of(store, snapshot)


async def inspect_invocation(
    store: Store, run_id: str, invocation_id: str, *, run: RunInfo | None = None
) -> Receipt:
    """Return the receipt of one of ``run_id``'s invocations. Read-only.

    Args:
        store: the store.
        run_id: the run the caller is authorized for.
        invocation_id: 64 lowercase hex digits.
        run: the run's registry entry, when the caller has already read it.

    Raises:
        InvocationNotFound: absent, expired, or not an invocation of this run.
        CapabilityChanged: the invocation's tool has since been revoked from the run.
        StoreUnavailable: Redis failed or timed out.

    """
    if not (is_run_id(run_id) and is_invocation_id(invocation_id)):
        raise InvocationNotFound()
    tool_call_id = await store.runs.tool_call_id_of(run_id, invocation_id)
    if tool_call_id is None or not store.keys.accepts_tool_call_id(tool_call_id):
        raise InvocationNotFound()
    receipt = await _current_receipt(store, run_id, invocation_id, tool_call_id)
    if receipt is None:
        raise InvocationNotFound()
    if receipt.invocation_id != invocation_id or receipt.run_id != run_id:
        # A record whose own ids disagree with the run's index is never shown.
        raise InvocationNotFound()
    if run is None:
        run = await store.runs.info(run_id)
    if run is None:
        raise InvocationNotFound()
    if receipt.tool in run.revoked:
        raise CapabilityChanged()
    return receipt
