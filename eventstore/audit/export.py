"""Export one run for an auditor: JSON Lines of record metadata and events.

Lines, in order: one ``export`` header, one ``run`` line (the registry entry; never the
token hash), then per invocation one ``record`` line followed by its ``event`` lines,
and one closing ``end`` line with the counts. Payload bytes (request, raw response,
agent result, and the harness-only failure detail of a failed call) are included only
when asked for, as UTF-8 text or, for bytes that are not UTF-8, base64; otherwise
``stored_payload_bytes`` gives their sizes. Everything is read, nothing written.
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final

import msgspec

from eventstore.audit.checks import problems_of
from eventstore.audit.readonly import Snapshot
from eventstore.audit.source import AuditSource, source_of
from eventstore.reader import StoredEvent
from eventstore.store import Store
from machine.events import PAYLOAD_FIELDS, stored_document
from machine.fold import InvocationState
from machine.ids import invocation_id, is_run_id
from machine.results import resolve_result

#: Format marker of the export header line.
EXPORT_FORMAT: Final = "canon.export.v1"
_METADATA_FIELDS: Final = frozenset(InvocationState.__struct_fields__) | {
    "invocation_id",
    "expires_at_ms",
}

Line = dict[str, Any]


def encode_payload(data: bytes) -> dict[str, str]:
    """Return a payload as ``{"encoding": "utf-8", "text"}`` or ``{"encoding": "base64"}``."""
    try:
        return {"encoding": "utf-8", "text": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"encoding": "base64", "data": base64.b64encode(data).decode("ascii")}


def _record_line(snapshot: Snapshot, *, with_payloads: bool) -> Line:
    fields = snapshot.fields
    metadata = {
        name.decode(): value.decode("utf-8", "replace")
        for name, value in sorted(fields.items())
        if name.decode("utf-8", "replace") in _METADATA_FIELDS
    }
    line: Line = {
        "kind": "record",
        "invocation_id": invocation_id(snapshot.run_id, snapshot.tool_call_id),
        "run_id": snapshot.run_id,
        "tool_call_id": snapshot.tool_call_id,
        "record_present": bool(fields),
        "record_pttl_ms": snapshot.record_pttl_ms,
        "stream_pttl_ms": snapshot.stream_pttl_ms,
        "fields": metadata,
        "stored_payload_bytes": {
            name: len(fields[name.encode()]) for name in PAYLOAD_FIELDS if name.encode() in fields
        },
        "problems": problems_of(snapshot),
    }
    if snapshot.archived:
        line["archived"] = True
    if with_payloads:
        line["payloads"] = {
            name: encode_payload(payload)
            for name in PAYLOAD_FIELDS
            if (payload := _payload(fields, name)) is not None
        }
    return line


def _payload(fields: Mapping[bytes, bytes], name: str) -> bytes | None:
    """A record's payload as written (a result stored once, as the raw response, resolved)."""
    if name == "result":
        return resolve_result(fields.get(b"result"), fields.get(b"raw"))
    return fields.get(name.encode())


def _event_line(inv_id: str, stored: StoredEvent) -> Line:
    line: Line = {
        "kind": "event",
        "invocation_id": inv_id,
        "entry_id": stored.entry_id,
        "stored_hash": stored.stored_hash,
        "computed_hash": stored.computed_hash,
        "decodable": stored.event is not None,
    }
    try:
        line["event"] = stored_document(stored.data)
    except msgspec.DecodeError:
        line["event"] = None
        line["data"] = encode_payload(stored.data)
    return line


async def export_run(
    store: Store | AuditSource, run_id: str, *, with_payloads: bool = False
) -> AsyncIterator[Line]:
    """Yield the export lines of one run (see the module docstring for their order).

    ``store`` is read through Redis, or an :class:`~.source.AuditSource` (an archive):
    the lines are the same, but that the header and each record say ``archived``.

    Raises:
        ValueError: the run id is not a run id (:func:`machine.ids.is_run_id`).
        StoreUnavailable: Redis failed or timed out.

    """
    if not is_run_id(run_id):
        raise ValueError("run id must be a safe id")
    source = source_of(store)
    header: Line = {
        "kind": "export",
        "format": EXPORT_FORMAT,
        "namespace": source.namespace,
        "run_id": run_id,
        "exported_at_ms": time.time_ns() // 1_000_000,
        "with_payloads": with_payloads,
    }
    if source.archived:
        header["archived"] = True
    yield header
    info = await source.run_info(run_id)
    run_line: Line = {"kind": "run", "run_id": run_id, "present": info is not None}
    if info is not None:
        run_line.update(msgspec.to_builtins(info))
        run_line["revoked"] = sorted(info.revoked)
    erasure = await source.erasure(run_id)
    if erasure is not None:
        run_line["erased"] = {"by": erasure.by, "at_ms": erasure.at_ms, "reason": erasure.reason}
    yield run_line
    invocations = events = 0
    for tool_call_id in await source.tool_call_ids(run_id):
        snapshot = await source.snapshot(run_id, tool_call_id)
        if not snapshot.exists:
            continue
        invocations += 1
        record = _record_line(snapshot, with_payloads=with_payloads)
        yield record
        for stored in snapshot.events:
            events += 1
            yield _event_line(record["invocation_id"], stored)
    yield {"kind": "end", "invocations": invocations, "events": events}
