"""Key layout: every key built from an id refuses an unsafe id, and never rewrites it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from eventstore.errors import InvalidArgument
from eventstore.keys import Keys
from machine.ids import MAX_ID_LENGTH, invocation_id

KEYS = Keys("ns", 4)
UNSAFE = ["", "x" * (MAX_ID_LENGTH + 1), "bad id:{x}\n", "a:b", "{s01}", "run 1", "rün", "\x00"]

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


@pytest.mark.parametrize("unsafe", UNSAFE)
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


def test_invocation_keys_equal_the_single_key_builders() -> None:
    """Keys.invocation, the writer's one-check-per-id path, builds the very same keys."""
    built = KEYS.invocation("run-7", "call-3")
    assert built.record == KEYS.record("run-7", "call-3")
    assert built.stream == KEYS.stream("run-7", "call-3")
    assert built.feed == KEYS.feed_of("run-7")
    assert built.run == KEYS.run("run-7")
    assert built.control == KEYS.control_of("run-7")
    assert built.progress == KEYS.progress("run-7")
