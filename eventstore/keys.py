"""Every Redis key the store uses, and the only code that formats one.

All keys of one run share the run's shard hash tag, so one script can touch a run's
record, stream, counters, progress list and the shard feed atomically, also on a cluster.

=================================== ====== ======================== =======================
key                                 type   written by               TTL
=================================== ====== ======================== =======================
``{ns}:meta``                       hash   check_namespace, rebuild none (namespace config)
``{ns}:{sNN}:ctl``                  hash   ``Store.set_paused``     none (one per shard)
``{ns}:{sNN}:run:<run>``            hash   open_run.lua, create.lua deadline + record TTL
``{ns}:{sNN}:inv:<run>:<call>``     hash   create.lua, append.lua   record TTL, set once
``{ns}:{sNN}:inv:<run>:<call>:ev``  stream create.lua, append.lua   same instant as record
``{ns}:{sNN}:progress:<run>``       list   append.lua (terminal)    the run's expiry
``{ns}:{sNN}:feed``                 stream create.lua, append.lua   trimmed by age, watermark-safe
``{ns}:{sNN}:receipt:<invocation>`` hash   receipt worker           the record's expiry
``{ns}:{sNN}:rview:<run>``          hash   progress worker          the run's expiry
``{ns}:{sNN}:pos:<group>``          hash   projection workers       none (per-shard cursor)
``{ns}:{sNN}:dead``                 stream projection workers       trimmed by length
``{ns}:{sNN}:fail:<group>:<entry>`` hash   projection workers       the feed's retention
=================================== ====== ======================== =======================

``fail:`` holds the last failure reason of one delivered feed entry (written when a
handling attempt fails), so whichever consumer finally dead-letters it can say why.

Projection outputs rebuilt by ``canon rebuild`` live beside the first ones, at
``receipt.g<N>:`` and ``rview.g<N>:``; the namespace metadata names the generation
readers use (``generation:<projection>``) and the consumer group of generation N > 1 is
``<projection>.g<N>``.

Every method that puts a run id or a tool call id into a key checks it first
(:func:`machine.ids.is_safe_id`: no ``:``, braces, whitespace or control characters, at
most 128 characters), so no key can be confused with another; an unsafe id raises
:class:`~eventstore.errors.InvalidArgument` before any command is sent, and is never
rewritten. :meth:`Keys.invocation` builds all the keys of one write with each id checked
once, for the writer's hot path.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from functools import lru_cache

from eventstore.errors import InvalidArgument
from machine.ids import is_invocation_id, is_safe_id

DEFAULT_NAMESPACE = "canon"
DEFAULT_SHARDS = 16


def generation_kind(kind: str, generation: int) -> str:
    """Return the key kind of a projection's output at ``generation`` (1 is the plain kind).

    ``canon rebuild`` writes a projection into a new generation beside the current one;
    the generation number in the kind keeps their keys apart.
    """
    if generation < 1:
        raise ValueError("generation must be at least 1")
    return kind if generation == 1 else f"{kind}.g{generation}"


def _safe(value: str, what: str) -> str:
    """Return ``value`` if it is a safe id; the error names the kind of id, never its text."""
    if not is_safe_id(value):
        raise InvalidArgument(f"{what} is not a safe id")
    return value


def shard_of(run_id: str, shards: int) -> int:
    """Return the shard number of a run: CRC32 of its id modulo the shard count."""
    return zlib.crc32(run_id.encode()) % shards


@dataclass(frozen=True, slots=True)
class InvocationKeys:
    """Every key a write of one invocation passes to its script (see :meth:`Keys.invocation`).

    Attributes:
        record: the canonical record hash.
        stream: the invocation's event stream.
        feed: the feed of the run's shard.
        run: the run registry hash.
        control: the control hash of the run's shard.
        progress: the run's list of finished calls.

    """

    record: str
    stream: str
    feed: str
    run: str
    control: str
    progress: str


@dataclass(frozen=True, slots=True)
class Keys:
    """Key layout of one namespace with a fixed shard count."""

    namespace: str = DEFAULT_NAMESPACE
    shards: int = DEFAULT_SHARDS

    def __post_init__(self) -> None:
        if not is_safe_id(self.namespace) or len(self.namespace) > 32:
            raise ValueError("namespace must be a safe id of at most 32 characters")
        if not 1 <= self.shards <= 1024:
            raise ValueError("shards must be between 1 and 1024")

    def tag(self, shard: int) -> str:
        """Return the key prefix of one shard, hash tag included."""
        return f"{self.namespace}:{{s{shard:02d}}}"

    def tag_of(self, run_id: str) -> str:
        """Return the key prefix of the shard that owns ``run_id``.

        Raises:
            InvalidArgument: ``run_id`` is not a safe id (so is every key built on it).

        """
        return self.tag(shard_of(_safe(run_id, "run id"), self.shards))

    def invocation(self, run_id: str, tool_call_id: str) -> InvocationKeys:
        """Return every key a write of one invocation touches, each id checked once.

        Raises:
            InvalidArgument: ``run_id`` or ``tool_call_id`` is not a safe id.

        """
        if type(run_id) is str and type(tool_call_id) is str:
            # The writes of one invocation follow each other closely: build its keys once.
            return _invocation_keys(self, run_id, tool_call_id)
        return _build_invocation_keys(self, run_id, tool_call_id)  # refuses it

    def meta(self) -> str:
        """Namespace metadata (shard count, schema)."""
        return f"{self.namespace}:meta"

    def control(self, shard: int) -> str:
        """Per-shard control hash (the execution pause switch lives in every shard)."""
        return _control(self.tag(shard))

    def control_of(self, run_id: str) -> str:
        """Control hash of the shard that owns ``run_id``."""
        return _control(self.tag_of(run_id))

    def run(self, run_id: str) -> str:
        """Run registry hash: activity, deadline, budgets, counters, token hash."""
        return _run(self.tag_of(run_id), run_id)

    def record(self, run_id: str, tool_call_id: str) -> str:
        """Canonical record of one invocation.

        Raises:
            InvalidArgument: ``run_id`` or ``tool_call_id`` is not a safe id.

        """
        return _record(self.tag_of(run_id), run_id, _safe(tool_call_id, "tool call id"))

    def stream(self, run_id: str, tool_call_id: str) -> str:
        """Event stream of one invocation."""
        return _stream(self.record(run_id, tool_call_id))

    def progress(self, run_id: str) -> str:
        """Ordered canonical identities of a run's finished calls."""
        return _progress(self.tag_of(run_id), run_id)

    def feed(self, shard: int) -> str:
        """Shard feed: one small entry per committed event (the outbox)."""
        return _feed(self.tag(shard))

    def feed_of(self, run_id: str) -> str:
        """Feed of the shard that owns ``run_id``."""
        return self.feed(shard_of(run_id, self.shards))

    def receipt(self, run_id: str, invocation_id: str, generation: int = 1) -> str:
        """Materialized receipt of one invocation (in its run's shard), per generation.

        Raises:
            InvalidArgument: ``run_id`` is not a safe id or ``invocation_id`` is not 64
                lowercase hex digits.

        """
        if not is_invocation_id(invocation_id):
            raise InvalidArgument("invocation id is not 64 lowercase hex digits")
        return f"{self.tag_of(run_id)}:{generation_kind('receipt', generation)}:{invocation_id}"

    def run_view(self, run_id: str, generation: int = 1) -> str:
        """Materialized progress view of one run, per generation."""
        return f"{self.tag_of(run_id)}:{generation_kind('rview', generation)}:{run_id}"

    def position(self, shard: int, projection: str) -> str:
        """Per-shard position of one projection (last applied feed entry id)."""
        return f"{self.tag(shard)}:pos:{projection}"

    def dead_letters(self, shard: int) -> str:
        """Dead-letter stream of one shard."""
        return f"{self.tag(shard)}:dead"

    def failure(self, shard: int, projection: str, entry_id: str) -> str:
        """Last failure reason of one feed entry in one projection (``entry_id``: a stream id).

        Raises:
            InvalidArgument: ``entry_id`` is not a stream entry id (``<ms>-<seq>``).

        """
        ms, _, seq = entry_id.partition("-")
        if not (ms.isascii() and ms.isdigit() and seq.isascii() and seq.isdigit()):
            raise InvalidArgument("entry id is not a stream entry id")
        return f"{self.tag(shard)}:fail:{projection}:{entry_id}"

    def scan_pattern(self, kind: str) -> str:
        """SCAN MATCH pattern for one kind of key across all shards (``inv``, ``run``...)."""
        return f"{self.namespace}:{{s*}}:{kind}:*"


# One formatter per key kind, shared by the checked methods above and by
# Keys.invocation, so a layout change cannot make the two disagree.
def _control(tag: str) -> str:
    return f"{tag}:ctl"


def _run(tag: str, run_id: str) -> str:
    return f"{tag}:run:{run_id}"


def _record(tag: str, run_id: str, tool_call_id: str) -> str:
    return f"{tag}:inv:{run_id}:{tool_call_id}"


def _stream(record: str) -> str:
    return f"{record}:ev"


def _progress(tag: str, run_id: str) -> str:
    return f"{tag}:progress:{run_id}"


def _feed(tag: str) -> str:
    return f"{tag}:feed"


def _build_invocation_keys(keys: Keys, run_id: str, tool_call_id: str) -> InvocationKeys:
    tag = keys.tag_of(run_id)
    record = _record(tag, run_id, _safe(tool_call_id, "tool call id"))
    return InvocationKeys(
        record=record,
        stream=_stream(record),
        feed=_feed(tag),
        run=_run(tag, run_id),
        control=_control(tag),
        progress=_progress(tag, run_id),
    )


# A refused id raises, and lru_cache keeps no exception: it is checked every time.
_invocation_keys = lru_cache(maxsize=4096)(_build_invocation_keys)
