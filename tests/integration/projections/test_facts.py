"""observed_facts: bounded by count and by encoded bytes; NO_EVIDENCE is a negative observation."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import msgspec

from eventstore.boundary.contracts import RunContext
from eventstore.store import Store
from eventstore.writer import Head
from machine.codes import ErrorCode, EvidenceStatus
from machine.limits import Limits
from projections import observed_facts

RUN = "run-f"


async def finish(
    store: Store, name: str, evidence: EvidenceStatus | None, scope: str = "s"
) -> Head:
    """A READY call with ``evidence`` and ``scope``, or an ERROR call when ``evidence`` is None."""
    head = await store.writer.create(RUN, name, "search", b'{"q":1}')
    head = await store.writer.start_projecting(head, b'{"raw":1}')
    if evidence is None:
        return await store.writer.fail(head, ErrorCode.PROJECTION_FAILED)
    return await store.writer.complete(head, b'{"a":1}', evidence, scope)


def encoded_sizes(facts: list[Any]) -> list[int]:
    """Each fact's encoded UTF-8 size, the measure ``facts_bytes`` bounds."""
    return [len(msgspec.json.encode(fact)) for fact in facts]


async def test_facts_stop_before_their_byte_bound_is_exceeded(make_store: Any) -> None:
    """Facts are whole and in order, their encoded total never passes facts_bytes (UTF-8, with
    3- and 4-byte scopes), and no later, smaller fact slips in after one that did not fit."""
    roomy: Store = make_store(shards=1)
    await roomy.open_run(RUN, deadline=timedelta(minutes=5))
    for name, scope in (("c0", "é" * 40), ("c1", "𝄞" * 60), ("c2", "s"), ("c3", "s")):
        await finish(roomy, name, EvidenceStatus.EVIDENCE_FOUND, scope)
    sizes = encoded_sizes(await observed_facts(roomy, RunContext(RUN)))
    assert sizes[1] > sizes[2], "the fact that does not fit is bigger than the next one"

    one_byte_short: Store = make_store(shards=1, limits=Limits(facts_bytes=sizes[0] + sizes[1] - 1))
    exact: Store = make_store(shards=1, limits=Limits(facts_bytes=sizes[0] + sizes[1]))
    short_facts = await observed_facts(one_byte_short, RunContext(RUN))
    exact_facts = await observed_facts(exact, RunContext(RUN))

    assert [fact.tool_call_id for fact in short_facts] == ["c0"]
    assert [fact.tool_call_id for fact in exact_facts] == ["c0", "c1"]
    assert exact_facts[1].scope == "𝄞" * 60, "a fact is never cut"
    assert sum(encoded_sizes(short_facts)) <= sizes[0] + sizes[1] - 1
    assert sum(encoded_sizes(exact_facts)) == sizes[0] + sizes[1]


async def test_facts_stop_at_their_count_bound(make_store: Any) -> None:
    """With fact_count=2 exactly the two earliest qualifying calls become facts; ERROR calls in
    between take no slot."""
    store: Store = make_store(shards=1, limits=Limits(fact_count=2))
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    await finish(store, "c0", EvidenceStatus.EVIDENCE_FOUND)
    await finish(store, "c1", None)
    await finish(store, "c2", EvidenceStatus.NO_EVIDENCE)
    await finish(store, "c3", EvidenceStatus.EVIDENCE_FOUND)
    await finish(store, "c4", EvidenceStatus.EVIDENCE_FOUND)

    facts = await observed_facts(store, RunContext(RUN))

    assert [(fact.tool_call_id, fact.position) for fact in facts] == [("c0", 1), ("c2", 3)]


async def test_no_evidence_becomes_a_scoped_negative_observation(make_store: Any) -> None:
    """NO_EVIDENCE becomes a negative observation keeping its scope; EVIDENCE_FOUND is evidence."""
    store: Store = make_store(shards=1)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    await finish(store, "found", EvidenceStatus.EVIDENCE_FOUND, "orders:2026")
    await finish(store, "none", EvidenceStatus.NO_EVIDENCE, "tickets:7d")

    facts = await observed_facts(store, RunContext(RUN))

    assert [(f.tool_call_id, f.kind, f.evidence_status, f.scope) for f in facts] == [
        ("found", "evidence", EvidenceStatus.EVIDENCE_FOUND, "orders:2026"),
        ("none", "negative_observation", EvidenceStatus.NO_EVIDENCE, "tickets:7d"),
    ]
