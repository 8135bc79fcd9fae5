"""``canon replay`` stays readable at 80 columns: no header, event name, digest or state
is cut (the wide table collapsed to ``reques…``, ``event …`` and blank columns)."""

from __future__ import annotations

import io
import re

from rich.console import Console

from canon.commands.replay import WIDE_TIMELINE, print_replay
from eventstore.audit import replay_invocation
from eventstore.store import Store
from tests.integration.audit.test_replay import RUN, populate, store

__all__ = ["store"]  # the fixture, re-used

NARROW_HEADERS = ("v", "event", "+ms", "payload", "digests", "state after")


def render(replay: object, width: int) -> str:
    """What print_replay writes on a console of ``width`` columns, without styles."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, highlight=False)
    print_replay(console, replay)  # type: ignore[arg-type]
    return buffer.getvalue()


def header_cells(text: str) -> list[str]:
    """The cells of the timeline's header line."""
    line = next(line for line in text.splitlines() if line.split()[:2] == ["v", "event"])
    return re.split(r"\s{2,}", line.strip())


async def test_the_timeline_is_whole_at_80_columns(store: Store) -> None:
    """Every header, event type, detail, payload field, 12-digit digest and state after an
    event is printed whole; no line is wider than the console; nothing ends in an ellipsis."""
    await populate(store)
    for call, detail, field in (
        ("call-ready", "EVIDENCE_FOUND", "raw"),
        ("call-fail", "EXECUTION_FAILED", "request"),
    ):
        replay = await replay_invocation(store, RUN, call)
        assert replay is not None
        text = render(replay, 80)
        assert "…" not in text
        assert all(len(line) <= 80 for line in text.splitlines())
        assert header_cells(text) == list(NARROW_HEADERS)
        words = set(text.split())
        assert {"Preflighted", detail, field, "INTACT"} <= words
        for step in replay.timeline:
            assert step.event_type in words
            assert step.event_hash is not None and step.event_hash[:12] in words
            if step.payload_sha256:
                assert step.payload_sha256[:12] in words
            assert step.state is not None
            assert {step.state.stage.value, step.state.evidence_status.value} <= words


async def test_a_wide_console_keeps_one_line_per_event(store: Store) -> None:
    """From WIDE_TIMELINE columns on, each event is one row with its UTC time."""
    await populate(store)
    replay = await replay_invocation(store, RUN, "call-ready")
    assert replay is not None
    text = render(replay, WIDE_TIMELINE)
    assert "at (UTC)" in text and "event hash" in text and "…" not in text
    rows = [line for line in text.splitlines() if "Preflighted" in line]
    assert len(rows) == 1 and "EXECUTING · PROJECTING · PENDING" in rows[0]
