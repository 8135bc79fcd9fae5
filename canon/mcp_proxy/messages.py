"""JSON-RPC as the proxy reads and writes it: codes, frames, limits, ids, encoding.

A host's frame is checked before it is parsed, in the order that costs least: its size
(the line or body was already bounded while it was read), its nesting depth (a scan over
its brackets outside strings, no parse), its encoding (UTF-8), then its JSON and its shape.
Each refusal is a JSON-RPC error naming the limit and the flag that raises it, answered
with the request's id whenever one can be read, even from a frame refused unparsed
(:func:`salvage_id`), so a host never waits on a request the proxy dropped.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from eventstore.errors import CanonError

#: Not JSON.
PARSE_ERROR: Final = -32700
#: JSON, but not a JSON-RPC 2.0 request or notification MCP accepts.
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
#: The upstream is not running (it exited, or is being restarted).
UPSTREAM_UNAVAILABLE: Final = -32001
#: A message over one of the proxy's size limits.
TOO_LARGE: Final = -32002

#: The 2026-07-28 per-request ``_meta`` keys a host sends and the proxy mirrors upstream.
PROTOCOL_VERSION_KEY: Final = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_KEY: Final = "io.modelcontextprotocol/clientCapabilities"
CLIENT_INFO_KEY: Final = "io.modelcontextprotocol/clientInfo"
ENVELOPE_KEYS: Final = (PROTOCOL_VERSION_KEY, CLIENT_CAPABILITIES_KEY, CLIENT_INFO_KEY)

Message = dict[str, Any]

# A JSON string (escapes included), so the brackets inside strings are not counted.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(value for value in range(256) if value not in b"[]{}")
_INNERMOST = re.compile(rb"\[\]|\{\}")
# The id among the first members of a frame too large to parse: ``{"jsonrpc":"2.0",
# "method":"...","id":...`` as every client writes it (a later id is not looked for).
_LEADING_ID = re.compile(
    rb'^\s*\{(?:\s*"(?:jsonrpc|method)"\s*:\s*"[^"\\]{0,200}"\s*,)*\s*"id"\s*:\s*'
    rb'(-?\d{1,18}(?![\d.eE])|"[A-Za-z0-9_.:\-]{0,200}")'
)


class FrameRefused(CanonError):
    """Raised when a host frame is refused before it is parsed (size, depth, encoding).

    Attributes:
        code: the JSON-RPC error code.
        message: the error message (names the limit and its flag).
        request_id: the frame's id when one could be read, else None.

    """

    def __init__(self, code: int, message: str, request_id: Any = None) -> None:
        """Keep the answer's parts."""
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


def is_request_id(value: Any) -> bool:
    """Whether ``value`` is a JSON-RPC id MCP accepts: a string or an integer (not a bool)."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def error_response(request_id: Any, code: int, message: str) -> Message:
    """A JSON-RPC error response."""
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def nested_deeper_than(data: bytes, limit: int) -> bool:
    """Whether the JSON text ``data`` nests arrays and objects deeper than ``limit``.

    No parse: the brackets outside strings are kept and the innermost pairs removed, at
    most ``limit`` times (each pass is one regular-expression scan in C). Brackets that do
    not pair up are left for the parser to refuse as not JSON.
    """
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    for _ in range(limit):
        if not brackets:
            return False
        fewer = _INNERMOST.sub(b"", brackets)
        if len(fewer) == len(brackets):
            return False
        brackets = fewer
    return bool(brackets)


def salvage_id(prefix: bytes) -> Any:
    """The id of a frame read only in part (its first bytes), or None."""
    match = _LEADING_ID.match(prefix)
    if match is None:
        return None
    return json.loads(match.group(1))


def decode_frame(data: bytes, *, max_depth: int, depth_flag: str) -> Any:
    """One host frame (bounded already) as JSON, or :class:`FrameRefused`.

    Raises:
        FrameRefused: nested deeper than ``max_depth`` (-32600 naming ``depth_flag``), not
            UTF-8 or not JSON (-32700).

    """
    if nested_deeper_than(data, max_depth):
        raise FrameRefused(
            INVALID_REQUEST,
            f"Invalid Request: nested deeper than {max_depth} levels; raise {depth_flag}",
            salvage_id(data[:4096]),
        )
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise FrameRefused(PARSE_ERROR, "Parse error", salvage_id(data[:4096])) from None


def encode(message: Message) -> bytes:
    """One message as one line of UTF-8 JSON (a lone surrogate written as its escape)."""
    try:
        return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
    except UnicodeEncodeError:
        # A host may send "\ud800" (valid JSON, not encodable as UTF-8): echo it escaped.
        return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def envelope_of(params: Any) -> dict[str, Any] | None:
    """The 2026-07-28 per-request ``_meta`` envelope of ``params``, when it has one."""
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get(PROTOCOL_VERSION_KEY), str):
        return None
    return {key: meta[key] for key in ENVELOPE_KEYS if key in meta}
