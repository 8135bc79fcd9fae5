"""The run timeline as a picture: one bar per invocation, from creation to terminal event.

Pure geometry for the inline SVG of the run page: a bar starts at the call's creation and
ends at its terminal event (or now, while it is in flight), on one time axis shared by
the run's calls; its colour says status and evidence, its label and hover title say tool,
duration and code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec

from eventstore.audit.run_calls import CallRow

WIDTH: Final = 960
LABEL_WIDTH: Final = 300
ROW_HEIGHT: Final = 20
BAR_HEIGHT: Final = 14
TOP: Final = 24
#: A bar is at least this wide, so an instant call still shows.
MIN_BAR: Final = 3.0

#: Fill per (status, evidence status or error code); the first match wins.
COLOURS: Final = {
    ("READY", "EVIDENCE_FOUND"): "#2e7d32",
    ("READY", "NO_EVIDENCE"): "#607d8b",
    ("ERROR", "EXECUTION_FAILED"): "#c62828",
    ("ERROR", None): "#ef6c00",
    ("PROJECTING", None): "#f9a825",
    ("READY", None): "#1565c0",
}
LEGEND: Final = (
    ("READY, evidence found", COLOURS[("READY", "EVIDENCE_FOUND")]),
    ("READY, no evidence", COLOURS[("READY", "NO_EVIDENCE")]),
    ("ERROR, execution failed", COLOURS[("ERROR", "EXECUTION_FAILED")]),
    ("ERROR, other code", COLOURS[("ERROR", None)]),
    ("in flight (PROJECTING)", COLOURS[("PROJECTING", None)]),
)


class Bar(msgspec.Struct, frozen=True, kw_only=True):
    """One bar of the timeline, placed in SVG user units."""

    invocation_id: str
    x: float
    y: float
    width: float
    fill: str
    label: str
    title: str


class Timeline(msgspec.Struct, frozen=True, kw_only=True):
    """Every bar of a run, the picture's size and its time span."""

    bars: list[Bar]
    width: int
    height: int
    label_width: int
    span_ms: int


def colour(row: CallRow) -> str:
    """The fill of a call's bar: by status, then evidence status or error code."""
    detail = row.evidence_status if row.status == "READY" else row.error_code
    return COLOURS.get((row.status, detail)) or COLOURS.get((row.status, None), "#9e9e9e")


def duration_text(ms: int) -> str:
    """A duration as people read it: ``850 ms``, ``2.4 s``, ``3 min 5 s``."""
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms // 60_000} min {ms % 60_000 // 1000} s"


def outcome(row: CallRow) -> str:
    """What the call ended with: its error code, evidence status, or ``in flight``."""
    if row.status == "ERROR":
        return row.error_code or "ERROR"
    if row.status == "READY":
        return row.evidence_status or "READY"
    return "in flight"


def layout(rows: Sequence[CallRow], now_ms: int) -> Timeline:
    """Place one bar per call on a time axis from the first creation to the last end."""
    if not rows:
        return Timeline(bars=[], width=WIDTH, height=TOP, label_width=LABEL_WIDTH, span_ms=0)
    start = min(row.created_at_ms for row in rows)
    ends = [row.finished_at_ms or max(now_ms, row.created_at_ms) for row in rows]
    span = max(max(ends) - start, 1)
    scale = (WIDTH - LABEL_WIDTH - 8) / span
    bars = []
    for index, (row, end) in enumerate(zip(rows, ends, strict=True)):
        took = max(end - row.created_at_ms, 0)
        shown = outcome(row)
        bars.append(
            Bar(
                invocation_id=row.invocation_id,
                x=LABEL_WIDTH + (row.created_at_ms - start) * scale,
                y=TOP + index * ROW_HEIGHT,
                width=max(took * scale, MIN_BAR),
                fill=colour(row),
                label=f"{row.tool} · {duration_text(took)} · {shown}",
                title=f"{row.tool_call_id}: {row.tool}, {duration_text(took)}, {shown}",
            )
        )
    return Timeline(
        bars=bars,
        width=WIDTH,
        height=TOP + len(rows) * ROW_HEIGHT + 8,
        label_width=LABEL_WIDTH,
        span_ms=span,
    )
