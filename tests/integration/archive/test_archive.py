"""The archive: every finished call, its events and its run, kept after Redis lets them go.

One abstract case (:class:`ArchiveContract`) holds every test; it runs once per archive
backend (SQLite, and PostgreSQL on a private server), each on every Redis backend.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest

from canon.cli import main
from eventstore import RunContext, ToolBoundary, ToolEnvelope
from eventstore.boundary.contracts import ApprovalPending, ToolError
from eventstore.keyring import Keyring
from eventstore.sealing import DATA_KEY_FIELD, KeyErased, is_sealed
from eventstore.store import Store
from eventstore.writer import Head
from machine.codes import ErrorCode, EvidenceStatus
from machine.ids import invocation_id
from projections.archive import ArchiveWorker, open_archive
from projections.archive.database import ArchiveDatabase, ArchiveSchemaError
from projections.archive.retention import prune
from projections.archive.schema import MIGRATIONS, check_schema, migrate
from projections.archive.search import SearchQuery, parse_condition, search
from projections.archive.source import ArchiveSource
from projections.archive.store import Archive, ArchiveBatch, RunSnapshot
from tests.support.left_calls import until_lapsed
from tests.support.operators import credentials
from tests.support.postgres import postgres_url  # noqa: F401 (a fixture)
from tests.support.tools import FakeTool
from tests.support.waiting import wait_for

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-a"
KEY_K1 = bytes(range(32))
KEY_K2 = bytes(range(32, 64))
KEYRING = Keyring({"k1": KEY_K1}, "k1")


def keyring_json(keys: dict[str, bytes], current: str) -> str:
    """A keyring's JSON, as ``CANON_KEYS`` may hold it."""
    encoded = {key_id: base64.b64encode(key).decode() for key_id, key in keys.items()}
    return json.dumps({"current": current, "keys": encoded})


async def finished(store: Store, call: str, *, run_id: str = RUN, fail: bool = False) -> Head:
    """One invocation written through the Writer to READY (or ERROR)."""
    head = await store.writer.create(run_id, call, "refund", b'{"amount":%d}' % (len(call) * 100))
    head = await store.writer.start_projecting(head, b'{"raw":true}')
    if fail:
        return await store.writer.fail(head, ErrorCode.EXECUTION_FAILED)
    return await store.writer.complete(head, b'{"ok":1}', EvidenceStatus.EVIDENCE_FOUND, "s")


class ArchiveContract:
    """What every archive backend must do (subclassed once per backend)."""

    @pytest.fixture
    def archive_url(self) -> str:
        """The URL of an empty archive (migrated by ``archive``)."""
        raise NotImplementedError

    @pytest.fixture
    def fresh_archive_url(self, archive_url: str) -> str:
        """The URL of a database no test has used (an empty archive, not migrated)."""
        return archive_url

    @pytest.fixture
    async def archive(self, archive_url: str) -> AsyncIterator[ArchiveDatabase]:
        """The archive database, migrated, closed after the test."""
        database = open_archive(archive_url)
        await migrate(database)
        try:
            yield database
        finally:
            await database.aclose()

    async def test_a_burst_archives_every_finished_call_with_its_events_and_run(
        self, make_open_store: Any, archive: ArchiveDatabase
    ) -> None:
        """Finished calls are archived at their version with every event; calls in flight
        are not; the run's row and its refusals are there too."""
        store: Store = await make_open_store(shards=4)
        await store.open_run(RUN, deadline=timedelta(minutes=5))
        heads = [await finished(store, f"c{i}", fail=i == 2) for i in range(4)]
        await store.writer.create(RUN, "open", "refund", b"{}")
        worker = ArchiveWorker(store, archive, consumer="w1")
        await worker.run(burst=True)

        archived = worker.archive
        for head in heads:
            inv = await archived.invocation(RUN, head.tool_call_id)
            assert inv is not None and inv.number("version") == head.version
            assert [e.event.version for e in inv.events if e.event] == [1, 2, 3]
            assert inv.fields[b"request"] == b'{"amount":%d}' % (len(head.tool_call_id) * 100)
        assert await archived.invocation(RUN, "open") is None
        info = await archived.run_info(RUN)
        assert info is not None and info.active and info.invocations == 4
        assert await archived.applied_version(invocation_id(RUN, "c0")) == 3

    async def test_a_redelivered_batch_changes_nothing(
        self, make_open_store: Any, redis: Any, archive: ArchiveDatabase
    ) -> None:
        """With the group rewound to the feed's start, every entry comes again and is
        settled without a second row or event: writes are keyed by namespace,
        invocation id and version."""
        store: Store = await make_open_store(shards=2)
        await store.open_run(RUN, deadline=timedelta(minutes=5))
        for i in range(3):
            await finished(store, f"c{i}")
        worker = ArchiveWorker(store, archive, consumer="w1")
        await worker.run(burst=True)
        before = await table_counts(archive, store.keys.namespace)
        for shard in range(2):
            if await redis.exists(store.keys.feed(shard)):
                await redis.xgroup_setid(store.keys.feed(shard), "archive", "0")
        again = ArchiveWorker(store, archive, consumer="w2")
        await again.run(burst=True)
        assert (
            await table_counts(archive, store.keys.namespace)
            == before
            == {
                "invocations": 3,
                "events": 9,
            }
        )
        assert again.counters["applied"] == 0 and again.counters["stale"] == 9

    async def test_replay_export_and_inspect_read_the_archive_after_the_ttl(
        self,
        make_open_store: Any,
        redis: Any,
        archive: ArchiveDatabase,
        archive_url: str,
        redis_url: str,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """Once Redis let a run's records expire, replay and export read them from the
        archive with the same verdicts and lines, and inspect builds the same receipt."""
        store: Store = await make_open_store(shards=2, ttl=timedelta(seconds=3))
        namespace = store.keys.namespace
        await store.open_run(RUN, deadline=timedelta(seconds=1))
        await finished(store, "c1")
        await finished(store, "c2", fail=True)
        await ArchiveWorker(store, archive, consumer="w1").run(burst=True)
        live_code, live = await cli_json(capsys, redis_url, namespace, "replay", RUN, "--json")
        live_export = await cli_lines(capsys, redis_url, namespace, "export", RUN)
        inv = invocation_id(RUN, "c2")
        _, live_receipt = await cli_json(
            capsys, redis_url, namespace, "inspect", inv, "--run-id", RUN
        )

        async def gone() -> bool:
            return await redis.exists(store.keys.record(RUN, "c1"), store.keys.run(RUN)) == 0

        await wait_for(gone, timeout_s=10)
        code, document = await cli_json(
            capsys, redis_url, namespace, "replay", RUN, "--json", "--archive", archive_url
        )
        assert (code, live_code) == (0, 0)
        assert document.pop("archived") is True
        for replay in document["invocations"] + live["invocations"]:
            for field in ("record_pttl_ms", "stream_pttl_ms", "archived"):
                replay.pop(field, None)
        assert document == live
        archived_export = await cli_lines(
            capsys, redis_url, namespace, "export", RUN, "--archive", archive_url
        )
        assert [strip(line) for line in archived_export] == [strip(line) for line in live_export]
        code, receipt = await cli_json(
            capsys, redis_url, namespace, "inspect", inv, "--run-id", RUN, "--archive", archive_url
        )
        assert code == 0
        for body in (receipt, live_receipt):
            body.pop("observed_at")
        assert receipt == live_receipt

    async def test_a_signed_anchor_catches_a_rewritten_archive_row(
        self, make_open_store: Any, archive: ArchiveDatabase, archive_url: str, tmp_path: Path
    ) -> None:
        """An anchor verifies until an archived event or record payload is rewritten;
        then verify names the run."""
        store: Store = await make_open_store(shards=2)
        namespace = store.keys.namespace
        await store.open_run(RUN, deadline=timedelta(minutes=5))
        for i in range(2):
            await finished(store, f"c{i}")
        await ArchiveWorker(store, archive, consumer="w1").run(burst=True)
        key, anchor_file = tmp_path / "anchor.key", tmp_path / "anchor.json"
        assert await asyncio.to_thread(main, ["archive", "keygen", "--key", str(key)]) == 0
        args = ["--archive", archive_url, "--namespace", namespace]
        anchor = ["archive", "anchor", "--key", str(key), "--out", str(anchor_file)]
        assert await asyncio.to_thread(main, [*anchor, "--settle-s", "0", *args]) == 0
        check = ["verify", "--anchor", str(anchor_file), "--public-key", f"{key}.pub", *args]
        assert await asyncio.to_thread(main, check) == 0

        inv = invocation_id(RUN, "c1")
        async with archive.transaction() as tx:
            await tx.execute(
                "UPDATE invocations SET request = ? WHERE namespace = ? AND invocation_id = ?",
                (archive.text(b'{"amount":1}'), namespace, inv),
            )
        assert await asyncio.to_thread(main, check) == 1
        async with archive.transaction() as tx:
            await tx.execute(
                "UPDATE invocations SET request = ? WHERE namespace = ? AND invocation_id = ?",
                (archive.text(b'{"amount":200}'), namespace, inv),
            )
            await tx.execute(
                "UPDATE events SET data = ? WHERE namespace = ? AND invocation_id = ? "
                "AND version = 1",
                (b"\x00forged", namespace, inv),
            )
        assert await asyncio.to_thread(main, check) == 1

    async def test_verify_archive_catches_a_consistent_rewrite_of_redis(
        self,
        make_open_store: Any,
        redis: Any,
        archive: ArchiveDatabase,
        archive_url: str,
        redis_url: str,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """A call rewritten in Redis after archiving, record and journal together (its
        chain intact), differs from its archived copy: verify --archive says so."""
        store: Store = await make_open_store(shards=2)
        namespace = store.keys.namespace
        await store.open_run(RUN, deadline=timedelta(minutes=5))
        await finished(store, "c1")
        await finished(store, "c2")
        await ArchiveWorker(store, archive, consumer="w1").run(burst=True)
        code, out, _ = await run_cli(
            capsys, redis_url, namespace, "verify", "--archive", archive_url
        )
        assert code == 0, out
        await redis.delete(store.keys.record(RUN, "c1"), store.keys.stream(RUN, "c1"))
        await redis.hdel(store.keys.run(RUN), f"inv:{invocation_id(RUN, 'c1')}")
        head = await store.writer.create(RUN, "c1", "refund", b'{"amount":1}')
        head = await store.writer.start_projecting(head, b'{"raw":true}')
        await store.writer.complete(head, b'{"ok":1}', EvidenceStatus.EVIDENCE_FOUND, "s")
        code, out, _ = await run_cli(
            capsys, redis_url, namespace, "verify", "--archive", archive_url, "--json"
        )
        problems = [json.loads(line) for line in out.splitlines()]
        assert code == 1
        assert {p["reason"] for p in problems if p["kind"] == "problem"} >= {"archive_mismatch:1"}
        assert {p["tool_call_id"] for p in problems if p["kind"] == "problem"} == {"c1"}

    async def test_search_finds_calls_by_column_and_json_path_a_page_at_a_time(
        self, make_open_store: Any, archive: ArchiveDatabase
    ) -> None:
        """Search by tool and code, by a JSON-path condition (typed: a string is never a
        number), newest first, paged by cursor."""
        store: Store = await make_open_store(shards=2)
        await store.open_run(RUN, deadline=timedelta(minutes=5))
        amounts = {"a": 100, "b": 600, "c": 900, "d": 700}
        for call, amount in amounts.items():
            head = await store.writer.create(RUN, call, "refund", b'{"amount":%d}' % amount)
            head = await store.writer.start_projecting(head, b"{}")
            await store.writer.fail(head, ErrorCode.EXECUTION_FAILED)
        head = await store.writer.create(RUN, "s", "refund", b'{"amount":"800"}')
        head = await store.writer.start_projecting(head, b"{}")
        await store.writer.fail(head, ErrorCode.EXECUTION_FAILED)
        await finished(store, "ok")
        await ArchiveWorker(store, archive, consumer="w1").run(burst=True)
        archived = Archive(archive, store.keys.namespace)

        failed = await search(archived, SearchQuery(tool="refund", error_code="EXECUTION_FAILED"))
        assert {hit.tool_call_id for hit in failed.hits} == {*amounts, "s"}
        big = SearchQuery(
            tool="refund",
            error_code="EXECUTION_FAILED",
            conditions=(parse_condition("request.amount>500"),),
            limit=2,
        )
        first = await search(archived, big)
        assert first.cursor is not None and len(first.hits) == 2
        rest = await search(archived, msgspec.structs.replace(big, cursor=first.cursor))
        assert rest.cursor is None
        assert {hit.tool_call_id for hit in first.hits + rest.hits} == {"b", "c", "d"}
        other = msgspec.structs.replace(
            big, conditions=(parse_condition("request.amount!=600"),), limit=50
        )
        assert {hit.tool_call_id for hit in (await search(archived, other)).hits} == {"a", "c", "d"}
        text = SearchQuery(conditions=(parse_condition('request.amount="800"'),))
        assert [hit.tool_call_id for hit in (await search(archived, text)).hits] == ["s"]
        assert (await search(archived, SearchQuery(run_id="other"))).hits == []

    async def test_erasure_leaves_digests_and_a_tombstone_and_the_chain_verifies(
        self,
        make_open_store: Any,
        archive: ArchiveDatabase,
        archive_url: str,
        redis_url: str,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """canon erase removes the payloads from Redis and the archive, as the operator the
        token names; replay from both says intact and erased (not tampered), with who,
        when and why."""
        store: Store = await make_open_store(shards=2)
        namespace = store.keys.namespace
        await store.open_run(RUN, deadline=timedelta(minutes=5))
        await finished(store, "c1")
        await ArchiveWorker(store, archive, consumer="w1").run(burst=True)
        for name, value in credentials("dpo").items():
            monkeypatch.setenv(name, value)
        erase = ("erase", RUN, "--reason", "GDPR request 7")
        code, _, err = await run_cli(capsys, redis_url, namespace, *erase, "--archive", archive_url)
        assert code == 0, err
        record = await store.reader.fields(RUN, "c1")
        assert not {b"request", b"raw", b"result"} & set(record)
        archived = await Archive(archive, namespace).invocation(RUN, "c1")
        assert archived is not None and not {b"request", b"raw", b"result"} & set(archived.fields)
        for extra in ((), ("--archive", archive_url)):
            code, document = await cli_json(
                capsys, redis_url, namespace, "replay", RUN, "--json", *extra
            )
            (replay,) = document["invocations"]
            assert (
                code == 0 and replay["verdict"]["intact"] and replay["verdict"]["payloads_erased"]
            )
            assert (replay["erasure"]["by"], replay["erasure"]["reason"]) == (
                "dpo",
                "GDPR request 7",
            )
        info = await store.run_info(RUN)
        assert info is not None and not info.active

    async def test_a_settled_calls_evidence_is_archived_and_erased_with_its_run(
        self, make_open_store: Any, fresh_archive_url: str
    ) -> None:
        """An archive of schema 1 is refused until migrated (one column more: the evidence
        an operator gave for settling a call left in flight); a settled call is archived
        with that evidence, and erasing its run drops it as any payload."""
        database = open_archive(fresh_archive_url)
        try:
            async with database.transaction() as tx:
                await tx.execute(
                    "CREATE TABLE archive_schema (version integer PRIMARY KEY, "
                    "applied_at_ms bigint NOT NULL, description text NOT NULL)"
                )
                _, description, statements = MIGRATIONS[0]
                for statement in statements(database.dialect):
                    await tx.execute(statement)
                await tx.execute("INSERT INTO archive_schema VALUES (?, ?, ?)", (1, 0, description))
            with pytest.raises(ArchiveSchemaError, match="canon archive --migrate"):
                await check_schema(database)
            assert await migrate(database) == [2, 3] and await migrate(database) == []
            await check_schema(database)
            store: Store = await make_open_store(shards=2, lease=timedelta(milliseconds=300))
            await store.open_run(RUN, deadline=timedelta(minutes=5))
            head = await store.writer.create(RUN, "c1", "refund", b'{"amount":1}')
            await until_lapsed(store, RUN, "c1")
            await store.writer.settle(head, ErrorCode.ABANDONED, "ops", b"nothing ran")
            await ArchiveWorker(store, database, consumer="w1").run(burst=True)
            archived = Archive(database, store.keys.namespace)
            found = await archived.invocation(RUN, "c1")
            assert found is not None
            assert found.fields[b"settlement_evidence"] == b"nothing ran"
            await archived.erase(RUN, by="dpo", reason="GDPR request 8", at_ms=1)
            found = await archived.invocation(RUN, "c1")
            assert found is not None and b"settlement_evidence" not in found.fields
        finally:
            await database.aclose()

    async def test_an_archive_of_schema_2_keeps_run_data_keys_once_migrated(
        self, make_open_store: Any, fresh_archive_url: str
    ) -> None:
        """An archive of schema 2 is refused until migrated (one column more: each run's
        wrapped data key); an encrypted run is then archived with its wrapped key, the
        one Redis holds, never an unwrapped one."""
        database = open_archive(fresh_archive_url)
        try:
            async with database.transaction() as tx:
                await tx.execute(
                    "CREATE TABLE archive_schema (version integer PRIMARY KEY, "
                    "applied_at_ms bigint NOT NULL, description text NOT NULL)"
                )
                for version, description, statements in MIGRATIONS[:2]:
                    for statement in statements(database.dialect):
                        await tx.execute(statement)
                    await tx.execute(
                        "INSERT INTO archive_schema VALUES (?, ?, ?)", (version, 0, description)
                    )
            with pytest.raises(ArchiveSchemaError, match="canon archive --migrate"):
                await check_schema(database)
            assert await migrate(database) == [3] and await migrate(database) == []
            await check_schema(database)
            store: Store = await make_open_store(shards=2, keys=KEYRING)
            await store.open_run(RUN, deadline=timedelta(minutes=5))
            await finished(store, "c1")
            await ArchiveWorker(store, database, consumer="w1").run(burst=True)
            archived = Archive(database, store.keys.namespace)
            wrapped = await store.client.hget(store.keys.run(RUN), DATA_KEY_FIELD)
            assert wrapped is not None and wrapped.startswith(b"k1:")
            assert await archived.data_key(RUN) == wrapped
            run = await archived.run(RUN)
            assert run is not None and DATA_KEY_FIELD not in run.fields
        finally:
            await database.aclose()

    async def test_an_encrypted_run_opens_from_the_archive_after_the_ttl_until_erased(
        self,
        make_open_store: Any,
        make_store: Any,
        redis: Any,
        archive: ArchiveDatabase,
        archive_url: str,
        redis_url: str,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """The archive keeps the run's wrapped data key (refreshed by a rewrap): once Redis
        let the run go, replay and export from the archive open its payloads with the
        keyring, show them sealed without it, and after canon erase nothing opens them,
        not even a copy of the ciphertext put back."""
        store: Store = await make_open_store(shards=2, ttl=timedelta(seconds=3), keys=KEYRING)
        namespace = store.keys.namespace
        await store.open_run(RUN, deadline=timedelta(seconds=1))
        await finished(store, "c1")
        worker = ArchiveWorker(store, archive, consumer="w1")
        await worker.run(burst=True)
        archived = Archive(archive, namespace)
        assert (await archived.data_key(RUN) or b"").startswith(b"k1:")
        # Rotation: k2 becomes current and rewraps the run; the sweep archives the new key.
        rotated = Keyring({"k1": KEY_K1, "k2": KEY_K2}, "k2")
        seals = make_store(shards=2, keys=rotated).seals
        assert seals is not None and await seals.rewrap(RUN) is True
        await worker.run(burst=True)
        assert (await archived.data_key(RUN) or b"").startswith(b"k2:")
        copy = await archived.invocation(RUN, "c1")
        assert copy is not None and is_sealed(copy.fields[b"request"])

        async def gone() -> bool:
            return await redis.exists(store.keys.record(RUN, "c1"), store.keys.run(RUN)) == 0

        await wait_for(gone, timeout_s=10)
        on_archive = ("--archive", archive_url)
        monkeypatch.setenv("CANON_KEYS", keyring_json({"k2": KEY_K2}, "k2"))
        code, document = await cli_json(
            capsys, redis_url, namespace, "replay", RUN, "--json", *on_archive
        )
        assert code == 0 and document["intact"], document
        lines = await cli_lines(
            capsys, redis_url, namespace, "export", RUN, "--with-payloads", *on_archive
        )
        (record,) = [line for line in lines if line["kind"] == "record"]
        assert record["payloads"]["request"] == {"encoding": "utf-8", "text": '{"amount":200}'}
        assert record["payloads"]["result"] == {"encoding": "utf-8", "text": '{"ok":1}'}
        source = ArchiveSource(archive, namespace, keys=Keyring({"k2": KEY_K2}, "k2"))
        snapshot = await source.snapshot(RUN, "c1")
        assert snapshot.fields[b"raw"] == b'{"raw":true}' and snapshot.unopened == ()

        monkeypatch.delenv("CANON_KEYS")
        code, document = await cli_json(
            capsys, redis_url, namespace, "replay", RUN, "--json", *on_archive
        )
        assert code == 0 and document["intact"], document
        lines = await cli_lines(
            capsys, redis_url, namespace, "export", RUN, "--with-payloads", *on_archive
        )
        (record,) = [line for line in lines if line["kind"] == "record"]
        sealed = base64.b64decode(record["payloads"]["request"]["data"])
        assert is_sealed(sealed) and sealed == copy.fields[b"request"]

        for name, value in credentials("dpo").items():
            monkeypatch.setenv(name, value)
        code, _, err = await run_cli(
            capsys, redis_url, namespace, "erase", RUN, "--reason", "GDPR request 9", *on_archive
        )
        assert code == 0, err
        assert await archived.data_key(RUN) is None
        # A copy of the ciphertext put back (a backup restored) opens nothing now.
        async with archive.transaction() as tx:
            await tx.execute(
                "UPDATE invocations SET request = ? WHERE namespace = ? AND run_id = ?",
                (archive.text(copy.fields[b"request"]), namespace, RUN),
            )
        with pytest.raises(KeyErased):
            await source.seal(RUN)
        snapshot = await source.snapshot(RUN, "c1")
        assert snapshot.fields[b"request"] == copy.fields[b"request"]
        # A later update of the run's row never brings the key back.
        await worker.run(burst=True)
        await archived.write(
            ArchiveBatch(runs=[RunSnapshot(run_id=RUN, fields={}, data_key=b"k2:stale")])
        )
        assert await archived.data_key(RUN) is None

    async def test_an_erased_runs_governed_call_never_runs(
        self, make_open_store: Any, archive: ArchiveDatabase
    ) -> None:
        """A governed call approved before its run was erased is refused RUN_ERASED on
        resume; its tool never runs."""
        store: Store = await make_open_store(shards=2)
        await store.open_run(RUN, deadline=timedelta(minutes=5))
        tool = FakeTool()
        boundary = ToolBoundary(store, tools={"pay": tool.spec(read_only=False, approval=True)})
        ctx = RunContext(RUN)
        pending = await boundary.invoke(
            ctx, ToolEnvelope(run_id=RUN, tool_call_id="g1", tool="pay", arguments={"x": 1})
        )
        assert isinstance(pending, ApprovalPending)
        await store.decide(RUN, "g1", approve=True, by="op", reason="fine")
        await store.erase_run(RUN, by="dpo", reason="erasure")
        reply = await boundary.resume(ctx, "g1")
        assert isinstance(reply, ToolError) and reply.error_code is ErrorCode.RUN_ERASED
        assert tool.executed == 0

    async def test_retention_prunes_old_runs_in_bounded_batches(
        self, make_open_store: Any, archive: ArchiveDatabase
    ) -> None:
        """Runs older than the horizon go in batches, with their calls and events;
        younger ones stay."""
        store: Store = await make_open_store(shards=2)
        for run_id in ("r1", "r2", "r3"):
            await store.open_run(run_id, deadline=timedelta(minutes=5))
            await finished(store, "c1", run_id=run_id)
        await ArchiveWorker(store, archive, consumer="w1").run(burst=True)
        archived = Archive(archive, store.keys.namespace)
        assert await prune(archived, older_than_ms=3_600_000) == 0
        assert await prune(archived, older_than_ms=-1000, batch=2, max_batches=1) == 2
        assert await prune(archived, older_than_ms=-1000, batch=2) == 1
        assert await table_counts(archive, store.keys.namespace) == {"invocations": 0, "events": 0}

    @pytest.mark.not_on_cluster("pruning reads and writes only the archive database")
    async def test_archive_prune_on_the_command_line_and_the_anchors_retention_horizon(
        self,
        make_open_store: Any,
        archive: ArchiveDatabase,
        archive_url: str,
        tmp_path: Path,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """``canon archive prune --retention-days N`` deletes every run last active over N
        days ago (calls, events, run events, rows) and keeps the rest; 0 is refused.
        ``canon verify --anchor --retention-days N`` counts a run gone past that horizon
        as pruned, and one gone within it as missing."""
        store: Store = await make_open_store(shards=2)
        namespace = store.keys.namespace
        for run_id in ("old-1", "old-2", "young"):
            await store.open_run(run_id, deadline=timedelta(minutes=5))
            await finished(store, "c1", run_id=run_id)
            await finished(store, "c2", run_id=run_id, fail=True)
        await ArchiveWorker(store, archive, consumer="w1").run(burst=True)
        two_days_ago = int(time.time() * 1000) - 2 * 86_400_000
        async with archive.transaction() as tx:
            await tx.execute(
                "UPDATE runs SET updated_at_ms = ? WHERE namespace = ? AND run_id IN (?, ?)",
                (two_days_ago, namespace, "old-1", "old-2"),
            )
        key, anchor_file = tmp_path / "anchor.key", tmp_path / "anchor.json"
        args = ["--archive", archive_url, "--namespace", namespace]
        assert await asyncio.to_thread(main, ["archive", "keygen", "--key", str(key)]) == 0
        anchor = ["archive", "anchor", "--key", str(key), "--out", str(anchor_file)]
        assert await asyncio.to_thread(main, [*anchor, "--settle-s", "0", *args]) == 0
        prune_cli = ["archive", "prune", *args, "--retention-days"]

        capsys.readouterr()
        assert await asyncio.to_thread(main, [*prune_cli, "0"]) == 2
        assert "keeps everything" in capsys.readouterr().err
        assert await asyncio.to_thread(main, [*prune_cli, "3"]) == 0
        assert "pruned 0 run(s)" in capsys.readouterr().out
        assert await asyncio.to_thread(main, [*prune_cli, "1"]) == 0
        assert "pruned 2 run(s) last active over 1 day(s) ago" in capsys.readouterr().out
        assert await table_counts(archive, namespace) == {"invocations": 2, "events": 6}
        for table in ("runs", "run_events", "invocations"):
            rows = await archive.fetch(
                f"SELECT DISTINCT run_id FROM {table} WHERE namespace = ?", (namespace,)
            )
            assert {row[0] for row in rows} == {"young"}, table

        check = ["verify", "--anchor", str(anchor_file), "--public-key", f"{key}.pub", *args]
        for days, code, pruned, missing in (("1", 0, 2, 0), ("3", 1, 0, 2)):
            capsys.readouterr()
            assert (
                await asyncio.to_thread(main, [*check, "--json", "--retention-days", days]) == code
            )
            lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
            (summary,) = [line for line in lines if line["kind"] == "anchor"]
            assert summary["pruned"] == pruned, days
            problems = [line["reason"] for line in lines if line["kind"] == "problem"]
            assert problems.count("run_missing") == missing, days

    async def test_a_killed_worker_converges_with_nothing_lost_or_doubled(
        self,
        make_open_store: Any,
        archive: ArchiveDatabase,
        archive_url: str,
        redis_url: str,
        spawn_module: Any,
    ) -> None:
        """Archive workers SIGKILLed while calls are written, then restarted: every
        finished call is archived once, at its last version, with each event once."""
        store: Store = await make_open_store(shards=2)
        namespace = store.keys.namespace
        await store.open_run(RUN, deadline=timedelta(minutes=5))
        command = ("canon.cli", "archive", "--redis-url", redis_url, "--namespace", namespace)
        options = ("--archive", archive_url, "--consumer", "k1", "--block-ms", "50")
        archived = Archive(archive, namespace)

        async def archived_calls() -> int:
            return (await table_counts(archive, namespace))["invocations"]

        calls = 0
        for _ in range(2):
            worker = await spawn_module(*command, *options, "--min-idle-ms", "100")
            for _ in range(10):
                await finished(store, f"c{calls}", fail=calls % 3 == 0)
                calls += 1
            target = calls - 5

            async def progressed(target: int = target, worker: Any = worker) -> bool:
                assert worker.returncode is None, await worker.stderr.read()
                return await archived_calls() >= target

            await wait_for(progressed, timeout_s=60)
            for _ in range(5):  # written while it runs, killed before or after archiving
                await finished(store, f"c{calls}")
                calls += 1
            worker.kill()  # SIGKILL: whatever it had read stays pending
            await worker.wait()
        for _ in range(5):
            await finished(store, f"c{calls}")
            calls += 1
        await ArchiveWorker(store, archive, consumer="k1", min_idle_ms=0).run(burst=True)

        assert await table_counts(archive, namespace) == {
            "invocations": calls,
            "events": 3 * calls,
        }
        assert await archived.versions([invocation_id(RUN, f"c{i}") for i in range(calls)]) == {
            invocation_id(RUN, f"c{i}"): 3 for i in range(calls)
        }


class TestSqliteArchive(ArchiveContract):
    """The archive in SQLite (the embedded default)."""

    @pytest.fixture
    def archive_url(self, tmp_path: Path) -> str:
        """A new SQLite file in the test's temp dir."""
        return f"sqlite:///{tmp_path / 'archive.db'}"


class TestPostgresArchive(ArchiveContract):
    """The archive in PostgreSQL (a private server, one namespace per test)."""

    @pytest.fixture
    def archive_url(self, postgres_url: str) -> str:  # noqa: F811 (the fixture's name)
        """The session's PostgreSQL database (tests keep apart by namespace)."""
        return postgres_url

    @pytest.fixture
    def fresh_archive_url(self, postgres_url: str) -> str:  # noqa: F811 (the fixture's name)
        """A new database on the session's server."""
        name = f"fresh_{uuid.uuid4().hex}"
        server = postgres_url.rsplit("/", 1)[0]
        with psycopg.connect(f"{server}/postgres", autocommit=True) as connection:
            connection.execute(f"CREATE DATABASE {name}")
        return f"{server}/{name}"


async def table_counts(archive: ArchiveDatabase, namespace: str) -> dict[str, int]:
    """How many invocation and event rows a namespace has in the archive."""
    return {
        table: int(
            (
                await archive.fetch(
                    f"SELECT count(*) FROM {table} WHERE namespace = ?", (namespace,)
                )
            )[0][0]
        )
        for table in ("invocations", "events")
    }


async def run_cli(
    capsys: pytest.CaptureFixture[str], redis_url: str, namespace: str, *argv: str
) -> tuple[int, str, str]:
    """Run ``canon`` in-process (in a thread: it runs its own loop); exit, out, err."""
    capsys.readouterr()
    code = await asyncio.to_thread(
        main, [*argv, "--redis-url", redis_url, "--namespace", namespace]
    )
    out, err = capsys.readouterr()
    return code, out, err


async def cli_json(
    capsys: pytest.CaptureFixture[str], redis_url: str, namespace: str, *argv: str
) -> tuple[int, dict[str, Any]]:
    """Run a command whose output is one JSON document."""
    code, out, err = await run_cli(capsys, redis_url, namespace, *argv)
    assert out, err
    return code, json.loads(out)


async def cli_lines(
    capsys: pytest.CaptureFixture[str], redis_url: str, namespace: str, *argv: str
) -> list[dict[str, Any]]:
    """Run a command whose output is JSON Lines."""
    code, out, err = await run_cli(capsys, redis_url, namespace, *argv)
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def strip(line: dict[str, Any]) -> dict[str, Any]:
    """An export line without what differs between Redis and the archive: times of the
    export, TTLs left, the archived marks."""
    return {
        name: value
        for name, value in line.items()
        if name not in ("exported_at_ms", "record_pttl_ms", "stream_pttl_ms", "archived")
    }
