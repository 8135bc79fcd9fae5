"""Identifier rules: which run ids, tool call ids and tool names the store accepts.

Unsafe ids are refused, never rewritten and never replaced by a generated id.

- **Tool call ids** are the framework's own id, kept exactly: any string of 1 to
  :data:`MAX_TOOL_CALL_ID_BYTES` UTF-8 bytes without whitespace, control characters or
  lone surrogates (so it is valid UTF-8). ``functions.get_weather:0``,
  ``call_…__thought__<base64>``, ``_x``, ``-x`` and ids holding ``:``, braces or glob
  characters all pass; the key layout (:mod:`eventstore.wire.keys`) puts the id last in every
  key, so any of them sits in a key unambiguously.
- **Run ids** stay key-safe, because other key components and ``run:call`` pairs are
  split at the first ``:`` after them: 1 to :data:`MAX_ID_LENGTH` characters of
  ``A-Z a-z 0-9 . _ -``, not starting with ``.`` (so ``.`` and ``..`` never name a run,
  also not as a URL path segment).
- **Tool names** follow the MCP rule: 1 to :data:`MAX_TOOL_NAME_LENGTH` characters of
  ``A-Z a-z 0-9 _ - .``.
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import Final, TypeGuard

#: Longest run id accepted, in characters (all allowed characters are ASCII, so also bytes).
MAX_ID_LENGTH: Final = 128
#: Longest tool call id accepted, in UTF-8 bytes.
MAX_TOOL_CALL_ID_BYTES: Final = 512
#: Longest tool name accepted, in characters (ASCII).
MAX_TOOL_NAME_LENGTH: Final = 128

_RUN_ID = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9._\-]{0,127}")
# \s is every character str.isspace() names (Unicode whitespace); \x00-\x1f and \x7f-\x9f
# are the control characters (category Cc); \ud800-\udfff the surrogates, which a str can
# hold but UTF-8 cannot encode.
_TOOL_CALL_ID = re.compile(r"[^\s\x00-\x1f\x7f-\x9f\ud800-\udfff]+")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
_INVOCATION_ID = re.compile(r"[0-9a-f]{64}")
# Below this many characters even four-byte characters stay within the byte limit.
_SHORT_ENOUGH: Final = MAX_TOOL_CALL_ID_BYTES // 4


def is_run_id(value: object) -> TypeGuard[str]:
    """Tell whether ``value`` may be used as a run id (key-safe: no ``:``, braces, spaces)."""
    return isinstance(value, str) and _RUN_ID.fullmatch(value) is not None


def is_tool_call_id(value: object) -> TypeGuard[str]:
    """Tell whether ``value`` is an acceptable framework tool call id.

    Accepted: a str of 1 to 512 UTF-8 bytes with no whitespace, no control character and
    no lone surrogate. Everything else (also bytes and other non-str values) is refused.
    """
    if not isinstance(value, str) or _TOOL_CALL_ID.fullmatch(value) is None:
        return False
    # No surrogate is left, so encoding cannot fail.
    return len(value) <= _SHORT_ENOUGH or len(value.encode()) <= MAX_TOOL_CALL_ID_BYTES


def is_tool_name(value: object) -> bool:
    """Tell whether ``value`` is an acceptable tool name (the MCP rule)."""
    return isinstance(value, str) and _TOOL_NAME.fullmatch(value) is not None


def is_invocation_id(value: object) -> bool:
    """Tell whether ``value`` looks like an invocation id: 64 lowercase hex digits."""
    return isinstance(value, str) and _INVOCATION_ID.fullmatch(value) is not None


@functools.lru_cache(maxsize=256)
def invocation_id(run_id: str, tool_call_id: str) -> str:
    """Return the public invocation id: SHA-256 of run id, a NUL, and the tool call id."""
    # Memoized: one tool call asks for its id several times (its log lines, its record,
    # its reply) within microseconds; a small cache answers all but the first.
    return hashlib.sha256(f"{run_id}\0{tool_call_id}".encode()).hexdigest()
