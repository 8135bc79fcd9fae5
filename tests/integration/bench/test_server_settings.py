"""Reading a live server's settings: the embedded server passes, Redis's defaults are named."""

from __future__ import annotations

from redis.asyncio import Redis

from eventstore.server.config_checks import (
    REDIS_DEFAULTS,
    check_server_settings,
    read_server_settings,
)
from eventstore.server.embedded import EmbeddedRedis, ServerBinary


def _args(settings: dict[str, str]) -> list[str]:
    return [arg for name, value in settings.items() for arg in (f"--{name}", value)]


async def test_the_test_server_runs_the_recommended_settings(redis: Redis) -> None:
    """The fixture server (started with the recommended settings) draws no warning."""
    assert await check_server_settings(redis) == []


async def test_embedded_server_with_redis_defaults_is_warned_about(
    server_binary: ServerBinary,
) -> None:
    """A server on Redis's defaults gets the stream-node and hash-value warnings."""
    with EmbeddedRedis(server_binary, extra_args=_args(REDIS_DEFAULTS)) as server:
        async with Redis.from_url(server.url) as client:
            settings = await read_server_settings(client)
            warnings = await check_server_settings(client)
    assert settings is not None
    assert settings["stream-node-max-bytes"] == "4096"
    assert [line.split(" is ")[0] for line in warnings] == [
        "stream-node-max-bytes",
        "hash-max-listpack-value",
    ]


async def test_recommended_hash_values_keep_records_compact(
    server_binary: ServerBinary,
) -> None:
    """On both server versions the embedded settings keep an 8 KiB hash value compact."""
    with EmbeddedRedis(server_binary) as server:
        async with Redis.from_url(server.url) as client:
            await client.hset("record", mapping={"raw": b"r" * 8000, "status": "READY"})
            encoding = await client.object("encoding", "record")
    assert encoding in (b"listpack", b"ziplist")
