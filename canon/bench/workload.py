"""The benchmark's workload: payloads, tools, and the floors' pre-built script arguments.

One invocation is three script calls (create, ProjectingStarted, Completed) carrying a
1 KiB request, a 4 KiB raw response and a 512 B agent result. The script floor and the
script ceiling run the store's own ``create.lua`` and ``append.lua`` with arguments built
once from real events, so Redis does exactly the work the Writer makes it do (same keys,
same payload and event sizes, same checks) while the client does nothing but EVALSHA.
The minimal floor runs ``minimal_write.lua`` (:mod:`canon.bench.minimal`) with the same
keys, fields and events: only the writes, no checks and no reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from redis.typing import EncodableT

from canon.bench.minimal import MinimalWriteArgv, MinimalWriteKeys, MinimalWriteScript
from eventstore.boundary.contracts import Projection, ToolCall, ToolSpec
from eventstore.wire.keys import Keys
from eventstore.wire.scripts import (
    AppendArgv,
    AppendKeys,
    AppendScript,
    CreateArgv,
    CreateKeys,
    CreateScript,
)
from machine.codes import EvidenceStatus, Stage
from machine.compact import STATUS_CODES, TYPE_CODES
from machine.events import (
    GENESIS_HASH,
    PAYLOAD_OF,
    Completed,
    Event,
    Preflighted,
    ProjectingStarted,
    encode_event,
    event_hash,
    event_type,
    payload_digest,
)
from machine.fold import record_pairs
from machine.lifecycle import STATUS_OF, next_stage
from machine.phases import DEFAULT_LEASE_MS

TOOL: Final = "bench_search"
#: Event id of every floor event: the scripts only compare it, so its length is what counts.
EVENT_ID: Final = "e" * 32
SCOPE: Final = "bench corpus"
#: Feed retention the floor passes, as a store with the default TTL does.
RETENTION_MS: Final = 25 * 3600 * 1000
TTL_MS: Final = 24 * 3600 * 1000
#: Entries a run's refusal log keeps (the store's default).
REFUSALS_KEPT: Final = 1000


def run_id_for(mode: str, repeat: int, concurrency: int, task: int) -> str:
    """A 12-character run id, the length the floor's template events carry.

    It starts with the first character of ``mode`` (the benchmark passes each mode's
    own letter, :data:`canon.bench.modes.MODES`), so no two modes share a run.
    """
    return f"{mode[0]}{repeat:02d}{concurrency:03d}{task:06d}"


def tool_call_id_for(number: int) -> str:
    """A 10-character tool call id."""
    return f"call{number:06d}"


def request_arguments(size: int) -> dict[str, str]:
    """Tool arguments whose canonical JSON (``{"q":"..."}``) is exactly ``size`` bytes."""
    return {"q": "x" * (size - len('{"q":""}'))}


def request_bytes(size: int) -> bytes:
    """The canonical request bytes of :func:`request_arguments`."""
    return b'{"q":"' + b"x" * (size - len('{"q":""}')) + b'"}'


def result_text(size: int) -> str:
    """An agent result whose JSON encoding (a string) is exactly ``size`` bytes."""
    return "s" * (size - 2)


@dataclass(frozen=True, slots=True)
class Payloads:
    """Sizes and bytes of one invocation's payloads."""

    request: bytes
    raw: bytes
    result: bytes

    @classmethod
    def of(cls, request: int = 1024, raw: int = 4096, result: int = 512) -> Payloads:
        """Payloads of the given byte sizes."""
        return cls(request_bytes(request), b"r" * raw, f'"{result_text(result)}"'.encode())

    @property
    def total(self) -> int:
        """Payload bytes one record holds."""
        return len(self.request) + len(self.raw) + len(self.result)


def boundary_tool(payloads: Payloads, *, plain: bool = False) -> ToolSpec:
    """A trivial read-only tool: returns the raw bytes, projects the fixed result.

    With ``plain`` its executor is a plain ``def``, as most users write one: the
    boundary runs it in a worker thread (``ToolSpec.thread``). Either way the projector
    is a plain function, which runs on the event loop.
    """
    raw = payloads.raw
    result = result_text(len(payloads.result))

    async def execute(arguments: dict[str, Any], call: ToolCall) -> bytes:
        return raw

    def execute_plain(arguments: dict[str, Any], call: ToolCall) -> bytes:
        return raw

    def project(value: Any, call: ToolCall) -> Projection:
        return Projection(result=result, evidence_status=EvidenceStatus.EVIDENCE_FOUND, scope=SCOPE)

    return ToolSpec(executor=execute_plain if plain else execute, projector=project)


def _pairs(event: Event, payload: bytes) -> list[EncodableT]:
    """The record field/value pairs the Writer sends with ``event`` and its payload."""
    pairs: list[EncodableT] = [*record_pairs(event)]
    field = PAYLOAD_OF[event_type(event)].payload
    return [*pairs, field, payload] if field is not None else pairs


class FloorArgs:
    """Pre-built EVALSHA arguments of one invocation's three calls, for any ids.

    Encoded events, hashes and payload fields are built once from real events with ids of
    the same length as the benchmark's; only keys and ids change per invocation. The
    hashes chain (each call's previous hash is the hash the call before stored), so
    ``append.lua`` runs every check and the fold exactly as for a Writer event. KEYS and
    ARGV are put in place by the scripts' wrappers, as for the Writer.
    """

    def __init__(self, keys: Keys, payloads: Payloads, *, at_ms: int) -> None:
        self._keys = keys
        event_id = EVENT_ID
        pre = Preflighted(
            version=1,
            prev_hash=GENESIS_HASH,
            run_id=run_id_for("r", 0, 0, 0),
            tool_call_id=tool_call_id_for(0),
            tool=TOOL,
            request_sha256=payload_digest(payloads.request),
            request_bytes=len(payloads.request),
            event_id=event_id,
            at_ms=at_ms,
        )
        started = ProjectingStarted(
            version=2,
            prev_hash=event_hash(encode_event(pre)),
            raw_sha256=payload_digest(payloads.raw),
            raw_bytes=len(payloads.raw),
            event_id=event_id,
            at_ms=at_ms,
        )
        done = Completed(
            version=3,
            prev_hash=event_hash(encode_event(started)),
            result_sha256=payload_digest(payloads.result),
            result_bytes=len(payloads.result),
            evidence_status=EvidenceStatus.EVIDENCE_FOUND,
            scope=SCOPE,
            event_id=event_id,
            at_ms=at_ms,
        )
        self._events: list[Event] = [pre, started, done]
        self._encoded = [encode_event(event) for event in self._events]
        self._hashes = [event_hash(encoded) for encoded in self._encoded]
        self._create_pairs = _pairs(pre, payloads.request)
        # The ids are the only fields that change per invocation.
        self._run_at = self._create_pairs.index("run_id") + 1
        self._call_at = self._create_pairs.index("tool_call_id") + 1
        self._append_pairs = [_pairs(started, payloads.raw), _pairs(done, payloads.result)]
        self._at_ms = at_ms
        self._expires_at_ms = at_ms + TTL_MS
        self._minimal = _minimal_fields(
            self._events, self._hashes, (payloads.request, payloads.raw, payloads.result)
        )
        first = self._minimal[0][0]
        self._minimal_ids = (
            first.index("run_id") + 1,
            first.index("tool_call_id") + 1,
            first.index("invocation_id") + 1,
        )
        first[first.index("expires_at_ms") + 1] = self._expires_at_ms

    def create(self, run_id: str, tool_call_id: str, invocation_id: str) -> tuple[Any, ...]:
        """``numkeys, *keys, *args`` of the creation call."""
        k = self._keys
        fields = self._create_pairs.copy()
        fields[self._run_at], fields[self._call_at] = run_id, tool_call_id
        keys, args = CreateScript.arguments(
            CreateKeys(
                record=k.record(run_id, tool_call_id),
                stream=k.stream(run_id, tool_call_id),
                feed=k.feed_of(run_id),
                run=k.run(run_id),
                control=k.control_of(run_id),
                refusals=k.refusals(run_id),
            ),
            CreateArgv(
                event_id=EVENT_ID,
                event_hash=self._hashes[0],
                event=self._encoded[0],
                run_id=run_id,
                tool_call_id=tool_call_id,
                tool=TOOL,
                invocation_id=invocation_id,
                at_ms=self._at_ms,
                ttl_ms=TTL_MS,
                retention_ms=RETENTION_MS,
                version=1,
                prev_hash=GENESIS_HASH,
                refusals_kept=REFUSALS_KEPT,
                log_refusals="all",
                event_type="Preflighted",
                lease_ms=DEFAULT_LEASE_MS,
            ),
            group_args=fields,
        )
        return (len(keys), *keys, *args)

    def append(self, run_id: str, tool_call_id: str, version: int) -> tuple[Any, ...]:
        """``numkeys, *keys, *args`` of the ProjectingStarted (2) or Completed (3) call."""
        k = self._keys
        event = self._events[version - 1]
        keys, args = AppendScript.arguments(
            AppendKeys(
                record=k.record(run_id, tool_call_id),
                stream=k.stream(run_id, tool_call_id),
                feed=k.feed_of(run_id),
                progress=k.progress(run_id),
                run=k.run(run_id),
            ),
            AppendArgv(
                event_type=event_type(event),
                version=version,
                event_id=EVENT_ID,
                prev_hash=self._hashes[version - 2],
                event_hash=self._hashes[version - 1],
                event=self._encoded[version - 1],
                at_ms=self._at_ms,
                retention_ms=RETENTION_MS,
                run_id=run_id,
                tool_call_id=tool_call_id,
            ),
            group_args=self._append_pairs[version - 2],
        )
        return (len(keys), *keys, *args)

    def minimal(
        self, run_id: str, tool_call_id: str, version: int, invocation_id: str = ""
    ) -> tuple[Any, ...]:
        """``numkeys, *keys, *args`` of the minimal floor's call for event ``version``.

        The record fields are those ``create.lua`` (version 1, with ``invocation_id``)
        or ``append.lua`` writes for the event, lifecycle fields included; version 1 also
        sets the expiry, a TTL from the template's time as the store's default TTL gives.
        """
        k = self._keys
        fields, type_code, status_code = self._minimal[version - 1]
        if version == 1:
            fields = fields.copy()
            run_at, call_at, invocation_at = self._minimal_ids
            fields[run_at], fields[call_at] = run_id, tool_call_id
            fields[invocation_at] = invocation_id
        keys, args = MinimalWriteScript.arguments(
            MinimalWriteKeys(
                record=k.record(run_id, tool_call_id),
                stream=k.stream(run_id, tool_call_id),
                feed=k.feed_of(run_id),
            ),
            MinimalWriteArgv(
                event=self._encoded[version - 1],
                expires_at_ms=self._expires_at_ms if version == 1 else "",
                run_id=run_id,
                tool_call_id=tool_call_id,
                version=version,
                type_code=type_code,
                status_code=status_code,
            ),
            group_args=fields,
        )
        return (len(keys), *keys, *args)


def _minimal_fields(
    events: list[Event], hashes: list[str], payloads: tuple[bytes, ...]
) -> list[tuple[list[EncodableT], int, int]]:
    """Per event: the record fields the store's script writes, and the feed's two codes.

    The lifecycle fields come first, in the order ``create.lua`` and ``append.lua`` set
    them (``expires_at_ms`` and ``invocation_id`` are placeholders, filled per call),
    then the event's own fields and payload, and for the first event the call's lease;
    an event's ``evidence_status`` is the record's, as ``append.lua`` folds it.
    """
    calls: list[tuple[list[EncodableT], int, int]] = []
    stage = Stage.NEW
    for event, event_hash_, payload in zip(events, hashes, payloads, strict=True):
        kind = event_type(event)
        dest = next_stage(stage, kind)
        if dest is None:
            raise ValueError(f"{kind} cannot follow {stage.value}")
        fields: dict[EncodableT, EncodableT] = {
            "stage": dest.value,
            "status": STATUS_OF[dest].value,
            "evidence_status": EvidenceStatus.PENDING.value,
            "version": event.version,
            "last_hash": event_hash_,
            "updated_at_ms": event.at_ms,
        }
        if stage is Stage.NEW:
            fields |= {"expires_at_ms": 0, "invocation_id": ""}
        fields[f"e{event.version}"] = event.event_id
        pairs = _pairs(event, payload)
        fields.update(zip(pairs[::2], pairs[1::2], strict=True))
        if stage is Stage.NEW:
            # create.lua's second HSET: the lease of the call that starts running.
            fields |= {"lease_version": 1, "lease_until_ms": event.at_ms + DEFAULT_LEASE_MS}
        flat = [item for pair in fields.items() for item in pair]
        calls.append((flat, TYPE_CODES[kind], STATUS_CODES[STATUS_OF[dest]]))
        stage = dest
    return calls
