"""Read-only inspection of one invocation through its run: the receipt API's core.

The lookup goes through the run's own registry entry (``inv:<invocation id>``), so an
invocation of another run is exactly as invisible as one that never existed. A
materialized receipt is served when it is as new as the record and its journal state can
no longer change with time; otherwise the receipt is built from the record and stream.
Nothing here writes: no record, no expiry, no counter.
"""

from __future__ import annotations

from typing import Final, cast

import msgspec

from eventstore.errors import CanonError, redis_errors
from eventstore.runs import RunInfo
from eventstore.store import Store
from eventstore.writer import now_ms
from machine.ids import is_invocation_id, is_run_id
from projections.generations import current_generation
from projections.journal import JournalState
from projections.receipt_projection import RECEIPT_PROJECTION
from projections.receipt_snapshot import read_receipt_snapshot, receipt_of
from projections.receipts import Receipt, decode_receipt, iso_ms

#: Journal states that do not turn into ``uncertain`` as time passes.
_SETTLED: Final = frozenset(
    {JournalState.COMPLETED, JournalState.EVIDENCE_DEGRADED, JournalState.UNKNOWN}
)


class InvocationNotFound(CanonError):
    """Raised when the run has no such invocation, or its record has expired."""


class CapabilityChanged(CanonError):
    """Raised when the invocation's tool was revoked from the run since the call."""


async def _materialized(
    store: Store, run_id: str, invocation_id: str, tool_call_id: str
) -> Receipt | None:
    """Return the stored receipt if it reflects the record's current version, else None."""
    keys = store.keys
    generation = await current_generation(store, RECEIPT_PROJECTION)
    async with redis_errors(), store.client.pipeline(transaction=True) as pipe:
        pipe.hmget(keys.receipt(run_id, invocation_id, generation), ["version", "receipt"])
        pipe.hget(keys.record(run_id, tool_call_id), "version")
        (stored_version, body), record_version = cast(
            tuple[list[bytes | None], bytes | None], await pipe.execute()
        )
    if stored_version is None or body is None or record_version != stored_version:
        return None
    try:
        receipt = decode_receipt(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if receipt.journal_state not in _SETTLED:
        return None
    return msgspec.structs.replace(receipt, observed_at=iso_ms(now_ms()))


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
    receipt = await _materialized(store, run_id, invocation_id, tool_call_id)
    if receipt is None:
        snapshot = await read_receipt_snapshot(store, run_id, tool_call_id)
        if not snapshot.fields:
            raise InvocationNotFound()
        receipt = receipt_of(store, snapshot)
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
