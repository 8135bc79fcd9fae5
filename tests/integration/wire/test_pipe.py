"""A kept connection's pipe: the same replies as redis-py's reading, and a clean hand-back."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any, cast

import hiredis
import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import Connection
from redis.exceptions import BusyLoadingError, NoScriptError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from eventstore.store import Store
from eventstore.wire import pipe as pipe_module
from eventstore.wire.batching import ScriptBatcher
from eventstore.wire.exchange import read_many
from eventstore.wire.pipe import Pipe, pipe_for, release_pipe
from tests.helpers import wait_until

#: Replies of every shape a script can give, one error in place, one nested.
SCRIPT = """
if ARGV[1] == 'error' then return redis.error_reply('WRONG made to fail') end
if ARGV[1] == 'nested' then return {1, redis.error_reply('INNER failed'), 'x'} end
return {ARGV[1], 42, {'a', 'b'}, redis.status_reply('FINE')}
"""


def _packed(*args: Any) -> bytes:
    return cast(bytes, hiredis.pack_command(args))


@pytest.fixture(params=[2, 3], ids=lambda p: f"resp{p}")
async def client(redis_url: str, request: pytest.FixtureRequest) -> AsyncIterator[Redis]:
    """A client speaking RESP2 or RESP3, closed after the test."""
    redis = Redis.from_url(redis_url, protocol=request.param)
    try:
        yield redis
    finally:
        await redis.aclose()


async def _connection(client: Redis) -> Connection:
    return cast(Connection, await client.connection_pool.get_connection())


async def _through_redis_py(connection: Connection, *args: Any) -> Any:
    await connection.send_packed_command([_packed(*args)], check_health=False)
    try:
        return await connection.read_response()
    except ResponseError as exc:
        return exc


async def test_replies_and_error_replies_are_those_redis_py_reads(client: Redis) -> None:
    sha = await client.script_load(SCRIPT)
    connection = await _connection(client)
    try:
        commands = [("EVALSHA", sha, 0, value) for value in ("v", "error", "nested")]
        expected = [await _through_redis_py(connection, *command) for command in commands]
        pipe = pipe_for(connection)
        assert isinstance(pipe, Pipe)
        replies = await pipe.send([_packed(*command) for command in commands])
        assert replies[0] == expected[0] == [b"v", 42, [b"a", b"b"], b"FINE"]
        assert isinstance(replies[1], ResponseError) and isinstance(expected[1], ResponseError)
        assert str(replies[1]) == str(expected[1]) == "WRONG made to fail"
        assert replies[2][0] == expected[2][0] == 1 and replies[2][2] == expected[2][2] == b"x"
        assert type(replies[2][1]) is type(expected[2][1]) and str(replies[2][1]) == "INNER failed"
        unknown = await pipe.send([_packed("EVALSHA", "0" * 40, 0)])
        assert isinstance(unknown[0], NoScriptError)  # the batcher reloads on this type
    finally:
        assert release_pipe(connection)
        await client.connection_pool.release(connection)


async def test_a_released_connection_is_read_by_redis_py_again(client: Redis) -> None:
    connection = await _connection(client)
    pipe = pipe_for(connection)
    assert pipe is not None and pipe_for(connection) is pipe  # attached once
    assert await pipe.send([_packed("SET", "pipe:k", "1")]) == [b"OK"]
    assert release_pipe(connection)
    await client.connection_pool.release(connection)
    # The pool hands the same connection out again, to redis-py's own reading.
    assert await client.get("pipe:k") == b"1"
    assert await client.delete("pipe:k") == 1


async def test_decoded_replies_follow_the_clients_encoding(redis_url: str) -> None:
    client = Redis.from_url(redis_url, decode_responses=True)
    connection = await _connection(client)
    try:
        pipe = pipe_for(connection)
        assert pipe is not None
        assert await pipe.send([_packed("ECHO", "été")]) == ["été"]
    finally:
        release_pipe(connection)
        await client.connection_pool.release(connection)
        await client.aclose()


async def test_a_connection_with_replies_due_is_not_handed_back(client: Redis) -> None:
    connection = await _connection(client)
    try:
        pipe = pipe_for(connection)
        assert pipe is not None
        due = pipe.send([_packed("BLPOP", "pipe:never", 0)])
        assert not release_pipe(connection)  # its next reader would take BLPOP's reply
        due.cancel()
    finally:
        await connection.disconnect(nowait=True)
        await client.connection_pool.release(connection)


async def test_a_closed_connection_fails_its_exchanges_and_refuses_more(client: Redis) -> None:
    connection = await _connection(client)
    try:
        pipe = pipe_for(connection)
        assert pipe is not None
        (own_id,) = await pipe.send([_packed("CLIENT", "ID")])
        waiting = pipe.send([_packed("BLPOP", "pipe:never", 0)])
        await client.client_kill_filter(_id=own_id)
        with pytest.raises(RedisConnectionError):
            await waiting
        with pytest.raises(RedisConnectionError):
            pipe.send([_packed("PING")])
        # redis-py's own disconnect still completes: its stream protocol saw the close.
        await asyncio.wait_for(connection.disconnect(), 5)
        assert release_pipe(connection)  # nothing of the pipe is left on it
    finally:
        await client.connection_pool.release(connection)
    assert await client.ping()


async def test_a_connection_lost_with_an_error_leaves_no_exception_unretrieved(
    client: Redis,
) -> None:
    """A write that fails (a broken pipe) closes the transport with that error. asyncio's
    stream protocol keeps it in a close future that it marks retrieved only when it is
    itself collected; a reference cycle can collect the future first. Here the future
    goes first on purpose: nothing may be reported as never retrieved."""
    loop = asyncio.get_running_loop()
    gc.collect()  # what earlier tests left is reported now, not below
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    connection = await _connection(client)
    try:
        assert connection._writer is not None
        stream_protocol: Any = connection._writer.transport.get_protocol()
        pipe = pipe_for(connection)
        assert pipe is not None
        broken = BrokenPipeError(32, "Broken pipe")
        pipe.connection_lost(broken)  # as the transport says it
        closed, stream_protocol._closed = stream_protocol._closed, loop.create_future()
        assert "BrokenPipeError" in repr(closed)  # kept, and not asked for here
        del closed
        gc.collect()
        assert [c.get("message") for c in reported if c.get("exception") is broken] == []
    finally:
        loop.set_exception_handler(previous)
        await connection.disconnect(nowait=True)
        await client.connection_pool.release(connection)


async def test_a_reply_nobody_waits_for_closes_the_connection(client: Redis) -> None:
    connection = await _connection(client)
    try:
        pipe = pipe_for(connection)
        assert pipe is not None
        # Two commands sent as one: the second reply has no exchange to go to.
        (pong,) = await pipe.send([_packed("PING") + _packed("PING")])
        assert pong in (b"PONG", "PONG", True)
        await wait_until(lambda: connection._writer is None or connection._writer.is_closing())
        with pytest.raises(RedisConnectionError):
            pipe.send([_packed("PING")])
    finally:
        await connection.disconnect(nowait=True)
        await client.connection_pool.release(connection)


async def test_push_messages_go_to_redis_pys_parser_not_to_a_caller(redis_url: str) -> None:
    client = Redis.from_url(redis_url, protocol=3)
    other = Redis.from_url(redis_url)
    connection = await _connection(client)
    pushed: list[Any] = []

    async def invalidated(message: Any) -> None:
        pushed.append(message)

    try:
        connection._parser.set_invalidation_push_handler(invalidated)  # type: ignore[union-attr]
        pipe = pipe_for(connection)
        assert pipe is not None
        await pipe.send([_packed("CLIENT", "TRACKING", "ON"), _packed("GET", "pipe:tracked")])
        await other.set("pipe:tracked", "changed")
        # The invalidation arrives before PING's answer; PING still gets its own reply.
        assert await pipe.send([_packed("PING")]) == [b"PONG"]
        await wait_until(lambda: bool(pushed))
        assert pushed[0][0] in (b"invalidate", "invalidate")
        assert pushed[0][1] == [b"pipe:tracked"]
    finally:
        await connection.disconnect(nowait=True)
        await client.connection_pool.release(connection)
        await other.delete("pipe:tracked")
        await client.aclose()
        await other.aclose()


async def test_resp3_without_push_messages_told_apart_is_read_by_redis_py(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # hiredis before 3.2 gives push messages as plain lists: a pipe could take one for a
    # reply, so such a connection keeps redis-py's reading, and the batcher still works.
    monkeypatch.setattr(pipe_module, "_PUSH", None)
    client = Redis.from_url(redis_url, protocol=3)
    batcher = ScriptBatcher(client)
    script = client.register_script("return ARGV[1]")
    try:
        assert await batcher.call(script, [], ["alone"]) == b"alone"
        replies = await asyncio.gather(*(batcher.call(script, [], [str(i)]) for i in range(5)))
        assert replies == [str(i).encode() for i in range(5)]
        connection = await _connection(client)
        try:
            assert pipe_for(connection) is None
        finally:
            await client.connection_pool.release(connection)
    finally:
        await batcher.close()
        await client.aclose()


async def test_the_batcher_reads_its_kept_connections_through_a_pipe(redis_url: str) -> None:
    client = Redis.from_url(redis_url, max_connections=20)
    batcher = ScriptBatcher(client)
    script = client.register_script("return ARGV[1]")
    try:
        assert await batcher.call(script, [], ["one"]) == b"one"
        kept = batcher._idle[0]
        assert isinstance(kept._writer.transport.get_protocol(), Pipe)  # type: ignore[union-attr]
        await batcher.close()
        # Handed back to the pool with redis-py's own reading restored.
        assert not isinstance(kept._writer.transport.get_protocol(), Pipe)  # type: ignore[union-attr]
        assert await client.echo("after") == b"after"
    finally:
        await batcher.close()
        await client.aclose()


async def test_an_error_reply_that_is_a_connection_error_fails_the_exchange(client: Redis) -> None:
    # redis-py raises these (LOADING: the server is loading its data) instead of handing
    # them back, so its Retry reconnects and sends again: the pipe does the same.
    connection = await _connection(client)
    try:
        pipe = pipe_for(connection)
        assert pipe is not None
        loading = _packed("EVAL", "return redis.error_reply('LOADING not yet')", 0)
        with pytest.raises(BusyLoadingError):
            await pipe.send([_packed("PING"), loading])
        assert await pipe.send([_packed("ECHO", "next")]) == [b"next"]  # still in step
        # ... also when it heads a list, as redis-py looks there too.
        heading = _packed("EVAL", "return {redis.error_reply('LOADING not yet'), 1}", 0)
        with pytest.raises(BusyLoadingError):
            await pipe.send([heading, _packed("PING")])
        assert await pipe.send([_packed("ECHO", "after")]) == [b"after"]
    finally:
        release_pipe(connection)
        await client.connection_pool.release(connection)


async def test_a_wide_read_is_one_exchange_with_replies_in_order(
    client: Redis, namespace: str
) -> None:
    """read_many of 2,000 HMGETs answers each in its order, an error reply in its place
    (a hash read as a list), and gives its connection back to the pool readable."""
    keys = [f"{namespace}:h:{n}" for n in range(2000)]
    async with client.pipeline(transaction=False) as pipe:
        for n, key in enumerate(keys):
            pipe.hset(key, mapping={"a": n, "b": f"v{n}"})
        await pipe.execute()
    commands: list[tuple[Any, ...]] = [("HMGET", key, "a", "b", "c") for key in keys]
    commands.append(("LRANGE", keys[0], 0, -1))
    replies = await read_many(client, commands, timeout_s=5.0)
    assert replies[:-1] == [[str(n).encode(), f"v{n}".encode(), None] for n in range(2000)]
    assert isinstance(replies[-1], ResponseError)
    assert await client.hget(keys[7], "b") == b"v7"  # the pool's connections still read
    assert await read_many(client, [], timeout_s=5.0) == []
    await client.delete(*keys)


async def test_a_wide_read_is_sent_again_after_its_connection_dropped(
    make_store: Any,
) -> None:
    """A connection the server closed while idle in the pool: the read goes through on a
    fresh one (the store's client retries connection errors), never answering from the
    dead one."""
    client = cast(Store, make_store()).client
    await client.set("read-many-probe", "1")
    connection = await _connection(client)
    await client.connection_pool.release(connection)
    await client.client_kill_filter(_id=await _client_id(client, connection), skipme=False)
    replies = await read_many(client, [("GET", "read-many-probe")] * 3, timeout_s=5.0)
    assert replies == [b"1"] * 3
    await client.delete("read-many-probe")


async def _client_id(client: Redis, connection: Connection) -> int:
    """The server's id of ``connection`` (CLIENT ID sent on it)."""
    await connection.send_command("CLIENT", "ID")
    return int(await connection.read_response())
