"""A call in flight is held by a lease its process renews; only once the lease lapsed (by
the server's clock) may a retry take the call over or a settlement end it, in one script
that folds exactly as the pure fold does."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from eventstore.audit import replay_invocation
from eventstore.errors import Refused
from eventstore.store import Store
from eventstore.wire.scripts import LeaseHeld
from eventstore.writer import Head, head_of, now_ms
from machine.codes import ErrorCode, Stage
from machine.fold import fold, state_from_record
from tests.helpers import RAW, REQUEST, TOOL

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-1"
LEASE = timedelta(milliseconds=300)


@pytest.fixture
async def store(make_open_store: Any) -> Store:
    """A store whose calls hold a 300 ms lease, with one open run."""
    store: Store = await make_open_store(shards=4, lease=LEASE)
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    return store


async def lease_of(store: Store, call: str) -> tuple[int, int]:
    """The record's (lease_version, lease_until_ms)."""
    version, until = await store.client.hmget(
        store.keys.record(RUN, call), ["lease_version", "lease_until_ms"]
    )
    return int(version), int(until)


async def past_its_lease(store: Store, call: str) -> Head:
    """Wait until the call's lease has lapsed by the server's clock; its head then."""
    _, until = await lease_of(store, call)
    while True:
        seconds, micros = await store.client.time()
        if seconds * 1000 + micros // 1000 >= until:
            break
        await asyncio.sleep(0.02)
    record = await store.reader.get(RUN, call)
    assert record is not None
    return head_of(record.state, record.expires_at_ms)


async def refolded(store: Store, call: str) -> Any:
    """The pure fold of the call's journal as stored."""
    state = None
    for stored in await store.reader.events(RUN, call):
        assert stored.event is not None
        state = fold(state, stored.event, stored.computed_hash)
    return state


async def record_state(store: Store, call: str) -> Any:
    fields = await store.client.hgetall(store.keys.record(RUN, call))
    return state_from_record({k.decode(): v.decode() for k, v in fields.items()})


async def test_a_call_that_starts_running_holds_a_lease_from_its_creation(store: Store) -> None:
    """Preflighted gives its writer the lease (version 1, the store's lease from now) in
    the creation script; a governed call waiting for approval holds none."""
    before = now_ms()
    await store.writer.create(RUN, "c1", TOOL, REQUEST)
    version, until = await lease_of(store, "c1")
    assert version == 1
    assert before + 200 <= until <= now_ms() + 1000
    await store.writer.request_approval(
        RUN,
        "g1",
        TOOL,
        REQUEST,
        approval_id="a" * 32,
        approval_expires_at_ms=now_ms() + 60_000,
        requested_by="agent",
    )
    assert await store.client.hget(store.keys.record(RUN, "g1"), "lease_until_ms") is None


async def test_only_the_holder_renews_and_only_while_in_flight(store: Store) -> None:
    """The holder's renewal moves the lease's end; another version, or an ended call, is
    not renewed; the record's fold and its replay are untouched by a renewal."""
    head = await store.writer.create(RUN, "c1", TOOL, REQUEST)
    _, first = await lease_of(store, "c1")
    await asyncio.sleep(0.05)
    renewed = await store.writer.renew_lease(RUN, "c1", 1)
    assert renewed is not None and renewed > first
    assert (await lease_of(store, "c1"))[1] == renewed
    assert await store.writer.renew_lease(RUN, "c1", 2) is None
    head = await store.writer.start_projecting(head, RAW)
    assert await store.writer.renew_lease(RUN, "c1", 1) is not None  # still its holder
    await store.writer.fail(head, ErrorCode.EXECUTION_FAILED)
    assert await store.writer.renew_lease(RUN, "c1", 1) is None
    assert await store.writer.renew_lease(RUN, "gone", 1) is None
    replay = await replay_invocation(store, RUN, "c1")
    assert replay is not None and replay.verdict.intact, replay.problems


async def test_nothing_takes_a_call_while_its_lease_is_held(store: Store) -> None:
    """A takeover or a settlement before the lease (or its grace) lapsed is LEASE_HELD,
    naming the lease's end, and writes nothing."""
    head = await store.writer.create(RUN, "c1", TOOL, REQUEST)
    _, until = await lease_of(store, "c1")
    with pytest.raises(LeaseHeld) as held:
        await store.writer.take_over(head, attempt=2, lapsed_at_ms=until)
    assert held.value.lease_until_ms == until and held.value.current_version == 1
    with pytest.raises(LeaseHeld):
        await store.writer.settle(head, ErrorCode.ABANDONED, "sweep", b"lapsed")
    head = await past_its_lease(store, "c1")
    with pytest.raises(LeaseHeld):
        await store.writer.settle(head, ErrorCode.ABANDONED, "sweep", b"x", grace_ms=60_000)
    assert (await record_state(store, "c1")).version == 1


async def test_a_takeover_folds_as_the_fold_does_and_holds_the_lease(store: Store) -> None:
    """Past its lease an ungoverned call is taken over (EXECUTING, version + 1); the record
    is exactly the fold of its journal, the taker holds the lease, the old holder not."""
    await store.writer.create(RUN, "c1", TOOL, REQUEST)
    head = await past_its_lease(store, "c1")
    taken = await store.writer.take_over(head, attempt=2, lapsed_at_ms=now_ms())
    state = await record_state(store, "c1")
    assert state == await refolded(store, "c1")
    assert (state.stage, state.attempt, taken.version) == (Stage.EXECUTING, 2, 2)
    assert (await lease_of(store, "c1"))[0] == 2
    assert await store.writer.renew_lease(RUN, "c1", 1) is None
    assert await store.writer.renew_lease(RUN, "c1", 2) is not None


async def test_a_settlement_folds_as_the_fold_does_and_ends_the_call(store: Store) -> None:
    """Past its lease a call is settled ERROR with the code it names, the evidence stored
    beside its digest; the run counts the failure, the journal replays intact."""
    head = await store.writer.create(RUN, "c1", TOOL, REQUEST)
    head = await store.writer.start_projecting(head, RAW)
    head = await past_its_lease(store, "c1")
    await store.writer.settle(head, ErrorCode.ABANDONED, "sweep", b"lease lapsed")
    state = await record_state(store, "c1")
    assert state == await refolded(store, "c1")
    assert (state.stage, state.error_code, state.settled_by) == (
        Stage.ERROR,
        ErrorCode.ABANDONED,
        "sweep",
    )
    record = await store.client.hget(store.keys.record(RUN, "c1"), "settlement_evidence")
    assert record == b"lease lapsed"
    info = await store.run_info(RUN)
    assert info is not None and info.failed == {"ABANDONED": 1}
    replay = await replay_invocation(store, RUN, "c1")
    assert replay is not None and replay.verdict.intact, replay.problems


async def test_a_reconciled_call_is_held_by_its_reconciler(store: Store) -> None:
    """Reconciled takes an attempted call back to EXECUTING under the reconciler's lease;
    its raw response and outcome then follow as a call that ran."""
    head = await store.writer.create(RUN, "c1", TOOL, REQUEST)
    head = await past_its_lease(store, "c1")
    head = await store.writer.reconcile(head, "hook:lookup", b"found it")
    assert (await lease_of(store, "c1"))[0] == head.version == 2
    head = await store.writer.start_projecting(head, RAW)
    state = await record_state(store, "c1")
    assert state == await refolded(store, "c1") and state.stage is Stage.PROJECTING


async def test_a_governed_call_is_never_taken_over(store: Store) -> None:
    """A dispatched governed call past its lease is refused a takeover, never run again."""
    head = await store.writer.request_approval(
        RUN,
        "g1",
        TOOL,
        REQUEST,
        approval_id="a" * 32,
        approval_expires_at_ms=now_ms() + 60_000,
        requested_by="agent",
    )
    head = await store.writer.approve(head, "ops", "ok", "d" * 32)
    permit = await store.writer.dispatch(
        head, TOOL, (await record_state(store, "g1")).request_sha256
    )
    assert (await lease_of(store, "g1"))[0] == permit.head.version
    head = await past_its_lease(store, "g1")
    with pytest.raises(Refused) as refused:
        await store.writer.take_over(head, attempt=2, lapsed_at_ms=now_ms())
    assert refused.value.code == "ILLEGAL_TRANSITION"
    await store.writer.settle(head, ErrorCode.RECONCILED_NOT_EXECUTED, "ops", b"bank: none")
    assert (await record_state(store, "g1")).stage is Stage.ERROR


async def test_a_takeover_needs_the_runs_authority_and_a_settlement_does_not(
    store: Store,
) -> None:
    """In a paused run a takeover is RUN_PAUSED (the tool would run again); a settlement,
    which runs nothing, is written."""
    await store.writer.create(RUN, "c1", TOOL, REQUEST)
    head = await past_its_lease(store, "c1")
    await store.pause_run(RUN, by="ops", reason="incident")
    with pytest.raises(Refused) as refused:
        await store.writer.take_over(head, attempt=2, lapsed_at_ms=now_ms())
    assert refused.value.code == "RUN_PAUSED"
    await store.writer.settle(head, ErrorCode.ABANDONED, "sweep", b"lapsed")


async def test_of_racing_takers_one_wins(store: Store) -> None:
    """Ten settlements and takeovers of one lapsed call at once: exactly one is written."""
    await store.writer.create(RUN, "c1", TOOL, REQUEST)
    head = await past_its_lease(store, "c1")

    async def take(n: int) -> bool:
        try:
            if n % 2:
                await store.writer.take_over(head, attempt=2, lapsed_at_ms=now_ms())
            else:
                await store.writer.settle(head, ErrorCode.ABANDONED, f"sweep-{n}", b"x")
        except Refused:
            return False
        return True

    won = await asyncio.gather(*(take(n) for n in range(10)))
    assert sum(won) == 1
    assert (await record_state(store, "c1")).version == 2
