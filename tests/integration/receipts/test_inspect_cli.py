"""``canon inspect``: prints an invocation's receipt through its run, and writes nothing."""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from eventstore.store import Store
from machine.codes import EvidenceStatus
from machine.ids import invocation_id
from tests.helpers import commandstats

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-i"
WRITES = ("hset", "hsetnx", "hincrby", "xadd", "xack", "pexpireat", "evalsha", "del")


async def canon(*args: str) -> tuple[int, str, str]:
    """Run ``canon`` in a subprocess; return its exit code, stdout and stderr."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "canon.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def prepared(make_store: Any) -> tuple[Store, str]:
    store: Store = make_store(shards=2)
    await store.check_namespace()
    token = (await store.open_run(RUN, deadline=timedelta(minutes=5))).access_token
    head = await store.writer.create(RUN, "c1", "search", b'{"q":1}')
    head = await store.writer.start_projecting(head, b'{"raw":1}')
    await store.writer.complete(head, b'{"x":1}', EvidenceStatus.EVIDENCE_FOUND, "s")
    return store, token


async def test_inspect_prints_the_receipt_and_writes_nothing(
    make_store: Any, redis: Redis, redis_url: str, namespace: str
) -> None:
    """With the run's token, inspect prints the receipt JSON; no write command is issued."""
    _, token = await prepared(make_store)
    before = await commandstats(redis)
    code, out, err = await canon(
        "inspect",
        invocation_id(RUN, "c1"),
        f"--run-token={token}",
        f"--redis-url={redis_url}",
        f"--namespace={namespace}",
    )
    after = await commandstats(redis)
    assert (code, err) == (0, "")
    receipt = json.loads(out)
    assert receipt["invocation_id"] == invocation_id(RUN, "c1")
    assert receipt["result"]["agent_result"] == {"x": 1}
    assert token not in out
    assert all(after.get(c, 0) == before.get(c, 0) for c in WRITES)


async def test_inspect_by_run_id_for_an_operator(
    make_store: Any, redis_url: str, namespace: str
) -> None:
    """An operator names the run by id; the same receipt is printed."""
    await prepared(make_store)
    code, out, _ = await canon(
        "inspect",
        invocation_id(RUN, "c1"),
        f"--run-id={RUN}",
        f"--redis-url={redis_url}",
        f"--namespace={namespace}",
    )
    assert code == 0
    assert json.loads(out)["journal_state"] == "completed"


async def test_inspect_refuses_bad_tokens_ids_and_unknown_invocations(
    make_store: Any, redis_url: str, namespace: str
) -> None:
    """A wrong token or an unknown invocation exits 1; a malformed id exits 2; nothing printed."""
    await prepared(make_store)
    connection = (f"--redis-url={redis_url}", f"--namespace={namespace}")
    wrong = await canon("inspect", invocation_id(RUN, "c1"), "--run-token=cr1:run-i:x", *connection)
    unknown = await canon("inspect", "ab" * 32, f"--run-id={RUN}", *connection)
    malformed = await canon("inspect", "AB" * 32, f"--run-id={RUN}", *connection)
    assert [r[0] for r in (wrong, unknown, malformed)] == [1, 1, 2]
    assert [r[1] for r in (wrong, unknown, malformed)] == ["", "", ""]
    assert "unauthorized" in wrong[2]
    assert "invocation_not_found" in unknown[2]
