"""Turning Redis reply values into Python values: the one place that decodes them.

The store's clients run with ``decode_responses=False`` (payloads are bytes, and must stay
bytes), so every reply value that is text (a stream id, a group name, a setting, a script
digest) arrives as bytes, or as ``str`` or ``int`` from some commands and from RESP3.
"""

from __future__ import annotations


def reply_text(value: object, errors: str = "strict") -> str:
    """Return a reply value as text: bytes decoded as UTF-8, anything else by ``str``.

    ``errors="replace"`` is for text shown to a person (a status report), where a stray
    byte must not stop the report.

    Raises:
        UnicodeDecodeError: the bytes are not UTF-8 (a reply that should be text is not),
            with the default ``errors``.

    """
    return value.decode("utf-8", errors) if isinstance(value, bytes) else str(value)
