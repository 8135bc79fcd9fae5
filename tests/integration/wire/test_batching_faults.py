"""The batcher under cut connections, an exhausted pool and cancelled callers: every caller
gets its own reply, its own error or its own cancellation, and no task or future of the
batcher ever ends with an exception nobody retrieved."""

from __future__ import annotations

import asyncio
import gc
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from eventstore.server.embedded import EmbeddedRedis
from eventstore.wire.batching import ScriptBatcher

PUSH = "return redis.call('RPUSH', KEYS[1], ARGV[1])"
CALLS = 400


@pytest.fixture
async def unretrieved() -> AsyncIterator[list[dict[str, Any]]]:
    """What the event loop's exception handler is given while the test runs (an exception
    nobody retrieved, among others); the previous handler is put back afterwards."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    seen: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    try:
        yield seen
    finally:
        loop.set_exception_handler(previous)


async def _cut_connections(admin: Redis, stopping: asyncio.Event) -> int:
    """Kill every other client's connection, again and again, until stopped."""
    kills = 0
    while not stopping.is_set():
        kills += int(
            await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        )
        await asyncio.sleep(random.uniform(0, 0.003))
    return kills


async def test_cut_connections_under_load_leave_nothing_unretrieved(
    start_server: Any, unretrieved: list[dict[str, Any]]
) -> None:
    """400 concurrent calls over a pool of 3 connections while every connection is killed
    over and over and a tenth of the callers are cancelled: each call ends in a reply, a
    Redis error or a cancellation; afterwards no lane is left and, after a full garbage
    collection, nothing was reported as never retrieved."""
    server: EmbeddedRedis = start_server()
    pool = BlockingConnectionPool.from_url(
        server.url,
        max_connections=3,
        timeout=0.05,  # an exhausted pool fails fast: ConnectionError("No connection available")
        socket_timeout=0.5,
        retry=Retry(NoBackoff(), 1),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
    )
    client = Redis.from_pool(pool)
    admin = Redis.from_url(server.url)
    batcher = ScriptBatcher(client, max_batch=4, max_lanes=3)
    push = client.register_script(PUSH)
    stopping = asyncio.Event()
    cutter = asyncio.create_task(_cut_connections(admin, stopping))
    try:
        for round_ in range(3):
            calls = [
                asyncio.create_task(batcher.call(push, [f"k{round_}"], [i])) for i in range(CALLS)
            ]
            for task in random.sample(calls, CALLS // 10):
                task.get_loop().call_later(random.uniform(0, 0.01), task.cancel)
            results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 60)
            kinds = {
                "reply" if isinstance(r, int) else type(r).__name__
                for r in results
                if not isinstance(r, RedisError)
            }
            assert kinds <= {"reply", "CancelledError"}, kinds
        stopping.set()
        assert await cutter > 0
        await asyncio.wait_for(batcher.drain(), 10)
        assert batcher._lanes == 0 and not batcher._queue and not batcher._in_flight
    finally:
        stopping.set()
        await asyncio.gather(cutter, return_exceptions=True)
        await client.aclose()
        await admin.aclose()
    del calls, results
    gc.collect()
    await asyncio.sleep(0)
    assert [context.get("message") for context in unretrieved] == []
