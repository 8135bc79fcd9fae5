"""The run registry: deadlines, budgets, tool grants and the run's access-token hash.

Budgets are reserved by ``create.lua`` in the same step that creates a record, so several
harness processes sharing one run can never overspend it.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import time
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Final, TypeAlias, cast

import msgspec
from redis.asyncio import Redis

from eventstore.errors import CanonError, InvalidArgument, redis_errors
from eventstore.wire.keys import Keys, registered_call_id, shard_of
from eventstore.wire.lua import NOTHING, flat
from eventstore.wire.scripts import (
    OpenRunArgv,
    OpenRunKeys,
    OpenRunScript,
    PauseRunArgv,
    PauseRunKeys,
    PauseRunScript,
    Scripts,
    UpdateRunKeys,
    UpdateRunScript,
    budget_argument,
)
from machine.ids import is_run_id, is_tool_name

_TOKEN_PREFIX: Final = "cr1"  # noqa: S105 (a format marker, not a secret)

#: What a run's ``deadline`` may be: how long from now (a ``timedelta``, or a number of
#: seconds), or when (a timezone-aware ``datetime``).
Deadline: TypeAlias = timedelta | float | datetime


def deadline_ms(deadline: Deadline, now_ms: int) -> int:
    """The absolute deadline, in milliseconds since the epoch, of a run's ``deadline``.

    Args:
        deadline: a ``timedelta`` or a number of seconds (an ``int`` or a finite
            ``float``) from ``now_ms``, or a timezone-aware ``datetime``.
        now_ms: the time a relative deadline counts from.

    Raises:
        InvalidArgument: anything else: a naive ``datetime``, a ``date``, a ``bool``, a
            string, NaN or an infinity, or a deadline beyond the year 9999.

    """
    if isinstance(deadline, datetime):
        if deadline.tzinfo is None or deadline.utcoffset() is None:
            raise InvalidArgument(
                "deadline must be timezone-aware (datetime.now(timezone.utc) + ...), "
                "or a timedelta or a number of seconds from now"
            )
        return int(deadline.timestamp() * 1000)
    if isinstance(deadline, timedelta):
        return now_ms + int(deadline.total_seconds() * 1000)
    # bool is an int; True seconds is a mistake, not a deadline.
    if isinstance(deadline, int | float) and not isinstance(deadline, bool):
        if math.isfinite(deadline) and abs(deadline) < _LONGEST_DEADLINE_S:
            return now_ms + int(deadline * 1000)
        raise InvalidArgument("deadline must be a finite number of seconds")
    raise InvalidArgument(
        "deadline must be a timedelta, a number of seconds or a timezone-aware datetime "
        f"(got {type(deadline).__name__})"
    )


#: More seconds than any datetime holds (the year 9999): beyond it a number is a mistake.
_LONGEST_DEADLINE_S: Final = 3e11


class OpenedRun(msgspec.Struct, frozen=True, kw_only=True):
    """What ``open_run`` hands back. ``access_token`` is shown once and stored only hashed."""

    run_id: str
    access_token: str
    deadline_ms: int
    expires_at_ms: int

    def __repr__(self) -> str:
        return f"OpenedRun(run_id={self.run_id!r}, access_token=<hidden>)"


class RunPause(msgspec.Struct, frozen=True, kw_only=True):
    """Who paused a run, why and since when (``at_ms`` None: not recorded)."""

    by: str
    reason: str
    at_ms: int | None


class PauseOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What pausing or unpausing a run did.

    Attributes:
        run_id: the run.
        paused: whether the run is paused now.
        changed: True when this request set the switch; False when the run was so already
            (``by``, ``reason`` and ``at_ms`` are then those of whoever set it).
        by: who set the switch as it stands.
        reason: why.
        at_ms: when (None: not recorded).

    """

    run_id: str
    paused: bool
    changed: bool
    by: str
    reason: str
    at_ms: int | None


class RunClosed(CanonError):
    """Raised when a run that is closed, or past its deadline, would be paused.

    Nothing of such a run runs any more: there is nothing to pause.
    """

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id} is closed or past its deadline: nothing of it runs")
        self.run_id = run_id


class RunInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A run's registry entry as stored (the token hash is never exposed)."""

    run_id: str
    active: bool
    deadline_ms: int
    expires_at_ms: int
    created_at_ms: int
    budget_total: int | None
    used_total: int
    tools: dict[str, int | None]
    used: dict[str, int]
    revoked: frozenset[str]
    invocations: int
    refused: dict[str, int] = msgspec.field(default_factory=dict)
    #: Calls that ended ERROR, by error code (empty for a run opened by an earlier
    #: version, which did not count them).
    failed: dict[str, int] = msgspec.field(default_factory=dict)
    #: The run is paused: none of its calls is recorded or dispatched.
    paused: bool = False
    #: Its governed calls waiting for an operator's decision.
    awaiting_approval: int = 0
    #: Who paused it, why and since when (None while it is not paused).
    pause: RunPause | None = None
    #: Its governed calls approved and not dispatched yet (waiting for their resume).
    approved: int = 0


class Refusal(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of a run's refusal log: a call turned away before any record existed.

    Attributes:
        entry_id: the log's stream entry id.
        at_ms: when it was refused (the server's clock, ms since epoch).
        tool: the tool name sent, or None when it was not a tool name.
        tool_call_id: the tool call id sent, or None when it was not an acceptable id
            (never stored then).
        tool_call_id_bytes: the UTF-8 size of the tool call id sent.
        code: the error code the call got.

    """

    entry_id: str
    at_ms: int
    tool: str | None
    tool_call_id: str | None
    tool_call_id_bytes: int
    code: str


#: The run hash's field prefix of a refusal count (``refused:<code>``, set by the scripts).
REFUSED_PREFIX: Final = "refused:"
#: The run hash's field prefix of the count of its calls that failed with a code
#: (append.lua counts each Failed event once).
FAILED_PREFIX: Final = "failed:"
#: The run hash's count of its governed calls waiting for a decision (the scripts keep it).
AWAITING_FIELD: Final = "awaiting_approval"
#: The run hash's count of its governed calls approved and not dispatched yet.
APPROVED_FIELD: Final = "approved"
#: Set in the run hash when the run counts its failures (runs opened by earlier
#: versions do not).
FAILURES_COUNTED: Final = "failures_counted"
#: The run hash's field prefix of the count of invocations created per tool.
USED_PREFIX: Final = "used:"


def prefixed_counts(fields: Mapping[str, Any], prefix: str) -> dict[str, int]:
    """The counts a run hash's fields (decoded names) hold under ``prefix``, by suffix."""
    return {
        name[len(prefix) :]: int(value) for name, value in fields.items() if name.startswith(prefix)
    }


def refused_counts(fields: Mapping[str, Any]) -> dict[str, int]:
    """The refusal counts per error code a run hash's fields hold (decoded field names)."""
    return prefixed_counts(fields, REFUSED_PREFIX)


def refusal_of(entry_id: bytes | str, fields: Mapping[bytes, bytes]) -> Refusal:
    """Build a :class:`Refusal` from one refusal log entry as XRANGE/XREVRANGE return it."""
    call = fields.get(b"call")
    tool = fields.get(b"tool")
    return Refusal(
        entry_id=entry_id.decode() if isinstance(entry_id, bytes) else entry_id,
        at_ms=int(fields[b"at"]),
        tool=tool.decode() if tool is not None else None,
        tool_call_id=call.decode() if call is not None else None,
        tool_call_id_bytes=len(call) if call is not None else int(fields.get(b"call_bytes", 0)),
        code=fields[b"code"].decode(),
    )


def token_digest(token: str) -> str:
    """Return the SHA-256 hex digest under which a run's token is stored."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def run_id_of_token(token: str) -> str | None:
    """Return the run id a token names, or None when the token is not of our form."""
    prefix, _, rest = token.partition(":")
    run_id, _, secret = rest.partition(":")
    if prefix != _TOKEN_PREFIX or not secret or not is_run_id(run_id):
        return None
    return run_id


def _int(value: bytes | None) -> int | None:
    return int(value) if value is not None else None


def pause_of(fields: Mapping[str, bytes]) -> RunPause | None:
    """Who paused a run, why and since when, from its hash's fields (None: not paused)."""
    if fields.get("paused") != b"1":
        return None
    at = fields.get("paused_at_ms")
    return RunPause(
        by=fields.get("paused_by", b"").decode("utf-8", "replace"),
        reason=fields.get("paused_reason", b"").decode("utf-8", "replace"),
        at_ms=int(at) if at is not None and at.isdigit() else None,
    )


class RunRegistry:
    """Opens, closes and reads runs of one namespace."""

    def __init__(self, client: Redis, keys: Keys, scripts: Scripts, *, ttl_ms: int) -> None:
        self._client = client
        self._keys = keys
        self._scripts = scripts
        self._ttl_ms = ttl_ms

    async def open(
        self,
        run_id: str,
        *,
        deadline_ms: int,
        budget: int | None = None,
        tools: Mapping[str, int | None] | None = None,
    ) -> OpenedRun:
        """Register a run and return its one-time access token.

        Args:
            run_id: a safe id, unique in the namespace for the run's lifetime.
            deadline_ms: absolute deadline (ms since epoch); calls after it are refused.
            budget: most invocations the run may create, or None for no run budget.
            tools: tools granted to the run, each with its own budget (None for none).

        Raises:
            InvalidArgument: an unsafe id or a negative budget.
            DeadlinePassed: the deadline has passed (an InvalidArgument).
            RunExists: the run id is already registered.

        """
        if not is_run_id(run_id):
            raise InvalidArgument("run id is not a safe id")
        grants = dict(tools or {})
        for name, tool_budget in grants.items():
            if not is_tool_name(name):
                raise InvalidArgument("tool name is not allowed")
            if tool_budget is not None and tool_budget < 0:
                raise InvalidArgument("tool budget must not be negative")
        if budget is not None and budget < 0:
            raise InvalidArgument("run budget must not be negative")
        token = f"{_TOKEN_PREFIX}:{run_id}:{secrets.token_urlsafe(32)}"
        expires_at_ms = await self._scripts.open_run(
            OpenRunScript.arguments(
                OpenRunKeys(
                    run=self._keys.run(run_id),
                    runs=self._keys.run_index(shard_of(run_id, self._keys.shards)),
                    control=self._keys.control_of(run_id),
                ),
                OpenRunArgv(
                    token_sha256=token_digest(token),
                    deadline_ms=deadline_ms,
                    ttl_ms=self._ttl_ms,
                    budget=budget_argument(budget),
                    run_id=run_id,
                ),
                group_args=flat((tool, budget_argument(limit)) for tool, limit in grants.items()),
            )
        )
        return OpenedRun(
            run_id=run_id, access_token=token, deadline_ms=deadline_ms, expires_at_ms=expires_at_ms
        )

    async def _update(self, run_id: str, *pairs: str | int) -> bool:
        if not is_run_id(run_id):
            return False
        return await self._scripts.update_run(
            UpdateRunScript.arguments(
                UpdateRunKeys(self._keys.run(run_id)), NOTHING, group_args=pairs
            )
        )

    async def close(self, run_id: str) -> bool:
        """Mark a run inactive; later calls are refused. False when the run is unknown.

        The time of the close is kept (``closed_at_ms``) for the run's history.
        """
        return await self._update(run_id, "active", 0, "closed_at_ms", time.time_ns() // 1_000_000)

    async def revoke_token(self, run_id: str) -> bool:
        """Withdraw the run's access token: nothing of the run can be read with it again."""
        return await self._update(run_id, "token_sha256", "revoked")

    async def set_paused(
        self, run_id: str, paused: bool, *, by: str, reason: str, at_ms: int
    ) -> PauseOutcome | None:
        """Set the run's pause switch, keeping who set it, when and why (``pause_run.lua``).

        A run paused already stays as it was paused (its who, why and when are answered,
        ``changed`` False); the same for unpausing a run that is not paused. Only an
        existing run hash is written. None when the run is unknown or expired.

        Raises:
            RunClosed: pausing a run that is closed or past its deadline.
            StoreUnavailable: Redis failed or timed out.

        """
        if not is_run_id(run_id):
            return None
        done, already = await self._scripts.pause_run(
            PauseRunScript.arguments(
                PauseRunKeys(self._keys.run(run_id)),
                PauseRunArgv(paused=int(paused), by=by, reason=reason, at_ms=at_ms),
            )
        )
        if done == "unknown":
            return None
        if done == "closed":
            raise RunClosed(run_id)
        if done == "done":
            return PauseOutcome(
                run_id=run_id, paused=paused, changed=True, by=by, reason=reason, at_ms=at_ms
            )
        who, why, when = already
        return PauseOutcome(
            run_id=run_id,
            paused=paused,
            changed=False,
            by=who,
            reason=why,
            at_ms=int(when) if when.isdigit() else None,
        )

    async def revoke_tool(self, run_id: str, tool: str) -> bool:
        """Withdraw a tool's authorization from a run (receipts of it become unreadable)."""
        return await self._update(run_id, f"revoked:{tool}", 1)

    async def info(self, run_id: str) -> RunInfo | None:
        """Return the run's registry entry, or None when unknown or expired."""
        if not is_run_id(run_id):
            return None
        async with redis_errors():
            raw = cast(dict[bytes, bytes], await self._client.hgetall(self._keys.run(run_id)))
        if not raw:
            return None
        fields = {k.decode(): v for k, v in raw.items()}
        tools = {
            name[5:]: _int(fields.get(f"budget:{name[5:]}"))
            for name in fields
            if name.startswith("tool:")
        }
        used = prefixed_counts(fields, USED_PREFIX)
        return RunInfo(
            run_id=run_id,
            active=fields.get("active") == b"1",
            deadline_ms=int(fields["deadline_ms"]),
            expires_at_ms=int(fields["expires_at_ms"]),
            created_at_ms=int(fields["created_at_ms"]),
            budget_total=_int(fields.get("budget_total")),
            used_total=int(fields.get("used_total", b"0")),
            tools=tools,
            used=used,
            revoked=frozenset(name[8:] for name in fields if name.startswith("revoked:")),
            invocations=sum(1 for name in fields if name.startswith("inv:")),
            refused=refused_counts(fields),
            failed=prefixed_counts(fields, FAILED_PREFIX),
            paused=fields.get("paused") == b"1",
            awaiting_approval=int(fields.get(AWAITING_FIELD, b"0")),
            pause=pause_of(fields),
            # A call approved before runs counted them is counted out only: never below 0.
            approved=max(int(fields.get(APPROVED_FIELD, b"0")), 0),
        )

    async def refusals(self, run_id: str, *, limit: int = 100) -> list[Refusal]:
        """Return the run's latest refusals, newest first (read-only, one XREVRANGE).

        Raises:
            InvalidArgument: ``limit`` is not a whole number of at least 1.

        """
        if type(limit) is not int or limit < 1:
            raise InvalidArgument("limit must be a whole number of at least 1")
        if not is_run_id(run_id):
            return []
        async with redis_errors():
            entries = cast(
                list[tuple[bytes, dict[bytes, bytes]]],
                await self._client.xrevrange(self._keys.refusals(run_id), "+", "-", count=limit),
            )
        return [refusal_of(entry_id, fields) for entry_id, fields in entries]

    async def authenticate(self, token: str) -> str | None:
        """Return the run id an access token belongs to, or None (compared in constant time)."""
        run_id = run_id_of_token(token)
        if run_id is None:
            return None
        async with redis_errors():
            stored = cast(
                bytes | None, await self._client.hget(self._keys.run(run_id), "token_sha256")
            )
        if stored is None:
            return None
        if hmac.compare_digest(stored.decode(), token_digest(token)):
            return run_id
        return None

    async def tool_call_id_of(self, run_id: str, invocation_id: str) -> str | None:
        """Return the tool call id behind one of the run's invocation ids, or None."""
        async with redis_errors():
            value = cast(
                bytes | None,
                await self._client.hget(self._keys.run(run_id), f"inv:{invocation_id}"),
            )
        return registered_call_id(value) if value is not None else None
