"""Run progress: observed facts resolved from the run's ordered canonical identities.

The progress list holds only ``run_id:tool_call_id`` identities of finished calls, in the
order they finished. Facts are rebuilt by reading each identity's record through the
store; only READY records of the same run qualify. Neither the list nor a fact holds a
raw response or a complete agent result: a fact carries ids, the evidence status, the
scope and the result's digest and size.
"""

from __future__ import annotations

from typing import Final, Literal, cast

import msgspec

from eventstore.boundary.contracts import RunContext
from eventstore.errors import redis_errors
from eventstore.store import Store
from eventstore.wire.keys import split_identity
from machine.codes import EvidenceStatus, Status
from machine.ids import invocation_id, is_run_id, is_tool_call_id

#: Record fields a fact is built from; payload fields are never read.
_FIELDS: Final = (
    "run_id",
    "tool_call_id",
    "tool",
    "status",
    "evidence_status",
    "scope",
    "result_sha256",
    "result_bytes",
    "updated_at_ms",
)

FactKind = Literal["evidence", "negative_observation"]


class ObservedFact(msgspec.Struct, frozen=True, kw_only=True):
    """One bounded fact about a READY call of the run.

    ``negative_observation`` facts come from NO_EVIDENCE results: they say that nothing
    was found within ``scope``, never that something is true.
    """

    position: int
    run_id: str
    tool_call_id: str
    invocation_id: str
    tool: str
    kind: FactKind
    evidence_status: EvidenceStatus
    scope: str
    result_sha256: str
    result_bytes: int
    completed_at_ms: int


_encoder: Final = msgspec.json.Encoder()


def fact_from_fields(
    position: int, run_id: str, identity: str, values: list[bytes | None]
) -> ObservedFact | None:
    """Build the fact of one progress identity, or None when it does not qualify.

    Missing or expired records, identities of another run, and records that are not
    READY (PROJECTING, ERROR) or whose evidence is not a READY evidence status never
    become facts.
    """
    owner, tool_call_id = split_identity(identity)
    if owner != run_id or not is_tool_call_id(tool_call_id):
        return None
    fields = dict(zip(_FIELDS, values, strict=True))
    if any(value is None for name, value in fields.items() if name != "scope"):
        return None
    text = {name: (value or b"").decode("utf-8", "replace") for name, value in fields.items()}
    if text["run_id"] != run_id or text["tool_call_id"] != tool_call_id:
        return None
    if text["status"] != Status.READY.value:
        return None
    if text["evidence_status"] == EvidenceStatus.EVIDENCE_FOUND.value:
        kind: FactKind = "evidence"
    elif text["evidence_status"] == EvidenceStatus.NO_EVIDENCE.value:
        kind = "negative_observation"
    else:
        return None
    try:
        return ObservedFact(
            position=position,
            run_id=run_id,
            tool_call_id=tool_call_id,
            invocation_id=invocation_id(run_id, tool_call_id),
            tool=text["tool"],
            kind=kind,
            evidence_status=EvidenceStatus(text["evidence_status"]),
            scope=text["scope"],
            result_sha256=text["result_sha256"],
            result_bytes=int(text["result_bytes"]),
            completed_at_ms=int(text["updated_at_ms"]),
        )
    except ValueError:
        return None


async def _read_page(
    store: Store, run_id: str, start: int, count: int
) -> list[tuple[str, list[bytes | None] | None]]:
    """Read one page of identities and the fact fields of their records."""
    keys = store.keys
    async with redis_errors():
        page = cast(
            list[bytes],
            await store.client.lrange(keys.progress(run_id), start, start + count - 1),
        )
        identities = [raw.decode("utf-8", "replace") for raw in page]
        # Only identities of this run whose call id the layout can hold are read.
        readable = [
            (owner == run_id and keys.accepts_tool_call_id(call), call)
            for owner, call in map(split_identity, identities)
        ]
        async with store.client.pipeline(transaction=False) as pipe:
            for ok, call_id in readable:
                if ok:
                    pipe.hmget(keys.record(run_id, call_id), list(_FIELDS))
            rows = iter(cast(list[list[bytes | None]], await pipe.execute()))
    return [
        (identity, next(rows) if ok else None)
        for identity, (ok, _) in zip(identities, readable, strict=True)
    ]


class FactScan(msgspec.Struct, kw_only=True):
    """How far facts have been resolved along a run's progress list.

    Attributes:
        facts: the facts found so far, in execution order.
        used_bytes: their encoded size.
        position: how many progress identities have been read.
        full: the count or byte bound was reached; no later identity can add a fact.

    """

    facts: list[ObservedFact] = msgspec.field(default_factory=list)
    used_bytes: int = 0
    position: int = 0
    full: bool = False


async def extend_facts(store: Store, run_id: str, scan: FactScan | None = None) -> FactScan:
    """Resolve the identities appended since ``scan`` and return the extended scan.

    Identities only ever get appended to a progress list, and a finished record's fact
    never changes, so a projection can extend an earlier scan instead of starting over
    (a fact whose record has expired since stays in the extended scan; only a scan from
    the start, as :func:`observed_facts` does, drops it). ``scan`` is not modified.
    """
    limits = store.settings.limits
    scan = FactScan() if scan is None else msgspec.structs.replace(scan, facts=list(scan.facts))
    if scan.full or not is_run_id(run_id):
        return scan
    page_size = max(16, limits.fact_count)
    while True:
        page = await _read_page(store, run_id, scan.position, page_size)
        for identity, values in page:
            scan.position += 1
            fact = (
                None
                if values is None
                else fact_from_fields(scan.position, run_id, identity, values)
            )
            if fact is None:
                continue
            size = len(_encoder.encode(fact))
            if len(scan.facts) >= limits.fact_count or scan.used_bytes + size > limits.facts_bytes:
                scan.full = True
                return scan
            scan.facts.append(fact)
            scan.used_bytes += size
        if len(page) < page_size:
            return scan


async def observed_facts(store: Store, ctx: RunContext) -> list[ObservedFact]:
    """Resolve the run's finished calls into bounded facts, in execution order.

    At most ``fact_count`` facts and ``facts_bytes`` bytes of encoded facts (the store's
    limits) are returned; later facts are left out rather than cut. The progress list
    is read in pages, so a long run costs no more memory than one page.
    """
    return (await extend_facts(store, ctx.run_id)).facts
