"""Auto-pipelining: concurrent script calls share round trips, each caller gets its own reply.

On the cluster only the tests that hold for any client run: there the store has one
batcher per master (tests/cluster/test_cluster_batching.py counts its pipelines), and
they show that the same concurrent calls keep each invocation's event order and refuse
only the duplicate.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from eventstore.errors import Refused, StoreUnavailable
from eventstore.server.embedded import EmbeddedRedis, ServerBinary
from eventstore.store import Store
from eventstore.wire import batching
from eventstore.wire.batching import DEFAULT_MAX_BATCH, ScriptBatcher
from eventstore.wire.exchange import send_batch
from eventstore.writer import Head
from machine.codes import EvidenceStatus
from tests.helpers import RAW, REQUEST, RESULT, TOOL, record_fields
from tests.support.waiting import wait_for

pytestmark = pytest.mark.backends("single", "cluster")

_NOT_BATCHED = "asserts one server's pipelines and round trips (one batcher per master there)"
_OWN_SERVER = "runs a single server of its own (script flush, killed connections, shutdown)"

PUSH = "return redis.call('RPUSH', KEYS[1], ARGV[1])"
INCR = "return redis.call('INCR', KEYS[1])"


async def _evalsha_calls(client: Redis) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def _lifecycle(store: Store, run_id: str, tool_call_id: str) -> Head:
    head = await store.writer.create(run_id, tool_call_id, TOOL, REQUEST)
    head = await store.writer.start_projecting(head, RAW)
    return await store.writer.complete(head, RESULT, EvidenceStatus.EVIDENCE_FOUND, "scope")


async def _open(store: Store, run_id: str = "run-1") -> str:
    await store.open_run(run_id, deadline=timedelta(minutes=5), tools={TOOL: None})
    return run_id


@pytest.fixture
def private_server(server_binary: ServerBinary) -> Iterator[EmbeddedRedis]:
    """A server of its own, for tests that flush scripts or kill connections."""
    with EmbeddedRedis(server_binary) as server:
        yield server


@pytest.fixture
async def private_store(private_server: EmbeddedRedis) -> AsyncIterator[Store]:
    """A store on the private server, closed after the test."""
    store = Store.from_url(private_server.url, namespace="batching")
    async with store:
        yield store


@pytest.mark.not_on_cluster(_NOT_BATCHED)
async def test_concurrent_appends_share_round_trips(store: Store, redis: Redis) -> None:
    """64 concurrent lifecycles need far fewer round trips than script calls, each run once."""
    run_id = await _open(store)
    await _lifecycle(store, run_id, "warm")  # the scripts are loaded on the server
    before, stats = await _evalsha_calls(redis), store.batch_stats
    calls, round_trips = stats.calls, stats.round_trips
    heads = await asyncio.gather(*(_lifecycle(store, run_id, f"call-{i}") for i in range(64)))
    assert stats.calls - calls == 192
    assert stats.round_trips - round_trips <= 192 // 4
    assert stats.largest_batch > 1
    assert await _evalsha_calls(redis) - before == 192
    assert {head.version for head in heads} == {3}


async def test_each_invocation_keeps_its_event_order(store: Store, redis: Redis) -> None:
    """Batched lifecycles leave every stream and every feed in version order."""
    run_id = await _open(store)
    calls = [f"call-{i}" for i in range(40)]
    await asyncio.gather(*(_lifecycle(store, run_id, call) for call in calls))
    for call in calls:
        events = await store.events(run_id, call)
        assert [stored.event.version for stored in events if stored.event] == [1, 2, 3]
    feed = await redis.xrange(store.keys.feed_of(run_id))
    seen: dict[bytes, list[int]] = {}
    for _, fields in feed:
        seen.setdefault(fields[b"c"], []).append(int(fields[b"v"]))
    assert seen == {call.encode(): [1, 2, 3] for call in calls}


@pytest.mark.not_on_cluster(_NOT_BATCHED)
async def test_a_batch_runs_in_call_order(redis: Redis, namespace: str) -> None:
    """Calls made in one event-loop turn are executed in the order they were made."""
    batcher = ScriptBatcher(redis, max_batch=64)
    push = redis.register_script(PUSH)
    await redis.script_load(PUSH)
    key = f"{namespace}:order"
    await asyncio.gather(*(batcher.call(push, [key], [i]) for i in range(50)))
    assert await redis.lrange(key, 0, -1) == [str(i).encode() for i in range(50)]
    assert batcher.stats.round_trips == 1
    await redis.delete(key)


@pytest.mark.not_on_cluster(_NOT_BATCHED)
async def test_a_large_turn_is_split_into_pipelines_of_max_batch(
    redis: Redis, namespace: str
) -> None:
    """A turn with more calls than max_batch goes out as several pipelines, all answered."""
    batcher = ScriptBatcher(redis, max_batch=8)
    push = redis.register_script(PUSH)
    await redis.script_load(PUSH)
    key = f"{namespace}:split"
    replies = await asyncio.gather(*(batcher.call(push, [key], [i]) for i in range(20)))
    assert sorted(replies) == list(range(1, 21))
    assert (batcher.stats.round_trips, batcher.stats.largest_batch) == (3, 8)
    assert sorted(int(v) for v in await redis.lrange(key, 0, -1)) == list(range(20))
    await redis.delete(key)


@pytest.mark.not_on_cluster(_NOT_BATCHED)
@pytest.mark.parametrize(("callers", "first"), [(8, 8), (16, 4), (24, 6), (32, 8), (64, 8)])
async def test_by_default_pipelines_are_sized_by_the_calls_outstanding(
    redis: Redis, namespace: str, monkeypatch: pytest.MonkeyPatch, callers: int, first: int
) -> None:
    """Up to one pipeline's worth, a turn goes as one; beyond, as pipelines of a quarter of
    the calls outstanding (at least 4, at most 8), so that Redis runs one while the client
    reads another."""
    sizes: list[int] = []

    async def sending(batch: list[Any], *args: Any) -> list[Any]:
        sizes.append(len(batch))
        return await send_batch(batch, *args)

    monkeypatch.setattr(batching, "send_batch", sending)
    batcher = ScriptBatcher(redis)
    push = redis.register_script(PUSH)
    await redis.script_load(PUSH)
    key = f"{namespace}:by-load"

    replies = await asyncio.gather(*(batcher.call(push, [key], [i]) for i in range(callers)))

    assert sorted(replies) == list(range(1, callers + 1))
    # The first pipeline is taken with every call of the turn queued; later ones are
    # sized by what is still outstanding when they are taken.
    assert sizes[0] == first and sum(sizes) == callers
    assert max(sizes) <= DEFAULT_MAX_BATCH
    assert sorted(int(v) for v in await redis.lrange(key, 0, -1)) == list(range(callers))
    await redis.delete(key)


@pytest.mark.not_on_cluster(_NOT_BATCHED)
async def test_at_most_max_lanes_pipelines_are_in_flight_each_on_one_connection(
    redis_url: str, namespace: str
) -> None:
    """A turn of 40 calls with 2 lanes of 4: ten pipelines on two connections, all answered,
    and the calls of each lane's pipelines in the order they were made."""
    async with Redis.from_url(redis_url) as client, Redis.from_url(redis_url) as admin:
        clients_before = (await admin.info("clients"))["connected_clients"]
        batcher = ScriptBatcher(client, max_batch=4, max_lanes=2)
        push = client.register_script(PUSH)
        await client.script_load(PUSH)
        key = f"{namespace}:lanes"

        replies = await asyncio.gather(*(batcher.call(push, [key], [i]) for i in range(40)))

        assert sorted(replies) == list(range(1, 41))
        assert (batcher.stats.round_trips, batcher.stats.largest_batch) == (10, 4)
        assert (await admin.info("clients"))["connected_clients"] <= clients_before + 2
        pushed = [int(v) for v in await client.lrange(key, 0, -1)]
        assert sorted(pushed) == list(range(40))
        # A pipeline is four consecutive calls, which run in the order they were made.
        position = {value: index for index, value in enumerate(pushed)}
        for first in range(0, 40, 4):
            places = [position[value] for value in range(first, first + 4)]
            assert places == sorted(places)
        await client.delete(key)


@pytest.mark.not_on_cluster("builds batchers only, touching no server; it already runs once")
def test_lanes_and_batches_must_be_at_least_one() -> None:
    """A batcher that could never send anything is refused when it is built."""
    client = Redis()
    for options in ({"max_batch": 0}, {"max_lanes": 0}):
        with pytest.raises(ValueError, match="at least 1"):
            ScriptBatcher(client, **options)


@pytest.mark.not_on_cluster(_NOT_BATCHED)
async def test_a_failing_command_does_not_fail_its_neighbours(redis: Redis, namespace: str) -> None:
    """A script error reaches only its own caller; the rest of its pipeline succeeds."""
    batcher = ScriptBatcher(redis)
    incr = redis.register_script(INCR)
    await redis.script_load(INCR)
    bad = f"{namespace}:text"
    await redis.set(bad, "not a number")
    keys = [f"{namespace}:n{i}" for i in range(5)]
    replies = await asyncio.gather(
        *(batcher.call(incr, [key], []) for key in [*keys[:2], bad, *keys[2:]]),
        return_exceptions=True,
    )
    assert isinstance(replies[2], ResponseError)
    assert replies[:2] + replies[3:] == [1, 1, 1, 1, 1]
    assert batcher.stats.round_trips == 1
    await redis.delete(bad, *keys)


async def test_a_refusal_in_a_batch_leaves_the_others_applied(store: Store) -> None:
    """A duplicate creation is refused alone while its batch's other creations apply."""
    run_id = await _open(store)
    results = await asyncio.gather(
        *(store.writer.create(run_id, call, TOOL, REQUEST) for call in ["a", "b", "a", "c"]),
        return_exceptions=True,
    )
    refused = [r for r in results if isinstance(r, Refused)]
    assert [r.code for r in refused] == ["DUPLICATE_TOOL_CALL"]
    assert sorted(r.tool_call_id for r in results if isinstance(r, Head)) == ["a", "b", "c"]


@pytest.fixture
async def spawn() -> AsyncIterator[Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]]]:
    """Starts tasks that are cancelled and awaited at the end of the test, whatever
    happened in it: a failed assertion never leaves a call running into the next test."""
    tasks: list[asyncio.Task[Any]] = []

    def start(coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(coroutine)
        tasks.append(task)
        return task

    yield start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.not_on_cluster(
    "cancels a call queued for the next flush; an unbatched call has no queue"
)
async def test_a_caller_cancelled_before_the_flush_is_never_sent(
    redis: Redis, namespace: str, spawn: Any
) -> None:
    """Cancelling a queued call drops it; the other calls of its turn still run."""
    batcher = ScriptBatcher(redis)
    push = redis.register_script(PUSH)
    key = f"{namespace}:cancel"
    tasks = [spawn(batcher.call(push, [key], [i])) for i in range(6)]
    # One turn: every task has queued its call (their steps were scheduled before the
    # flush, which the first call schedules), and the flush has not yet run.
    await asyncio.sleep(0)
    assert len(batcher._queue) == 6 and not batcher.stats.round_trips
    tasks[3].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[3], asyncio.CancelledError)
    assert await redis.lrange(key, 0, -1) == [b"0", b"1", b"2", b"4", b"5"]
    await redis.delete(key)


@pytest.mark.not_on_cluster(
    "cancels a caller of a pipeline on the wire; an unbatched call has no pipeline"
)
async def test_a_caller_cancelled_in_flight_leaves_the_others_answered(
    redis: Redis, namespace: str, spawn: Any
) -> None:
    """Cancelling a caller whose batch is on the wire changes nothing for its neighbours."""
    batcher = ScriptBatcher(redis)
    push = redis.register_script(PUSH)
    key = f"{namespace}:flight"
    tasks = [spawn(batcher.call(push, [key], [i])) for i in range(6)]
    # Until the batch has been taken for sending (however long a connection takes on a
    # busy machine). Polled by yielding only, never sleeping: the check then runs in the
    # loop turn after the send, before the reply can be read (its read callback, then
    # its reader's wake-up, come in later turns). A poll that slept 5 ms could see the
    # whole round trip done.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while batcher.stats.round_trips == 0:
        assert loop.time() < deadline, "the batch was never sent"
        await asyncio.sleep(0)
    assert batcher.stats.round_trips == 1 and not tasks[0].done()
    tasks[0].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError)
    assert sorted(r for r in results[1:] if isinstance(r, int)) == [2, 3, 4, 5, 6]
    await batcher.drain()
    assert await redis.llen(key) == 6
    await redis.delete(key)


@pytest.mark.not_on_cluster(_OWN_SERVER)
async def test_noscript_after_script_flush_is_recovered_inside_a_batch(
    private_store: Store,
) -> None:
    """After SCRIPT FLUSH a batch loads the script once and re-sends only the refused calls."""
    run_id = await _open(private_store)
    await _lifecycle(private_store, run_id, "warm")
    await private_store.client.script_flush()
    stats = private_store.batch_stats
    reloads, round_trips = stats.reloads, stats.round_trips
    calls = [f"call-{i}" for i in range(DEFAULT_MAX_BATCH)]  # exactly one pipeline
    heads = await asyncio.gather(
        *(private_store.writer.create(run_id, call, TOOL, REQUEST) for call in calls)
    )
    assert [head.version for head in heads] == [1] * len(calls)
    assert (stats.reloads - reloads, stats.round_trips - round_trips) == (1, 2)
    for call in calls:
        record = await private_store.get(run_id, call)
        assert record is not None and record.state.version == 1


@pytest.mark.not_on_cluster(_OWN_SERVER)
async def test_killed_connections_are_retried_without_double_writes(
    private_store: Store, private_server: EmbeddedRedis
) -> None:
    """A batch whose pooled connection was killed is re-sent once; every event applies once."""
    run_id = await _open(private_store)
    await asyncio.gather(*(_lifecycle(private_store, run_id, f"warm-{i}") for i in range(8)))
    async with Redis.from_url(private_server.url) as admin:
        assert await admin.client_kill_filter(_type="normal", skipme=True) >= 1
    heads = await asyncio.gather(
        *(_lifecycle(private_store, run_id, f"call-{i}") for i in range(16))
    )
    assert private_store.batch_stats.resends >= 1
    assert {head.version for head in heads} == {3}
    for i in range(16):
        assert len(await private_store.events(run_id, f"call-{i}")) == 3


async def test_one_call_at_a_time_goes_alone_on_its_kept_connection_and_survives_its_loss(
    private_store: Store, private_server: EmbeddedRedis
) -> None:
    """With one call in flight each call is its own round trip on the one connection the
    batcher keeps; when that connection is killed between calls, the next call is sent
    again on a fresh one and every event still applies exactly once."""
    run_id = await _open(private_store)
    await _lifecycle(private_store, run_id, "warm")
    stats = private_store.batch_stats
    calls, round_trips = stats.calls, stats.round_trips
    await _lifecycle(private_store, run_id, "alone")
    assert (stats.calls - calls, stats.round_trips - round_trips, stats.largest_batch) == (3, 3, 1)
    async with Redis.from_url(private_server.url) as admin:
        assert await admin.client_kill_filter(_type="normal", skipme=True) >= 1
    for i in range(3):
        head = await _lifecycle(private_store, run_id, f"after-{i}")
        assert head.version == 3
        assert len(await private_store.events(run_id, f"after-{i}")) == 3
    assert stats.resends >= 1


class _CountingSelector(selectors.DefaultSelector):
    """The loop's selector, counting how often the loop polls: once per turn."""

    polls = 0

    def select(self, timeout: float | None = None) -> list[Any]:
        self.polls += 1
        return super().select(timeout)


@pytest.mark.not_on_cluster(_NOT_BATCHED)
def test_a_lone_call_with_nothing_else_to_run_costs_no_extra_turn_of_the_loop(
    redis_url: str, namespace: str
) -> None:
    """One call at a time, with nothing else ready to run, takes two turns of the loop:
    one that waits for the reply and one that resumes its caller; none before it is sent."""
    selector = _CountingSelector()
    loop = asyncio.SelectorEventLoop(selector)

    async def polls_per_call() -> float:
        client = Redis.from_url(redis_url)
        batcher = ScriptBatcher(client)
        incr = client.register_script(INCR)
        key = f"{namespace}:lone"
        try:
            await batcher.call(incr, [key], [])  # connects and loads the script
            before = selector.polls
            for _ in range(10):
                await batcher.call(incr, [key], [])
            return (selector.polls - before) / 10
        finally:
            await batcher.close()
            await client.delete(key)
            await client.aclose()

    try:
        assert loop.run_until_complete(polls_per_call()) == 2
    finally:
        loop.close()


@pytest.mark.not_on_cluster(_OWN_SERVER)
async def test_an_unreachable_server_fails_every_caller_of_the_batch(
    private_server: EmbeddedRedis,
) -> None:
    """When Redis is gone, each batched caller gets StoreUnavailable, nothing hangs."""
    store = Store.from_url(private_server.url, namespace="gone", timeout_s=0.5)
    async with store:
        run_id = await _open(store)
        private_server.stop()
        results: list[Any] = await asyncio.gather(
            *(store.writer.create(run_id, f"call-{i}", TOOL, REQUEST) for i in range(8)),
            return_exceptions=True,
        )
        assert all(isinstance(result, StoreUnavailable) for result in results)


async def test_a_lone_call_to_a_gone_server_is_tried_as_often_as_the_client_retry_says(
    private_server: EmbeddedRedis,
) -> None:
    """The client's Retry (three retries) decides: one call to a stopped server makes four
    attempts, three of them re-sends, then fails with StoreUnavailable."""
    store = Store.from_url(private_server.url, namespace="retried", timeout_s=0.5)
    async with store:
        run_id = await _open(store)
        await _lifecycle(store, run_id, "warm")  # a kept connection, to a live server
        stats = store.batch_stats
        round_trips, resends = stats.round_trips, stats.resends
        private_server.stop()
        with pytest.raises(StoreUnavailable):
            await store.writer.create(run_id, "call-1", TOOL, REQUEST)
        assert (stats.round_trips - round_trips, stats.resends - resends) == (4, 3)


@pytest.mark.not_on_cluster(_OWN_SERVER)
async def test_a_stalled_server_times_out_the_batch_and_every_caller_hears_it(
    private_server: EmbeddedRedis,
) -> None:
    """One timer bounds a batch's replies: a server that stops answering fails each caller
    with StoreUnavailable once the retries are spent, long before it answers again; the
    next batch, once it does, goes through and nothing was applied twice."""
    store = Store.from_url(private_server.url, namespace="stalled", timeout_s=0.3)
    async with store, Redis.from_url(private_server.url) as admin:
        run_id = await _open(store)
        await asyncio.gather(*(_lifecycle(store, run_id, f"warm-{i}") for i in range(8)))
        await admin.execute_command("CLIENT", "PAUSE", 4000, "WRITE")
        loop = asyncio.get_running_loop()
        started = loop.time()

        results: list[Any] = await asyncio.gather(
            *(store.writer.create(run_id, f"call-{i}", TOOL, REQUEST) for i in range(8)),
            return_exceptions=True,
        )

        assert all(isinstance(result, StoreUnavailable) for result in results), results
        assert loop.time() - started < 3.5
        await admin.execute_command("CLIENT", "UNPAUSE")
        heads = await asyncio.gather(*(_lifecycle(store, run_id, f"after-{i}") for i in range(8)))
        assert {head.version for head in heads} == {3}
        for i in range(8):
            assert len(await store.events(run_id, f"after-{i}")) == 3
            assert len(await store.events(run_id, f"call-{i}")) <= 1


@pytest.mark.not_on_cluster(_OWN_SERVER)
async def test_a_short_stall_is_ridden_out_by_the_retries(private_server: EmbeddedRedis) -> None:
    """A stall shorter than the retries last: the timed-out batch is sent again and every
    event applies exactly once."""
    store = Store.from_url(private_server.url, namespace="hiccup", timeout_s=0.3)
    async with store, Redis.from_url(private_server.url) as admin:
        run_id = await _open(store)
        await asyncio.gather(*(_lifecycle(store, run_id, f"warm-{i}") for i in range(8)))
        await admin.execute_command("CLIENT", "PAUSE", 400, "WRITE")

        heads = await asyncio.gather(*(_lifecycle(store, run_id, f"call-{i}") for i in range(8)))

        assert store.batch_stats.resends >= 1
        assert {head.version for head in heads} == {3}
        for i in range(8):
            assert len(await store.events(run_id, f"call-{i}")) == 3


@pytest.mark.not_on_cluster(_OWN_SERVER)
async def test_connections_kept_under_load_go_back_to_the_pool_when_it_ends(
    private_server: EmbeddedRedis,
) -> None:
    """Between batches the batcher keeps its connections while more calls are coming, and
    gives every one back once nothing is: a pool of two then serves two readers at once."""
    store = Store.from_url(private_server.url, namespace="pooled", max_connections=2)
    async with store:
        run_id = await _open(store)
        for burst in range(3):
            heads = await asyncio.gather(
                *(_lifecycle(store, run_id, f"call-{burst}-{i}") for i in range(32))
            )
            assert {head.version for head in heads} == {3}
            await store._batcher.drain()  # white-box: the batcher gives its connections back

            records = await asyncio.wait_for(
                asyncio.gather(
                    *(store.get(run_id, f"call-{burst}-{i}") for i in range(2)),
                    # Both connections at once: a held one would make this wait.
                    record_fields(store, run_id, f"call-{burst}-2"),
                ),
                timeout=5,
            )
            assert all(record for record in records)
        assert store.batch_stats.round_trips < store.batch_stats.calls


async def test_a_steady_load_keeps_its_lanes_connections_and_takes_none_from_the_pool(
    private_server: EmbeddedRedis,
) -> None:
    """The connections the lanes used are kept for the next lanes (one per lane): a second
    burst like the first takes no connection from the pool, and closing the store gives
    every kept one back."""
    store = Store.from_url(private_server.url, namespace="kept")
    async with store:
        run_id = await _open(store)
        pool: Any = store.client.connection_pool
        await asyncio.gather(*(_lifecycle(store, run_id, f"warm-{i}") for i in range(64)))
        await store._batcher.drain()  # white-box: every lane is done
        taken = 0
        get_connection = pool.get_connection

        async def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal taken
            taken += 1
            return await get_connection(*args, **kwargs)

        pool.get_connection = counted
        try:
            heads = await asyncio.gather(
                *(_lifecycle(store, run_id, f"call-{i}") for i in range(64))
            )
        finally:
            del pool.get_connection
        assert {head.version for head in heads} == {3}
        assert store.batch_stats.largest_batch > 1
        assert taken == 0
    assert pool._in_use_connections == set()  # white-box: nothing is held after close


async def test_a_small_pool_keeps_a_full_set_of_connections_for_the_rest_of_the_store(
    private_server: EmbeddedRedis,
) -> None:
    """From a pool of ten the batcher keeps at most two between bursts (what is left beyond
    its eight lanes): eight connections can still be taken at once right after one."""
    store = Store.from_url(private_server.url, namespace="small", max_connections=10)
    async with store:
        run_id = await _open(store)
        pool: Any = store.client.connection_pool
        await asyncio.gather(*(_lifecycle(store, run_id, f"call-{i}") for i in range(64)))
        await store._batcher.drain()
        held = [await asyncio.wait_for(pool.get_connection(), timeout=5) for _ in range(8)]
        for connection in held:
            await pool.release(connection)


@pytest.mark.not_on_cluster(
    "touches no server (an unconnected cluster client); it already runs once"
)
def test_a_cluster_client_is_not_batched() -> None:
    """A cluster client's calls go out one by one (cluster pipelines split by node)."""
    client = RedisCluster(host="127.0.0.1", port=1)
    assert ScriptBatcher(client).batching is False  # type: ignore[arg-type]


@pytest.mark.not_on_cluster(_OWN_SERVER)
async def test_a_close_cancelled_while_calls_are_answered_still_closes_every_connection(
    private_server: EmbeddedRedis,
) -> None:
    """A close cancelled while it waits for the calls in flight (the server holds their
    writes) still closes the pool, the connections waiting in it too: once the calls
    have ended, the server holds no connection of the store's."""
    store = Store.from_url(private_server.url, namespace="closing")
    run_id = await _open(store)
    # Plain reads at once: more connections wait in the pool than the calls' lanes take.
    await asyncio.gather(*(store.get(run_id, f"c{n}") for n in range(8)))
    async with Redis.from_url(private_server.url) as admin:
        sent = store.batch_stats.calls
        await admin.execute_command("CLIENT", "PAUSE", "30000", "WRITE")
        try:
            calls = [
                asyncio.create_task(store.writer.create(run_id, f"c{n}", TOOL, REQUEST))
                for n in range(4)
            ]
            await wait_for(lambda: store.batch_stats.calls >= sent + 4)
            closing = asyncio.create_task(store.aclose())
            for _ in range(3):  # into the wait for the calls' answers
                await asyncio.sleep(0)
            assert not closing.done()
            closing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await closing
        finally:
            await admin.execute_command("CLIENT", "UNPAUSE")
        await asyncio.gather(*calls, return_exceptions=True)

        async def only_the_admin_left() -> bool:
            return len(await admin.client_list()) == 1

        await wait_for(only_the_admin_left)


@pytest.mark.not_on_cluster(_OWN_SERVER)
async def test_a_store_used_after_its_close_opens_no_connection(
    private_server: EmbeddedRedis,
) -> None:
    """A read or a write made after the store was closed (a call that outlived it) fails as
    on an unreachable server, and the server holds no connection of the store's after."""
    store = Store.from_url(private_server.url, namespace="reuse")
    run_id = await _open(store)
    await asyncio.gather(*(store.get(run_id, f"c{n}") for n in range(4)))
    await store.aclose()

    with pytest.raises(StoreUnavailable):
        await store.get(run_id, "c0")
    with pytest.raises(StoreUnavailable):
        await store.writer.create(run_id, "late", TOOL, REQUEST)
    async with Redis.from_url(private_server.url) as admin:

        async def only_the_admin_left() -> bool:
            return len(await admin.client_list()) == 1

        await wait_for(only_the_admin_left)
