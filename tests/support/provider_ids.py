"""Tool call ids as the providers publish them, and the unsafe values that stay refused.

One table for the unit, integration and cluster tests: every accepted id must reach the
record, the key, the cluster slot and replay exactly as sent.
"""

from __future__ import annotations

import base64
from typing import Final

# LiteLLM's Gemini 3 ids carry the thought signature: call_<32 hex>__thought__<base64>.
_SIGNATURE: Final = base64.b64encode(bytes((i * 37 + 11) % 256 for i in range(176))).decode()
GEMINI_3: Final = f"call_{'5f1c' * 8}__thought__{_SIGNATURE}"
#: 127 four-byte characters and two two-byte ones: exactly 512 UTF-8 bytes.
LONGEST_MULTIBYTE: Final = "\U0001f980" * 127 + "é" * 2

#: Accepted ids, by the shape they stand for.
ACCEPTED: Final[dict[str, str]] = {
    "openai-chat": "call_9pw1qnYScqvGrCH58HWCvFH6",
    "openai-responses": "fc_67ca09c5efe0819096d0511c92b8c890096610f474011cc0",
    "anthropic": "toolu_01A09q90qw90lq917835lq9",
    "anthropic-vertex": "toolu_vrtx_01XyZ7qW3eRtYuIoPaSdFgHj",
    "bedrock": "tooluse_kZJMlvQmRJ6eAyJE5GIl7Q",
    "deepseek": "call_0_3f6bdf4b-8bd0-4a43-9e6b-1f5d8a7d4e2c",
    "vllm": "chatcmpl-tool-4f6c9a0d8e2b4c1a9f3e7d5b6a8c0e12",
    "mistral-9": "D681PevKs",
    "kimi": "functions.get_weather:0",
    "kimi-two-digit": "functions.search_docs:12",
    "gemini-3": GEMINI_3,
    "ends-in-ev": "call_1:ev",
    "is-just-ev": ":ev",
    "braces": "call_{s00}_x}{",
    "glob-characters": "call*?[a-z]\\x",
    "underscore-first": "_call_1",
    "dash-first": "-call-1",
    "colon-first-and-last": ":call:",
    "longest-multibyte": LONGEST_MULTIBYTE,
}

#: Refused values (INVALID_TOOL_CALL_ID), by what is wrong with them.
REFUSED: Final[dict[str, object]] = {
    "empty": "",
    "513-bytes": "a" * 513,
    "513-bytes-multibyte": "é" * 256 + "a",
    "space": "call 1",
    "only-spaces": "   ",
    "tab": "call\t1",
    "newline": "call_1\n",
    "carriage-return": "call\r1",
    "nul": "call\x001",
    "escape": "call\x1b[31m",
    "delete": "call\x7f",
    "c1-control": "call\x9b1",
    "no-break-space": "call\xa01",
    "line-separator": "call\u20281",
    "ideographic-space": "call\u30001",
    "lone-surrogate": "call_\ud800",
    "none": None,
    "int": 7,
    "bytes": b"call_1",
    "list": ["call_1"],
}
