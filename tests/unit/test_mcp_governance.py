"""Which upstream tools ``canon mcp-proxy --govern`` governs, and the console page URL."""

from __future__ import annotations

import pytest

from canon.command_errors import CommandError
from canon.commands.mcp_proxy_command import governance_of
from canon.integrations.mcp import console_base, console_call_url, pending_meta
from canon.mcp_proxy.relay import Governance
from eventstore.boundary.contracts import ApprovalPending
from eventstore.errors import InvalidArgument

READ_ONLY = {"name": "read", "annotations": {"readOnlyHint": True}}
WRITES = {"name": "write", "annotations": {"readOnlyHint": False, "destructiveHint": True}}
BARE = {"name": "bare"}
ONLY_OTHER_HINTS = {"name": "hinted", "annotations": {"idempotentHint": True}}
STRING_HINT = {"name": "stringy", "annotations": {"readOnlyHint": "true"}}
INVOCATION = "ab" * 32


def test_by_default_nothing_is_governed() -> None:
    assert not any(Governance().governs(t) for t in (READ_ONLY, WRITES, BARE, ONLY_OTHER_HINTS))


def test_annotations_govern_every_tool_not_marked_read_only() -> None:
    """Only ``readOnlyHint: true`` (the JSON boolean) runs ungoverned, as MCP reads hints."""
    governance = Governance(annotations=True)
    assert not governance.governs(READ_ONLY)
    assert all(governance.governs(t) for t in (WRITES, BARE, ONLY_OTHER_HINTS, STRING_HINT))


def test_names_govern_the_named_tools_whatever_their_annotations() -> None:
    governance = Governance(names=frozenset({"read", "bare"}))
    assert governance.governs(READ_ONLY) and governance.governs(BARE)
    assert not governance.governs(WRITES)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], Governance()),
        (["none"], Governance()),
        (["none", "none"], Governance()),
        (["annotations"], Governance(annotations=True)),
        (["a.b", "c_d"], Governance(names=frozenset({"a.b", "c_d"}))),
        (["annotations", "x"], Governance(annotations=True, names=frozenset({"x"}))),
    ],
)
def test_govern_flags(flags: list[str], expected: Governance) -> None:
    assert governance_of(flags) == expected


@pytest.mark.parametrize("flags", [["none", "annotations"], ["x", "none"], ["a b"], [""]])
def test_contradictory_or_bad_govern_flags_are_refused(flags: list[str]) -> None:
    with pytest.raises(CommandError) as refused:
        governance_of(flags)
    assert refused.value.exit_code == 2


@pytest.mark.parametrize(
    "given",
    [
        "http://127.0.0.1:8000",
        "http://127.0.0.1:8000/",
        "http://127.0.0.1:8000/console",
        "http://127.0.0.1:8000/console/",
    ],
)
def test_the_console_address_is_the_servers_root_or_its_console(given: str) -> None:
    assert console_base(given) == "http://127.0.0.1:8000"
    assert console_call_url(given, "run-1", INVOCATION) == (
        f"http://127.0.0.1:8000/console/runs/run-1/invocations/{INVOCATION}"
    )


def test_a_console_behind_a_path_keeps_its_path() -> None:
    assert console_call_url("https://ops.example.com/canon/console/", "r", INVOCATION) == (
        f"https://ops.example.com/canon/console/runs/r/invocations/{INVOCATION}"
    )


@pytest.mark.parametrize(
    "given",
    ["ftp://host", "javascript:alert(1)", "http://", "/console", "http://h/?a=1", "http://h/#x"],
)
def test_a_console_address_that_is_no_http_url_is_refused(given: str) -> None:
    with pytest.raises(InvalidArgument):
        console_base(given)


def test_the_pending_meta_names_the_page_only_with_a_console() -> None:
    pending = ApprovalPending(tool_call_id="c1", invocation_id=INVOCATION, approval_id="ap-1")
    assert pending_meta(pending, "r", None) == {"io.canon/approval_id": "ap-1"}
    assert pending_meta(pending, "r", "http://h:1") == {
        "io.canon/approval_id": "ap-1",
        "io.canon/console_url": f"http://h:1/console/runs/r/invocations/{INVOCATION}",
    }
