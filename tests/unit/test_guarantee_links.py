"""Every link to a section of the guarantees pages, from any page of the docs, lands on a
heading of that page."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_LINK = re.compile(r"\]\(((?:docs/)?(guarantees(?:-reference)?\.md))#([a-z0-9-]+)\)")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: str) -> set[str]:
    """The anchors of the headings of ``docs/<page>``."""
    text = (ROOT / "docs" / page).read_text()
    return {slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def links() -> list[tuple[str, str, str]]:
    """Each (page linking, page linked, anchor) of a link to a guarantees page's section."""
    found = []
    for page in PAGES:
        for match in _LINK.finditer(page.read_text()):
            found.append((str(page.relative_to(ROOT)), match.group(2), match.group(3)))
    return found


def test_the_summary_keeps_the_sections_pages_linked_to() -> None:
    """Not vacuous: the summary links each section to the reference; and the sections
    other pages linked to before the reference existed are still the summary's."""
    assert len([link for link in links() if link[0] == "docs/guarantees.md"]) >= 15
    assert {
        "governed-calls",
        "every-call-ends-known-the-crash-point-matrix",
        "a-process-that-dies-inside-the-projector",
    } <= anchors("guarantees.md")


@pytest.mark.parametrize(("source", "page", "anchor"), links())
def test_every_link_lands_on_a_heading(source: str, page: str, anchor: str) -> None:
    """The anchor is one of the linked page's headings."""
    assert anchor in anchors(page), f"{source} links to {page}#{anchor}"
