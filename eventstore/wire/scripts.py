"""The store's Lua scripts (``eventstore/scripts``), each wrapped in one typed class.

A script's KEYS and ARGV are declared once, in order, by two ``NamedTuple`` classes
(``CreateKeys``, ``CreateArgv``, ...): the wrapper's ``layout`` is derived from them
(and checked against the script's header by a test), and so is the packing of a call
(:meth:`~eventstore.wire.lua.LuaScript.arguments`). The Writer, the run registry and the
benchmark fill those tuples; nothing else lists the positions. Replies come back typed;
refusals are raised as the exceptions of :mod:`eventstore.errors`.
"""

from __future__ import annotations

from typing import Any, Final, Literal, NamedTuple

from redis.asyncio import Redis
from redis.exceptions import RedisError

from eventstore.errors import (
    DeadlinePassed,
    RecordExpired,
    Refused,
    RunExists,
    redis_errors,
    store_error,
)
from eventstore.wire.batching import ScriptBatcher, call_script
from eventstore.wire.cluster_batching import ClusterScriptBatcher
from eventstore.wire.lua import (
    FIELD_VALUE,
    KeysAndArgs,
    Layout,
    LuaScript,
    Nothing,
    ScriptCall,
    ScriptFolder,
)
from eventstore.wire.replies import reply_text
from machine.codes import ErrorCode
from machine.events import GENESIS_HASH
from machine.fold import LIFECYCLE_FIELDS
from machine.lifecycle import lua_first_event, lua_lifecycle

#: Fields only the scripts themselves may write.
_PROTECTED: Final = sorted(
    (LIFECYCLE_FIELDS - {"evidence_status"}) | {"expires_at_ms", "invocation_id"}
)


def _first_event() -> str:
    """The ``-- @include first_event`` part: the creating event's constants."""
    return f'{lua_first_event()}\nlocal GENESIS_HASH = "{GENESIS_HASH}"'


def _field_scan() -> str:
    """The ``-- @include field_scan`` part: ``scan_fields``, one pass over the fields.

    ``scan_fields(first)`` looks at the field names from ``ARGV[first]`` on (every other
    argument) and returns the position of the first that only the scripts write (a
    lifecycle field or an ``e<version>`` event id), else nil followed by the values of
    ``evidence_status`` and ``error_code`` (the last of each, nil when absent). The
    comparisons are written out, for the reason the lifecycle is functions
    (:func:`~machine.lifecycle.lua_lifecycle`); byte 101 is "e", the first letter of every
    ``e<version>`` field, of ``evidence_status`` and of ``error_code``, so only names
    that start with it are looked at further.
    """
    protected = " or ".join(f'name == "{field}"' for field in _PROTECTED)
    return "\n".join(
        [
            "local function scan_fields(first)",
            "  local evidence, error_code",
            "  for i = first, #ARGV, 2 do",
            "    local name = ARGV[i]",
            f"    if {protected} then return i end",
            "    if string.byte(name) == 101 then",
            "      if name == 'evidence_status' then evidence = ARGV[i + 1]",
            "      elseif name == 'error_code' then error_code = ARGV[i + 1]",
            "      elseif string.match(name, '^e%d+$') then return i end",
            "    end",
            "  end",
            "  return nil, evidence, error_code",
            "end",
        ]
    )


#: The store's scripts folder.
FOLDER: Final = ScriptFolder(
    "eventstore.wire",
    {
        "lifecycle": lua_lifecycle,
        "first_event": _first_event,
        "field_scan": _field_scan,
    },
)


class Committed(NamedTuple):
    """What a write script answers when its event is in the journal.

    Attributes:
        version: the event's version.
        entry_id: its feed entry id ("" when an earlier attempt had already applied it).
        expires_at_ms: the record's absolute expiry.

    """

    version: int
    entry_id: str
    expires_at_ms: int


def is_committed(reply: Any) -> bool:
    """Whether a create or append reply says its event is now in the journal.

    Only that answer is one string; an event applied before and a refusal are lists.
    """
    return isinstance(reply, bytes | str)


def committed(reply: Any) -> Committed:
    """The :class:`Committed` of a create or append reply, or its refusal raised.

    A committed event is answered with one string, ``"<version> <entry id> <expiry>"``;
    an event applied before, and a refusal, with a list.

    Raises:
        RecordExpired: the record is gone.
        Refused: any other refusal, with its code and the record's version.

    """
    if is_committed(reply):
        version, entry_id, expires_at_ms = reply_text(reply).split(" ")
        return Committed(int(version), entry_id, int(expires_at_ms))
    outcome = reply[0]
    if outcome == b"refused" or outcome == "refused":
        code = reply_text(reply[1])
        if code == ErrorCode.RECORD_EXPIRED.value:
            raise RecordExpired()
        raise Refused(code, int(reply[2]) if len(reply) > 2 else None)
    return Committed(int(reply[1]), reply_text(reply[2]), int(reply[3]))


async def _commit(script: LuaScript[Any, Any], call: KeysAndArgs) -> Committed:
    """Run a create or append script; its :class:`Committed`, or its refusal raised."""
    try:
        reply = await script._call(script.script, call[0], call[1])
    except (RedisError, OSError) as exc:  # the hot path: no context manager to enter
        raise store_error(exc) from None
    return committed(reply)


#: Which of the run's refusals ``create.lua`` puts on the run's refusal log: ``all``,
#: ``none``, or ``not_duplicates`` (the caller answers a duplicate from its record, and
#: records it itself when nothing recorded answers it).
RefusalLogging = Literal["all", "none", "not_duplicates"]


class CreateKeys(NamedTuple):
    """``create.lua``'s KEYS, in order."""

    record: str
    stream: str
    feed: str
    run: str
    control: str
    refusals: str


class CreateArgv(NamedTuple):
    """``create.lua``'s fixed ARGV, in order (the record's field/value pairs follow)."""

    event_id: str
    event_hash: str
    event: bytes
    run_id: str
    tool_call_id: str
    tool: str
    invocation_id: str
    at_ms: int
    ttl_ms: int
    retention_ms: int
    version: int
    prev_hash: str
    refusals_kept: int
    log_refusals: RefusalLogging
    event_type: str


class CreateScript(LuaScript[CreateKeys, CreateArgv]):
    """``create.lua``: create an invocation with its Preflighted event."""

    name = "create"
    layout = Layout.of(CreateKeys, CreateArgv, argv_groups=(FIELD_VALUE,))

    async def __call__(self, call: KeysAndArgs) -> Committed:
        """Run the script with KEYS and ARGV from :meth:`~LuaScript.arguments`.

        Raises:
            Refused: with a preflight code (RUN_INACTIVE, DUPLICATE_TOOL_CALL, budgets...)
                or a writer conflict (VERSION_CONFLICT, CHAIN_BROKEN, PROTECTED_FIELD).
            StoreUnavailable: Redis failed or timed out.

        """
        return await _commit(self, call)


class AppendKeys(NamedTuple):
    """``append.lua``'s KEYS, in order."""

    record: str
    stream: str
    feed: str
    progress: str
    run: str
    control: str


class AppendArgv(NamedTuple):
    """``append.lua``'s fixed ARGV, in order (the record's field/value pairs follow)."""

    event_type: str
    version: int
    event_id: str
    prev_hash: str
    event_hash: str
    event: bytes
    at_ms: int
    retention_ms: int
    run_id: str
    tool_call_id: str


class AppendScript(LuaScript[AppendKeys, AppendArgv]):
    """``append.lua``: append one event to an existing invocation and fold it in."""

    name = "append"
    layout = Layout.of(AppendKeys, AppendArgv, argv_groups=(FIELD_VALUE,))

    async def __call__(self, call: KeysAndArgs) -> Committed:
        """Run the script with KEYS and ARGV from :meth:`~LuaScript.arguments`.

        Raises:
            RecordExpired: the record is gone; nothing was created.
            Refused: VERSION_CONFLICT, CHAIN_BROKEN, ILLEGAL_TRANSITION,
                INVALID_EVIDENCE_STATUS, MISSING_ERROR_CODE or PROTECTED_FIELD.
            StoreUnavailable: Redis failed or timed out.

        """
        return await _commit(self, call)


class RefuseKeys(NamedTuple):
    """``refuse.lua``'s KEYS, in order."""

    run: str
    refusals: str


class RefuseArgv(NamedTuple):
    """``refuse.lua``'s ARGV, in order.

    ``tool`` is ``""`` when the name sent is not a tool name, ``tool_call_id`` ``""``
    when the id sent is not one a key may hold (its size is recorded instead).
    """

    tool: str
    tool_call_id: str
    tool_call_id_bytes: int
    code: str
    refusals_kept: int


class RefuseScript(LuaScript[RefuseKeys, RefuseArgv]):
    """``refuse.lua``: put a refusal decided before any script on the run's record."""

    name = "refuse"
    layout = Layout.of(RefuseKeys, RefuseArgv)

    async def __call__(self, call: KeysAndArgs) -> bool:
        """Run the script; False when the run does not exist (nothing was written).

        Raises:
            StoreUnavailable: Redis failed or timed out.

        """
        async with redis_errors():
            return bool(await self._call(self.script, call[0], call[1]))


class OpenRunKeys(NamedTuple):
    """``open_run.lua``'s KEYS, in order."""

    run: str
    runs: str
    control: str


class OpenRunArgv(NamedTuple):
    """``open_run.lua``'s fixed ARGV, in order (tool/budget pairs follow).

    A budget is a count, or ``""`` for none (:func:`budget_argument`).
    """

    token_sha256: str
    deadline_ms: int
    ttl_ms: int
    budget: int | str
    run_id: str


def budget_argument(budget: int | None) -> int | str:
    """A budget as ``open_run.lua`` reads it: the count, or ``""`` for no budget."""
    return "" if budget is None else budget


class OpenRunScript(LuaScript[OpenRunKeys, OpenRunArgv]):
    """``open_run.lua``: register a run with its deadline, budgets and token hash."""

    name = "open_run"
    layout = Layout.of(OpenRunKeys, OpenRunArgv, argv_groups=(("tool", "tool_budget"),))

    async def __call__(self, call: KeysAndArgs) -> int:
        """Run the script; return the run's absolute expiry (ms).

        Raises:
            RunExists: the run id is already registered.
            DeadlinePassed: the deadline has passed by the server's clock.
            StoreUnavailable: Redis failed or timed out.

        """
        async with redis_errors():
            reply = await self._call(self.script, call[0], call[1])
        if reply_text(reply[0]) == "refused":
            if reply_text(reply[1]) == "RUN_EXISTS":
                raise RunExists("run id is already registered")
            raise DeadlinePassed("deadline has already passed")
        return int(reply[1])


class UpdateRunKeys(NamedTuple):
    """``update_run.lua``'s KEYS (field/value pairs are its only ARGV)."""

    run: str


class UpdateRunScript(LuaScript[UpdateRunKeys, Nothing]):
    """``update_run.lua``: set fields of an existing run hash, never creating one."""

    name = "update_run"
    layout = Layout.of(UpdateRunKeys, argv_groups=(FIELD_VALUE,))

    async def __call__(self, call: KeysAndArgs) -> bool:
        """Run the script; False when the run does not exist (nothing was written).

        Raises:
            StoreUnavailable: Redis failed or timed out.

        """
        async with redis_errors():
            return bool(await self._call(self.script, call[0], call[1]))


#: Every wrapper of this folder (the header test walks them).
WRAPPERS: Final = (CreateScript, AppendScript, RefuseScript, OpenRunScript, UpdateRunScript)


class Scripts:
    """The store's scripts registered on one client.

    ``create``, ``append`` and ``refuse`` go through ``batcher`` when one is given
    (concurrent appends share round trips, see :mod:`eventstore.wire.batching`); the run
    registry's scripts are sent alone.
    """

    def __init__(
        self, client: Redis, batcher: ScriptBatcher | ClusterScriptBatcher | None = None
    ) -> None:
        writes: ScriptCall = batcher.call if batcher is not None else call_script
        self.create = CreateScript(client, FOLDER, writes)
        self.append = AppendScript(client, FOLDER, writes)
        self.refuse = RefuseScript(client, FOLDER, writes)
        self.open_run = OpenRunScript(client, FOLDER)
        self.update_run = UpdateRunScript(client, FOLDER)
