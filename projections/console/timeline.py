"""The run timeline as pictures: an overview of the whole run, and one bar per call shown.

Pure geometry for the inline SVGs of the run page. The *overview* stays readable however
many calls a run holds: the run's time is cut into :data:`COLUMNS` equal columns, each a
stack of the calls created in it, coloured by outcome, with the run's refusals as ticks
under the axis; a column links to the table page holding its first call. The *bars* are
the calls of the table page shown: a bar starts at the call's creation and ends at its
terminal event, on one time axis shared by those calls; its colour says status and
evidence, its label (cut to fit, with an ellipsis) and hover title say tool, duration and
code.

Both axes span what was recorded, never the wall clock: from the first call (or refusal)
to the latest event written. A run still open, or a call waiting for an operator for an
hour, would otherwise stretch the axis to *now*, and 3,000 calls made in two seconds
would collapse into one column. A call in flight runs to the axis's end, its title
saying for how long so far.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
#: Characters of a bar's label that fit in LABEL_WIDTH at the page's 12 px monospace.
LABEL_CHARS: Final = 40
#: Columns of the overview; its plot height, and the band of refusal ticks under it.
COLUMNS: Final = 120
OVERVIEW_HEIGHT: Final = 80
TICKS_HEIGHT: Final = 12

#: Fill per (status, evidence status or error code); the first match wins.
COLOURS: Final = {
    ("READY", "EVIDENCE_FOUND"): "#2e7d32",
    ("READY", "NO_EVIDENCE"): "#607d8b",
    ("ERROR", "EXECUTION_FAILED"): "#c62828",
    ("ERROR", None): "#ef6c00",
    ("PROJECTING", None): "#f9a825",
    ("READY", None): "#1565c0",
}
_ERROR_FILLS: Final = frozenset({COLOURS[("ERROR", "EXECUTION_FAILED")], COLOURS[("ERROR", None)]})
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


class Segment(msgspec.Struct, frozen=True, kw_only=True):
    """One outcome's share of an overview column: its colour, place and height."""

    fill: str
    y: float
    height: float


class Column(msgspec.Struct, frozen=True, kw_only=True):
    """One overview column: the calls created in its time slice, stacked by outcome.

    ``page`` is the table page (of ``per_page`` calls) that holds its first call; ``title``
    says its time slice and counts.
    """

    x: float
    width: float
    segments: list[Segment]
    page: int
    title: str


class Overview(msgspec.Struct, frozen=True, kw_only=True):
    """The whole run at a glance: columns of calls, refusal ticks, size and time span."""

    columns: list[Column]
    ticks: list[float]
    width: int
    height: int
    plot_height: int
    span_ms: int
    start_ms: int


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
    """What the call ended with: its error code, evidence status, or where it stands.

    A call not ended is ``in flight`` while its process runs it, else its stage (awaiting
    approval, approved, attempted, abandoned).
    """
    if row.status == "ERROR":
        return row.error_code or "ERROR"
    if row.status == "READY":
        return row.evidence_status or "READY"
    if row.phase in ("", "dispatching"):
        return "in flight"
    return row.phase.replace("_", " ")


def fitted(label: str, chars: int = LABEL_CHARS) -> str:
    """``label`` cut to ``chars`` characters, its last one an ellipsis when it was cut."""
    return label if len(label) <= chars else label[: chars - 1] + "…"


def recorded_at_ms(row: CallRow) -> int:
    """The latest time the call's record says something happened.

    Its terminal event, else its latest event, else its creation.
    """
    return max(row.finished_at_ms or row.last_event_at_ms or 0, row.created_at_ms)


def overview(
    rows: Sequence[CallRow],
    refused_at_ms: Sequence[int],
    *,
    per_page: int,
    iso: Callable[[int], str],
) -> Overview:
    """Stack the run's calls (oldest first) by creation time into columns, refusals as ticks.

    The axis runs from the first call or refusal to the latest event recorded (a call's
    end, its latest event while in flight, or the last refusal), never to the wall clock.
    A column's height is its count over the fullest column's; ``iso`` writes a column's
    times in its title.
    """
    plot = WIDTH - 8
    starts = [row.created_at_ms for row in rows] + list(refused_at_ms)
    if not starts:
        return Overview(
            columns=[],
            ticks=[],
            width=WIDTH,
            height=OVERVIEW_HEIGHT + TICKS_HEIGHT,
            plot_height=OVERVIEW_HEIGHT,
            span_ms=0,
            start_ms=0,
        )
    start = min(starts)
    ends = [recorded_at_ms(row) for row in rows]
    span = max(max(ends + list(refused_at_ms)) - start, 1)
    slice_ms = span / COLUMNS
    counts: list[dict[str, int]] = [{} for _ in range(COLUMNS)]
    first_index: list[int | None] = [None] * COLUMNS
    for index, row in enumerate(rows):
        column = min(int((row.created_at_ms - start) / slice_ms), COLUMNS - 1)
        fill = colour(row)
        counts[column][fill] = counts[column].get(fill, 0) + 1
        if first_index[column] is None:
            first_index[column] = index
    fullest = max((sum(c.values()) for c in counts), default=0) or 1
    step = plot / COLUMNS
    columns = []
    order = [fill for _, fill in LEGEND]
    for number, (count, first) in enumerate(zip(counts, first_index, strict=True)):
        if first is None:
            continue
        y = float(OVERVIEW_HEIGHT)
        segments = []
        for fill in sorted(count, key=lambda f: order.index(f) if f in order else len(order)):
            height = count[fill] * OVERVIEW_HEIGHT / fullest
            y -= height
            segments.append(Segment(fill=fill, y=y, height=height))
        begins = start + int(number * slice_ms)
        errors = sum(n for fill, n in count.items() if fill in _ERROR_FILLS)
        columns.append(
            Column(
                x=number * step,
                width=max(step - 1, 1.0),
                segments=segments,
                page=first // per_page + 1,
                title=f"{iso(begins)} + {duration_text(int(slice_ms))}: "
                f"{sum(count.values())} calls, {errors} ERROR",
            )
        )
    ticks = [(at - start) * plot / span for at in refused_at_ms]
    return Overview(
        columns=columns,
        ticks=ticks,
        width=WIDTH,
        height=OVERVIEW_HEIGHT + TICKS_HEIGHT,
        plot_height=OVERVIEW_HEIGHT,
        span_ms=span,
        start_ms=start,
    )


def layout(rows: Sequence[CallRow], now_ms: int) -> Timeline:
    """Place one bar per call on a time axis from the first creation to the latest event.

    A call in flight runs to the axis's end; its label and title give how long it has
    been in flight at ``now_ms``.
    """
    if not rows:
        return Timeline(bars=[], width=WIDTH, height=TOP, label_width=LABEL_WIDTH, span_ms=0)
    start = min(row.created_at_ms for row in rows)
    span = max(max(recorded_at_ms(row) for row in rows) - start, 1)
    ends = [row.finished_at_ms if row.finished_at_ms is not None else start + span for row in rows]
    scale = (WIDTH - LABEL_WIDTH - 8) / span
    bars = []
    for index, (row, end) in enumerate(zip(rows, ends, strict=True)):
        finished = row.finished_at_ms is not None
        took = max((end if finished else max(now_ms, end)) - row.created_at_ms, 0)
        shown = outcome(row) if finished else f"{outcome(row)} (so far)"
        bars.append(
            Bar(
                invocation_id=row.invocation_id,
                x=LABEL_WIDTH + (row.created_at_ms - start) * scale,
                y=TOP + index * ROW_HEIGHT,
                width=max((end - row.created_at_ms) * scale, MIN_BAR),
                fill=colour(row),
                label=fitted(f"{row.tool} · {duration_text(took)} · {shown}"),
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
