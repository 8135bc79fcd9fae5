"""Refusals create nothing; a namespace keeps its shard count; scripts survive SCRIPT FLUSH.

Unsafe ids and disallowed tool names are refused before any command is sent.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import msgspec
import pytest
from redis.asyncio import Redis

from canon.bench.workload import TOOL as FLOOR_TOOL
from canon.bench.workload import FloorArgs, Payloads
from eventstore.errors import (
    InvalidArgument,
    NamespaceMismatch,
    RecordExpired,
    Refused,
    StoreUnavailable,
)
from eventstore.store import Store
from eventstore.wire.scripts import FOLDER, AppendScript, Scripts, committed
from eventstore.writer import Head, now_ms
from machine.codes import ErrorCode, EvidenceStatus
from machine.events import GENESIS_HASH
from machine.ids import MAX_ID_LENGTH, MAX_TOOL_CALL_ID_BYTES, invocation_id
from tests.helpers import RAW, REQUEST, RESULT, TOOL, key_values, namespace_keys, open_store
from tests.support.waiting import wait_for

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-1"
Setup = Callable[[Store], Awaitable[None]]


@pytest.fixture
async def store(make_open_store: Any) -> Store:
    """A store on the test's namespace (no run opened)."""
    store: Store = await make_open_store(shards=4, ttl=timedelta(minutes=5))
    return store


async def _inactive(store: Store) -> None:
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    assert await store.close_run(RUN)


async def _paused(store: Store) -> None:
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    await store.set_paused(True)
    assert await store.is_paused()


async def _past_deadline(store: Store) -> None:
    opened = await store.open_run(RUN, deadline=timedelta(milliseconds=500))
    await wait_for(lambda: now_ms() > opened.deadline_ms + 5)


async def _tool_budget_spent(store: Store) -> None:
    await store.open_run(RUN, deadline=timedelta(minutes=5), tools={TOOL: 1})
    await store.writer.create(RUN, "call-0", TOOL, REQUEST)


async def _run_budget_spent(store: Store) -> None:
    await store.open_run(RUN, deadline=timedelta(minutes=5), budget=1)
    await store.writer.create(RUN, "call-0", "other_tool", REQUEST)


async def _tool_budget_zero(store: Store) -> None:
    await store.open_run(RUN, deadline=timedelta(minutes=5), tools={TOOL: 0})


async def _tool_not_granted(store: Store) -> None:
    await store.open_run(RUN, deadline=timedelta(minutes=5), tools={"other_tool": None})


async def _tool_revoked(store: Store) -> None:
    await store.open_run(RUN, deadline=timedelta(minutes=5), tools={TOOL: None})
    assert await store.runs.revoke_tool(RUN, TOOL)


async def _unknown_run(store: Store) -> None:
    return None


_CASES: list[tuple[str, Setup, ErrorCode]] = [
    ("inactive", _inactive, ErrorCode.RUN_INACTIVE),
    ("unknown-run", _unknown_run, ErrorCode.RUN_INACTIVE),
    ("paused", _paused, ErrorCode.EXECUTION_PAUSED),
    ("past-deadline", _past_deadline, ErrorCode.RUN_DEADLINE_EXPIRED),
    ("tool-budget-spent", _tool_budget_spent, ErrorCode.TOOL_BUDGET_EXHAUSTED),
    ("tool-budget-zero", _tool_budget_zero, ErrorCode.TOOL_BUDGET_EXHAUSTED),
    ("run-budget-spent", _run_budget_spent, ErrorCode.RUN_BUDGET_EXHAUSTED),
    ("tool-not-granted", _tool_not_granted, ErrorCode.UNAUTHORIZED),
    ("tool-revoked", _tool_revoked, ErrorCode.UNAUTHORIZED),
]


@pytest.mark.parametrize(("setup", "code"), [c[1:] for c in _CASES], ids=[c[0] for c in _CASES])
async def test_refused_creation_creates_nothing(
    store: Store, redis: Redis, setup: Setup, code: ErrorCode
) -> None:
    """A refused creation raises its code and leaves no record, stream, feed entry or spend:
    the only write is the refusal on the run's record (its log and its count of the code),
    and none at all for a run that does not exist."""
    await setup(store)
    info_before = await store.run_info(RUN)
    keys_before = await namespace_keys(redis, store.keys.namespace)
    feed_before = await redis.xlen(store.keys.feed_of(RUN))
    with pytest.raises(Refused) as refused:
        await store.writer.create(RUN, "call-1", TOOL, REQUEST)
    assert refused.value.code == code.value
    assert refused.value.error_code is code
    record, stream = store.keys.record(RUN, "call-1"), store.keys.stream(RUN, "call-1")
    assert await redis.exists(record, stream) == 0
    keys_after = await namespace_keys(redis, store.keys.namespace)
    logged = set() if info_before is None else {store.keys.refusals(RUN).encode()}
    assert set(keys_after) - set(keys_before) == logged
    assert set(keys_before) <= set(keys_after)
    assert await redis.xlen(store.keys.feed_of(RUN)) == feed_before
    info_after = await store.run_info(RUN)
    if info_before is None:
        assert info_after is None
    else:
        counted = {**info_before.refused, code.value: info_before.refused.get(code.value, 0) + 1}
        assert info_after == msgspec.structs.replace(info_before, refused=counted)


async def test_resuming_execution_lets_calls_through(store: Store) -> None:
    """After set_paused(False) the same call is accepted."""
    await _paused(store)
    with pytest.raises(Refused):
        await store.writer.create(RUN, "call-1", TOOL, REQUEST)
    await store.set_paused(False)
    assert not await store.is_paused()
    head = await store.writer.create(RUN, "call-1", TOOL, REQUEST)
    assert head.version == 1


async def test_update_of_a_missing_record_creates_nothing(store: Store, redis: Redis) -> None:
    """Every update of a record that never existed raises RecordExpired and writes no key."""
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    keys_before = await namespace_keys(redis, store.keys.namespace)
    ghost = Head(
        run_id=RUN,
        tool_call_id="ghost",
        version=1,
        last_hash=GENESIS_HASH,
        entry_id="",
        expires_at_ms=0,
    )
    with pytest.raises(RecordExpired):
        await store.writer.start_projecting(ghost, RAW)
    with pytest.raises(RecordExpired):
        await store.writer.complete(ghost, RESULT, EvidenceStatus.EVIDENCE_FOUND, "docs")
    with pytest.raises(RecordExpired) as expired:
        await store.writer.fail(ghost, ErrorCode.EXECUTION_FAILED)
    assert expired.value.error_code is ErrorCode.RECORD_EXPIRED
    assert await namespace_keys(redis, store.keys.namespace) == keys_before


async def test_update_of_a_record_without_its_stream_creates_nothing(
    store: Store, redis: Redis
) -> None:
    """A record whose stream is gone counts as expired; the stream is not re-created."""
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    head = await store.writer.create(RUN, "call-1", TOOL, REQUEST)
    await redis.delete(store.keys.stream(RUN, "call-1"))
    with pytest.raises(RecordExpired):
        await store.writer.start_projecting(head, RAW)
    assert await redis.exists(store.keys.stream(RUN, "call-1")) == 0


@pytest.mark.not_on_cluster(
    "inspects a single server's connection pool; test_cluster_layout has the cluster version"
)
async def test_other_shard_count_on_a_namespace_is_refused(redis_url: str, namespace: str) -> None:
    """A second store with a different shard count fails on entry with NamespaceMismatch."""
    async with open_store(redis_url, namespace, shards=4):
        pass
    other = Store.from_url(redis_url, namespace=namespace, shards=8)
    with pytest.raises(NamespaceMismatch):
        async with other:
            pytest.fail("entered a namespace with the wrong shard count")
    # A failed entry closes its own pool instead of leaking connections.
    assert not any(c.is_connected for c in other.client.connection_pool._available_connections)
    async with open_store(redis_url, namespace, shards=4) as same:
        assert same.keys.shards == 4


async def test_writes_survive_script_flush(store: Store, redis: Redis) -> None:
    """After SCRIPT FLUSH the next writes reload their scripts and succeed."""
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    head = await store.writer.create(RUN, "call-1", TOOL, REQUEST)
    await redis.script_flush()
    assert await redis.script_exists(Scripts(store.client).append.sha) == [False]
    head = await store.writer.start_projecting(head, RAW)
    await redis.script_flush()
    head = await store.writer.complete(head, RESULT, EvidenceStatus.EVIDENCE_FOUND, "docs")
    await redis.script_flush()
    assert (await store.writer.create(RUN, "call-2", TOOL, REQUEST)).version == 1
    record = await store.get(RUN, "call-1")
    assert record is not None and record.state.version == head.version == 3


async def test_concurrent_writes_survive_script_flush(store: Store, redis: Redis) -> None:
    """After SCRIPT FLUSH, 20 concurrent creates (sent in shared round trips) all succeed."""
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    await store.writer.create(RUN, "call-0", TOOL, REQUEST)
    await redis.script_flush()
    heads = await asyncio.gather(
        *(store.writer.create(RUN, f"call-{i}", TOOL, REQUEST) for i in range(1, 21))
    )
    assert [head.version for head in heads] == [1] * 20
    info = await store.run_info(RUN)
    assert info is not None and info.used_total == 21


#: Run ids no key may contain: key separators, hash tags, whitespace, nothing, too much.
_UNSAFE_RUN_IDS = {
    "colon-brace-newline": "bad id:{x}\n",
    "empty": "",
    "too-long": "x" * (MAX_ID_LENGTH + 1),
    "hash-tag": "{s00}",
    "space": "call 1",
    "non-ascii": "call-é",
}
#: Tool call ids no key may contain: whitespace, control characters, nothing, too much.
_UNSAFE_CALL_IDS = {
    "brace-newline": "bad id:{x}\n",
    "empty": "",
    "too-long": "x" * (MAX_TOOL_CALL_ID_BYTES + 1),
    "space": "call 1",
    "control": "call\x07",
    "lone-surrogate": "call-\ud83d",
}
_UNSAFE = pytest.mark.parametrize("unsafe", _UNSAFE_RUN_IDS.values(), ids=_UNSAFE_RUN_IDS.keys())
_UNSAFE_CALL = pytest.mark.parametrize(
    "unsafe", _UNSAFE_CALL_IDS.values(), ids=_UNSAFE_CALL_IDS.keys()
)


@_UNSAFE
async def test_an_unsafe_run_id_is_refused_and_creates_nothing(
    store: Store, redis: Redis, unsafe: str
) -> None:
    """create() with an unsafe run id raises InvalidArgument; the namespace holds no key."""
    with pytest.raises(InvalidArgument, match=r"^run id is not a safe id$"):
        await store.writer.create(unsafe, "call-1", TOOL, REQUEST)
    # Only the namespace metadata the store wrote on entry.
    assert await namespace_keys(redis, store.keys.namespace) == [store.keys.meta().encode()]


@_UNSAFE_CALL
async def test_an_unsafe_tool_call_id_is_refused_and_creates_nothing(
    store: Store, redis: Redis, unsafe: str
) -> None:
    """create() with an unsafe tool call id raises InvalidArgument; no key, no budget spent."""
    await store.open_run(RUN, deadline=timedelta(minutes=5), budget=3)
    info_before = await store.run_info(RUN)
    keys_before = await namespace_keys(redis, store.keys.namespace)
    # The message names the kind of id and never echoes it.
    with pytest.raises(InvalidArgument, match=r"^tool call id is not a safe id$") as refused:
        await store.writer.create(RUN, unsafe, TOOL, REQUEST)
    assert isinstance(refused.value, ValueError)
    assert await namespace_keys(redis, store.keys.namespace) == keys_before
    assert await store.run_info(RUN) == info_before


_BAD_TOOLS = {
    "colon-brace": "bad tool:{x}",
    "empty": "",
    "space": "two words",
    "too-long": "t" * 129,
    "newline": "tool\n",
}


@pytest.mark.parametrize("tool", _BAD_TOOLS.values(), ids=_BAD_TOOLS.keys())
async def test_a_tool_name_that_is_not_allowed_is_refused_and_creates_nothing(
    store: Store, redis: Redis, tool: str
) -> None:
    """The tool name goes into the record and the run's counters, so it is checked too."""
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    info_before = await store.run_info(RUN)
    keys_before = await namespace_keys(redis, store.keys.namespace)
    with pytest.raises(InvalidArgument, match="tool name"):
        await store.writer.create(RUN, "call-1", tool, REQUEST)
    assert await namespace_keys(redis, store.keys.namespace) == keys_before
    assert await store.run_info(RUN) == info_before


@pytest.mark.parametrize("field", ["run_id", "tool_call_id"])
async def test_an_update_naming_an_unsafe_id_is_refused_and_changes_nothing(
    store: Store, redis: Redis, field: str
) -> None:
    """Every update of a Head whose id is unsafe raises InvalidArgument; nothing changes."""
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    head = await store.writer.create(RUN, "call-1", TOOL, REQUEST)
    keys_before = await namespace_keys(redis, store.keys.namespace)
    feed_before = await redis.xlen(store.keys.feed_of(RUN))
    bad = dataclasses.replace(head, **{field: "call 1:{x}"})
    with pytest.raises(InvalidArgument):
        await store.writer.start_projecting(bad, RAW)
    with pytest.raises(InvalidArgument):
        await store.writer.complete(bad, RESULT, EvidenceStatus.EVIDENCE_FOUND, "docs")
    with pytest.raises(InvalidArgument):
        await store.writer.fail(bad, ErrorCode.EXECUTION_FAILED)
    assert await namespace_keys(redis, store.keys.namespace) == keys_before
    assert await redis.xlen(store.keys.feed_of(RUN)) == feed_before
    record = await store.get(RUN, "call-1")
    assert record is not None and record.state.version == 1


async def test_unsafe_ids_are_refused_before_any_command_is_sent() -> None:
    """With no server to talk to, an unsafe id still raises InvalidArgument, not
    StoreUnavailable: the check runs before the first command; a safe id does reach Redis."""
    offline = Store.from_url("redis://127.0.0.1:1/0", timeout_s=0.2)
    try:
        with pytest.raises(InvalidArgument):
            await offline.writer.create("bad id:{x}\n", "call-1", TOOL, REQUEST)
        with pytest.raises(InvalidArgument):
            await offline.writer.create(RUN, "bad id:{x}\n", TOOL, REQUEST)
        with pytest.raises(InvalidArgument):
            await offline.writer.create(RUN, "call-1", "bad tool:{x}", REQUEST)
        with pytest.raises(StoreUnavailable):
            await offline.writer.create(RUN, "call-1", TOOL, REQUEST)
    finally:
        await offline.aclose()


_LIFECYCLE_FIELDS = [
    "stage",
    "status",
    "version",
    "last_hash",
    "updated_at_ms",
    "expires_at_ms",
    "invocation_id",
]


async def _snapshot(redis: Redis, store: Store) -> list[tuple[bytes, list[bytes]]]:
    return [
        (key, await key_values(redis, key))
        for key in await namespace_keys(redis, store.keys.namespace)
    ]


@dataclasses.dataclass
class _Scripts:
    """The write scripts called directly, as a caller other than the Writer could, with
    the benchmark's real arguments (FloorArgs) on an open run."""

    redis: Redis
    floor: FloorArgs
    create_sha: str
    append_sha: str

    @classmethod
    async def on_open_run(cls, store: Store, redis: Redis) -> _Scripts:
        await store.open_run(RUN, deadline=timedelta(minutes=5), tools={FLOOR_TOOL: None})
        return cls(
            redis,
            FloorArgs(store.keys, Payloads.of(), at_ms=now_ms()),
            await redis.script_load(FOLDER.source("create")),
            await redis.script_load(FOLDER.source("append")),
        )

    async def create(self, call: str, *extra: str) -> Any:
        args = self.floor.create(RUN, call, invocation_id(RUN, call))
        return await self.redis.evalsha(self.create_sha, *args, *extra)

    async def append(
        self, call: str, event_version: int, *extra: str, argv: dict[str, str] | None = None
    ) -> Any:
        """The append of event ``event_version``, its ARGV ``argv`` replaced by name."""
        args = list(self.floor.append(RUN, call, event_version))
        for name, value in (argv or {}).items():
            args[1 + len(AppendScript.layout.keys) + AppendScript.layout.argv.index(name)] = value
        return await self.redis.evalsha(self.append_sha, *args, *extra)


@pytest.mark.parametrize("name", [*_LIFECYCLE_FIELDS, "evidence_status", "e1", "e2", "e10"])
async def test_a_creation_naming_a_field_only_the_scripts_write_is_refused(
    store: Store, redis: Redis, name: str
) -> None:
    """A creating call whose fields name a lifecycle field, an event id slot (e<version>) or
    the evidence status is refused with PROTECTED_FIELD and writes nothing."""
    scripts = await _Scripts.on_open_run(store, redis)
    before = await _snapshot(redis, store)
    with pytest.raises(Refused) as refused:
        committed(await scripts.create("call-1", name, "x"))
    assert refused.value.code == "PROTECTED_FIELD"
    assert await _snapshot(redis, store) == before


@pytest.mark.parametrize("name", [*_LIFECYCLE_FIELDS, "e1", "e2", "e3", "e10"])
async def test_an_append_naming_a_field_only_the_scripts_write_is_refused(
    store: Store, redis: Redis, name: str
) -> None:
    """An appending call whose fields name a lifecycle field or an event id slot is refused
    with PROTECTED_FIELD and changes nothing."""
    scripts = await _Scripts.on_open_run(store, redis)
    committed(await scripts.create("c"))
    before = await _snapshot(redis, store)
    with pytest.raises(Refused) as refused:
        committed(await scripts.append("c", 2, name, "x"))
    assert (refused.value.code, refused.value.current_version) == ("PROTECTED_FIELD", 1)
    assert await _snapshot(redis, store) == before


async def test_fields_that_only_look_like_protected_ones_are_written(
    store: Store, redis: Redis
) -> None:
    """Names that start like an event id slot or a lifecycle field but are not one pass."""
    scripts = await _Scripts.on_open_run(store, redis)
    extra = ["e", "1", "e1x", "2", "ex", "3", "stages", "4", "evidence", "5"]
    assert committed(await scripts.create("c", *extra)).version == 1
    assert committed(await scripts.append("c", 2, "e2e", "6")).version == 2
    record = await redis.hgetall(store.keys.record(RUN, "c"))
    names = [*extra[::2], "e2e"]
    assert [record[name.encode()] for name in names] == [b"1", b"2", b"3", b"4", b"5", b"6"]


@pytest.mark.parametrize("version", ["two", "", "2x"])
async def test_an_append_whose_version_is_no_number_is_a_conflict(
    store: Store, redis: Redis, version: str
) -> None:
    """A version that is not a number is refused as VERSION_CONFLICT, not a script error,
    and changes nothing."""
    scripts = await _Scripts.on_open_run(store, redis)
    committed(await scripts.create("c"))
    before = await _snapshot(redis, store)
    with pytest.raises(Refused) as refused:
        committed(await scripts.append("c", 2, argv={"version": version}))
    assert (refused.value.code, refused.value.current_version) == ("VERSION_CONFLICT", 1)
    assert await _snapshot(redis, store) == before
