"""The timeline's geometry: an overview of the whole run in fixed columns, and one bar per
call on a shared axis, coloured, labelled (cut to fit)."""

from __future__ import annotations

import msgspec

from eventstore.audit.run_calls import CallRow
from projections.console.timeline import (
    COLOURS,
    COLUMNS,
    LABEL_CHARS,
    LABEL_WIDTH,
    MIN_BAR,
    OVERVIEW_HEIGHT,
    WIDTH,
    duration_text,
    fitted,
    layout,
    overview,
)


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
    """The axis spans the calls' recorded times; a call in flight runs to its end and says
    how long it has been in flight so far (at now), which does not stretch the axis."""
    rows = [
        row("a", "READY", 1_000, 1_500, evidence="EVIDENCE_FOUND"),
        row("b", "ERROR", 1_200, 1_200, code="EXECUTION_FAILED"),
        row("c", "PROJECTING", 1_400, None),
    ]
    timeline = layout(rows, now_ms=600_000)
    a, b, c = timeline.bars
    assert timeline.span_ms == 500
    assert a.x == LABEL_WIDTH and a.width > b.width
    assert abs(a.x + a.width - (WIDTH - 8)) < 1e-6  # a ended last
    assert b.width == MIN_BAR  # an instant failure still shows
    assert abs(c.x + c.width - (WIDTH - 8)) < 1e-6  # in flight: to the axis's end
    assert "9 min 58 s · in flight (so far)" in c.label
    assert a.y < b.y < c.y and timeline.height > c.y
    assert a.fill == COLOURS[("READY", "EVIDENCE_FOUND")]
    assert b.fill == COLOURS[("ERROR", "EXECUTION_FAILED")]
    assert c.fill == COLOURS[("PROJECTING", None)]
    assert a.label == "search · 500 ms · EVIDENCE_FOUND"
    assert b.title == "b: search, 0 ms, EXECUTION_FAILED"


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


def test_the_overview_stacks_every_call_by_creation_time_into_fixed_columns() -> None:
    """3,000 calls fit in at most COLUMNS columns; each column's segments stack to its
    count over the fullest column's; a column links to the table page of its first call."""
    rows = [
        row(
            f"c{n:04d}",
            "ERROR" if n % 100 == 0 else "READY",
            1_000 + n,
            1_010 + n,
            evidence="EVIDENCE_FOUND",
            code="EXECUTION_FAILED",
        )
        for n in range(3_000)
    ]
    shown = overview(rows, [1_500, 3_999], per_page=100, iso=str)
    assert 0 < len(shown.columns) <= COLUMNS
    fullest = max(sum(seg.height for seg in col.segments) for col in shown.columns)
    assert abs(fullest - OVERVIEW_HEIGHT) < 1e-6
    for column in shown.columns:
        assert column.segments[-1].y >= 0  # stacked upwards from the axis, never above
        assert 1 <= column.page <= 30
    assert shown.columns[0].page == 1 and shown.columns[-1].page == 30
    assert any("1 ERROR" in column.title for column in shown.columns)
    assert len(shown.ticks) == 2 and 0 <= shown.ticks[0] < shown.ticks[1] <= WIDTH - 8


def test_an_empty_run_has_an_empty_overview() -> None:
    shown = overview([], [], per_page=100, iso=str)
    assert shown.columns == [] and shown.ticks == [] and shown.span_ms == 0


def test_an_active_run_s_overview_spans_its_calls_not_the_wall_clock() -> None:
    """3,000 calls made in 1.6 s, one still in flight (waiting for an operator) and the run
    open for ten minutes: the overview spans the 1.6 s of recorded events, so the calls
    spread over its columns instead of collapsing into the first."""
    rows = [
        row(f"c{n:04d}", "READY", 1_000 + n * 1_600 // 3_000, 1_001 + n * 1_600 // 3_000)
        for n in range(3_000)
    ]
    rows.append(
        CallRow(
            **{
                **msgspec.structs.asdict(row("w", "PROJECTING", 1_500, None)),
                "last_event_at_ms": 1_500,
            }
        )
    )
    shown = overview(rows, [], per_page=100, iso=str)
    assert shown.span_ms == 1_600
    assert len(shown.columns) > COLUMNS // 2


def test_a_long_label_is_cut_with_an_ellipsis_and_kept_whole_in_its_title() -> None:
    long_tool = "search_the_very_long_named_internal_knowledge_base"
    call = CallRow(**{**msgspec.structs.asdict(row("a", "READY", 1, 2)), "tool": long_tool})
    (bar,) = layout([call], now_ms=3).bars
    assert len(bar.label) == LABEL_CHARS and bar.label.endswith("…")
    assert long_tool in bar.title
    assert fitted("short") == "short"
