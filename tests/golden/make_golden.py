"""Write the golden event histories and their expected folded records (run once, check in).

    .venv/bin/python tests/golden/make_golden.py

Each ``<name>.jsonl`` holds one schema 0/1 event per line, byte for byte as the stream
stored it (field ``e``) before schema 2; each ``<name>.compact.hex`` holds one event per
line as the hex of its stored bytes in the compact encoding of schema 2 (a stream written
across the upgrade mixes both). ``<name>[.compact].expected.json`` is the folded state as
formatted msgspec JSON. Regenerate only on purpose: a changed fixture is a changed event
shape, encoding or fold, and records already stored in production keep their old bytes.
"""

from __future__ import annotations

import hashlib
import pathlib
from typing import Any

import msgspec

from machine.codes import ErrorCode, EvidenceStatus
from machine.events import (
    GENESIS_HASH,
    Completed,
    Event,
    Failed,
    Preflighted,
    ProjectingStarted,
    decode_event,
    encode_event,
    event_hash,
    payload_digest,
)
from machine.fold import fold_all

HERE = pathlib.Path(__file__).parent
T0 = 1_700_000_000_000


#: State fields newer than the first fixtures: left out of an expected file while None, so
#: the files of histories that never set them keep their bytes.
LATER_FIELDS = (
    "failure_detail_sha256",
    "failure_detail_bytes",
    "requested_by",
    "approvals_required",
    "approval_count",
    "retry_of",
    "retried_by",
    "lapsed_at_ms",
    "attempt",
    "settled_by",
    "settlement_evidence_sha256",
    "settlement_evidence_bytes",
)


def render_state(lines: list[bytes]) -> bytes:
    """Fold stored event lines and return the expected-file bytes of the state."""
    state = fold_all((decode_event(line), event_hash(line)) for line in lines)
    fields = msgspec.structs.asdict(state) if state is not None else None
    if fields is not None:
        for name in LATER_FIELDS:
            if fields[name] is None:
                del fields[name]
    return msgspec.json.format(msgspec.json.encode(fields), indent=2) + b"\n"


def json_line(event: Event) -> bytes:
    """The stored bytes of ``event`` as a schema 1 writer stored it: its JSON object."""
    return msgspec.json.encode(msgspec.structs.replace(event, schema=1))


class _Chain:
    """Builds one invocation's stored lines, each linked to the hash of the previous.

    Events are stored as schema 1 JSON until :meth:`upgrade`, compactly after it.
    """

    def __init__(self, name: str, *, compact: bool = False) -> None:
        self.name = name
        self.lines: list[bytes] = []
        self.compact = compact

    def upgrade(self) -> _Chain:
        self.compact = True
        return self

    @property
    def prev_hash(self) -> str:
        return event_hash(self.lines[-1]) if self.lines else GENESIS_HASH

    def common(self) -> dict[str, Any]:
        version = len(self.lines) + 1
        return {
            "event_id": hashlib.sha256(f"{self.name}:{version}".encode()).hexdigest()[:32],
            "version": version,
            "at_ms": T0 + 250 * version,
            "prev_hash": self.prev_hash,
        }

    def add(self, event: Event) -> _Chain:
        self.lines.append(encode_event(event) if self.compact else json_line(event))
        return self

    def add_raw(self, obj: dict[str, Any]) -> _Chain:
        self.lines.append(msgspec.json.encode(obj))
        return self

    def preflighted(self, request: bytes, tool: str = "search") -> _Chain:
        return self.add(
            Preflighted(
                **self.common(),
                run_id="run-golden",
                tool_call_id=f"call-{self.name}",
                tool=tool,
                request_sha256=payload_digest(request),
                request_bytes=len(request),
            )
        )

    def projecting(self, raw: bytes) -> _Chain:
        return self.add(
            ProjectingStarted(**self.common(), raw_sha256=payload_digest(raw), raw_bytes=len(raw))
        )

    def completed(self, result: bytes, evidence: EvidenceStatus, scope: str) -> _Chain:
        return self.add(
            Completed(
                **self.common(),
                result_sha256=payload_digest(result),
                result_bytes=len(result),
                evidence_status=evidence,
                scope=scope,
            )
        )

    def failed(
        self, code: ErrorCode, rejected_bytes: int | None = None, detail: bytes | None = None
    ) -> _Chain:
        kept = (
            {"failure_detail_sha256": payload_digest(detail), "failure_detail_bytes": len(detail)}
            if detail is not None
            else {}
        )
        return self.add(
            Failed(**self.common(), error_code=code, rejected_bytes=rejected_bytes, **kept)
        )


REQUEST = b'{"query":"canonical records"}'
RAW = b'{"hits":[{"id":"doc-1","title":"Canonical records"}]}'
RESULT = b'{"summary":"1 document found","ids":["doc-1"]}'
EMPTY = b'{"summary":"nothing found","ids":[]}'
#: A harness-only failure detail (machine.failure_detail), as a boundary stores it.
DETAIL = (
    b'{"type":"TimeoutError","message":"search backend did not answer",'
    b'"traceback":"Traceback (most recent call last):\\n  File \\"tools.py\\", line 7, '
    b'in search\\nTimeoutError: search backend did not answer\\n","cut_bytes":0}'
)


def _lifecycles(compact: bool) -> list[_Chain]:
    """READY, NO_EVIDENCE and both ERROR paths, stored as JSON or compactly."""
    return [
        _Chain("ready", compact=compact)
        .preflighted(REQUEST)
        .projecting(RAW)
        .completed(RESULT, EvidenceStatus.EVIDENCE_FOUND, "docs:title-search"),
        _Chain("no-evidence", compact=compact)
        .preflighted(REQUEST, tool="lookup")
        .projecting(b'{"hits":[]}')
        .completed(EMPTY, EvidenceStatus.NO_EVIDENCE, "docs:exact-id"),
        _Chain("error-executing", compact=compact)
        .preflighted(REQUEST)
        .failed(ErrorCode.EXECUTION_FAILED),
        _Chain("error-projecting", compact=compact)
        .preflighted(REQUEST)
        .projecting(RAW)
        .failed(ErrorCode.RESULT_TOO_LARGE, rejected_bytes=20_480),
    ]


def histories() -> dict[str, list[bytes]]:
    """Return every golden history stored as JSON (schemas 0 and 1), by name."""
    request = REQUEST
    chains = _lifecycles(compact=False)
    legacy = _Chain("legacy-schema0").preflighted(request, tool="flaky")
    # Schema 0 ``Failed`` (a test-fixture legacy shape): ``code``, no ``rejected_bytes``.
    legacy.add_raw({"type": "Failed", "code": "EXECUTION_FAILED", **legacy.common(), "schema": 0})
    chains.append(legacy)
    return {chain.name: chain.lines for chain in chains}


def compact_histories() -> dict[str, list[bytes]]:
    """Return every golden history of schema 2 (compact), by name.

    ``upgrade`` began before schema 2 (a JSON Preflighted) and ended after it.
    """
    chains = _lifecycles(compact=True)
    upgrade = _Chain("upgrade").preflighted(REQUEST).upgrade().projecting(RAW)
    chains.append(upgrade.completed(RESULT, EvidenceStatus.EVIDENCE_FOUND, "docs:title-search"))
    # Failed events that kept a failure detail: its digest and size end the event.
    chains.append(
        _Chain("error-detail", compact=True)
        .preflighted(REQUEST)
        .failed(ErrorCode.EXECUTION_FAILED, detail=DETAIL)
    )
    chains.append(
        _Chain("error-detail-projecting", compact=True)
        .preflighted(REQUEST)
        .projecting(RAW)
        .failed(ErrorCode.PROJECTION_FAILED, detail=DETAIL)
    )
    return {chain.name: chain.lines for chain in chains}


def main() -> None:
    """Write every history and its expected state beside this script."""
    for name, lines in histories().items():
        (HERE / f"{name}.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
        (HERE / f"{name}.expected.json").write_bytes(render_state(lines))
        print(f"wrote {name}")
    for name, lines in compact_histories().items():
        text = "".join(line.hex() + "\n" for line in lines)
        (HERE / f"{name}.compact.hex").write_text(text, "ascii")
        (HERE / f"{name}.compact.expected.json").write_bytes(render_state(lines))
        print(f"wrote {name}.compact")


if __name__ == "__main__":
    import sys

    # Run as a script: the repository root, for the fixtures' legacy upcaster
    # (tests/conftest.py registers it for the test session).
    sys.path.insert(0, str(HERE.parents[1]))
    from tests.support.legacy_schema import register_legacy_upcaster

    register_legacy_upcaster()
    main()
