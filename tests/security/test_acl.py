"""Least-privilege ACL users, loaded from the exact rules in docs/acl.md: the writer runs the
boundary, the workers project, the reader audits and serves receipts, nothing is denied
while each does its job, and each is refused what its role does not need."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.exceptions
from redis.asyncio import Redis

from canon.cli import main as canon_main
from eventstore import RunContext, Store, ToolBoundary
from eventstore.audit.waiting import sweep_expired
from eventstore.errors import AccessDenied
from eventstore.server.embedded import EmbeddedRedis, ServerBinary
from machine.codes import EvidenceStatus
from machine.ids import invocation_id
from projections import ProgressWorker, ReceiptWorker, create_app, read_view
from projections.worker.supervisor import run_workers
from tests.support.calls import RUN, TOOL, envelope, outcome
from tests.support.left_calls import until_lapsed
from tests.support.log_scan import forbid_in_logs
from tests.support.tools import FakeTool

DOC = Path(__file__).resolve().parents[2] / "docs" / "acl.md"
PASSWORDS = {
    "canon-writer": "acl-writer-pass-3f9b1c",
    "canon-workers": "acl-workers-pass-a72e04",
    "canon-reader": "acl-reader-pass-5d08c6",
}
forbid_in_logs(*PASSWORDS.values())
#: Commands no role may run (each is a write, an admin command, or a key listing).
NEVER_ALLOWED: list[tuple[Any, ...]] = [
    ("FLUSHALL",),
    ("FLUSHDB",),
    ("KEYS", "*"),
    ("CONFIG", "SET", "appendonly", "no"),
    ("DEL", "canon:meta"),
    ("EVAL", "return 1", "0"),
    ("SET", "elsewhere", "1"),
    ("HSET", "elsewhere", "f", "1"),
    ("SHUTDOWN",),
    ("ACL", "LIST"),
]
#: Every write the reader might attempt on its own namespace.
WRITES: list[tuple[Any, ...]] = [
    ("HSET", "canon:{s00}:inv:run-a:c1", "status", "READY"),
    ("HSETNX", "canon:meta", "shards", "4"),
    ("HINCRBY", "canon:{s00}:run:run-a", "used_total", "1"),
    ("DEL", "canon:{s00}:inv:run-a:c1"),
    ("UNLINK", "canon:{s00}:inv:run-a:c1"),
    ("PEXPIRE", "canon:{s00}:inv:run-a:c1", "1"),
    ("PERSIST", "canon:{s00}:inv:run-a:c1"),
    ("XADD", "canon:{s00}:feed", "*", "r", "x"),
    ("XTRIM", "canon:{s00}:feed", "MAXLEN", "0"),
    ("XDEL", "canon:{s00}:feed", "0-1"),
    ("XACK", "canon:{s00}:feed", "receipts", "0-1"),
    ("XGROUP", "CREATE", "canon:{s00}:feed", "g", "0"),
    ("XREADGROUP", "GROUP", "receipts", "c", "STREAMS", "canon:{s00}:feed", ">"),
    ("RPUSH", "canon:{s00}:progress:run-a", "x"),
    ("SET", "canon:x", "1"),
    ("EVALSHA", "0" * 40, "0"),
    ("SCRIPT", "LOAD", "return 1"),
    ("RENAME", "canon:meta", "canon:meta2"),
]


def acl_rules(block: str) -> list[tuple[str, list[str]]]:
    """(user, rules) of every line of one fenced ``block`` of docs/acl.md, passwords filled."""
    match = re.search(rf"```{block}\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert match, f"docs/acl.md has no {block} block"
    users = []
    for line in match.group(1).strip().splitlines():
        # A selector "(+cmd ~pattern)" is one rule although it contains spaces.
        _, name, *rules = re.findall(r"\([^)]*\)|\S+", line)
        placeholder = "CHANGE_ME_" + name.removeprefix("canon-").upper()
        users.append((name, [rule.replace(placeholder, PASSWORDS[name]) for rule in rules]))
    return users


async def apply_rules(admin: Redis, block: str) -> None:
    """Create or update the users of one block with ACL SETUSER."""
    for name, rules in acl_rules(block):
        assert await admin.execute_command("ACL", "SETUSER", name, *rules)


def url_of(server: EmbeddedRedis, user: str) -> str:
    """The server's URL with one role's credentials."""
    return f"redis://{user}:{PASSWORDS[user]}@127.0.0.1:{server.port}/0"


async def denials(admin: Redis) -> list[dict[str, Any]]:
    """ACL LOG entries, except redis-py's optional CLIENT SETINFO on connect (its failure is
    ignored by the client; 6.2 logs it as ``client``, 7.2+ as ``client|setinfo``)."""
    entries = await admin.acl_log()
    return [e for e in entries if e["object"] not in ("client", "client|setinfo")]


@pytest.fixture
def server(server_binary: ServerBinary) -> Iterator[EmbeddedRedis]:
    """A private server of each supported version with an append-only file."""
    with EmbeddedRedis(server_binary, appendonly=True, appendfsync="always") as embedded:
        yield embedded


@pytest.fixture
async def admin(server: EmbeddedRedis) -> AsyncIterator[Redis]:
    """The default (administrator) user, with the portable rules loaded and ACL LOG empty."""
    client = Redis.from_url(server.url)
    try:
        await apply_rules(client, "acl-portable")
        await client.execute_command("ACL", "LOG", "RESET")
        yield client
    finally:
        await client.aclose()


async def write_calls(server: EmbeddedRedis) -> tuple[str, ToolBoundary, Store]:
    """As the writer: open the run, then one READY call, one failure and one duplicate."""
    store = Store.from_url(url_of(server, "canon-writer"), shards=4, durability="strict")
    await store.__aenter__()
    token = (await store.open_run(RUN, deadline=timedelta(minutes=5))).access_token
    tools = {TOOL: FakeTool().spec(), "broken": FakeTool(raise_in_executor=OSError()).spec()}
    boundary = ToolBoundary(store, tools)
    replies = [
        await boundary.invoke(RunContext(RUN), envelope("c1")),
        await boundary.invoke(RunContext(RUN), envelope("c2", tool="broken")),
        await boundary.invoke(RunContext(RUN), envelope("c1")),
    ]
    assert [outcome(r) for r in replies] == ["READY", "EXECUTION_FAILED", "DUPLICATE_TOOL_CALL"]
    return token, boundary, store


async def assert_refused(client: Redis, commands: list[tuple[Any, ...]]) -> None:
    """Every command fails with NOPERM."""
    for command in commands:
        with pytest.raises(redis.exceptions.NoPermissionError):
            await client.execute_command(*command)


async def test_writer_runs_the_boundary_end_to_end(server: EmbeddedRedis, admin: Redis) -> None:
    """The writer user enters a strict store, opens a run, makes calls, has calls refused
    (put on the run's refusal log, in the creation script and after preflight), pauses,
    reads back and closes the run without a single denial; admin and foreign-key commands
    are refused."""
    _, _, store = await write_calls(server)
    try:
        boundary = ToolBoundary(store, {TOOL: FakeTool().spec()})
        refused = [
            await boundary.invoke(RunContext(RUN), envelope("c1")),
            await boundary.invoke(RunContext(RUN), envelope("c9", tool="nowhere")),
        ]
        assert [outcome(reply) for reply in refused] == ["DUPLICATE_TOOL_CALL", "UNKNOWN_TOOL"]
        assert [entry.code for entry in await store.refusals(RUN, limit=2)] == [
            "UNKNOWN_TOOL",
            "DUPLICATE_TOOL_CALL",
        ]
        await store.set_paused(True)
        assert await store.is_paused()
        await store.set_paused(False)
        record = await store.get(RUN, "c1")
        assert record is not None and record.state.evidence_status is EvidenceStatus.EVIDENCE_FOUND
        assert len(await store.events(RUN, "c1")) == 3
        assert await store.close_run(RUN)
        assert await denials(admin) == []
        xreadgroup = ("XREADGROUP", "GROUP", "receipts", "c", "STREAMS", "canon:{s00}:feed", ">")
        await assert_refused(store.client, [*NEVER_ALLOWED, xreadgroup])
    finally:
        await store.aclose()


async def test_writer_reconciles_settles_and_pauses_without_a_denial(
    server: EmbeddedRedis, admin: Redis
) -> None:
    """As the writer: a call left by a process that died is swept (the reconcile lists the
    runs and their calls), another settled by an operator, the run paused twice and
    unpaused, the expired approvals swept, a takeover refused in the paused run: not one
    denial."""
    store = Store.from_url(
        url_of(server, "canon-writer"),
        shards=4,
        durability="strict",
        lease=timedelta(milliseconds=200),
    )
    await store.__aenter__()
    try:
        await store.open_run(RUN, deadline=timedelta(minutes=5))
        for call in ("left-1", "left-2"):
            await store.writer.create(RUN, call, TOOL, b"{}")
        for call in ("left-1", "left-2"):
            await until_lapsed(store, RUN, call)
        assert await store.pause_run(RUN, by="ops", reason="incident")
        again = await store.decisions.set_run_paused(RUN, True, by="ops", reason="again")
        assert again is not None and not again.changed
        settled = await store.settle(RUN, "left-1", executed=False, by="ops", evidence="none")
        assert settled.made_now
        report = await ToolBoundary(store, {TOOL: FakeTool().spec()}).reconcile(
            RUN, grace=timedelta(0)
        )
        assert [(c.tool_call_id, c.outcome) for c in report.calls] == [("left-2", "abandoned")]
        assert await store.unpause_run(RUN, by="ops", reason="over")
        await sweep_expired(store)
        assert await denials(admin) == []
    finally:
        await store.aclose()


async def test_writer_trims_old_feed_entries_without_a_denial(
    server: EmbeddedRedis, admin: Redis
) -> None:
    """A write that finds feed entries past the retention reads where the groups stand and
    trims, all within the writer's rules; the entries a group has not settled stay."""
    async with Store.from_url(url_of(server, "canon-writer"), shards=4) as store:
        await store.open_run(RUN, deadline=timedelta(minutes=5))
        feed = store.keys.feed_of(RUN)
        seconds, _ = await admin.time()
        old_ms = int(seconds) * 1000 - store.settings.feed_retention_ms - 10 * 60_000
        for seq in range(300):
            await admin.xadd(feed, {"r": "old"}, f"{old_ms}-{seq}")
        await admin.xgroup_create(feed, "receipts", id="0")
        delivered = await admin.xreadgroup("receipts", "c", {feed: ">"}, count=300)
        ids = [entry_id for entry_id, _ in delivered[0][1]]
        await admin.xack(feed, "receipts", *ids[:200])

        reply = await ToolBoundary(store, {TOOL: FakeTool().spec()}).invoke(
            RunContext(RUN), envelope("c1")
        )

        assert outcome(reply) == "READY"
        assert await denials(admin) == []
        left = [entry_id for entry_id, _ in await admin.xrange(feed)]
        assert set(ids[200:]) <= set(left)
        assert len(left) < 300


async def test_workers_project_every_event(server: EmbeddedRedis, admin: Redis) -> None:
    """The workers user builds every receipt and the run's view without a denial, and is
    refused admin commands, foreign keys and running the writer's EVAL."""
    _, _, writer = await write_calls(server)
    await writer.aclose()
    async with Store.from_url(url_of(server, "canon-workers"), shards=4) as store:
        workers = [ReceiptWorker(store, min_idle_ms=0), ProgressWorker(store, min_idle_ms=0)]
        await run_workers(workers, burst=True, handle_signals=False)
        view = await read_view(store, RUN)
        assert view is not None and view.by_status == {"READY": 1, "ERROR": 1}
        receipts = [k async for k in admin.scan_iter(match="canon:{s*}:receipt:*")]
        assert len(receipts) == 2
        assert await denials(admin) == []
        await assert_refused(store.client, NEVER_ALLOWED)


async def test_reader_runs_the_audit_tools_and_serves_receipts(
    server: EmbeddedRedis, admin: Redis
) -> None:
    """The reader user runs canon replay, verify and export (exit 0) and serves receipts over
    the HTTP API, with no denial in the ACL log."""
    token, _, writer = await write_calls(server)
    await writer.aclose()
    url = url_of(server, "canon-reader")
    for command in (["replay", RUN], ["verify", "--no-progress"], ["export", RUN]):
        code = await asyncio.to_thread(canon_main, [*command, f"--redis-url={url}", "--shards=4"])
        assert code == 0, command
    reader = Store.from_url(url, shards=4)
    try:
        # XREVRANGE: the reader reads the log (write_calls' second "c1" was refused).
        assert [entry.code for entry in await reader.refusals(RUN)] == ["DUPLICATE_TOOL_CALL"]
        transport = httpx.ASGITransport(app=create_app(reader))
        async with httpx.AsyncClient(transport=transport, base_url="http://canon") as http:
            for call in ("c1", "c2"):
                response = await http.get(
                    f"/v1/invocations/{invocation_id(RUN, call)}/receipt",
                    headers={"Authorization": f"Bearer {token}"},
                )
                assert response.status_code == 200, response.text
                assert response.json()["tool_call_id"] == call
    finally:
        await reader.aclose()
    assert await denials(admin) == []


async def test_reader_cannot_write(server: EmbeddedRedis, admin: Redis) -> None:
    """Every write command fails with NOPERM for the reader; a writing store it enters on
    the existing namespace (which needs no write) refuses its first write as an ACL
    denial, and entering one that would have to record the metadata (a new namespace)
    is refused as an ACL denial too, writing nothing."""
    _, _, writer = await write_calls(server)
    await writer.aclose()
    reader = Store.from_url(url_of(server, "canon-reader"), shards=4)
    try:
        await assert_refused(reader.client, [*WRITES, *NEVER_ALLOWED])
    finally:
        await reader.aclose()
    async with Store.from_url(url_of(server, "canon-reader"), shards=4) as store:
        assert store.keys.shards == 4
        with pytest.raises(AccessDenied):
            await store.open_run("run-b", deadline=timedelta(minutes=5))
    await admin.delete("canon:meta")
    with pytest.raises(AccessDenied):
        async with Store.from_url(url_of(server, "canon-reader"), shards=4):
            pass
    assert await admin.exists("canon:meta") == 0


async def test_redis7_key_permissions_confine_each_role(
    server: EmbeddedRedis, admin: Redis
) -> None:
    """On Redis 7 the %R~ rules let the writer and the workers do their whole job, while a
    worker cannot write a record, stream or run and the writer cannot write a receipt."""
    if server.binary.version < (7, 0, 0):
        # Redis 6.2 has no %R~ key permissions; the portable block is its least privilege.
        with pytest.raises(redis.exceptions.ResponseError):
            await apply_rules(admin, "acl-redis7")
        return
    await apply_rules(admin, "acl-redis7")
    _, _, writer = await write_calls(server)
    async with Store.from_url(url_of(server, "canon-workers"), shards=4) as workers_store:
        workers = [
            ReceiptWorker(workers_store, min_idle_ms=0),
            ProgressWorker(workers_store, min_idle_ms=0),
        ]
        await run_workers(workers, burst=True, handle_signals=False)
        assert [worker.counters["failed"] for worker in workers] == [0, 0]
        view = await read_view(workers_store, RUN)
        assert view is not None and view.by_status == {"READY": 1, "ERROR": 1}
        assert await denials(admin) == []
        keys = workers_store.keys
        await assert_refused(
            workers_store.client,
            [
                ("HSET", keys.record(RUN, "c1"), "status", "ERROR"),
                ("XADD", keys.stream(RUN, "c1"), "*", "e", "{}"),
                ("HINCRBY", keys.run(RUN), "used_total", "-1"),
                ("RPUSH", keys.progress(RUN), "forged"),
            ],
        )
        receipt = keys.receipt(RUN, invocation_id(RUN, "c1"))
        await assert_refused(
            writer.client,
            [("HSET", receipt, "version", "99"), ("HSET", keys.run_view(RUN), "x", "1")],
        )
        # Only the forced attempts were denied: by key where the command is granted to the
        # role, by command where it is not (RPUSH); nothing the roles did on their own.
        denied = {entry["object"] for entry in await denials(admin)}
        assert denied == {
            keys.record(RUN, "c1"),
            keys.stream(RUN, "c1"),
            keys.run(RUN),
            "rpush",
            receipt,
            keys.run_view(RUN),
        }
    await writer.aclose()
