"""Payloads encrypted at rest: with a keyring no payload byte reaches Redis, the store reads
them back opened, digests stay the plaintext's, a run's data key is made once, a governed
call whose stored request was altered or swapped runs nothing, and erasing a run deletes
its data key so every copy of its payloads stays unreadable."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from eventstore import ApprovalPending, RunContext, Store, ToolBoundary, ToolError, ToolResult
from eventstore.audit import replay_invocation
from eventstore.boundary.contracts import Projection, ToolCall, ToolSpec
from eventstore.keyring import Keyring
from eventstore.sealing import (
    DATA_KEY_FIELD,
    KeyErased,
    SealBroken,
    data_key_context,
    is_sealed,
)
from eventstore.wire.scripts import PermitRefused
from eventstore.writer import head_of
from machine.codes import ErrorCode, EvidenceStatus, Stage, Status
from machine.events import payload_digest
from machine.ids import invocation_id
from projections import ReceiptWorker
from projections.archive import ArchiveWorker, open_archive
from projections.archive.database import ArchiveDatabase
from projections.archive.schema import migrate
from projections.archive.source import ArchiveSource
from projections.archive.store import Archive
from projections.console.views import payloads_page
from projections.receipts.builder import decode_receipt
from tests.helpers import key_values, namespace_keys
from tests.support.calls import RUN, envelope, open_run
from tests.support.waiting import wait_for

pytestmark = pytest.mark.backends("single", "cluster")

CTX = RunContext(RUN)
#: Written into every payload; must never appear in Redis.
MARKER = "zq-marker-7f3a"
KEYRING = Keyring({"k1": bytes(range(32))}, "k1")


class Marked:
    """A tool whose request, raw response and result all carry the marker."""

    def __init__(self) -> None:
        self.ran: list[dict[str, Any]] = []

    async def execute(self, arguments: dict[str, Any], call: ToolCall) -> Any:
        self.ran.append(arguments)
        return {"raw": f"{MARKER}-raw", "echo": arguments}

    def project(self, raw: Any, call: ToolCall) -> Projection:
        return Projection(
            result={"answer": f"{MARKER}-result"},
            evidence_status=EvidenceStatus.EVIDENCE_FOUND,
            scope="s",
        )

    def spec(self, **options: Any) -> dict[str, ToolSpec]:
        return {
            "search": ToolSpec(executor=self.execute, projector=self.project, **options),
            "refund": ToolSpec(
                executor=self.execute, projector=self.project, read_only=False, approval=True
            ),
        }


async def every_stored_byte(redis: Any, namespace: str) -> bytes:
    """Every key name, field and value of the namespace, concatenated."""
    parts: list[bytes] = []
    for key in await namespace_keys(redis, namespace):
        parts.append(key)
        parts.extend(await key_values(redis, key))
    return b"\n".join(parts)


@asynccontextmanager
async def archived(store: Store, folder: Path) -> AsyncIterator[ArchiveDatabase]:
    """A SQLite archive in ``folder`` holding what the store's feeds hold now."""
    database = open_archive(f"sqlite:///{folder / 'archive.db'}")
    try:
        await migrate(database)
        await ArchiveWorker(store, database, consumer="w1").run(burst=True)
        yield database
    finally:
        await database.aclose()


async def archive_files(folder: Path) -> bytes:
    """Every byte of the archive's database files (the database and its journals)."""

    def read() -> bytes:
        return b"".join(
            file.read_bytes() for file in folder.iterdir() if file.name.startswith("archive.db")
        )

    return await asyncio.to_thread(read)


async def test_no_payload_byte_reaches_redis_and_the_store_reads_them_opened(
    make_store: Any, redis: Any, namespace: str
) -> None:
    """Request, raw response and result are sealed in the record; get() opens them; the
    events' digests are the plaintext's, keyed (never its plain SHA-256), and its sizes;
    a retry answers the recorded result."""
    store: Store = make_store(keys=KEYRING)
    await open_run(store)
    tool = Marked()
    boundary = ToolBoundary(store, tool.spec(), on_duplicate="replay")
    arguments = {"q": f"{MARKER}-request"}
    first = await boundary.invoke(CTX, envelope("c1", arguments=arguments))
    assert isinstance(first, ToolResult) and first.result == {"answer": f"{MARKER}-result"}
    assert MARKER.encode() not in await every_stored_byte(redis, namespace)
    stored = await redis.hgetall(store.keys.record(RUN, "c1"))
    assert all(is_sealed(stored[field]) for field in (b"request", b"raw", b"result"))
    wrapped = await redis.hget(store.keys.run(RUN), DATA_KEY_FIELD)
    assert wrapped.startswith(b"k1:")
    record = await store.get(RUN, "c1")
    assert record is not None and msgspec.json.decode(record.request) == arguments
    assert record.raw is not None and MARKER.encode() in record.raw
    # Keyed digests (HMAC by the run's data key): a short payload cannot be guessed.
    digest_of = await store.reader.digest_of(RUN)
    assert record.state.request_sha256 == digest_of(record.request)
    assert record.state.request_sha256 != payload_digest(record.request)
    assert record.state.raw_sha256 == digest_of(record.raw)
    assert record.result is not None
    assert record.state.result_sha256 == digest_of(record.result)
    assert record.state.request_bytes == len(record.request)
    events = b"".join(event.data for event in await store.events(RUN, "c1"))
    assert payload_digest(record.request).encode() not in events
    assert bytes.fromhex(payload_digest(record.request)) not in events
    again = await boundary.invoke(CTX, envelope("c1", arguments=arguments))
    assert again == first and len(tool.ran) == 1
    # A store with another keyring (a fresh process) reads them too, by the run's key.
    other: Store = make_store(keys=KEYRING)
    assert await other.get(RUN, "c1") == record


async def test_a_store_without_the_keyring_reads_lifecycle_but_never_plaintext(
    make_store: Any,
) -> None:
    """Without a keyring the record's lifecycle reads as ever; its payloads stay sealed."""
    keyed: Store = make_store(keys=KEYRING)
    await open_run(keyed)
    await ToolBoundary(keyed, Marked().spec()).invoke(CTX, envelope("c1", arguments={"q": MARKER}))
    plain: Store = make_store()
    record = await plain.get(RUN, "c1")
    assert record is not None and record.state.status is Status.READY
    assert is_sealed(record.request) and MARKER.encode() not in record.request


async def test_concurrent_first_writers_of_a_run_share_one_data_key(make_store: Any) -> None:
    """Stores racing to make a run's data key (as processes would) all keep the first."""
    stores: list[Store] = [make_store(keys=KEYRING) for _ in range(4)]
    await open_run(stores[0])
    seals = await asyncio.gather(
        *(store.seals.for_writing(RUN) for store in stores if store.seals is not None)
    )
    sealed = seals[0].seal("request", "inv", b"x")
    assert all(seal.open("request", "inv", sealed) == b"x" for seal in seals)


async def test_no_data_key_is_made_for_a_run_that_does_not_exist(
    make_store: Any, redis: Any
) -> None:
    """The data key script never creates a run hash (it would never expire)."""
    store: Store = make_store(keys=KEYRING)
    assert store.seals is not None
    await store.seals.for_writing("run-missing")
    assert await redis.exists(store.keys.run("run-missing")) == 0


async def test_an_approved_request_altered_or_swapped_in_redis_runs_nothing(
    make_store: Any, redis: Any
) -> None:
    """GCM binds the sealed request to its call: tampered bytes, or another call's
    ciphertext moved in, never open, and the resume runs nothing."""
    store: Store = make_store(keys=KEYRING)
    await open_run(store)
    tool = Marked()
    boundary = ToolBoundary(store, tool.spec())
    for call in ("c1", "c2", "c3"):
        pending = await boundary.invoke(CTX, envelope(call, tool="refund", arguments={"n": call}))
        assert isinstance(pending, ApprovalPending)
        await store.decide(RUN, call, approve=True, by="ops@example", reason="ok")
    c1 = store.keys.record(RUN, "c1")
    sealed = await redis.hget(c1, "request")
    await redis.hset(c1, "request", sealed[:-1] + bytes([sealed[-1] ^ 1]))
    swapped = await redis.hget(store.keys.record(RUN, "c3"), "request")
    await redis.hset(store.keys.record(RUN, "c2"), "request", swapped)
    for call in ("c1", "c2"):
        reply = await boundary.resume(CTX, call)
        assert isinstance(reply, ToolError)
        assert reply.error_code is ErrorCode.APPROVED_REQUEST_CHANGED
        with pytest.raises(SealBroken):
            await store.get(RUN, call)
    assert tool.ran == []
    # Altered after the resumer read it: the permit's bytes do not open; nothing runs.
    record = await store.get(RUN, "c3")
    assert record is not None
    await redis.hset(store.keys.record(RUN, "c3"), "request", sealed)
    head = head_of(record.state, record.expires_at_ms)
    # The approval binds the keyed digest: the plain SHA-256 of the same bytes is refused.
    with pytest.raises(PermitRefused) as refused:
        await store.writer.dispatch(head, "refund", payload_digest(record.request))
    assert refused.value.error_code is ErrorCode.APPROVED_REQUEST_CHANGED
    keyed = (await store.reader.digest_of(RUN))(record.request)
    permit = await store.writer.dispatch(head, "refund", keyed)
    assert permit.request is None
    assert tool.ran == []


async def test_a_governed_call_resumes_with_its_sealed_request(make_store: Any) -> None:
    """The frozen request is sealed; a re-entry with the same request attaches to it (its
    keyed digest matches) and another request under its id is a duplicate; the approved
    call runs opened, once."""
    store: Store = make_store(keys=KEYRING)
    await open_run(store)
    tool = Marked()
    boundary = ToolBoundary(store, tool.spec())
    call = envelope("c1", tool="refund", arguments={"n": MARKER})
    await boundary.invoke(CTX, call)
    assert isinstance(await boundary.invoke(CTX, call), ApprovalPending)  # a re-entry
    await store.decide(RUN, "c1", approve=True, by="ops@example", reason="ok")
    # The framework calling again with the same request resumes it (keyed digests match).
    reply = await boundary.invoke(CTX, call)
    assert isinstance(reply, ToolResult) and tool.ran == [{"n": MARKER}]
    assert await boundary.resume(CTX, "c1") == reply and len(tool.ran) == 1
    other = await boundary.invoke(CTX, envelope("c1", tool="refund", arguments={"n": 2}))
    assert isinstance(other, ToolError) and other.error_code is ErrorCode.DUPLICATE_TOOL_CALL
    record = await store.get(RUN, "c1")
    assert record is not None and record.state.stage is Stage.READY


async def test_erasing_a_run_deletes_its_data_key_so_no_copy_opens(
    make_store: Any, redis: Any
) -> None:
    """A backup taken before the erasure holds ciphertext; once the run's data key is
    deleted, putting it back opens nothing (KeyErased), while lifecycle and events stay."""
    store: Store = make_store(keys=KEYRING)
    await open_run(store)
    await ToolBoundary(store, Marked().spec()).invoke(CTX, envelope("c1", arguments={"q": 1}))
    record_key = store.keys.record(RUN, "c1")
    backup = await redis.hget(record_key, "result")
    erasure = await store.erase_run(RUN, by="dpo", reason="request 7")
    assert erasure.records == 1
    assert await redis.hget(store.keys.run(RUN), DATA_KEY_FIELD) is None
    await redis.hset(record_key, "result", backup)  # the backup restored
    for reader in (store, make_store(keys=KEYRING)):
        with pytest.raises(KeyErased):
            await reader.get(RUN, "c1")
    assert len(await store.events(RUN, "c1")) == 3


async def test_a_failed_call_seals_its_failure_detail(make_store: Any, redis: Any) -> None:
    """The failure detail (the exception's text) is a payload too."""

    async def boom(arguments: dict[str, Any], call: ToolCall) -> Any:
        raise RuntimeError(f"{MARKER}-failure")

    store: Store = make_store(keys=KEYRING)
    await open_run(store)
    boundary = ToolBoundary(
        store,
        {"search": ToolSpec(executor=boom, projector=Marked().project)},
    )
    reply = await boundary.invoke(CTX, envelope("c1", arguments={"q": 1}))
    assert isinstance(reply, ToolError) and reply.error_code is ErrorCode.EXECUTION_FAILED
    stored = await redis.hgetall(store.keys.record(RUN, "c1"))
    assert is_sealed(stored[b"failure_detail"]) and MARKER.encode() not in stored[b"failure_detail"]
    opened = await store.reader.select(RUN, "c1", ("failure_detail",))
    assert MARKER.encode() in opened["failure_detail"]


@pytest.mark.not_on_cluster("a private single server with an append-only file")
async def test_no_payload_byte_reaches_the_append_only_file(
    start_server: Any, namespace: str, tmp_path: Path
) -> None:
    """A server with appendonly: its AOF files hold ciphertext only."""
    server = start_server(appendonly=True)
    keyring_file = tmp_path / "keys.json"
    keyring_file.write_text(
        json.dumps({"current": "k1", "keys": {"k1": base64.b64encode(bytes(32)).decode()}})
    )
    async with Store.from_url(
        server.url, namespace=namespace, keys=Keyring.from_file(keyring_file)
    ) as store:
        await open_run(store)
        reply = await ToolBoundary(store, Marked().spec()).invoke(
            CTX, envelope("c1", arguments={"q": f"{MARKER}-request"})
        )
        assert isinstance(reply, ToolResult)
        # Written before the reply: the AOF buffer is flushed before clients are answered.
        files = [path for path in server.data_dir.rglob("*") if path.is_file()]
        aof = b"".join(path.read_bytes() for path in files if "aof" in path.name)
        assert namespace.encode() in aof and b"search" in aof
        assert MARKER.encode() not in aof


async def test_replay_judges_a_sealed_run_with_and_without_the_keyring(
    make_store: Any, redis: Any
) -> None:
    """Without the key a sealed payload is checked by its size; with it, opened and checked
    by digest. A ciphertext altered in Redis is a digest mismatch through the keyring."""
    keyed: Store = make_store(keys=KEYRING)
    await open_run(keyed)
    await ToolBoundary(keyed, Marked().spec()).invoke(CTX, envelope("c1", arguments={"q": 1}))
    plain: Store = make_store()
    for store in (keyed, plain):
        replay = await replay_invocation(store, RUN, "c1")
        assert replay is not None and replay.problems == [] and replay.verdict.intact
    record_key = keyed.keys.record(RUN, "c1")
    sealed = await redis.hget(record_key, "raw")
    await redis.hset(record_key, "raw", sealed[:-1] + bytes([sealed[-1] ^ 1]))
    replay = await replay_invocation(keyed, RUN, "c1")
    assert replay is not None and replay.problems == ["payload_digest_mismatch:raw"]
    assert replay.verdict.payload_digests_match is False


async def test_a_receipt_never_opens_a_sealed_result(make_store: Any, redis: Any) -> None:
    """The receipt worker, even on a store with the keyring, writes no payload byte: the
    receipt says the call completed and holds no result."""
    store: Store = make_store(keys=KEYRING)
    await open_run(store)
    await ToolBoundary(store, Marked().spec()).invoke(CTX, envelope("c1", arguments={"q": 1}))
    await ReceiptWorker(store, consumer="w1").run(burst=True)
    stored = (await redis.hgetall(store.keys.receipt(RUN, invocation_id(RUN, "c1"))))[b"receipt"]
    receipt = decode_receipt(stored)
    assert receipt.journal_state.value == "completed"
    assert receipt.result is None and MARKER.encode() not in stored
    assert MARKER.encode() not in await every_stored_byte(redis, store.keys.namespace)


async def test_the_console_payload_page_shows_encrypted_without_the_keyring(
    make_store: Any,
) -> None:
    """Without the keyring each payload shows as ``encrypted (key k1)`` with its size;
    with it, opened."""
    keyed: Store = make_store(keys=KEYRING)
    await open_run(keyed)
    await ToolBoundary(keyed, Marked().spec()).invoke(CTX, envelope("c1", arguments={"q": MARKER}))
    plain: Store = make_store()
    page = await payloads_page(plain, RUN, invocation_id(RUN, "c1"))
    assert page is not None
    record = await keyed.get(RUN, "c1")
    assert record is not None
    shown = {payload.name: payload for payload in page[1]}
    assert shown["request"].text == "encrypted (key k1)"
    assert shown["request"].size == len(record.request)
    assert all(MARKER not in (payload.text or "") for payload in page[1])
    opened = await payloads_page(keyed, RUN, invocation_id(RUN, "c1"), reveal=True)
    assert opened is not None
    assert any(MARKER in (payload.text or "") for payload in opened[1])


async def test_an_edited_governed_call_is_sealed_and_runs_its_edit(
    make_store: Any, redis: Any, namespace: str
) -> None:
    """An operator's edit is a new frozen request: sealed like any other, run once approved."""
    store: Store = make_store(keys=KEYRING)
    await open_run(store)
    tool = Marked()
    boundary = ToolBoundary(store, tool.spec())
    await boundary.invoke(CTX, envelope("c1", tool="refund", arguments={"n": 1}))
    edit = await store.decisions.supersede(
        RUN, "c1", {"n": f"{MARKER}-edit"}, by="ed", reason="cap"
    )
    assert edit.edited == "c1.edit1"
    assert MARKER.encode() not in await every_stored_byte(redis, namespace)
    await store.decide(RUN, "c1.edit1", approve=True, by="bo", reason="ok")
    done = await boundary.resume(CTX, "c1.edit1")
    assert isinstance(done, ToolResult) and tool.ran == [{"n": f"{MARKER}-edit"}]


@pytest.mark.not_on_cluster("the archive worker's output is one SQLite file")
async def test_the_archive_worker_writes_no_payload_byte(
    make_open_store: Any, tmp_path: Path
) -> None:
    """The archive copies payloads as stored: its database file holds ciphertext only,
    and an archived call replays intact through the keyring."""
    store: Store = await make_open_store(keys=KEYRING)
    await open_run(store)
    await ToolBoundary(store, Marked().spec()).invoke(
        CTX, envelope("c1", arguments={"q": f"{MARKER}-request"})
    )
    async with archived(store, tmp_path) as database:
        copy = await Archive(database, store.keys.namespace).invocation(RUN, "c1")
        assert copy is not None and is_sealed(copy.fields[b"request"])

    stored = await archive_files(tmp_path)
    assert b"search" in stored and MARKER.encode() not in stored


async def test_an_archived_run_opens_after_the_ttl_with_its_archived_key_until_erased(
    make_open_store: Any, redis: Any, tmp_path: Path
) -> None:
    """The archive keeps the run's wrapped data key (never the key itself): once Redis let
    the run go, the archive's reader opens its payloads with the keyring and replays
    them intact by their keyed digests; without the keyring they stay sealed and are
    checked by size; once erased in the archive, a copy put back opens nothing."""
    store: Store = await make_open_store(keys=KEYRING, ttl=timedelta(seconds=2))
    await open_run(store, deadline=timedelta(seconds=1))
    arguments = {"q": f"{MARKER}-request"}
    await ToolBoundary(store, Marked().spec()).invoke(CTX, envelope("c1", arguments=arguments))
    wrapped = await redis.hget(store.keys.run(RUN), DATA_KEY_FIELD)
    data_key = KEYRING.unwrap(wrapped, data_key_context(store.keys.namespace, RUN))
    async with archived(store, tmp_path) as database:

        async def gone() -> bool:
            return await redis.exists(store.keys.run(RUN), store.keys.record(RUN, "c1")) == 0

        await wait_for(gone, timeout_s=10)
        keyed = ArchiveSource(database, store.keys.namespace, keys=KEYRING)
        plain = ArchiveSource(database, store.keys.namespace)
        opened = await keyed.snapshot(RUN, "c1")
        assert msgspec.json.decode(opened.fields[b"request"]) == arguments
        assert MARKER.encode() in opened.fields[b"raw"] and opened.unopened == ()
        sealed = await plain.snapshot(RUN, "c1")
        assert all(is_sealed(sealed.fields[name]) for name in (b"request", b"raw", b"result"))
        for source in (keyed, plain):
            replay = await replay_invocation(source, RUN, "c1")
            assert replay is not None and replay.problems == [] and replay.verdict.intact
        archive = Archive(database, store.keys.namespace)
        await archive.erase(RUN, by="dpo", reason="request 11", at_ms=1)
        async with database.transaction() as tx:  # the ciphertext put back from a backup
            await tx.execute(
                "UPDATE invocations SET request = ? WHERE run_id = ?",
                (sealed.fields[b"request"], RUN),
            )
        with pytest.raises(KeyErased):
            await keyed.seal(RUN)
        after = await keyed.snapshot(RUN, "c1")
        assert after.fields[b"request"] == sealed.fields[b"request"]

    stored = await archive_files(tmp_path)
    assert data_key not in stored and MARKER.encode() not in stored
