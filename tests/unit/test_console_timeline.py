"""The timeline's geometry: one bar per call on a shared axis, coloured, labelled."""

from __future__ import annotations

from eventstore.audit.run_calls import CallRow
from projections.console.timeline import COLOURS, LABEL_WIDTH, MIN_BAR, WIDTH, duration_text, layout


def row(call: str, status: str, created: int, finished: int | None, **extra: str) -> CallRow:
    return CallRow(
        invocation_id=call * 8,
        tool_call_id=call,
        tool="search",
        stage=status,
        status=status,
        evidence_status=extra.get("evidence"),
        error_code=extra.get("code"),
        created_at_ms=created,
        finished_at_ms=finished,
        events=2,
        request_bytes=10,
        result_bytes=None,
    )


def test_bars_share_one_axis_from_the_first_creation_to_the_last_end() -> None:
    rows = [
        row("a", "READY", 1_000, 1_500, evidence="EVIDENCE_FOUND"),
        row("b", "ERROR", 1_200, 1_200, code="EXECUTION_FAILED"),
        row("c", "PROJECTING", 1_400, None),
    ]
    timeline = layout(rows, now_ms=2_000)
    a, b, c = timeline.bars
    assert timeline.span_ms == 1_000
    assert a.x == LABEL_WIDTH and a.width > b.width
    assert b.width == MIN_BAR  # an instant failure still shows
    assert c.x + c.width == WIDTH - 8  # in flight: up to now
    assert a.y < b.y < c.y and timeline.height > c.y
    assert a.fill == COLOURS[("READY", "EVIDENCE_FOUND")]
    assert b.fill == COLOURS[("ERROR", "EXECUTION_FAILED")]
    assert c.fill == COLOURS[("PROJECTING", None)]
    assert a.label == "search · 500 ms · EVIDENCE_FOUND"
    assert b.title == "b: search, 0 ms, EXECUTION_FAILED"
    assert "in flight" in c.label


def test_other_codes_and_an_empty_run() -> None:
    timeline = layout([row("x", "ERROR", 5, 9, code="RESULT_TOO_LARGE")], now_ms=10)
    assert timeline.bars[0].fill == COLOURS[("ERROR", None)]
    assert layout([], now_ms=1).bars == []


def test_durations_read_as_people_say_them() -> None:
    assert [duration_text(ms) for ms in (0, 999, 2_400, 185_000)] == [
        "0 ms",
        "999 ms",
        "2.4 s",
        "3 min 5 s",
    ]
