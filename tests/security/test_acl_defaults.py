"""Every user of docs/acl.md, with the rules read from that file, does its whole job on a
server left at Redis's own defaults (no append-only file, default stream node and hash
value sizes), where entering a store has something to warn about: the warning is logged
once, the server is told apart without a command the user may not run, and no role is
denied anything. ``canon status`` as the reader, which may not run CONFIG GET, reports
those settings as unknown with one line saying why."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from structlog.testing import capture_logs

from canon.cli import main as canon_main
from eventstore import RunContext, Store, ToolBoundary
from eventstore.server.config_checks import REDIS_DEFAULTS
from eventstore.server.embedded import EmbeddedRedis, ServerBinary
from machine.codes import EvidenceStatus
from machine.ids import invocation_id
from projections import ProgressWorker, ReceiptWorker, create_app, read_view
from projections.worker.supervisor import run_workers
from tests.security.test_acl import PASSWORDS, acl_rules, apply_rules, denials, url_of
from tests.support.calls import RUN, TOOL, envelope, outcome
from tests.support.tools import FakeTool

#: The blocks of docs/acl.md a server of each version takes (Redis 7 adds key permissions).
BLOCKS = {"portable": ("acl-portable",), "redis7": ("acl-portable", "acl-redis7")}
#: ACL LOG names of a denied CONFIG GET (6.2 logs the command, 7.x command|subcommand).
CONFIG_GET = {"config", "config|get"}


def _events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"] == name]


@pytest.fixture
def server(server_binary: ServerBinary) -> Iterator[EmbeddedRedis]:
    """A private server of each supported version on Redis's defaults: no append-only file,
    4096-byte stream nodes, 64-byte compact hash values."""
    args = [arg for name, value in REDIS_DEFAULTS.items() for arg in (f"--{name}", value)]
    with EmbeddedRedis(server_binary, extra_args=args) as embedded:
        yield embedded


@pytest.fixture(params=list(BLOCKS))
async def admin(server: EmbeddedRedis, request: pytest.FixtureRequest) -> AsyncIterator[Redis]:
    """The administrator, with the rules of docs/acl.md loaded as the doc states them (the
    Redis 7 block too where the server takes it) and ACL LOG empty."""
    client = Redis.from_url(server.url)
    try:
        for block in BLOCKS[request.param]:
            if block == "acl-redis7" and server.binary.version < (7, 0, 0):
                continue  # 6.2 has no %R~ (test_acl.py proves it refuses the block)
            await apply_rules(client, block)
        await client.execute_command("ACL", "LOG", "RESET")
        yield client
    finally:
        await client.aclose()


async def _writer_job(server: EmbeddedRedis) -> str:
    """The writer's documented job in a store of the default mode (warn): open a run, a
    READY call, a failed one, pause and resume, read back, close the run; its token."""
    async with Store.from_url(url_of(server, "canon-writer"), shards=4) as store:
        token = (await store.open_run(RUN, deadline=timedelta(minutes=5))).access_token
        tools = {TOOL: FakeTool().spec(), "broken": FakeTool(raise_in_executor=OSError()).spec()}
        boundary = ToolBoundary(store, tools)
        replies = [
            await boundary.invoke(RunContext(RUN), envelope("c1")),
            await boundary.invoke(RunContext(RUN), envelope("c2", tool="broken")),
        ]
        assert [outcome(reply) for reply in replies] == ["READY", "EXECUTION_FAILED"]
        await store.set_paused(True)
        await store.set_paused(False)
        record = await store.get(RUN, "c1")
        assert record is not None and record.state.evidence_status is EvidenceStatus.EVIDENCE_FOUND
        assert len(await store.events(RUN, "c1")) == 3
        assert await store.close_run(RUN)
    return token


async def test_writer_enters_and_runs_the_boundary_without_a_denial(
    server: EmbeddedRedis, admin: Redis
) -> None:
    """The writer enters stores on a server with settings to warn about and runs the
    boundary end to end: the durability and cost warnings are logged once for the server,
    not at every store open, and ACL LOG holds no denial (no INFO to tell servers apart)."""
    with capture_logs() as logs:
        await _writer_job(server)
        for _ in range(2):
            async with Store.from_url(url_of(server, "canon-writer"), shards=4):
                pass
    [warning] = _events(logs, "durability_warning")
    assert warning["risks"] == ["appendonly=no"] and warning["source"] == "config"
    advice = [entry["advice"] for entry in _events(logs, "server_setting_warning")]
    assert [line.split(" is ")[0] for line in advice] == [
        "stream-node-max-bytes",
        "hash-max-listpack-value",
    ]
    assert not any(password in repr(logs) for password in PASSWORDS.values())
    assert await denials(admin) == []


async def test_workers_enter_and_project_without_a_denial(
    server: EmbeddedRedis, admin: Redis
) -> None:
    """``canon workers``' user enters its store (the preflight warns, as for the writer) and
    projects every receipt and the run's view with no denial."""
    await _writer_job(server)
    async with Store.from_url(url_of(server, "canon-workers"), shards=4) as store:
        workers = [ReceiptWorker(store, min_idle_ms=0), ProgressWorker(store, min_idle_ms=0)]
        await run_workers(workers, burst=True, handle_signals=False)
        assert [worker.counters["failed"] for worker in workers] == [0, 0]
        view = await read_view(store, RUN)
        assert view is not None and view.by_status == {"READY": 1, "ERROR": 1}
    assert len([key async for key in admin.scan_iter(match="canon:{s*}:receipt:*")]) == 2
    assert await denials(admin) == []


async def test_reader_audits_and_serves_receipts_without_a_denial(
    server: EmbeddedRedis, admin: Redis
) -> None:
    """The reader runs replay, verify, export and inspect (exit 0) and serves both receipts
    over the HTTP API with no denial."""
    token = await _writer_job(server)
    url = f"--redis-url={url_of(server, 'canon-reader')}"
    for command in (
        ["replay", RUN],
        ["verify", "--no-progress"],
        ["export", RUN],
        ["inspect", invocation_id(RUN, "c1"), f"--run-id={RUN}"],
    ):
        code = await asyncio.to_thread(canon_main, [*command, url, "--shards=4"])
        assert code == 0, command
    reader = Store.from_url(url_of(server, "canon-reader"), shards=4, read_only=True)
    try:
        transport = httpx.ASGITransport(app=create_app(reader))
        async with httpx.AsyncClient(transport=transport, base_url="http://canon") as http:
            for call in ("c1", "c2"):
                response = await http.get(
                    f"/v1/invocations/{invocation_id(RUN, call)}/receipt",
                    headers={"Authorization": f"Bearer {token}"},
                )
                assert response.status_code == 200, response.text
                assert response.json()["journal_state"] == "completed"
    finally:
        await reader.aclose()
    assert await denials(admin) == []


async def test_reader_status_reports_unreadable_settings_as_unknown(
    server: EmbeddedRedis, admin: Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    """``canon status`` as the reader (denied CONFIG GET on purpose) reports: exit 0, the
    cost settings ``unknown``, one warning line saying why (the ACL denial, NOPERM, this
    doc), no traceback; ``--strict`` exits 1 for the same report. CONFIG GET is the only
    command refused, once per run."""
    await _writer_job(server)
    capsys.readouterr()
    url = f"--redis-url={url_of(server, 'canon-reader')}"

    code = await asyncio.to_thread(canon_main, ["status", "--json", url, "--shards=4"])
    out, err = capsys.readouterr()

    assert code == 0, err
    status = json.loads(out)
    assert status["records"] == 2 and status["appendonly"] == "no"
    assert status["maxmemory_policy"] == "noeviction"  # INFO, which the reader may run
    assert status["server_settings"] == {
        "stream-node-max-bytes": "unknown",
        "hash-max-listpack-value": "unknown",
        "hash-max-listpack-entries": "unknown",
    }
    [why] = [line for line in status["warnings"] if "server settings" in line]
    assert why.startswith("server settings could not be read: CONFIG GET is denied")
    assert "NOPERM" in why and "docs/acl.md" in why
    assert "Traceback" not in out + err and "unavailable" not in err
    assert not any(password in out + err for password in PASSWORDS.values())

    strict = await asyncio.to_thread(canon_main, ["status", url, "--shards=4", "--strict"])
    human, err = capsys.readouterr()
    assert strict == 1, err
    assert "cost settings: stream-node-max-bytes: unknown" in human
    assert human.count("server settings could not be read") == 1
    entries = await denials(admin)
    assert {entry["object"] for entry in entries} <= CONFIG_GET
    assert sum(int(entry["count"]) for entry in entries) == 2  # one per status run


def _without_config(user: str) -> list[str]:
    """The doc's trade-off for a server using requirepass: ``+config|get`` dropped and
    ``+info`` added to ``user``'s portable rules."""
    [rules] = [rules for name, rules in acl_rules("acl-portable") if name == user]
    assert "+config|get" in rules
    return [rule for rule in rules if rule != "+config|get"] + ["+info"]


async def test_roles_without_config_use_info_and_run_their_jobs(
    server: EmbeddedRedis, admin: Redis
) -> None:
    """With the documented trade-off (INFO instead of CONFIG GET) the writer and the
    workers still enter and do their jobs: the preflight reads appendonly from INFO (one
    warning for the server), and only the CONFIG GET it tries first is refused."""
    for user in ("canon-writer", "canon-workers"):
        assert await admin.execute_command("ACL", "SETUSER", user, *_without_config(user))
    await admin.execute_command("ACL", "LOG", "RESET")
    with capture_logs() as logs:
        await _writer_job(server)
        async with Store.from_url(url_of(server, "canon-workers"), shards=4) as store:
            workers = [ReceiptWorker(store, min_idle_ms=0), ProgressWorker(store, min_idle_ms=0)]
            await run_workers(workers, burst=True, handle_signals=False)
            assert [worker.counters["failed"] for worker in workers] == [0, 0]
    [warning] = _events(logs, "durability_warning")
    assert (warning["source"], warning["risks"]) == ("info", ["appendonly=no"])
    assert {entry["object"] for entry in await denials(admin)} <= CONFIG_GET
