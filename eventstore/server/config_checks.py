"""Server settings that decide what an invocation costs in Redis, and warnings about them.

The figures in docs/performance.md hold under :data:`RECOMMENDED_SETTINGS` (the settings
the embedded server and the test fixtures use). :func:`server_settings_warnings` names
every setting of a server that makes records cost more than that, or that puts history at
risk; ``canon status`` and the durability preflight print its lines. The warnings name
settings and values only, never a key or a payload.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, NamedTuple, cast

from redis.asyncio import Redis
from redis.exceptions import NoPermissionError, RedisError, ResponseError

from eventstore.server.embedded import RECOMMENDED_SERVER_ARGS
from eventstore.wire.replies import reply_text

#: The recommended server settings, by the name Redis 6.2 and 7.x both accept.
RECOMMENDED_SETTINGS: Final = dict(RECOMMENDED_SERVER_ARGS)

#: Redis's own defaults for the recommended settings (what a server gets without them).
REDIS_DEFAULTS: Final = {
    "maxmemory-policy": "noeviction",
    "stream-node-max-bytes": "4096",
    "hash-max-ziplist-value": "64",
}

#: Settings read by :func:`read_server_settings` (7.x names and their 6.2 aliases).
SETTING_NAMES: Final = (
    "maxmemory-policy",
    "stream-node-max-bytes",
    "hash-max-listpack-value",
    "hash-max-ziplist-value",
    "hash-max-listpack-entries",
    "hash-max-ziplist-entries",
)

#: The settings that decide what a record costs, by their 7.x names, with their 6.2 aliases.
COST_SETTINGS: Final[dict[str, tuple[str, ...]]] = {
    "stream-node-max-bytes": (),
    "hash-max-listpack-value": ("hash-max-ziplist-value",),
    "hash-max-listpack-entries": ("hash-max-ziplist-entries",),
}

#: A record holds about 30 fields; fewer allowed entries make every record a hashtable.
MIN_HASH_ENTRIES: Final = 64

_STREAM_NODE_BYTES: Final = int(RECOMMENDED_SETTINGS["stream-node-max-bytes"])
#: What Redis 7 pre-allocates for a new stream node at most (STREAM_LISTPACK_MAX_PRE_ALLOCATE).
_MAX_PREALLOCATED: Final = 4096
_HASH_VALUE_BYTES: Final = int(RECOMMENDED_SETTINGS["hash-max-ziplist-value"])
_COSTLIER: Final = "records cost more than the figures in docs/performance.md"


def _number(config: Mapping[str, str], *names: str) -> int | None:
    """The first of ``names`` that ``config`` holds, as an int (None if absent or bad)."""
    value = next((config[name] for name in names if config.get(name)), None)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def server_settings_warnings(config: Mapping[str, str | bytes | int]) -> list[str]:
    """Return one line per server setting that is worse for this store than recommended.

    Args:
        config: ``CONFIG GET`` output (any of :data:`SETTING_NAMES`; 7.x or 6.2 names).
            A setting that is absent is not judged.

    Returns:
        Human-readable warnings, most serious first; empty when every setting is fine.

    """
    settings = {reply_text(name): reply_text(value) for name, value in config.items()}
    warnings: list[str] = []
    policy = settings.get("maxmemory-policy")
    if policy is not None and policy != "noeviction":
        warnings.append(
            f"maxmemory-policy is {policy}: Redis may evict records and event streams "
            "(lost history); set maxmemory-policy noeviction"
        )
    node_bytes = _number(settings, "stream-node-max-bytes")
    if node_bytes is not None and (node_bytes == 0 or node_bytes > _STREAM_NODE_BYTES):
        reserved = min(node_bytes or _MAX_PREALLOCATED, _MAX_PREALLOCATED)
        warnings.append(
            f"stream-node-max-bytes is {node_bytes}: every invocation stream reserves a "
            f"node of {reserved} bytes on Redis 7, so {_COSTLIER} (about "
            f"{reserved - _STREAM_NODE_BYTES} B more per invocation); "
            f"set stream-node-max-bytes {_STREAM_NODE_BYTES}"
        )
    elif node_bytes is not None and node_bytes < _STREAM_NODE_BYTES:
        warnings.append(
            f"stream-node-max-bytes is {node_bytes}: an invocation's three events no longer "
            f"fit one stream node, so {_COSTLIER} (about 250 B more per invocation); "
            f"set stream-node-max-bytes {_STREAM_NODE_BYTES}"
        )
    value_bytes = _number(settings, "hash-max-listpack-value", "hash-max-ziplist-value")
    if value_bytes is not None and value_bytes < _HASH_VALUE_BYTES:
        warnings.append(
            f"hash-max-listpack-value is {value_bytes}: a record with a payload above "
            f"{value_bytes} bytes becomes a hashtable, so {_COSTLIER} (about 1.6 KB more "
            f"per invocation); set hash-max-listpack-value {_HASH_VALUE_BYTES}"
        )
    entries = _number(settings, "hash-max-listpack-entries", "hash-max-ziplist-entries")
    if entries is not None and entries < MIN_HASH_ENTRIES:
        warnings.append(
            f"hash-max-listpack-entries is {entries}: every record becomes a hashtable, "
            f"so {_COSTLIER}; set it to at least {MIN_HASH_ENTRIES} (default 128)"
        )
    return warnings


#: Why :data:`SETTING_NAMES` could not be read, by what refused ``CONFIG GET``.
REFUSED_BY_ACL: Final = "CONFIG GET is denied to this ACL user (NOPERM, see docs/acl.md)"
REFUSED_BY_SERVER: Final = "CONFIG GET is refused by the server (disabled or renamed)"
REFUSED_UNANSWERED: Final = "CONFIG GET was not answered"


class ServerSettings(NamedTuple):
    """What :func:`inspect_server_settings` found.

    Attributes:
        values: the settings read (7.x or 6.2 names), None when CONFIG GET was refused.
        refusal: why they could not be read (one of the ``REFUSED_*`` sentences), or None.

    """

    values: dict[str, str] | None
    refusal: str | None


async def inspect_server_settings(client: Redis) -> ServerSettings:
    """Read the server's values of :data:`SETTING_NAMES`, or say why CONFIG GET was refused.

    Managed services often rename or forbid CONFIG, and the documented read-only ACL user
    may not run it (it can read the server's passwords); the first refusal stops the read,
    so a user without CONFIG is refused once, and the caller says the settings could not
    be checked rather than guessing.
    """
    settings: dict[str, str] = {}
    try:
        for name in SETTING_NAMES:
            reply = cast(dict[bytes | str, bytes | str], await client.config_get(name))
            settings.update({reply_text(k): reply_text(v) for k, v in reply.items()})
    except NoPermissionError:
        return ServerSettings(None, REFUSED_BY_ACL)
    except ResponseError:
        return ServerSettings(None, REFUSED_BY_SERVER)
    except (RedisError, OSError):
        return ServerSettings(None, REFUSED_UNANSWERED)
    return ServerSettings(settings, None)


async def read_server_settings(client: Redis) -> dict[str, str] | None:
    """Return the server's values of :data:`SETTING_NAMES`, or None if CONFIG is refused."""
    return (await inspect_server_settings(client)).values


def unreadable_settings_warning(refusal: str, names: Sequence[str]) -> str:
    """The one line saying the settings ``names`` could not be read, and why."""
    listed = ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]
    return f"server settings could not be read: {refusal}; check {listed} by hand"


def cost_settings(values: Mapping[str, str] | None) -> dict[str, str]:
    """Each setting of :data:`COST_SETTINGS` by its 7.x name: its value, else ``unknown``."""
    values = values or {}
    return {
        name: next((values[n] for n in (name, *aliases) if values.get(n)), "unknown")
        for name, aliases in COST_SETTINGS.items()
    }


async def check_server_settings(client: Redis) -> list[str]:
    """Read the server's settings and return :func:`server_settings_warnings` for them."""
    values, refusal = await inspect_server_settings(client)
    if values is None:
        names = ("maxmemory-policy", "stream-node-max-bytes", "hash-max-listpack-value")
        return [unreadable_settings_warning(refusal or REFUSED_UNANSWERED, names)]
    return server_settings_warnings(values)
