"""The store's Lua scripts (``eventstore/scripts``), each wrapped in one typed class.

A script's KEYS and ARGV are declared once, in order, by two ``NamedTuple`` classes
(``CreateKeys``, ``CreateArgv``, ...): the wrapper's ``layout`` is derived from them
(and checked against the script's header by a test), and so is the packing of a call
(:meth:`~eventstore.wire.lua.LuaScript.arguments`). The Writer, the run registry and the
benchmark fill those tuples; nothing else lists the positions. Replies come back typed;
refusals are raised as the exceptions of :mod:`eventstore.errors`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Final, Literal, NamedTuple, cast

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError
from redis.typing import EncodableT, KeyT

from eventstore.errors import (
    DeadlinePassed,
    RecordExpired,
    Refused,
    RunExists,
    redis_errors,
    store_error,
)
from eventstore.wire.batching import ScriptCalls, SentCall, call_script
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
from machine.compact import TYPE_CODES
from machine.events import COMPACT_LAYOUT, GENESIS_HASH
from machine.fold import LIFECYCLE_FIELDS
from machine.lifecycle import lua_first_event, lua_lifecycle
from machine.phases import DEFAULT_LEASE_MS, LAST_TAKEN_VERSION

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


#: The compact events a script that reads a journal decodes, and where its fields are.
_JOURNAL_FIELDS: Final = {
    "AR": (
        "ApprovalRequested",
        (
            "run_id",
            "tool_call_id",
            "tool",
            "request_sha256",
            "approval_expires_at_ms",
            "requested_by",
            "approvals_required",
        ),
    ),
}
_DECISIONS: Final = ("ApprovalAdded", "Approved")


def _position(event_type: str, field: str) -> int:
    """The Lua index of ``field`` in the compact array of ``event_type``.

    The array is ``[type code, schema, <COMPACT_LAYOUT fields>]`` (:mod:`machine.compact`).
    """
    return COMPACT_LAYOUT[event_type].index(field) + 3


def _journal_layout() -> str:
    """The ``-- @include journal_layout`` part: where a script finds a stored event's fields.

    Constants derived from the one declaration of the events (their compact order) and
    their permanent type codes, so a script decoding a journal with ``cmsgpack`` reads
    the same positions the codec writes: ``EVENT_TYPE``, ``EVENT_VERSION``,
    ``EVENT_PREV_HASH``, ``TYPE_<EVENT>``, ``AR_<FIELD>`` of ApprovalRequested, and
    ``DECIDED_BY``, the same position in both approval events.
    """
    decided_by = {_position(kind, "decided_by") for kind in _DECISIONS}
    assert len(decided_by) == 1, "the approval events keep decided_by at one position"
    lines = [
        f'local GENESIS_HASH = "{GENESIS_HASH}"',
        "local EVENT_TYPE = 1",
        f"local EVENT_VERSION = {_position('Preflighted', 'version')}",
        f"local EVENT_PREV_HASH = {_position('Preflighted', 'prev_hash')}",
        f"local DECIDED_BY = {decided_by.pop()}",
    ]
    for kind in ("ApprovalRequested", "ApprovalAdded", "Approved"):
        constant = "".join(f"_{c}" if c.isupper() else c.upper() for c in kind).lstrip("_")
        lines.append(f"local TYPE_{constant} = {TYPE_CODES[kind]}")
    for prefix, (kind, fields) in _JOURNAL_FIELDS.items():
        lines += [f"local {prefix}_{field.upper()} = {_position(kind, field)}" for field in fields]
    return "\n".join(lines)


def _lease_default() -> str:
    """The ``-- @include lease_default`` part: the lease of a record written before leases.

    Such a record holds no ``lease_until_ms``: its lease is taken to end
    :data:`~machine.phases.DEFAULT_LEASE_MS` after its last event. Also the last version
    a takeover may have (:data:`~machine.phases.LAST_TAKEN_VERSION`).
    """
    return "\n".join(
        [
            f"local DEFAULT_LEASE_MS = {DEFAULT_LEASE_MS}",
            f"local LAST_TAKEN_VERSION = {LAST_TAKEN_VERSION}",
        ]
    )


#: The store's scripts folder.
FOLDER: Final = ScriptFolder(
    "eventstore.wire",
    {
        "lifecycle": lua_lifecycle,
        "first_event": _first_event,
        "field_scan": _field_scan,
        "journal_layout": _journal_layout,
        "lease_default": _lease_default,
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


#: How the Scripts write the first of two ordered calls (a batcher's ``send``).
ScriptSend = Callable[[AsyncScript, Sequence[KeyT], Iterable[EncodableT]], Awaitable[SentCall]]

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
    lease_ms: int


class CreateScript(LuaScript[CreateKeys, CreateArgv]):
    """``create.lua``: create an invocation with its Preflighted event."""

    name = "create"
    layout = Layout.of(CreateKeys, CreateArgv, argv_groups=(FIELD_VALUE,))

    async def __call__(self, call: KeysAndArgs) -> Committed:
        """Run the script with KEYS and ARGV from :meth:`~LuaScript.arguments`.

        Raises:
            RecordExpired: this very event was applied and its record has expired since
                (a creation resent by the client's retry).
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
                INVALID_EVIDENCE_STATUS, MISSING_ERROR_CODE, PROTECTED_FIELD,
                APPROVAL_EXPIRED or PERMIT_REQUIRED (see the script's header).
            StoreUnavailable: Redis failed or timed out.

        """
        return await _commit(self, call)


class PermitKeys(NamedTuple):
    """``permit.lua``'s KEYS, in order."""

    record: str
    stream: str
    feed: str
    run: str
    control: str


class PermitArgv(NamedTuple):
    """``permit.lua``'s fixed ARGV, in order (Dispatched's record field/value pairs follow)."""

    version: int
    event_id: str
    prev_hash: str
    event_hash: str
    event: bytes
    at_ms: int
    retention_ms: int
    run_id: str
    tool_call_id: str
    tool: str
    request_sha256: str
    lease_ms: int


class Permitted(NamedTuple):
    """The permit granted to this caller: its Dispatched is in the journal.

    Attributes:
        committed: where Dispatched stands (its version, feed entry, the record's expiry).
        request: the stored request, read in the step that granted the permit (None when
            the record holds none), to be checked against the journal's digest before
            anything runs.

    """

    committed: Committed
    request: bytes | None


class PermitRefused(Refused):
    """Raised when ``permit.lua`` refuses the permit; ``why`` says where a journal disagreed."""

    def __init__(self, code: str, current_version: int | None, why: str) -> None:
        super().__init__(code, current_version)
        self.why = why


class PermitScript(LuaScript[PermitKeys, PermitArgv]):
    """``permit.lua``: an approved call's one dispatch permit, granted by its journal."""

    name = "permit"
    layout = Layout.of(PermitKeys, PermitArgv, argv_groups=(FIELD_VALUE,))

    async def __call__(self, call: KeysAndArgs) -> Permitted:
        """Run the script with KEYS and ARGV from :meth:`~LuaScript.arguments`.

        Raises:
            RecordExpired: the record is gone.
            PermitRefused: any other refusal (the script's header lists them), with the
                record's version and, for JOURNAL_MISMATCH, where the journal disagreed.
            StoreUnavailable: Redis failed or timed out.

        """
        async with redis_errors():
            reply = await self._call(self.script, call[0], call[1])
        head = reply_text(reply[0])
        if head == "refused":
            code = reply_text(reply[1])
            if code == ErrorCode.RECORD_EXPIRED.value:
                raise RecordExpired()
            raise PermitRefused(code, int(reply[2]), reply_text(reply[3]))
        offset = 1 if head == "applied" else 0
        committed = Committed(
            int(reply[offset]), reply_text(reply[offset + 1]), int(reply[offset + 2])
        )
        request = reply[offset + 3] if len(reply) > offset + 3 else None
        return Permitted(committed, bytes(request) if request is not None else None)


class LeaseKeys(NamedTuple):
    """``lease.lua``'s KEYS, in order."""

    record: str


class LeaseArgv(NamedTuple):
    """``lease.lua``'s ARGV, in order."""

    lease_version: int
    lease_ms: int


class LeaseScript(LuaScript[LeaseKeys, LeaseArgv]):
    """``lease.lua``: renew the lease of a call in flight, for the holder that has it."""

    name = "lease"
    layout = Layout.of(LeaseKeys, LeaseArgv)

    async def __call__(self, call: KeysAndArgs) -> int | None:
        """Run the script; the lease's new end (ms), or None when the caller lost the call.

        Raises:
            StoreUnavailable: Redis failed or timed out.

        """
        async with redis_errors():
            reply = int(await self._call(self.script, call[0], call[1]))
        return reply or None


class LapsedKeys(NamedTuple):
    """``lapsed.lua``'s KEYS, in order."""

    record: str
    stream: str
    feed: str
    progress: str
    run: str
    control: str


class LapsedArgv(NamedTuple):
    """``lapsed.lua``'s fixed ARGV, in order (the record's field/value pairs follow)."""

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
    lease_ms: int
    grace_ms: int


class LeaseHeld(Refused):
    """Raised when ``lapsed.lua`` finds the call's lease still held (or within its grace).

    ``lease_until_ms`` is when the holder's lease ends, by the server's clock.
    """

    def __init__(self, current_version: int | None, lease_until_ms: int) -> None:
        super().__init__("LEASE_HELD", current_version)
        self.lease_until_ms = lease_until_ms


class LapsedScript(LuaScript[LapsedKeys, LapsedArgv]):
    """``lapsed.lua``: take on or end a call in flight whose holder's lease lapsed."""

    name = "lapsed"
    layout = Layout.of(LapsedKeys, LapsedArgv, argv_groups=(FIELD_VALUE,))

    async def __call__(self, call: KeysAndArgs) -> Committed:
        """Run the script with KEYS and ARGV from :meth:`~LuaScript.arguments`.

        Raises:
            LeaseHeld: the holder's lease (or its grace) has not passed.
            RecordExpired: the record is gone.
            Refused: any other refusal (see the script's header).
            StoreUnavailable: Redis failed or timed out.

        """
        async with redis_errors():
            reply = await self._call(self.script, call[0], call[1])
        refused = not is_committed(reply) and reply_text(reply[0]) == "refused"
        if refused and reply_text(reply[1]) == "LEASE_HELD":
            raise LeaseHeld(int(reply[2]), int(reply[3]))
        return committed(reply)


class SupersedeKeys(NamedTuple):
    """``supersede.lua``'s KEYS, in order."""

    record: str
    stream: str
    edited_record: str
    edited_stream: str
    feed: str
    progress: str
    run: str


class SupersedeArgv(NamedTuple):
    """``supersede.lua``'s fixed ARGV, in order (both events' record field/value pairs follow).

    ``denied_fields`` is how many of the arguments that follow are the denial's fields and
    values; the edited call's come after them.
    """

    run_id: str
    tool_call_id: str
    tool: str
    version: int
    event_id: str
    prev_hash: str
    event_hash: str
    event: bytes
    edited_call_id: str
    edited_invocation_id: str
    edited_event_id: str
    edited_event_hash: str
    edited_event: bytes
    at_ms: int
    ttl_ms: int
    retention_ms: int
    denied_fields: int


class Superseded(NamedTuple):
    """What ``supersede.lua`` wrote: the original's denial and the edited call, both.

    Attributes:
        version: the original's version after its Denied.
        expires_at_ms: the original record's expiry.
        edited_expires_at_ms: the edited record's expiry, set by the script.

    """

    version: int
    expires_at_ms: int
    edited_expires_at_ms: int


class SupersedeScript(LuaScript[SupersedeKeys, SupersedeArgv]):
    """``supersede.lua``: deny a waiting call as superseded and record its edit, atomically."""

    name = "supersede"
    layout = Layout.of(SupersedeKeys, SupersedeArgv, argv_groups=(FIELD_VALUE,))

    async def __call__(self, call: KeysAndArgs) -> Superseded:
        """Run the script with KEYS and ARGV from :meth:`~LuaScript.arguments`.

        Raises:
            RecordExpired: the original's record is gone.
            Refused: nothing was written (the script's header lists the codes).
            StoreUnavailable: Redis failed or timed out.

        """
        async with redis_errors():
            reply = await self._call(self.script, call[0], call[1])
        if reply_text(reply[0]) == "refused":
            code = reply_text(reply[1])
            if code == ErrorCode.RECORD_EXPIRED.value:
                raise RecordExpired()
            raise Refused(code, int(reply[2]))
        return Superseded(int(reply[0]), int(reply[1]), int(reply[2]))


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


class EraseKeys(NamedTuple):
    """``erase.lua``'s fixed KEYS (the run's records follow, one group each)."""

    run: str


class EraseArgv(NamedTuple):
    """``erase.lua``'s fixed ARGV (the payload field names follow, one group each)."""

    by: str
    reason: str
    at_ms: int
    calls: int
    force: str


class EraseReply(NamedTuple):
    """What ``erase.lua`` answered: ``code`` is None when it erased, else why it refused."""

    code: str | None
    erased_at_ms: int
    records: int


class EraseScript(LuaScript[EraseKeys, EraseArgv]):
    """``erase.lua``: erase a run's payloads in one step, leaving its tombstone."""

    name = "erase"
    layout = Layout.of(EraseKeys, EraseArgv, key_groups=(("record",),), argv_groups=(("field",),))

    async def __call__(self, call: KeysAndArgs) -> EraseReply:
        """Run the script: when it erased, and how many records; or the refusal's code.

        Raises:
            StoreUnavailable: Redis failed or timed out.

        """
        async with redis_errors():
            reply = await self._call(self.script, call[0], call[1])
        if reply_text(reply[0]) == "erased":
            return EraseReply(None, int(reply[1]), int(reply[2]))
        return EraseReply(reply_text(reply[1]), 0, 0)


class PauseRunKeys(NamedTuple):
    """``pause_run.lua``'s KEYS, in order."""

    run: str


class PauseRunArgv(NamedTuple):
    """``pause_run.lua``'s ARGV, in order."""

    paused: int
    by: str
    reason: str
    at_ms: int


#: What ``pause_run.lua`` did: set the switch now, found it so already, refused a closed
#: run, found no run.
PauseReply = Literal["done", "already", "closed", "unknown"]


class PauseRunScript(LuaScript[PauseRunKeys, PauseRunArgv]):
    """``pause_run.lua``: pause or unpause one open run, keeping who, when and why."""

    name = "pause_run"
    layout = Layout.of(PauseRunKeys, PauseRunArgv)

    async def __call__(self, call: KeysAndArgs) -> tuple[PauseReply, list[str]]:
        """Run the script; what it did, and (``already``) who, why and when it was so.

        Raises:
            StoreUnavailable: Redis failed or timed out.

        """
        async with redis_errors():
            reply = await self._call(self.script, call[0], call[1])
        outcome = cast(PauseReply, reply_text(reply[0]))
        return outcome, [reply_text(value, "replace") for value in reply[1:]]


#: Every wrapper of this folder (the header test walks them).
class DataKeyKeys(NamedTuple):
    """``data_key.lua``'s KEYS, in order."""

    run: str


class DataKeyArgv(NamedTuple):
    """``data_key.lua``'s ARGV, in order."""

    wrapped: bytes


class DataKeyScript(LuaScript[DataKeyKeys, DataKeyArgv]):
    """``data_key.lua``: a run's one wrapped data key, created by its first writer."""

    name = "data_key"
    layout = Layout.of(DataKeyKeys, DataKeyArgv)

    async def __call__(self, call: KeysAndArgs) -> bytes | None:
        """Run the script: the run's wrapped data key, or None (no such run, or erased).

        Raises:
            StoreUnavailable: Redis failed or timed out.

        """
        async with redis_errors():
            reply = await self._call(self.script, call[0], call[1])
        return reply if isinstance(reply, bytes) else None


class RewrapKeyKeys(NamedTuple):
    """``rewrap_key.lua``'s KEYS, in order."""

    run: str


class RewrapKeyArgv(NamedTuple):
    """``rewrap_key.lua``'s ARGV, in order."""

    expected: bytes
    wrapped: bytes


class RewrapKeyScript(LuaScript[RewrapKeyKeys, RewrapKeyArgv]):
    """``rewrap_key.lua``: put a run's data key under another master key (compare and set)."""

    name = "rewrap_key"
    layout = Layout.of(RewrapKeyKeys, RewrapKeyArgv)

    async def __call__(self, call: KeysAndArgs) -> bool:
        """Run the script: True when replaced, False when the run holds another key or none.

        Raises:
            StoreUnavailable: Redis failed or timed out.

        """
        async with redis_errors():
            reply = await self._call(self.script, call[0], call[1])
        return int(reply) == 1


WRAPPERS: Final = (
    CreateScript,
    AppendScript,
    PermitScript,
    LeaseScript,
    LapsedScript,
    SupersedeScript,
    RefuseScript,
    OpenRunScript,
    UpdateRunScript,
    EraseScript,
    PauseRunScript,
    DataKeyScript,
    RewrapKeyScript,
)


class Scripts:
    """The store's scripts registered on one client.

    ``create``, ``append`` and ``refuse`` go through ``batcher`` when one is given
    (concurrent appends share round trips, see :mod:`eventstore.wire.batching`); the run
    registry's scripts are sent alone.
    """

    def __init__(self, client: Redis, batcher: ScriptCalls | None = None) -> None:
        writes: ScriptCall = batcher.call if batcher is not None else call_script
        #: Writes a call now and answers it with the next (``None``: not batched, every
        #: call is awaited); see :meth:`~eventstore.wire.batching.ScriptBatcher.send`.
        self.send: ScriptSend | None = batcher.send if batcher is not None else None
        self.create = CreateScript(client, FOLDER, writes)
        self.append = AppendScript(client, FOLDER, writes)
        self.permit = PermitScript(client, FOLDER)
        self.lease = LeaseScript(client, FOLDER)
        self.lapsed = LapsedScript(client, FOLDER)
        self.supersede = SupersedeScript(client, FOLDER)
        self.refuse = RefuseScript(client, FOLDER, writes)
        self.open_run = OpenRunScript(client, FOLDER)
        self.update_run = UpdateRunScript(client, FOLDER)
        self.erase = EraseScript(client, FOLDER)
        self.pause_run = PauseRunScript(client, FOLDER)
        self.data_key = DataKeyScript(client, FOLDER)
        self.rewrap_key = RewrapKeyScript(client, FOLDER)
