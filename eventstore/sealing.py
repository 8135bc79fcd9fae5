"""Payloads encrypted at rest: each run's data key, and the payload fields it seals.

With a keyring (:mod:`eventstore.keyring`), every payload field a writer stores (the
request, the raw response, the agent result, the failure detail, settlement evidence)
leaves the process sealed: AES-256-GCM under the run's data key, a random nonce per
value, the record field's name and the invocation id as associated data (so a value
moved to another field or another call does not open). A sealed value is
:data:`SEALED_PREFIX`, the nonce, then the ciphertext and its tag.

A run's data key is made by the first writer of its payloads, wrapped by the keyring's
current master key and kept on the run hash (``data_key``, created once by
``data_key.lua``); erasing the run deletes it. Sizes and digests are the plaintext's,
computed before sealing by the caller. Without a keyring nothing here is used.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Callable, Mapping
from typing import Final, TypeVar, cast

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from redis.asyncio import Redis

from eventstore.errors import CanonError, redis_errors
from eventstore.keyring import KEY_BYTES, NONCE_BYTES, Keyring, wrapped_key_id
from eventstore.wire.keys import Keys
from eventstore.wire.scripts import (
    DataKeyArgv,
    DataKeyKeys,
    DataKeyScript,
    RewrapKeyArgv,
    RewrapKeyKeys,
    RewrapKeyScript,
    Scripts,
)
from machine.events import PAYLOAD_FIELDS, payload_digest
from machine.ids import invocation_id

__all__ = [
    "DATA_KEY_FIELD",
    "SEALED_OVERHEAD",
    "SEALED_PREFIX",
    "KeyErased",
    "RunSeal",
    "SealBroken",
    "Seals",
    "is_sealed",
    "sealed_key_id",
]

#: Starts every sealed payload value: a NUL (no JSON text starts with one) and a version.
SEALED_PREFIX: Final = b"\x00cs1"
#: Bytes a sealed value adds to its plaintext: the prefix, the nonce and the GCM tag.
SEALED_OVERHEAD: Final = len(SEALED_PREFIX) + NONCE_BYTES + 16
#: The run hash field that keeps the run's wrapped data key.
DATA_KEY_FIELD: Final = "data_key"
#: Record fields that hold payloads (and so are sealed), as bytes and as text.
SEALED_FIELDS: Final = frozenset(PAYLOAD_FIELDS)
_SEALED_FIELD_BYTES: Final = frozenset(name.encode() for name in PAYLOAD_FIELDS)
#: SHA-256's block size: an HMAC key is padded to it.
_SHA256_BLOCK: Final = 64
#: Run data keys kept in memory per store (the oldest is dropped past it).
RUN_KEYS_KEPT: Final = 4096

_Name = TypeVar("_Name", str, bytes)

#: Random nonces drawn from the OS in one read, then handed out one by one: a system
#: call per sealed value would cost more than the encryption of 1 KiB.
_NONCES_PER_READ: Final = 256
_nonces: list[bytes] = []


def _forget_nonces() -> None:
    # A forked child must never hand out its parent's pending nonces (GCM under one key
    # with a repeated nonce loses confidentiality and authenticity).
    _nonces.clear()


os.register_at_fork(after_in_child=_forget_nonces)


def _nonce() -> bytes:
    """A fresh random 96-bit nonce (from the OS's random source)."""
    if not _nonces:
        pool = os.urandom(NONCE_BYTES * _NONCES_PER_READ)
        _nonces.extend(pool[i : i + NONCE_BYTES] for i in range(0, len(pool), NONCE_BYTES))
    return _nonces.pop()


class SealBroken(CanonError):
    """Raised when a sealed payload does not open: tampered, moved, or a wrong key.

    AES-GCM authenticates the value, its field and its invocation: garbage is never
    returned in its place.
    """


class KeyErased(CanonError):
    """Raised when a run's payloads are sealed and its data key is gone (erased, expired).

    Attributes:
        run_id: the run.

    """

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id}'s data key is gone (erased or expired)")
        self.run_id = run_id


def is_sealed(value: bytes | None) -> bool:
    """Whether a stored payload value is sealed (encrypted at rest)."""
    return value is not None and value.startswith(SEALED_PREFIX)


def sealed_size_matches(value: bytes, size: int | None) -> bool:
    """Whether sealed ``value`` holds a plaintext of ``size`` bytes (checked without a key)."""
    return size is not None and len(value) == size + SEALED_OVERHEAD


def sealed_key_id(wrapped: bytes | None) -> str | None:
    """The master key id a run's wrapped data key names, or None when it has none."""
    if wrapped is None:
        return None
    return wrapped_key_id(wrapped) or None


def _associated(field: str | bytes, invocation: str) -> bytes:
    """What a payload value is bound to: its record field and its invocation."""
    name = field if isinstance(field, bytes) else field.encode()
    return name + b"\x00" + invocation.encode()


def data_key_context(namespace: str, run_id: str) -> bytes:
    """What a run's wrapped data key is bound to: its namespace and run."""
    return b"canon data key\x00" + namespace.encode() + b"\x00" + run_id.encode()


class RunSeal:
    """One run's data key: seals and opens the payload values of its calls.

    Attributes:
        key_id: the master key id that wraps it ("" for a key nobody keeps).

    """

    __slots__ = ("_cipher", "_inner", "_outer", "key_id")

    def __init__(self, data_key: bytes, key_id: str) -> None:
        """Seal with ``data_key`` (32 bytes), wrapped by master key ``key_id``."""
        self._cipher = AESGCM(data_key)
        # A key of its own for the digests (never the data key itself): HKDF-SHA-256.
        digest_key = HKDF(
            algorithm=hashes.SHA256(), length=32, salt=None, info=b"canon payload digest v1"
        ).derive(data_key)
        # HMAC's two padded-key states (RFC 2104), hashed once: each digest then copies
        # them instead of building an HMAC object (a third of its cost per payload).
        padded = digest_key.ljust(_SHA256_BLOCK, b"\0")
        self._inner = hashlib.sha256(bytes(byte ^ 0x36 for byte in padded))
        self._outer = hashlib.sha256(bytes(byte ^ 0x5C for byte in padded))
        self.key_id = key_id

    def digest(self, payload: bytes) -> str:
        """The keyed digest of a payload of this run: HMAC-SHA-256, hex.

        What the events of an encrypted run name instead of a plain SHA-256, so that a
        short payload cannot be guessed from its digest by whoever reads the events.
        """
        inner = self._inner.copy()
        inner.update(payload)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.hexdigest()

    def seal(self, field: str | bytes, invocation: str, plaintext: bytes) -> bytes:
        """``plaintext`` of record field ``field`` of ``invocation``, sealed."""
        nonce = _nonce()
        sealed = self._cipher.encrypt(nonce, plaintext, _associated(field, invocation))
        return b"".join((SEALED_PREFIX, nonce, sealed))

    def open(self, field: str | bytes, invocation: str, value: bytes) -> bytes:
        """The plaintext of sealed ``value`` of record field ``field`` of ``invocation``.

        A value that is not sealed (written before a keyring was configured) is returned
        as stored.

        Raises:
            SealBroken: it does not authenticate (tampered, from another field or call,
                or sealed by another key).

        """
        if not value.startswith(SEALED_PREFIX):
            return value
        body = value[len(SEALED_PREFIX) :]
        try:
            return self._cipher.decrypt(
                body[:NONCE_BYTES], body[NONCE_BYTES:], _associated(field, invocation)
            )
        except InvalidTag:
            raise SealBroken(
                "an encrypted payload failed authentication (altered, moved or wrong key)"
            ) from None

    def open_fields(self, invocation: str, fields: Mapping[_Name, bytes]) -> dict[_Name, bytes]:
        """``fields`` (record fields by name) with every sealed payload field opened."""
        opened = dict(fields)
        for name, value in fields.items():
            if _is_payload_field(name) and value.startswith(SEALED_PREFIX):
                opened[name] = self.open(name, invocation, value)
        return opened


def _is_payload_field(name: str | bytes) -> bool:
    return name in _SEALED_FIELD_BYTES if isinstance(name, bytes) else name in SEALED_FIELDS


def has_sealed(fields: Mapping[_Name, bytes]) -> bool:
    """Whether any payload field of ``fields`` is sealed."""
    return any(
        _is_payload_field(name) and value.startswith(SEALED_PREFIX)
        for name, value in fields.items()
    )


class Seals:
    """The data keys of one namespace's runs, through one keyring (a per-store cache)."""

    def __init__(self, client: Redis, keys: Keys, scripts: Scripts, keyring: Keyring) -> None:
        """Read and create run data keys on ``client`` in ``keys``'s namespace."""
        self._client = client
        self._keys = keys
        self._script: DataKeyScript = scripts.data_key
        self._rewrap: RewrapKeyScript = scripts.rewrap_key
        #: The master keys.
        self.keyring = keyring
        self._runs: dict[str, RunSeal] = {}

    def _keep(self, run_id: str, seal: RunSeal) -> RunSeal:
        if len(self._runs) >= RUN_KEYS_KEPT:
            del self._runs[next(iter(self._runs))]
        self._runs[run_id] = seal
        return seal

    async def digest_for(self, run_id: str) -> Callable[[bytes], str]:
        """How the payload digests of a run's events are taken: keyed by its data key.

        A run that holds no data key (none of its payloads was written with a keyring, or
        it was erased) has plain SHA-256 digests.

        Raises:
            UnknownKey, KeyringError: its data key is wrapped by a key this keyring lacks,
                or does not open.
            StoreUnavailable: Redis failed or timed out.

        """
        try:
            seal = self._runs.get(run_id) or await self.for_reading(run_id)
        except KeyErased:
            return payload_digest
        return seal.digest

    def cached(self, run_id: str) -> RunSeal | None:
        """The run's seal if this store holds its data key already (no Redis call)."""
        return self._runs.get(run_id)

    def forget(self, run_id: str) -> None:
        """Drop a run's data key from memory (its erasure deleted it from Redis)."""
        self._runs.pop(run_id, None)

    async def for_writing(self, run_id: str) -> RunSeal:
        """The seal a run's payloads are written with: its data key, created if need be.

        A run that does not exist or was erased gets a key nobody keeps: what is sealed
        with it never opens (and its script refuses the write anyway).

        Raises:
            UnknownKey, KeyringError: the run's data key is wrapped by a key this keyring
                lacks, or does not open.
            StoreUnavailable: Redis failed or timed out.

        """
        seal = self._runs.get(run_id)
        if seal is not None:
            return seal
        context = data_key_context(self._keys.namespace, run_id)
        offered = self.keyring.wrap(secrets.token_bytes(KEY_BYTES), context)
        wrapped = await self._script(
            DataKeyScript.arguments(DataKeyKeys(self._keys.run(run_id)), DataKeyArgv(offered))
        )
        if wrapped is None:
            return RunSeal(secrets.token_bytes(KEY_BYTES), "")
        return self._keep(
            run_id, RunSeal(self.keyring.unwrap(wrapped, context), wrapped_key_id(wrapped))
        )

    async def for_reading(self, run_id: str) -> RunSeal:
        """The seal a run's stored payloads open with.

        Raises:
            KeyErased: the run holds no data key (erased, or the run expired).
            UnknownKey, KeyringError: its data key is wrapped by a key this keyring
                lacks, or does not open.
            StoreUnavailable: Redis failed or timed out.

        """
        seal = self._runs.get(run_id)
        if seal is not None:
            return seal
        async with redis_errors():
            wrapped = cast(
                bytes | None, await self._client.hget(self._keys.run(run_id), DATA_KEY_FIELD)
            )
        if wrapped is None:
            raise KeyErased(run_id)
        context = data_key_context(self._keys.namespace, run_id)
        return self._keep(
            run_id, RunSeal(self.keyring.unwrap(wrapped, context), wrapped_key_id(wrapped))
        )

    async def rewrap(self, run_id: str) -> bool | None:
        """Put a run's data key under the keyring's current master key; payloads untouched.

        True when re-wrapped, False when it already was under the current key, None when
        the run holds no data key (none written yet, erased, or expired).

        Raises:
            UnknownKey, KeyringError: its data key is wrapped by a key this keyring lacks,
                or does not open.
            StoreUnavailable: Redis failed or timed out.

        """
        run = self._keys.run(run_id)
        context = data_key_context(self._keys.namespace, run_id)
        while True:
            async with redis_errors():
                wrapped = cast(bytes | None, await self._client.hget(run, DATA_KEY_FIELD))
            if wrapped is None:
                return None
            if wrapped_key_id(wrapped) == self.keyring.current:
                return False
            again = self.keyring.wrap(self.keyring.unwrap(wrapped, context), context)
            if await self._rewrap(
                RewrapKeyScript.arguments(RewrapKeyKeys(run), RewrapKeyArgv(wrapped, again))
            ):
                self.forget(run_id)
                return True
            # Changed since it was read (another rewrap, or an erasure): read it again.

    async def open_fields(
        self, run_id: str, tool_call_id: str, fields: Mapping[_Name, bytes]
    ) -> dict[_Name, bytes]:
        """``fields`` of a call's record with its sealed payload fields opened.

        Raises:
            KeyErased, UnknownKey, KeyringError, SealBroken: a sealed field cannot be
                opened (never returned sealed or as garbage).
            StoreUnavailable: Redis failed or timed out.

        """
        if not has_sealed(fields):
            return dict(fields)
        seal = await self.for_reading(run_id)
        return seal.open_fields(invocation_id(run_id, tool_call_id), fields)
