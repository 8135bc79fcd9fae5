"""Loads the Lua scripts beside this module and wraps each in one typed function.

Scripts are registered once per client and called by SHA; redis-py reloads a script
when the server answers NOSCRIPT (after a restart or SCRIPT FLUSH).
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any, Final

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from machine.events import GENESIS_HASH
from machine.fold import LIFECYCLE_FIELDS
from machine.lifecycle import lua_tables

_MARKER: Final = "-- @lifecycle-tables"
_FEED_TRIM_MARKER: Final = "-- @feed-trim"
#: Fields only the scripts themselves may write.
_PROTECTED: Final = sorted(
    (LIFECYCLE_FIELDS - {"evidence_status"}) | {"expires_at_ms", "invocation_id"}
)

ScriptReply = list[Any]


@cache
def script_source(name: str) -> str:
    """Return the source of ``<name>.lua`` with the generated lifecycle tables and constants.

    ``-- @feed-trim`` is replaced by ``feed_trim.lua`` (the feed trimming both write
    scripts share).
    """
    folder = resources.files("eventstore").joinpath("scripts")
    text = folder.joinpath(f"{name}.lua").read_text("utf-8")
    if _FEED_TRIM_MARKER in text:
        trim = folder.joinpath("feed_trim.lua").read_text("utf-8")
        text = text.replace(_FEED_TRIM_MARKER, trim, 1)
    if _MARKER in text:
        protected = ", ".join(f'["{field}"] = true' for field in _PROTECTED)
        generated = (
            f"{lua_tables()}\nlocal PROTECTED = {{ {protected} }}\n"
            f'local GENESIS_HASH = "{GENESIS_HASH}"'
        )
        text = text.replace(_MARKER, generated, 1)
    return text


class Scripts:
    """The store's scripts registered on one client."""

    def __init__(self, client: Redis) -> None:
        self.create: AsyncScript = client.register_script(script_source("create"))
        self.append: AsyncScript = client.register_script(script_source("append"))
        self.open_run: AsyncScript = client.register_script(script_source("open_run"))
        self.update_run: AsyncScript = client.register_script(script_source("update_run"))
