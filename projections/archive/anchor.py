"""Signed checkpoints of the archive: a Merkle root over its chain heads, signed with Ed25519.

An invocation's chain head is the hash of its last event; each event names the hash of
the one before, so a head commits to the whole journal. A run's head is the SHA-256 of
its invocations' ids, versions and heads (sorted by invocation id); the checkpoint's root
is a Merkle tree over the runs' heads (sorted by run id). :func:`make_anchor` computes
them over the events archived up to a cutoff and signs the result;
:func:`verify_anchor` recomputes them from the archive and says, run by run, what no
longer matches: an event rewritten (its chain breaks, or its head changes), an event
removed or added before the cutoff, a run gone (or pruned by retention). The checkpoint
file is kept elsewhere (another disk, another operator); whoever can rewrite the archive
cannot rewrite it without the private key.
"""

from __future__ import annotations

import base64
import hashlib
from collections import defaultdict
from collections.abc import Sequence
from typing import Final

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from eventstore.audit.journal import verify_fields
from eventstore.errors import CanonError
from machine.events import GENESIS_HASH, decode_event
from projections.archive.store import Archive, now_ms

#: The checkpoint file's format marker.
ANCHOR_FORMAT: Final = "canon.archive-anchor.v1"


class AnchorError(CanonError):
    """Raised when a checkpoint file cannot be read, or its key cannot be used."""


class AnchoredRun(msgspec.Struct, frozen=True, array_like=True):
    """One run in a checkpoint: its id, its head, its invocations and last activity."""

    run_id: str
    head: str
    invocations: int
    updated_at_ms: int


class Anchor(msgspec.Struct, frozen=True, kw_only=True):
    """A signed checkpoint of one namespace of the archive."""

    format: str
    namespace: str
    created_at_ms: int
    cutoff_ms: int
    root: str
    runs: list[AnchoredRun]
    key_id: str
    public_key: str
    signature: str = ""


class AnchorProblem(msgspec.Struct, frozen=True, kw_only=True):
    """One run of a checkpoint that the archive no longer matches, and why."""

    run_id: str
    reason: str


class AnchorReport(msgspec.Struct, frozen=True, kw_only=True):
    """What checking the archive against a checkpoint found.

    ``signature_valid`` says the checkpoint was signed by the key it names (and by the
    trusted key, when one was given); ``root_valid`` that its runs give its root.
    ``pruned`` counts runs gone by retention (older than its horizon), not problems.
    """

    signature_valid: bool
    trusted_key: bool
    root_valid: bool
    runs: int
    pruned: int
    problems: list[AnchorProblem]

    @property
    def intact(self) -> bool:
        """The checkpoint is authentic and the archive still holds what it signed."""
        return self.signature_valid and self.root_valid and not self.problems


def _sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def merkle_root(leaves: Sequence[bytes]) -> str:
    """The Merkle root of ``leaves`` (0x00/0x01 prefixed, an odd node carried up)."""
    level = [_sha(b"\x00" + leaf) for leaf in leaves]
    if not level:
        return _sha(b"").hex()
    while len(level) > 1:
        level = [
            _sha(b"\x01" + level[i] + level[i + 1]) if i + 1 < len(level) else level[i]
            for i in range(0, len(level), 2)
        ]
    return level[0].hex()


def _leaf(run: AnchoredRun) -> bytes:
    return run.run_id.encode() + b"\x00" + bytes.fromhex(run.head)


def run_head(heads: Sequence[tuple[str, int, str]]) -> str:
    """A run's head: SHA-256 over its invocations' (id, version, head), sorted by id."""
    digest = hashlib.sha256(b"canon.run-head.v1\n")
    for inv_id, version, head in sorted(heads):
        digest.update(f"{inv_id} {version} {head}\n".encode())
    return digest.hexdigest()


def _message(anchor: Anchor) -> bytes:
    """The bytes a checkpoint's signature covers."""
    return "\n".join(
        (
            anchor.format,
            anchor.namespace,
            str(anchor.created_at_ms),
            str(anchor.cutoff_ms),
            anchor.root,
            str(len(anchor.runs)),
            anchor.key_id,
        )
    ).encode()


def key_id(public: Ed25519PublicKey) -> str:
    """A short, stable name of a public key: its SHA-256, first 16 hex digits."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def new_key() -> tuple[bytes, bytes]:
    """A new Ed25519 key pair as PEM: (private, public)."""
    private = Ed25519PrivateKey.generate()
    return (
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )


def load_private_key(pem: bytes) -> Ed25519PrivateKey:
    """An Ed25519 private key from PEM.

    Raises:
        AnchorError: not an unencrypted Ed25519 private key in PEM.

    """
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError):
        raise AnchorError("the key file is not an unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise AnchorError("the key file is not an Ed25519 key")
    return key


def load_public_key(pem: bytes) -> Ed25519PublicKey:
    """An Ed25519 public key from PEM (a private key's public half too).

    Raises:
        AnchorError: not an Ed25519 key in PEM.

    """
    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError):
        return load_private_key(pem).public_key()
    if not isinstance(key, Ed25519PublicKey):
        raise AnchorError("the public key file is not an Ed25519 key")
    return key


async def _heads(
    archive: Archive, cutoff_ms: int, run_ids: Sequence[str] | None = None
) -> tuple[dict[str, list[tuple[str, int, str]]], list[AnchorProblem]]:
    """Each run's invocation heads over the events archived up to ``cutoff_ms``.

    Each journal's chain is checked on the way (every event names the hash of the bytes
    before it, from the genesis hash); a broken one is a problem of its run.
    """
    params: list[object] = [archive.namespace, cutoff_ms]
    where = ""
    if run_ids is not None:
        where = f" AND i.run_id IN ({', '.join('?' for _ in run_ids)})"
        params += list(run_ids)
    rows = await archive.database.fetch(
        "SELECT i.run_id, e.invocation_id, e.version, e.data FROM events e "
        "JOIN invocations i ON i.namespace = e.namespace AND i.invocation_id = e.invocation_id "
        f"WHERE e.namespace = ? AND e.archived_at_ms <= ?{where} "
        "ORDER BY i.run_id, e.invocation_id, e.version",
        params,
    )
    heads: dict[str, list[tuple[str, int, str]]] = defaultdict(list)
    problems: list[AnchorProblem] = []
    journal: list[tuple[int, bytes]] = []
    current: tuple[str, str] | None = None

    def close() -> None:
        if current is None or not journal:
            return
        run_id, inv_id = current
        previous = GENESIS_HASH
        for position, (version, data) in enumerate(journal, start=1):
            try:
                event = decode_event(data)
                linked = event.version == position == version and event.prev_hash == previous
            except msgspec.DecodeError:
                linked = False
            if not linked:
                problems.append(AnchorProblem(run_id=run_id, reason=f"broken_chain:{inv_id}"))
                break
            previous = hashlib.sha256(data).hexdigest()
        heads[run_id].append((inv_id, len(journal), previous))

    for run_id, inv_id, version, data in rows:
        if current != (run_id, inv_id):
            close()
            current, journal = (str(run_id), str(inv_id)), []
        journal.append((int(version), bytes(data)))
    close()
    return heads, problems


async def make_anchor(
    archive: Archive, private_key: Ed25519PrivateKey, *, settle_ms: int = 10_000
) -> Anchor:
    """A signed checkpoint of the archive's heads, over what was archived ``settle_ms`` ago.

    The cutoff lies ``settle_ms`` in the past so that no transaction still committing
    rows stamped before it can change what the checkpoint covers.
    """
    created = now_ms()
    cutoff = created - settle_ms
    heads, _ = await _heads(archive, cutoff)
    updated = {
        str(run_id): int(at)
        for run_id, at in await archive.database.fetch(
            "SELECT run_id, updated_at_ms FROM runs WHERE namespace = ?", (archive.namespace,)
        )
    }
    runs = [
        AnchoredRun(run_id, run_head(found), len(found), updated.get(run_id, cutoff))
        for run_id, found in sorted(heads.items())
    ]
    public = private_key.public_key()
    unsigned = Anchor(
        format=ANCHOR_FORMAT,
        namespace=archive.namespace,
        created_at_ms=created,
        cutoff_ms=cutoff,
        root=merkle_root([_leaf(run) for run in runs]),
        runs=runs,
        key_id=key_id(public),
        public_key=base64.b64encode(
            public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        ).decode(),
    )
    signature = private_key.sign(_message(unsigned))
    return msgspec.structs.replace(unsigned, signature=base64.b64encode(signature).decode())


def encode_anchor(anchor: Anchor) -> bytes:
    """A checkpoint as its file's bytes (JSON)."""
    return msgspec.json.format(msgspec.json.encode(anchor), indent=1)


def decode_anchor(data: bytes) -> Anchor:
    """A checkpoint from its file's bytes.

    Raises:
        AnchorError: not a checkpoint of this format.

    """
    try:
        anchor = msgspec.json.decode(data, type=Anchor)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise AnchorError("the file is not an archive checkpoint") from None
    if anchor.format != ANCHOR_FORMAT:
        raise AnchorError("the file is not an archive checkpoint of a known format")
    return anchor


async def verify_anchor(
    archive: Archive,
    anchor: Anchor,
    *,
    trusted: Ed25519PublicKey | None = None,
    retention_ms: int | None = None,
) -> AnchorReport:
    """Check the archive against a checkpoint: its signature, its root, then every run.

    Args:
        archive: the archive (namespace ``anchor.namespace``).
        anchor: the checkpoint.
        trusted: the public key the checkpoint must be signed with (else the key it
            names is used, which proves integrity since, not authorship).
        retention_ms: the archive's retention; a missing run whose last activity is
            older than it was pruned, not removed.

    """
    try:
        embedded = Ed25519PublicKey.from_public_bytes(base64.b64decode(anchor.public_key))
        signature = base64.b64decode(anchor.signature)
    except ValueError:
        embedded, signature = None, b""
    key = trusted or embedded
    signed = False
    if key is not None and key_id(key) == anchor.key_id:
        try:
            key.verify(signature, _message(anchor))
            signed = True
        except InvalidSignature:
            signed = False
    root_valid = merkle_root([_leaf(run) for run in anchor.runs]) == anchor.root
    heads, chain_problems = await _heads(
        archive, anchor.cutoff_ms, [run.run_id for run in anchor.runs] or [""]
    )
    problems = list(chain_problems)
    pruned = 0
    horizon = now_ms() - retention_ms if retention_ms is not None else None
    for run in anchor.runs:
        found = heads.get(run.run_id)
        if found is None:
            if horizon is not None and run.updated_at_ms < horizon:
                pruned += 1
            else:
                problems.append(AnchorProblem(run_id=run.run_id, reason="run_missing"))
        elif run_head(found) != run.head:
            reason = "invocation_missing" if len(found) < run.invocations else "head_changed"
            if len(found) > run.invocations:
                reason = "invocation_added"
            problems.append(AnchorProblem(run_id=run.run_id, reason=reason))
    problems += await _record_problems(archive, [run.run_id for run in anchor.runs])
    return AnchorReport(
        signature_valid=signed,
        trusted_key=trusted is not None,
        root_valid=root_valid,
        runs=len(anchor.runs),
        pruned=pruned,
        problems=problems,
    )


async def _record_problems(archive: Archive, run_ids: Sequence[str]) -> list[AnchorProblem]:
    """Each archived record of the runs judged against its archived journal."""
    problems: list[AnchorProblem] = []
    for run_id in run_ids:
        for call in await archive.tool_call_ids(run_id):
            found = await archive.invocation(run_id, call)
            if found is None:
                continue
            record = {name.decode(): value for name, value in found.fields.items()}
            problems += [
                AnchorProblem(run_id=run_id, reason=f"{reason}@{found.invocation_id}")
                for reason in verify_fields(record, found.events)
            ]
    return problems
