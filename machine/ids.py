"""Identifier rules: which run ids, tool call ids and tool names may reach a Redis key.

Unsafe ids are refused, never rewritten and never replaced by a generated id.
"""

from __future__ import annotations

import hashlib
import re

#: Longest id accepted, in characters (all allowed characters are ASCII, so also bytes).
MAX_ID_LENGTH = 128

# No ':' (key separator), no braces (cluster hash tags), no whitespace or control chars.
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]*")
_TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}")
_INVOCATION_ID = re.compile(r"[0-9a-f]{64}")


def is_safe_id(value: object) -> bool:
    """Tell whether ``value`` may be used as a run id or a framework tool call id."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_ID_LENGTH
        and _SAFE_ID.fullmatch(value) is not None
    )


def is_tool_name(value: object) -> bool:
    """Tell whether ``value`` is an acceptable tool name."""
    return isinstance(value, str) and _TOOL_NAME.fullmatch(value) is not None


def is_invocation_id(value: object) -> bool:
    """Tell whether ``value`` looks like an invocation id: 64 lowercase hex digits."""
    return isinstance(value, str) and _INVOCATION_ID.fullmatch(value) is not None


def invocation_id(run_id: str, tool_call_id: str) -> str:
    """Return the public invocation id: SHA-256 of run id, a NUL, and the tool call id."""
    return hashlib.sha256(f"{run_id}\0{tool_call_id}".encode()).hexdigest()
