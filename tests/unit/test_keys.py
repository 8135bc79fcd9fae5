"""Key layout: every key built from an id refuses an unsafe id, and never rewrites it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from redis.crc import key_slot

from eventstore.errors import InvalidArgument
from eventstore.wire.keys import (
    LEGACY_LAYOUT,
    PLAIN_TAG_LAYOUT,
    InvocationKey,
    Keys,
    split_identity,
)
from machine.ids import MAX_ID_LENGTH, invocation_id
from tests.support.provider_ids import ACCEPTED, REFUSED

KEYS = Keys("ns", 4)
LEGACY = Keys("ns", 4, LEGACY_LAYOUT)
UNSAFE = ["", "x" * (MAX_ID_LENGTH + 1), "bad id:{x}\n", "a:b", "{s01}", "run 1", "rün", "\x00"]
UNSAFE_CALLS = ["", "x" * 513, "bad id:{x}\n", "run 1", "\x00", "a\ud800"]

#: Every key builder that puts a run id into a key, as a function of that run id.
BY_RUN: dict[str, Callable[[str], str]] = {
    "tag_of": KEYS.tag_of,
    "control_of": KEYS.control_of,
    "run": KEYS.run,
    "progress": KEYS.progress,
    "record": lambda run_id: KEYS.record(run_id, "call-1"),
    "stream": lambda run_id: KEYS.stream(run_id, "call-1"),
    "invocation": lambda run_id: KEYS.invocation(run_id, "call-1").record,
    "receipt": lambda run_id: KEYS.receipt(run_id, invocation_id("run-1", "call-1")),
    "run_view": KEYS.run_view,
}

#: Every key builder that puts a tool call id into a key, as a function of that id.
BY_CALL: dict[str, Callable[[str], str]] = {
    "record": lambda call: KEYS.record("run-1", call),
    "stream": lambda call: KEYS.stream("run-1", call),
    "invocation": lambda call: KEYS.invocation("run-1", call).stream,
}


@pytest.mark.parametrize("unsafe", UNSAFE)
@pytest.mark.parametrize("builder", BY_RUN.values(), ids=BY_RUN.keys())
def test_every_key_of_a_run_refuses_an_unsafe_run_id(
    builder: Callable[[str], str], unsafe: str
) -> None:
    """An unsafe run id raises InvalidArgument (a ValueError) naming the kind, not the text."""
    with pytest.raises(InvalidArgument, match=r"^run id is not a safe id$"):
        builder(unsafe)


@pytest.mark.parametrize("unsafe", UNSAFE_CALLS)
@pytest.mark.parametrize("builder", BY_CALL.values(), ids=BY_CALL.keys())
def test_every_key_of_an_invocation_refuses_an_unsafe_tool_call_id(
    builder: Callable[[str], str], unsafe: str
) -> None:
    """An unsafe tool call id raises InvalidArgument naming the kind, not the text."""
    with pytest.raises(InvalidArgument, match=r"^tool call id is not a safe id$"):
        builder(unsafe)


@pytest.mark.parametrize("value", [None, 7, b"run-1"])
def test_an_id_that_is_not_text_is_refused(value: object) -> None:
    """Only str ids reach a key; bytes or numbers are refused, not formatted."""
    with pytest.raises(InvalidArgument):
        KEYS.run(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["", "inv-1", "A" * 64, "a" * 63, "a" * 64 + ":x"])
def test_a_receipt_key_refuses_anything_but_an_invocation_id(value: str) -> None:
    """The receipt key takes only 64 lowercase hex digits as the invocation id."""
    with pytest.raises(InvalidArgument):
        KEYS.receipt("run-1", value)


def test_safe_ids_are_used_exactly_as_given() -> None:
    """A safe id at the length limit goes into the key unchanged."""
    run_id, call = "R" * MAX_ID_LENGTH, "toolu_01ABC-2.x"
    assert KEYS.record(run_id, call).endswith(f":inv:{run_id}:{call}")
    assert KEYS.stream(run_id, call).endswith(f":ev:{run_id}:{call}")


@pytest.mark.parametrize("name", list(ACCEPTED))
def test_every_accepted_id_is_the_last_component_of_its_keys(name: str) -> None:
    """Record and stream keys end with the exact id, read back to the same ids, and hash
    to the run's shard slot (braces in the id do not move it)."""
    call = ACCEPTED[name]
    record, stream = KEYS.record("run-1", call), KEYS.stream("run-1", call)
    tag = KEYS.tag_of("run-1")
    assert record == f"{tag}:inv:run-1:{call}"
    assert stream == f"{tag}:ev:run-1:{call}"
    assert KEYS.parse_invocation_key(record) == InvocationKey("record", "run-1", call, True)
    assert KEYS.parse_invocation_key(stream.encode()) == InvocationKey(
        "stream", "run-1", call, True
    )
    slot = key_slot(tag.encode())
    assert key_slot(record.encode()) == key_slot(stream.encode()) == slot
    assert key_slot(KEYS.run("run-1").encode()) == slot


def test_no_record_key_is_another_calls_stream_key() -> None:
    """Across every accepted id (one of them ending in ':ev'), the record and stream keys
    are all distinct, so no id can reach another invocation's key."""
    calls = [*ACCEPTED.values(), "call_1", "call"]
    built = [KEYS.record("run-1", c) for c in calls] + [KEYS.stream("run-1", c) for c in calls]
    assert len(set(built)) == 2 * len(calls)


@pytest.mark.parametrize("name", list(REFUSED))
def test_refused_ids_build_no_key(name: str) -> None:
    """Every value the id rules refuse raises before a key is formatted."""
    with pytest.raises(InvalidArgument, match=r"^tool call id is not a safe id$"):
        KEYS.invocation("run-1", REFUSED[name])  # type: ignore[arg-type]


def test_the_legacy_layout_appends_ev_and_holds_no_colon() -> None:
    """In the legacy layout the stream is the record key plus ':ev'; a call id with ':'
    (which could end in ':ev') is refused there, every other accepted id is not."""
    record = LEGACY.record("run-1", "call-1")
    assert record == Keys("ns", 4, PLAIN_TAG_LAYOUT).record("run-1", "call-1")
    assert LEGACY.stream("run-1", "call-1") == f"{record}:ev"
    assert LEGACY.invocation("run-1", "call-1").stream == f"{record}:ev"
    assert LEGACY.parse_invocation_key(f"{record}:ev") == InvocationKey(
        "stream", "run-1", "call-1", True
    )
    assert LEGACY.parse_invocation_key(record) == InvocationKey("record", "run-1", "call-1", True)
    assert LEGACY.parse_invocation_key(KEYS.stream("run-1", "call-1")) is None
    for call in ACCEPTED.values():
        assert LEGACY.accepts_tool_call_id(call) == (":" not in call)
    with pytest.raises(InvalidArgument, match=r"^tool call id is not a safe id$"):
        LEGACY.record("run-1", "functions.get_weather:0")


@pytest.mark.parametrize(
    "key",
    [
        "{tag}:inv:run-1:call-1".replace("{tag}", "ns:{s09}"),  # not run-1's shard
        "{tag}:inv:run 1:call-1",
        "{tag}:inv::call-1",
        "{tag}:ev:run-1:",
        "{tag}:inv:run-1:call 1",
    ],
)
def test_a_key_that_only_looks_like_an_invocation_key_is_not_placed(key: str) -> None:
    """Wrong shard, unsafe or empty ids: recognized as record or stream, but not placed."""
    parsed = KEYS.parse_invocation_key(key.replace("{tag}", KEYS.tag_of("run-1")))
    assert parsed is not None and not parsed.placed


@pytest.mark.parametrize(
    "key", ["ns:{s00}:run:run-1", "other:{s00}:inv:run-1:c", "ns:{s00}:inv:run-1", "ns:meta"]
)
def test_other_keys_are_not_invocation_keys(key: str) -> None:
    """Run hashes, other namespaces and truncated keys are not parsed as invocations."""
    assert KEYS.parse_invocation_key(key) is None


def test_progress_identities_split_at_the_first_colon() -> None:
    """Run ids hold no ':', so a 'run:call' item splits unambiguously, whatever the call."""
    for call in ACCEPTED.values():
        assert split_identity(f"run-1:{call}") == ("run-1", call)


def test_invocation_keys_equal_the_single_key_builders() -> None:
    """Keys.invocation, the writer's one-check-per-id path, builds the very same keys."""
    built = KEYS.invocation("run-7", "call-3")
    assert built.record == KEYS.record("run-7", "call-3")
    assert built.stream == KEYS.stream("run-7", "call-3")
    assert built.feed == KEYS.feed_of("run-7")
    assert built.run == KEYS.run("run-7")
    assert built.control == KEYS.control_of("run-7")
    assert built.progress == KEYS.progress("run-7")


# --- Parsing a key back into its ids (the inverse of record and stream) -----------------


@pytest.mark.parametrize(
    ("run_id", "tool_call_id"), [("run-1", "call-1"), ("r", "ev"), ("a_b", "call_1")]
)
def test_a_record_key_parses_back_into_its_ids(run_id: str, tool_call_id: str) -> None:
    """record_ids inverts record, in bytes (as SCAN returns keys) and in text."""
    key = KEYS.record(run_id, tool_call_id)
    assert KEYS.record_ids(key) == (run_id, tool_call_id)
    assert KEYS.record_ids(key.encode()) == (run_id, tool_call_id)
    assert KEYS.parse_invocation_key(key) == InvocationKey("record", run_id, tool_call_id, True)


def test_a_stream_key_parses_as_a_stream_and_is_no_record() -> None:
    """The stream of an invocation names the same ids, and is not taken for its record."""
    key = KEYS.stream("run-1", "call-1")
    assert KEYS.parse_invocation_key(key) == InvocationKey("stream", "run-1", "call-1", True)
    assert KEYS.record_ids(key) is None


def test_a_record_key_in_another_shard_than_its_runs_is_not_a_record() -> None:
    """A misplaced key parses (verify reports it) but record_ids refuses it."""
    right = KEYS.tag_of("run-1")
    wrong = next(KEYS.tag(shard) for shard in range(KEYS.shards) if KEYS.tag(shard) != right)
    key = f"{wrong}:inv:run-1:call-1"
    assert KEYS.parse_invocation_key(key) == InvocationKey("record", "run-1", "call-1", False)
    assert KEYS.record_ids(key) is None


@pytest.mark.parametrize(
    "key",
    [
        "other:{s01}:inv:run-1:call-1",  # another namespace
        "ns:{s01}:run:run-1",  # another kind
        "ns:{s01}:receipt:run-1:call-1",
        "ns:{s01}:inv:run-1",  # no tool call id
        "nsx{s01}:inv:run-1:call-1",  # the namespace is matched literally, not as a pattern
    ],
)
def test_anything_else_is_not_an_invocation_key(key: str) -> None:
    """Keys of other namespaces or kinds, or without a tool call id, parse as nothing."""
    assert KEYS.parse_invocation_key(key) is None
    assert KEYS.record_ids(key) is None


@pytest.mark.parametrize(
    "key",
    [
        "ns:{s01}:inv:run 1:call-1",  # an unsafe run id
        "ns:{s01}:inv:run-1:call 1",  # an unsafe tool call id
        b"ns:{s01}:inv:run-1:\xff",  # bytes that are not UTF-8 (SCAN returns any bytes)
    ],
)
def test_a_key_with_unacceptable_ids_is_never_a_record(key: str | bytes) -> None:
    """It looks like an invocation key, so verify can report it; it is never a record."""
    parsed = KEYS.parse_invocation_key(key)
    assert parsed is not None and not parsed.placed
    assert KEYS.record_ids(key) is None


def test_a_namespace_with_pattern_characters_is_matched_literally() -> None:
    """The namespace is escaped: `a.b` matches `a.b`, never `axb`."""
    keys = Keys("a.b", 4)
    assert keys.record_ids(keys.record("run-1", "call-1")) == ("run-1", "call-1")
    assert keys.parse_invocation_key("axb:{s01}:inv:run-1:call-1") is None
