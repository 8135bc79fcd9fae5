"""Layout 3: a new namespace gets 48 balanced shards; an older one keeps its count and tags.

A namespace records its layout and shard count when it is created and never changes
them: a store built with another shard count is refused on entry with a message that
says how to open it, never remapped.
"""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from eventstore import RunContext, ToolBoundary
from eventstore.audit import open_read_only
from eventstore.errors import NamespaceMismatch
from eventstore.wire.keys import (
    BALANCED_TAGS_48,
    LAYOUT,
    PLAIN_TAG_LAYOUT,
    Keys,
    shard_of,
)
from tests.support.calls import envelope, open_run, outcome
from tests.support.tools import FakeTool

pytestmark = pytest.mark.backends("single", "cluster")

RUN = "run-balanced"


async def write_one(store: Any) -> None:
    """One READY call of :data:`RUN` through the boundary."""
    await open_run(store, RUN)
    boundary = ToolBoundary(store, {"search": FakeTool().spec()})
    reply = await boundary.invoke(RunContext(RUN), envelope("call-1", run_id=RUN))
    assert outcome(reply) == "READY"


async def test_a_new_namespace_gets_48_shards_with_balanced_tags(
    make_store: Any, redis: Redis, namespace: str
) -> None:
    """Created with the defaults: layout 3 and 48 shards recorded, keys under the fixed tags."""
    async with make_store() as store:
        assert store.keys == Keys(namespace, 48, LAYOUT)
        await write_one(store)
        record = store.keys.record(RUN, "call-1")
    tag = BALANCED_TAGS_48[shard_of(RUN, 48)]
    assert record == f"{namespace}:{{{tag}}}:inv:{RUN}:call-1"
    assert await redis.exists(record) == 1
    assert await redis.hgetall(f"{namespace}:meta") == {b"layout": b"3", b"shards": b"48"}


async def test_a_16_shard_namespace_keeps_its_count_and_its_plain_tags(
    make_store: Any, redis: Redis, redis_url: str, namespace: str
) -> None:
    """A layout 2 namespace of 16 shards: a store given another count (48) is refused with
    a message naming both counts and the way out; one given none adopts 16 on entering, and
    one given 16 too: both write as before, in {sNN}."""
    meta = f"{namespace}:meta"
    await redis.hset(meta, mapping={"layout": PLAIN_TAG_LAYOUT, "shards": 16})
    with pytest.raises(NamespaceMismatch, match=r"has 16 shards; .* built with 48.*shards=16"):
        async with make_store(shards=48):
            pytest.fail("entered a 16-shard namespace with 48 shards")
    assert await redis.hgetall(meta) == {b"layout": b"2", b"shards": b"16"}

    async with make_store() as store:  # no count given: the namespace's own
        assert store.keys == Keys(namespace, 16, PLAIN_TAG_LAYOUT)

    async with make_store(shards=16) as store:
        assert store.keys == Keys(namespace, 16, PLAIN_TAG_LAYOUT)
        await write_one(store)
    record = f"{namespace}:{{s{shard_of(RUN, 16):02d}}}:inv:{RUN}:call-1"
    assert await redis.exists(record) == 1

    # The read-only tools take the count and layout from the metadata, whatever they default to.
    async with open_read_only(redis_url, namespace=namespace) as reader:
        assert reader.keys == Keys(namespace, 16, PLAIN_TAG_LAYOUT)
        found = await reader.get(RUN, "call-1")
        assert found is not None
