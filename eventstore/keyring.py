"""The keyring: the master keys that wrap each run's data key (payloads encrypted at rest).

A keyring is a set of 256-bit AES keys, each under a short id (``k1``, ``2026-12`` ...),
one of them current: the current key wraps the data key of every run that starts
writing payloads from now on; the others still unwrap the runs they wrapped, until
``canon keys rewrap`` moves those runs to the current key.

Its file is JSON (``canon keys new`` writes one)::

    {"current": "k1", "keys": {"k1": "<32 bytes, base64>"}}

``CANON_KEYS`` names such a file, or holds the JSON itself. No message of this module,
and no ``repr``, contains a key's bytes.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from eventstore.errors import CanonError

__all__ = ["KEYS_ENV", "Keyring", "KeyringError", "UnknownKey", "load_keyring", "new_keyring_text"]

#: The environment variable the commands read a keyring from (a file path, or the JSON).
KEYS_ENV: Final = "CANON_KEYS"
#: Bytes of a master key and of a run's data key: AES-256.
KEY_BYTES: Final = 32
#: Bytes of an AES-GCM nonce (random per encryption).
NONCE_BYTES: Final = 12
#: What a key id may be: short, printable, no separator of the wrapped key's layout.
_KEY_ID: Final = re.compile(r"[A-Za-z0-9_.-]{1,32}")
#: Separates a wrapped data key's master key id from its bytes (never in a key id).
WRAP_SEPARATOR: Final = b":"


class KeyringError(CanonError):
    """Raised when a keyring cannot be loaded or is not valid (never naming key bytes)."""


class UnknownKey(CanonError):
    """Raised when a run's data key is wrapped by a master key this keyring does not hold.

    Attributes:
        key_id: the master key id the run's data key names.

    """

    def __init__(self, key_id: str) -> None:
        super().__init__(f"payloads are encrypted with key {key_id}, which the keyring lacks")
        self.key_id = key_id


class Keyring:
    """Master keys by id, one of them current (the one that wraps new runs' data keys)."""

    __slots__ = ("_ciphers", "current")

    def __init__(self, keys: Mapping[str, bytes], current: str) -> None:
        """A keyring of ``keys`` (id → 32 bytes) whose ``current`` key wraps new data keys.

        Raises:
            KeyringError: no keys, a key id that is not 1 to 32 of ``A-Z a-z 0-9 _ . -``,
                a key that is not 32 bytes, or ``current`` not among the ids.

        """
        if not keys:
            raise KeyringError("the keyring holds no keys")
        for key_id, key in keys.items():
            if not _KEY_ID.fullmatch(key_id):
                raise KeyringError("a key id must be 1 to 32 of A-Z a-z 0-9 _ . -")
            if len(key) != KEY_BYTES:
                raise KeyringError(f"key {key_id} is not {KEY_BYTES} bytes (AES-256)")
        if current not in keys:
            raise KeyringError("the current key id is not one of the keyring's keys")
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keys.items()}
        #: The id of the key that wraps new runs' data keys.
        self.current = current

    def __repr__(self) -> str:
        return f"Keyring(current={self.current!r}, key_ids={sorted(self._ciphers)!r})"

    @property
    def key_ids(self) -> list[str]:
        """The ids of the keys held, sorted."""
        return sorted(self._ciphers)

    def wrap(self, data_key: bytes, context: bytes) -> bytes:
        """``data_key`` encrypted by the current key, bound to ``context`` (its run).

        The result is ``<key id>:<nonce><ciphertext and tag>``: the master key id stays
        readable beside it, so a reader without the keyring can say which key it needs.
        """
        nonce = secrets.token_bytes(NONCE_BYTES)
        sealed = self._ciphers[self.current].encrypt(nonce, data_key, context)
        return self.current.encode() + WRAP_SEPARATOR + nonce + sealed

    def unwrap(self, wrapped: bytes, context: bytes) -> bytes:
        """The data key ``wrapped`` holds, checked against ``context`` (its run).

        Raises:
            UnknownKey: it names a master key this keyring does not hold.
            KeyringError: it does not authenticate (tampered, moved from another run, or
                a different key under the same id).

        """
        key_id = wrapped_key_id(wrapped)
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise UnknownKey(key_id)
        body = wrapped[len(key_id) + 1 :]
        try:
            return cipher.decrypt(body[:NONCE_BYTES], body[NONCE_BYTES:], context)
        except InvalidTag:
            raise KeyringError(
                f"the run's data key does not open with key {key_id}: a wrong key under"
                " that id, or the wrapped key was altered"
            ) from None

    @classmethod
    def from_json(cls, text: str) -> Keyring:
        """A keyring from its JSON text (the layout in the module docstring).

        Raises:
            KeyringError: not that JSON, or a key that is not base64 of 32 bytes.

        """
        try:
            document = json.loads(text)
        except ValueError:
            raise KeyringError("the keyring is not JSON") from None
        if not isinstance(document, dict):
            raise KeyringError('the keyring must be a JSON object {"current": ..., "keys": ...}')
        current, keys = document.get("current"), document.get("keys")
        if not isinstance(current, str) or not isinstance(keys, dict):
            raise KeyringError('the keyring needs "current" (a key id) and "keys" (id: base64)')
        decoded: dict[str, bytes] = {}
        for key_id, value in keys.items():
            if not isinstance(value, str):
                raise KeyringError("each key must be a base64 string")
            try:
                decoded[str(key_id)] = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise KeyringError("a key is not valid base64") from None
        return cls(decoded, current)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Keyring:
        """A keyring read from the JSON file at ``path``.

        Raises:
            KeyringError: the file cannot be read, or does not hold a valid keyring.

        """
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            raise KeyringError("the keyring file cannot be read") from None
        return cls.from_json(text)


def wrapped_key_id(wrapped: bytes) -> str:
    """The master key id a wrapped data key names (``""`` when it names none)."""
    key_id, separator, _ = wrapped.partition(WRAP_SEPARATOR)
    return key_id.decode("ascii", "replace") if separator else ""


def load_keyring(spec: str | None = None) -> Keyring | None:
    """The keyring ``spec`` (default: ``CANON_KEYS``) gives: inline JSON, or a file path.

    None when neither is set: payloads are then stored as given.

    Raises:
        KeyringError: the keyring cannot be read or is not valid.

    """
    value = os.environ.get(KEYS_ENV) if spec is None else spec
    if not value:
        return None
    if value.lstrip().startswith("{"):
        return Keyring.from_json(value)
    return Keyring.from_file(value)


def new_keyring_text(key_id: str = "k1", existing: str | None = None) -> str:
    """The JSON of a keyring with a fresh random 256-bit key ``key_id``, made current.

    ``existing``: the JSON of a keyring to add the key to (rotation: its keys stay, for
    the runs they wrapped); None starts a new keyring.

    Raises:
        KeyringError: ``key_id`` is not a valid key id or is taken, or ``existing`` is
            not a valid keyring.

    """
    if not _KEY_ID.fullmatch(key_id):
        raise KeyringError("a key id must be 1 to 32 of A-Z a-z 0-9 _ . -")
    keys: dict[str, str] = {}
    if existing is not None:
        Keyring.from_json(existing)  # refuses an invalid one before anything is written
        keys = dict(json.loads(existing)["keys"])
        if key_id in keys:
            raise KeyringError(f"the keyring already holds a key {key_id}")
    keys[key_id] = base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()
    return json.dumps({"current": key_id, "keys": keys}, indent=2) + "\n"
