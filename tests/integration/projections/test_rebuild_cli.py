"""``canon rebuild receipts|progress``: the operator's command, its report and exit codes."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from eventstore.store import Store
from machine.codes import EvidenceStatus
from projections import ReceiptWorker
from projections.generations import current_generation
from tests.integration.receipts.test_inspect_cli import canon

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-rbc"


async def prepared(make_store: Any) -> Store:
    store: Store = make_store(shards=2)
    await store.check_namespace()
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    for i in range(3):
        head = await store.writer.create(RUN, f"c{i}", "search", b'{"q":1}')
        head = await store.writer.start_projecting(head, b'{"raw":1}')
        await store.writer.complete(head, b'{"x":1}', EvidenceStatus.EVIDENCE_FOUND, "s")
    await ReceiptWorker(store, consumer="w").run(burst=True)
    return store


async def test_rebuild_reports_the_switch_and_exits_0(
    make_store: Any, redis_url: str, namespace: str
) -> None:
    """The report names both generations and what was projected; readers use the new one."""
    store = await prepared(make_store)
    connection = (f"--redis-url={redis_url}", f"--namespace={namespace}", "--shards=2")

    code, out, err = await canon("rebuild", "receipts", *connection)
    assert code == 0, err
    assert "canon: error" not in err  # warnings (e.g. a server without AOF) may appear
    assert "receipts: generation 1 → 2" in out
    assert "3 records projected (applied 3)" in out
    assert "generation 1 removed (3 output keys deleted)" in out

    code, out, _ = await canon("rebuild", "receipts", "--json", *connection)
    assert code == 0
    report = json.loads(out)
    assert (report["previous_generation"], report["generation"]) == (2, 3)
    assert await current_generation(store, "receipts") == 3


async def test_a_held_claim_is_one_line_and_exit_1(
    make_store: Any, redis: Redis, redis_url: str, namespace: str
) -> None:
    """Another rebuild in progress: exit 1, one line saying how to take over."""
    store = await prepared(make_store)
    await redis.hset(store.keys.meta(), "rebuilding:progress", "2:1700000000000:x")
    code, out, err = await canon(
        "rebuild", "progress", f"--redis-url={redis_url}", f"--namespace={namespace}", "--shards=2"
    )
    assert (code, out) == (1, "")
    errors = [line for line in err.splitlines() if line.startswith("canon: error:")]
    assert len(errors) == 1 and "--takeover" in errors[0] and "Traceback" not in err


async def test_usage_errors_are_one_line_and_exit_2(redis_url: str, namespace: str) -> None:
    """An unknown projection is one line on stderr and exit 2; no reachable server, exit 3."""
    code, out, err = await canon("rebuild", "nonsense", f"--redis-url={redis_url}")
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "invalid choice" in err

    url = "redis://ops:s3cret-pw@127.0.0.1:1/0"
    code, out, err = await canon("rebuild", "receipts", f"--redis-url={url}")
    assert (code, out) == (3, "")
    assert err.count("\n") == 1 and "unavailable" in err and "s3cret-pw" not in err
