"""The legacy schema 0 ``Failed`` shape the test fixtures store, and its upcaster.

No release of canon ever stored it: it stands for "an event written by an older writer"
in the golden histories and the replay and upcasting tests, so its upcaster lives here,
registered (once) when the test session starts (``tests/conftest.py``).
"""

from __future__ import annotations

from typing import Final

from machine.upcasting import JSONObject, register_upcaster, registered_upcasters

#: Schema of the legacy ``Failed`` shape.
LEGACY_FAILED_SCHEMA: Final = 0


def failed_code_to_error_code(obj: JSONObject) -> JSONObject:
    """Schema 0 ``Failed`` named its stable code ``code``; schema 1 calls it ``error_code``.

    Schema 0 also had no ``rejected_bytes``; the current default (``null``) applies.
    """
    if "code" in obj and "error_code" not in obj:
        obj["error_code"] = obj.pop("code")
    return obj


def register_legacy_upcaster() -> None:
    """Register the schema 0 ``Failed`` upcaster, unless it already is."""
    if ("Failed", LEGACY_FAILED_SCHEMA) not in registered_upcasters():
        register_upcaster("Failed", LEGACY_FAILED_SCHEMA)(failed_code_to_error_code)
