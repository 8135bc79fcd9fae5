"""Feed entries: event type and status travel as permanent codes; spelled-out names (from
writers before the codes) still parse, and anything else is a malformed entry."""

from __future__ import annotations

import pytest

from machine.codes import Status
from machine.compact import STATUS_CODES, TYPE_CODES
from projections.feed import FeedEntry, MalformedEntry


def fields(t: bytes, s: bytes, **others: bytes) -> dict[bytes, bytes]:
    """The raw fields of one entry of run ``run-1``, call ``c1``, version 2."""
    base = {b"r": b"run-1", b"c": b"c1", b"v": b"2", b"t": t, b"s": s}
    return {**base, **{name.encode(): value for name, value in others.items()}}


def test_the_codes_are_permanent():
    """Stored feeds depend on these numbers: changing one must change this test."""
    assert TYPE_CODES == {
        "Preflighted": 1,
        "ProjectingStarted": 2,
        "Completed": 3,
        "Failed": 4,
        "ApprovalRequested": 5,
        "Approved": 6,
        "Denied": 7,
        "ApprovalExpired": 8,
        "Dispatched": 9,
        "ApprovalAdded": 10,
        "TakenOver": 11,
        "Reconciled": 12,
        "Settled": 13,
    }
    assert STATUS_CODES == {Status.PROJECTING: 1, Status.READY: 2, Status.ERROR: 3}


@pytest.mark.parametrize("kind", list(TYPE_CODES))
@pytest.mark.parametrize("status", list(Status))
def test_an_entry_with_codes_parses_to_names(kind: str, status: Status):
    """What the scripts write: ``t`` and ``s`` as codes."""
    raw = fields(str(TYPE_CODES[kind]).encode(), str(STATUS_CODES[status]).encode())

    entry = FeedEntry.parse(3, "1-1", raw)

    assert (entry.shard, entry.entry_id, entry.run_id, entry.tool_call_id, entry.version) == (
        3,
        "1-1",
        "run-1",
        "c1",
        2,
    )
    assert (entry.event_type, entry.status) == (kind, status)


@pytest.mark.parametrize("kind", list(TYPE_CODES))
def test_an_entry_with_names_from_an_older_writer_parses_the_same(kind: str):
    """Entries written before the codes (still in a feed after an upgrade) are understood."""
    coded = FeedEntry.parse(0, "1-1", fields(str(TYPE_CODES[kind]).encode(), b"2"))
    named = FeedEntry.parse(0, "1-1", fields(kind.encode(), b"READY"))

    assert named == coded


@pytest.mark.parametrize(
    "raw",
    [
        fields(b"0", b"1"),
        fields(b"14", b"1"),
        fields(b"1", b"4"),
        fields(b"Deleted", b"READY"),
        fields(b"Completed", b"ready"),
        fields(b" 1", b"1"),
        {b"r": b"run-1", b"c": b"c1", b"v": b"1", b"t": b"1"},
        fields(b"1", b"1", v=b"0"),
        fields(b"1", b"1", r=b"bad:id"),
        fields(b"1", b"1", c=b"\xff"),
    ],
    ids=[
        "type-code-0",
        "type-code-14",
        "status-code-4",
        "unknown-type",
        "lowercase-status",
        "padded-code",
        "no-status",
        "version-0",
        "unsafe-run-id",
        "undecodable-call-id",
    ],
)
def test_anything_else_is_a_malformed_entry(raw: dict[bytes, bytes]):
    """No writer produces these: the entry is refused (and dead-lettered by its worker)."""
    with pytest.raises(MalformedEntry):
        FeedEntry.parse(0, "1-1", raw)
