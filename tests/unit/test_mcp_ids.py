"""Fallback tool call ids and JSON-RPC ids: distinct by type and value, always accepted."""

from __future__ import annotations

from canon.integrations.mcp import fallback_call_id
from canon.mcp_proxy.relay import is_request_id
from machine.ids import is_tool_call_id


def test_integer_and_string_ids_of_the_same_digits_are_two_calls() -> None:
    """``502`` and ``"502"`` (and ``"s502"``) never share a tool call id."""
    ids = {
        fallback_call_id("c0", 502),
        fallback_call_id("c0", "502"),
        fallback_call_id("c0", "s502"),
    }
    assert len(ids) == 3
    assert fallback_call_id("c0", 502) == "mcp-c0-502"


def test_any_string_id_gives_an_accepted_tool_call_id() -> None:
    """Spaces, control characters or long strings are hashed, never refused."""
    for request_id in ("a b", "\x00", "é" * 300, "", "x" * 64):
        assert is_tool_call_id(fallback_call_id("c0", request_id))
    assert fallback_call_id("c0", "a b") != fallback_call_id("c0", "a  b")


def test_json_rpc_ids_are_strings_or_integers_but_not_booleans() -> None:
    """MCP's RequestId: a string or an integer; ``true``, ``1.5``, ``null`` are not ids."""
    assert is_request_id(0) and is_request_id("") and is_request_id(-3)
    assert not any(is_request_id(value) for value in (True, 1.5, None, [1], {}))
