"""Python and Lua agree: the pure fold and the Redis scripts accept and refuse alike."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventstore.errors import RecordExpired, Refused
from eventstore.store import Store
from eventstore.writer import Head, head_of, now_ms
from machine.codes import ErrorCode, EvidenceStatus, Stage
from machine.events import (
    CREATING_EVENTS,
    EVENT_TYPES,
    LAPSED_EVENTS,
    Dispatched,
    Event,
    event_type,
)
from machine.fold import (
    ChainBroken,
    FoldError,
    IllegalTransition,
    InvalidEvidence,
    InvocationState,
    VersionMismatch,
    fold,
    state_from_record,
)
from machine.lifecycle import TRANSITIONS
from tests.helpers import (
    PAYLOADS,
    RAW,
    REQUEST,
    RESULT,
    TOOL,
    make_event,
    record_fields,
)

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-1"

#: The Lua refusal code for each reason the fold gives.
_LUA_CODE: dict[type[FoldError], str] = {
    VersionMismatch: "VERSION_CONFLICT",
    ChainBroken: "CHAIN_BROKEN",
    IllegalTransition: "ILLEGAL_TRANSITION",
    InvalidEvidence: "INVALID_EVIDENCE_STATUS",
}


def expected_lua_code(state: InvocationState | None, event: Event, error: FoldError) -> str:
    """The refusal Redis must give where the fold raised ``error``.

    Creating an invocation that exists is a duplicate call, and updating one that does
    not exist finds no record; otherwise the reason is the fold's own.
    """
    creating = event_type(event) in CREATING_EVENTS
    if state is not None and creating:
        return ErrorCode.DUPLICATE_TOOL_CALL.value
    if state is None and not creating:
        return ErrorCode.RECORD_EXPIRED.value
    return _LUA_CODE[type(error)]


@pytest.fixture
async def store(make_open_store: Any) -> Store:
    """A store on the test's namespace with one open, unrestricted run."""
    store: Store = await make_open_store(shards=4, ttl=timedelta(minutes=5))
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    return store


async def redis_state(store: Store, tool_call_id: str) -> InvocationState | None:
    """The lifecycle state held by the record in Redis, or None when there is none."""
    fields = await record_fields(store, RUN, tool_call_id)
    if not fields:
        return None
    return state_from_record({k.decode(): v.decode() for k, v in fields.items()})


async def drive(store: Store, tool_call_id: str, stage: Stage) -> None:
    """Write the legal path into ``stage`` through the Writer's own methods."""
    if stage is Stage.NEW:
        return
    writer = store.writer
    if stage in (Stage.AWAITING_APPROVAL, Stage.APPROVED):
        head = await writer.request_approval(
            RUN,
            tool_call_id,
            TOOL,
            REQUEST,
            approval_id="a" * 32,
            approval_expires_at_ms=now_ms() + 60_000,
            requested_by="agent",
        )
        if stage is Stage.APPROVED:
            await writer.approve(head, "ops", "ok", "d" * 32)
        return
    head = await writer.create(RUN, tool_call_id, TOOL, REQUEST)
    if stage is Stage.ERROR:
        await writer.fail(head, ErrorCode.EXECUTION_FAILED)
        return
    if stage in (Stage.PROJECTING, Stage.READY):
        head = await writer.start_projecting(head, RAW)
    if stage is Stage.READY:
        await writer.complete(head, RESULT, EvidenceStatus.EVIDENCE_FOUND, "docs")


async def apply_both(
    store: Store, tool_call_id: str, state: InvocationState | None, event: Event
) -> InvocationState | None:
    """Apply ``event`` in Python and in Redis, assert they agree, return the new state."""
    try:
        expected: InvocationState | FoldError = fold(state, event)
    except FoldError as exc:
        expected = exc
    try:
        outcome: Head | Refused = await store.writer.append(
            event, PAYLOADS.get(event_type(event)), run_id=RUN, tool_call_id=tool_call_id
        )
    except Refused as exc:
        outcome = exc
    after = await redis_state(store, tool_call_id)
    if isinstance(event, Dispatched) and not isinstance(expected, FoldError):
        # The one dispatch permit is permit.lua's (it judges the journal): append.lua
        # refuses it where the fold would take it (test_a_permit_folds_as_the_fold_does).
        assert isinstance(outcome, Refused) and outcome.code == "PERMIT_REQUIRED"
        assert after == state, "a refused event changed the record"
        return state
    if event_type(event) in LAPSED_EVENTS and not isinstance(expected, FoldError):
        # Taking a call from its holder is lapsed.lua's (it judges the lease): append.lua
        # refuses it where the fold would take it (tests/integration/reconcile/test_leases.py).
        assert isinstance(outcome, Refused) and outcome.code == "LAPSE_REQUIRED"
        assert after == state, "a refused event changed the record"
        return state
    if isinstance(expected, FoldError):
        assert isinstance(outcome, Refused), f"Lua accepted what the fold refused: {expected!r}"
        assert outcome.code == expected_lua_code(state, event, expected)
        assert isinstance(outcome, RecordExpired) == (outcome.code == "RECORD_EXPIRED")
        if state is not None and event_type(event) not in CREATING_EVENTS:
            assert outcome.current_version == state.version
        assert after == state, "a refused event changed the record"
        return state
    assert isinstance(outcome, Head), f"Lua refused what the fold accepted: {outcome!r}"
    assert outcome.version == event.version
    assert outcome.last_hash == expected.last_hash
    assert outcome.entry_id != ""
    assert after == expected
    return expected


def _cases() -> list[tuple[Stage, str, EvidenceStatus]]:
    cases = []
    for stage in Stage:
        for kind in EVENT_TYPES:
            evidences = list(EvidenceStatus) if kind == "Completed" else [EvidenceStatus.PENDING]
            cases += [(stage, kind, evidence) for evidence in evidences]
    return cases


_CASES = _cases()


@pytest.mark.parametrize(
    ("stage", "kind", "evidence"),
    _CASES,
    ids=[f"{s.value}-{k}" + (f"-{e.value}" if k == "Completed" else "") for s, k, e in _CASES],
)
async def test_every_stage_and_event_pair_agrees(
    store: Store, stage: Stage, kind: str, evidence: EvidenceStatus
) -> None:
    """In every stage, each event type is accepted by both or refused by both alike."""
    await drive(store, "call-1", stage)
    state = await redis_state(store, "call-1")
    assert (state.stage if state else Stage.NEW) is stage
    if kind == "Preflighted":
        event = make_event(kind, None, evidence=evidence)  # a creation is always version 1
    else:
        event = make_event(kind, state, evidence=evidence)
    streamed = await store.client.xlen(store.keys.stream(RUN, "call-1"))
    after = await apply_both(store, "call-1", state, event)
    grew = await store.client.xlen(store.keys.stream(RUN, "call-1")) - streamed
    assert grew == (0 if after == state else 1)


async def test_a_permit_folds_as_the_fold_does(store: Store) -> None:
    """The permit script's Dispatched leaves the record exactly as the pure fold of the
    journal's events says, as every other script's event does."""
    await drive(store, "call-1", Stage.APPROVED)
    state = await redis_state(store, "call-1")
    assert state is not None
    expires = int(await store.client.hget(store.keys.record(RUN, "call-1"), "expires_at_ms"))
    permit = await store.writer.dispatch(head_of(state, expires), TOOL, state.request_sha256)
    assert permit.request == REQUEST
    events = await store.reader.events(RUN, "call-1")
    expected = None
    for stored in events:
        assert stored.event is not None
        expected = fold(expected, stored.event, stored.computed_hash)
    assert await redis_state(store, "call-1") == expected
    assert expected is not None and expected.stage is Stage.EXECUTING
    assert permit.head.version == expected.version == 3


@pytest.mark.parametrize("version", [-1, 0, 1, 3, 9])
async def test_out_of_order_versions_agree(store: Store, version: int) -> None:
    """A version other than the next one is a version conflict in Python and in Redis."""
    await drive(store, "call-1", Stage.EXECUTING)
    state = await redis_state(store, "call-1")
    event = make_event("ProjectingStarted", state, version=version)
    assert await apply_both(store, "call-1", state, event) is state


async def test_a_forged_predecessor_agrees(store: Store) -> None:
    """An event naming another predecessor breaks the chain in Python and in Redis."""
    await drive(store, "call-1", Stage.PROJECTING)
    state = await redis_state(store, "call-1")
    event = make_event("Completed", state, prev_hash="c" * 64)
    assert await apply_both(store, "call-1", state, event) is state


async def test_a_retried_event_is_applied_once_and_names_itself(store: Store) -> None:
    """Re-sending an applied event answers with that event's Head and changes nothing."""
    first = make_event("Preflighted", None)
    head = await store.writer.append(first, REQUEST, run_id=RUN, tool_call_id="call-1")
    second = make_event("ProjectingStarted", await redis_state(store, "call-1"))
    await store.writer.append(second, RAW, run_id=RUN, tool_call_id="call-1")
    before = await redis_state(store, "call-1")
    again = await store.writer.append(first, REQUEST, run_id=RUN, tool_call_id="call-1")
    assert (again.version, again.last_hash, again.entry_id) == (1, head.last_hash, "")
    assert await redis_state(store, "call-1") == before


_counter = itertools.count()
#: Mostly legal moves, so sequences reach every stage; the rest probe refusals.
_ACTIONS = ["legal"] * 4 + ["any"] * 2 + ["retry"]
_OFFSETS = [0] * 5 + [-2, -1, 1, 3]  # version offset from the expected one
_CHAINED = [True] * 4 + [False]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data(), length=st.integers(min_value=1, max_value=8))
async def test_random_event_sequences_agree(store: Store, data: st.DataObject, length: int) -> None:
    """After every step of a random sequence, Redis holds the fold's state or both refused."""
    tool_call_id = f"call-{next(_counter)}"
    state: InvocationState | None = None
    applied: list[Event] = []
    for _ in range(length):
        action = data.draw(st.sampled_from(_ACTIONS))
        if action == "retry":
            if not applied:
                continue
            event = data.draw(st.sampled_from(applied))
            head = await store.writer.append(
                event, PAYLOADS.get(event_type(event)), run_id=RUN, tool_call_id=tool_call_id
            )
            assert (head.version, head.entry_id) == (event.version, "")
            assert await redis_state(store, tool_call_id) == state
            continue
        stage = state.stage if state else Stage.NEW
        legal = [kind for kind in EVENT_TYPES if (stage, kind) in TRANSITIONS]
        kinds = legal if action == "legal" and legal else list(EVENT_TYPES)
        kind = data.draw(st.sampled_from(kinds))
        expected_version = state.version + 1 if state else 1
        event = make_event(
            kind,
            state,
            tool_call_id=tool_call_id,
            version=expected_version + data.draw(st.sampled_from(_OFFSETS)),
            prev_hash=None if data.draw(st.sampled_from(_CHAINED)) else "b" * 64,
            evidence=data.draw(st.sampled_from(list(EvidenceStatus))),
        )
        new_state = await apply_both(store, tool_call_id, state, event)
        if new_state is not state:
            applied.append(event)
        state = new_state
    stored = await store.events(RUN, tool_call_id)
    assert [entry.event for entry in stored] == applied
    if state is not None:
        assert stored[-1].stored_hash == state.last_hash
