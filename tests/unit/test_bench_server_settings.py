"""Server settings warnings: every setting that makes records costlier is named, nothing else."""

from __future__ import annotations

from eventstore.server.config_checks import (
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


def test_larger_hash_values_are_fine() -> None:
    """A hash value limit above the recommended one keeps records compact: no warning."""
    config = {**RECOMMENDED_SETTINGS, "hash-max-ziplist-value": "65536"}
    assert server_settings_warnings(config) == []


def test_stream_nodes_other_than_recommended_are_named() -> None:
    """Larger nodes reserve more per stream, smaller ones split an invocation's events."""
    for value, reason in (("1024", "reserves a node of 1024 bytes"), ("0", "of 4096 bytes")):
        (warning,) = server_settings_warnings({"stream-node-max-bytes": value})
        assert warning.startswith(f"stream-node-max-bytes is {value}") and reason in warning
    (warning,) = server_settings_warnings({"stream-node-max-bytes": "256"})
    assert "no longer fit one stream node" in warning
