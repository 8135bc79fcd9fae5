"""Shared test helpers: hand-built events, stores on a test namespace, key inspection."""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from eventstore.store import Store
from machine.codes import ErrorCode, EvidenceStatus, Stage
from machine.events import (
    GENESIS_HASH,
    ApprovalAdded,
    ApprovalExpired,
    ApprovalRequested,
    Approved,
    Completed,
    Denied,
    Dispatched,
    Event,
    Failed,
    Preflighted,
    ProjectingStarted,
    Reconciled,
    Settled,
    TakenOver,
    payload_digest,
)
from machine.fold import InvocationState, fold

#: The tool every test run grants unless it says otherwise.
TOOL = "lookup"

#: Payloads of the legal path, one per event type that carries one.
REQUEST = b'{"q":"request-bytes"}'
RAW = b'{"raw":"response-bytes"}'
RESULT = b'{"result":"agent-bytes"}'
EVIDENCE = b"the bank has no refund under this key"
PAYLOADS: dict[str, bytes] = {
    "Preflighted": REQUEST,
    "ApprovalRequested": REQUEST,
    "ProjectingStarted": RAW,
    "Completed": RESULT,
    "Reconciled": EVIDENCE,
    "Settled": EVIDENCE,
}

#: An approval expiry no test reaches (2100-01-01).
APPROVAL_FAR_AHEAD_MS = 4_102_444_800_000

#: Event types on the way from NEW into each stage.
PATH_TO: dict[Stage, tuple[str, ...]] = {
    Stage.NEW: (),
    Stage.EXECUTING: ("Preflighted",),
    Stage.PROJECTING: ("Preflighted", "ProjectingStarted"),
    Stage.READY: ("Preflighted", "ProjectingStarted", "Completed"),
    Stage.ERROR: ("Preflighted", "Failed"),
    Stage.AWAITING_APPROVAL: ("ApprovalRequested",),
    Stage.APPROVED: ("ApprovalRequested", "Approved"),
}


def make_event(
    kind: str,
    state: InvocationState | None,
    *,
    run_id: str = "run-1",
    tool_call_id: str = "call-1",
    version: int | None = None,
    prev_hash: str | None = None,
    evidence: EvidenceStatus = EvidenceStatus.EVIDENCE_FOUND,
    event_id: str | None = None,
    at_ms: int = 1_700_000_000_000,
) -> Event:
    """Build an event of type ``kind`` that follows ``state`` unless told otherwise."""
    common: dict[str, Any] = {
        "event_id": event_id or os.urandom(8).hex(),
        "version": version if version is not None else (state.version + 1 if state else 1),
        "at_ms": at_ms,
        "prev_hash": prev_hash
        if prev_hash is not None
        else (state.last_hash if state else GENESIS_HASH),
    }
    payload = PAYLOADS.get(kind, b"")
    if kind == "Preflighted":
        return Preflighted(
            **common,
            run_id=run_id,
            tool_call_id=tool_call_id,
            tool=TOOL,
            request_sha256=payload_digest(payload),
            request_bytes=len(payload),
        )
    if kind == "ProjectingStarted":
        return ProjectingStarted(
            **common, raw_sha256=payload_digest(payload), raw_bytes=len(payload)
        )
    if kind == "Completed":
        return Completed(
            **common,
            result_sha256=payload_digest(payload),
            result_bytes=len(payload),
            evidence_status=evidence,
            scope="docs",
        )
    if kind == "Failed":
        return Failed(**common, error_code=ErrorCode.EXECUTION_FAILED, rejected_bytes=7)
    if kind == "ApprovalRequested":
        return ApprovalRequested(
            **common,
            run_id=run_id,
            tool_call_id=tool_call_id,
            tool=TOOL,
            request_sha256=payload_digest(payload),
            request_bytes=len(payload),
            approval_id="a" * 32,
            # Far ahead of any server's clock: whether the scripts take a decision or a
            # permit in time is tested on its own, not with the table.
            approval_expires_at_ms=APPROVAL_FAR_AHEAD_MS,
        )
    decision = {"decided_by": "ops@example", "decision_reason": "ok", "decision_id": "d" * 32}
    if kind == "ApprovalAdded":
        return ApprovalAdded(**common, **decision, approval_count=1)
    if kind == "Approved":
        return Approved(**common, **decision)
    if kind == "Denied":
        return Denied(**common, **decision, error_code=ErrorCode.APPROVAL_DENIED)
    if kind == "ApprovalExpired":
        return ApprovalExpired(**common, error_code=ErrorCode.APPROVAL_EXPIRED)
    if kind == "Dispatched":
        return Dispatched(**common, dispatched_request_sha256=payload_digest(REQUEST))
    if kind == "TakenOver":
        return TakenOver(**common, lapsed_at_ms=at_ms - 1, attempt=2)
    settlement = {
        "settled_by": "ops@example",
        "settlement_evidence_sha256": payload_digest(EVIDENCE),
        "settlement_evidence_bytes": len(EVIDENCE),
    }
    if kind == "Reconciled":
        return Reconciled(**common, **settlement)
    if kind == "Settled":
        return Settled(**common, **settlement, error_code=ErrorCode.RECONCILED_NOT_EXECUTED)
    raise ValueError(kind)


def fold_path(
    stage: Stage, *, run_id: str = "run-1", tool_call_id: str = "call-1"
) -> InvocationState | None:
    """Fold the legal path into ``stage`` from nothing (None for NEW)."""
    state: InvocationState | None = None
    for kind in PATH_TO[stage]:
        state = fold(state, make_event(kind, state, run_id=run_id, tool_call_id=tool_call_id))
    return state


@asynccontextmanager
async def open_store(
    url: str, namespace: str, *, shards: int = 4, ttl: timedelta = timedelta(minutes=5)
) -> AsyncIterator[Store]:
    """A store on the test's namespace, its pool closed on exit."""
    async with Store.from_url(url, namespace=namespace, shards=shards, ttl=ttl) as store:
        yield store


async def commandstats(client: Redis | RedisCluster) -> dict[str, int]:
    """Return calls per command from ``INFO commandstats`` (lowercase names).

    On a cluster, summed over every primary: which one holds a run's keys depends on its
    shard's slot, not on which node INFO happens to reach.
    """
    if isinstance(client, RedisCluster):
        per_node = await client.info("commandstats", target_nodes=RedisCluster.PRIMARIES)
        infos = list(cast(dict[str, Any], per_node).values())
    else:
        infos = [await client.info("commandstats")]
    calls: dict[str, int] = {}
    for info in infos:
        for name, stats in cast(dict[str, Any], info).items():
            command = name.removeprefix("cmdstat_")
            if isinstance(stats, dict):
                count = int(stats["calls"])
            else:  # older clients leave the value as "calls=1,usec=..."
                count = int(str(stats).split(",")[0].split("=")[1])
            calls[command] = calls.get(command, 0) + count
    return calls


async def namespace_keys(client: Redis, namespace: str) -> list[bytes]:
    """Every key of ``namespace`` (SCAN, never KEYS)."""
    return sorted([key async for key in client.scan_iter(match=f"{namespace}:*", count=1000)])


async def key_values(client: Redis, key: bytes) -> list[bytes]:
    """Every field name and value stored under ``key``, whatever its type."""
    kind = cast(bytes, await client.type(key)).decode()
    values: list[Any]
    if kind == "hash":
        values = [part for pair in (await client.hgetall(key)).items() for part in pair]
    elif kind == "stream":
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]], await client.xrange(key))
        values = [part for _, fields in entries for pair in fields.items() for part in pair]
    elif kind == "list":
        values = list(await client.lrange(key, 0, -1))
    elif kind == "string":
        values = [await client.get(key)]
    elif kind == "set":
        values = list(await client.smembers(key))
    elif kind == "zset":
        values = list(await client.zrange(key, 0, -1))
    else:
        raise AssertionError(f"unexpected key type {kind}")
    assert all(isinstance(value, bytes) for value in values)
    return values


async def record_fields(store: Store, run_id: str, tool_call_id: str) -> dict[bytes, bytes]:
    """The record's raw hash fields ({} when absent or expired), read through the seam."""
    return cast(
        dict[bytes, bytes], await store.client.hgetall(store.keys.record(run_id, tool_call_id))
    )


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]], *, timeout_s: float = 10.0
) -> None:
    """Poll ``condition`` (plain or async) until it is true; fail after ``timeout_s``.

    Tests wait on what they need to have happened, never on a fixed time: on a busy
    machine a fixed sleep is too short, and the bound here is only a backstop.
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    while True:
        outcome = condition()
        if inspect.isawaitable(outcome):
            outcome = await outcome
        if outcome:
            return
        elapsed = loop.time() - started
        assert elapsed < timeout_s, f"condition not met within {timeout_s} s"
        # For the first 50 ms a poll only yields, so a condition met one loop turn later
        # is seen in that turn; then it polls every 5 ms.
        await asyncio.sleep(0 if elapsed < 0.05 else 0.005)
