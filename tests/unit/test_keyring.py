"""The keyring loads from a file or CANON_KEYS, refuses bad input with stable errors that
never show key bytes, and a run's seal opens only what it sealed for that field and call."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from eventstore.keyring import Keyring, KeyringError, UnknownKey, load_keyring, new_keyring_text
from eventstore.sealing import RunSeal, SealBroken, is_sealed

KEY = bytes(range(32))
KEY_B64 = base64.b64encode(KEY).decode()


def keyring_json(**override: object) -> str:
    document: dict[str, object] = {"current": "k1", "keys": {"k1": KEY_B64}}
    document.update(override)
    return json.dumps(document)


def test_a_keyring_loads_from_a_file_from_inline_json_and_from_canon_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file path, the JSON itself, or CANON_KEYS holding either; nothing set: None."""
    path = tmp_path / "keys.json"
    path.write_text(keyring_json())
    assert load_keyring(str(path)) is not None
    assert load_keyring(keyring_json()) is not None
    monkeypatch.setenv("CANON_KEYS", str(path))
    loaded = load_keyring()
    assert loaded is not None and loaded.current == "k1" and loaded.key_ids == ["k1"]
    monkeypatch.delenv("CANON_KEYS")
    assert load_keyring() is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not JSON"),
        ("[1]", "JSON object"),
        (keyring_json(current=None), '"current"'),
        (keyring_json(current="k9"), "current key id"),
        (keyring_json(keys={}), "no keys"),
        (keyring_json(keys={"k1": "!!!"}), "base64"),
        (keyring_json(keys={"k1": base64.b64encode(b"short").decode()}), "32 bytes"),
        (keyring_json(current="a:b", keys={"a:b": KEY_B64}), "key id"),
        (keyring_json(keys={"k1": 7}), "base64 string"),
    ],
)
def test_bad_keyrings_are_refused_with_a_clear_error(text: str, message: str) -> None:
    """Each mistake has its own message; none of them shows key material."""
    with pytest.raises(KeyringError, match=message) as raised:
        Keyring.from_json(text)
    assert KEY_B64 not in str(raised.value)


def test_an_unreadable_file_is_a_keyring_error(tmp_path: Path) -> None:
    with pytest.raises(KeyringError, match="cannot be read"):
        load_keyring(str(tmp_path / "missing.json"))


def test_no_repr_or_error_shows_key_bytes() -> None:
    keyring = Keyring.from_json(keyring_json())
    assert KEY_B64 not in repr(keyring) and repr(KEY) not in repr(keyring)
    wrapped = keyring.wrap(b"d" * 32, b"run-a")
    with pytest.raises(KeyringError) as raised:
        keyring.unwrap(wrapped, b"run-b")  # bound to its run
    assert KEY_B64 not in str(raised.value)


def test_a_wrapped_key_names_its_master_key_and_needs_it() -> None:
    """Wrapped by the current key; a keyring without that id says which key it lacks."""
    old = Keyring.from_json(keyring_json())
    wrapped = old.wrap(b"d" * 32, b"ctx")
    assert wrapped.startswith(b"k1:") and old.unwrap(wrapped, b"ctx") == b"d" * 32
    rotated = Keyring.from_json(new_keyring_text("k2", keyring_json()))
    assert rotated.current == "k2" and rotated.key_ids == ["k1", "k2"]
    assert rotated.unwrap(wrapped, b"ctx") == b"d" * 32
    other = Keyring.from_json(new_keyring_text("k2"))
    with pytest.raises(UnknownKey) as raised:
        other.unwrap(wrapped, b"ctx")
    assert raised.value.key_id == "k1" and "k1" in str(raised.value)


def test_a_new_key_id_must_be_new_and_valid() -> None:
    with pytest.raises(KeyringError, match="already holds"):
        new_keyring_text("k1", keyring_json())
    with pytest.raises(KeyringError, match="key id"):
        new_keyring_text("bad id")


def test_a_sealed_value_opens_only_for_its_field_and_invocation() -> None:
    """AES-GCM binds a value to its record field and its call: moved, altered or opened
    with another data key, it raises SealBroken, never garbage."""
    seal = RunSeal(b"k" * 32, "k1")
    sealed = seal.seal("request", "inv-1", b'{"q":"marker"}')
    assert is_sealed(sealed) and b"marker" not in sealed
    assert seal.open("request", "inv-1", sealed) == b'{"q":"marker"}'
    assert seal.seal("request", "inv-1", b"x") != seal.seal("request", "inv-1", b"x")
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    for field, invocation, value in [
        ("result", "inv-1", sealed),
        ("request", "inv-2", sealed),
        ("request", "inv-1", tampered),
    ]:
        with pytest.raises(SealBroken):
            seal.open(field, invocation, value)
    with pytest.raises(SealBroken):
        RunSeal(b"o" * 32, "k1").open("request", "inv-1", sealed)
    assert seal.open("request", "inv-1", b'{"plain":1}') == b'{"plain":1}'


def test_a_runs_keyed_digest_is_hmac_sha256_under_a_key_derived_from_its_data_key() -> None:
    """RFC 2104 HMAC-SHA-256 with the HKDF-derived key: never the plain SHA-256, and
    another run's data key gives another digest."""
    data_key = b"d" * 32
    derived = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=None, info=b"canon payload digest v1"
    ).derive(data_key)
    payload = b'{"q":"marker"}'
    seal = RunSeal(data_key, "k1")
    assert seal.digest(payload) == hmac.new(derived, payload, hashlib.sha256).hexdigest()
    assert seal.digest(payload) == seal.digest(payload)  # the padded states are copied
    assert seal.digest(payload) != hashlib.sha256(payload).hexdigest()
    assert RunSeal(b"e" * 32, "k1").digest(payload) != seal.digest(payload)
