"""Server settings warnings: every setting that makes records costlier is named, nothing else."""

from __future__ import annotations

from eventstore.server_settings import (
    RECOMMENDED_SETTINGS,
    REDIS_DEFAULTS,
    server_settings_warnings,
)


def test_recommended_settings_give_no_warning() -> None:
    """The settings the docs recommend are judged fine."""
    assert server_settings_warnings(RECOMMENDED_SETTINGS) == []


def test_redis_defaults_warn_about_stream_nodes_and_hash_values() -> None:
    """Redis's defaults make streams and records costlier; both settings are named."""
    warnings = server_settings_warnings(REDIS_DEFAULTS)
    assert len(warnings) == 2
    assert warnings[0].startswith("stream-node-max-bytes is 4096")
    assert warnings[1].startswith("hash-max-listpack-value is 64")
    assert all("docs/performance.md" in line for line in warnings)


def test_an_evicting_policy_is_the_first_warning() -> None:
    """A maxmemory policy other than noeviction is reported before any cost warning."""
    config = {**REDIS_DEFAULTS, "maxmemory-policy": "allkeys-lru"}
    warnings = server_settings_warnings(config)
    assert warnings[0].startswith("maxmemory-policy is allkeys-lru")
    assert "noeviction" in warnings[0]


def test_7x_names_and_bytes_replies_are_understood() -> None:
    """CONFIG GET replies as bytes and the 7.x listpack names are read like the 6.2 ones."""
    config = {
        b"hash-max-listpack-value": b"128",
        b"hash-max-listpack-entries": b"16",
        b"stream-node-max-bytes": b"0",
    }
    warnings = server_settings_warnings(config)
    assert [line.split(" is ")[0] for line in warnings] == [
        "stream-node-max-bytes",
        "hash-max-listpack-value",
        "hash-max-listpack-entries",
    ]


def test_absent_or_unreadable_settings_are_not_judged() -> None:
    """A setting the server did not report, or reported as nonsense, gives no warning."""
    assert server_settings_warnings({}) == []
    assert server_settings_warnings({"stream-node-max-bytes": "lots"}) == []


def test_smaller_stream_nodes_and_larger_hash_values_are_fine() -> None:
    """Settings that make records cheaper than recommended are not warned about."""
    config = {"stream-node-max-bytes": "512", "hash-max-ziplist-value": "65536"}
    assert server_settings_warnings(config) == []
