"""The route tables match whole paths and only the methods they name; --help reads them."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.routing import Match

from projections.console.app import CONSOLE_ROUTES, CONSOLE_TABLE
from projections.http_api import OPERATOR_ROUTES, READ_ROUTES, ROUTES
from projections.routing import ExactRoute, described

RECEIPT = "/v1/invocations/" + "a" * 64 + "/receipt"


def scope(path: str, method: str = "GET") -> dict[str, Any]:
    """An HTTP request's scope as the router sees it."""
    return {"type": "http", "path": path, "method": method, "root_path": ""}


def matched(path: str, method: str = "GET") -> list[tuple[str, Match]]:
    """The API routes ``path`` matches at all, and how."""
    found = []
    for route in (*READ_ROUTES, *OPERATOR_ROUTES):
        match, _ = route.matches(scope(path, method))
        if match is not Match.NONE:
            found.append((route.name, match))
    return found


def test_each_read_route_takes_its_path_and_get_only() -> None:
    """A receipt path (any one segment, an empty one too) is the receipt route's; HEAD and
    POST are methods it does not serve."""
    assert matched(RECEIPT) == [("receipt", Match.FULL)]
    assert matched("/v1/invocations//receipt") == [("receipt", Match.FULL)]
    assert matched(RECEIPT, "HEAD") == [("receipt", Match.PARTIAL)]
    assert matched("/v1/runs/run-1/progress", "POST") == [("progress", Match.PARTIAL)]


@pytest.mark.parametrize(
    "path",
    [
        RECEIPT + "\n",
        "/v1/invocations/inspection-capabilities\n",
        "/v1/runs/run-1/progress\n",
        "/v1/runs/run!1/progress",
        "/v1/runs/" + "r" * 129 + "/invocations",
        "/v1/approvals/",
    ],
    ids=["receipt-lf", "capabilities-lf", "progress-lf", "bad-run-id", "long-run-id", "slash"],
)
def test_a_path_of_another_shape_matches_no_route(path: str) -> None:
    """A final line feed, a run id that is not one, or a slash more is another path."""
    assert matched(path) == []
    assert matched(path, "POST") == []


def test_the_console_routes_its_pages_whole() -> None:
    """A console path matches the one route it names; a final line feed matches none."""
    call = "/console/runs/run-1/invocations/" + "b" * 64
    names = {
        route.name
        for route in CONSOLE_TABLE
        if route.matches(scope(call + "/payloads", "POST"))[0] is Match.FULL
    }
    assert names == {"payloads"}
    assert all(route.matches(scope("/console/login\n"))[0] is Match.NONE for route in CONSOLE_TABLE)


def test_help_lines_are_read_from_the_tables() -> None:
    """Each route's methods and path, its parameters named as a reader says them."""
    assert ROUTES[0] == "GET /v1/invocations/inspection-capabilities"
    assert "GET /v1/invocations/<invocation id>/receipt" in ROUTES
    assert "POST /v1/runs/<run id>/invocations/<invocation id>/settlement" in ROUTES
    assert "GET /console/runs/<run id>/invocations/<invocation id>/payloads" in CONSOLE_ROUTES
    assert "POST /console/runs/<run id>/invocations/<invocation id>/payloads" in CONSOLE_ROUTES
    # A route for every method (the console's redirect from /console) is not listed.
    assert described([ExactRoute("/x", lambda request: None)]) == ()
