"""Every Redis key the store uses, and the only code that formats one.

All keys of one run share the run's shard hash tag, so one script can touch a run's
record, stream, counters, progress list and the shard feed atomically, also on a cluster.

=================================== ====== ======================== ==========================
key                                 type   written by               TTL
=================================== ====== ======================== ==========================
``{ns}:meta``                       hash   check_namespace, rebuild none (namespace config)
``{ns}:{sNN}:ctl``                  hash   ``Store.set_paused``     none (one per shard)
``{ns}:{sNN}:run:<run>``            hash   open_run.lua, create.lua deadline + record TTL
``{ns}:{sNN}:runs``                 zset   open_run.lua             its latest run's expiry
``{ns}:{sNN}:inv:<run>:<call>``     hash   create.lua, append.lua   record TTL, set once
``{ns}:{sNN}:ev:<run>:<call>``      stream create.lua, append.lua   same instant as record
``{ns}:{sNN}:progress:<run>``       list   append.lua (terminal)    the run's expiry
``{ns}:{sNN}:refusals:<run>``       stream create.lua, refuse.lua   the run's expiry, set at each
                                                                write; trimmed by count
``{ns}:{sNN}:feed``                 stream create.lua, append.lua   trimmed by age, watermark-safe
``{ns}:{sNN}:receipt:<inv id>``     hash   receipt worker           the record's expiry
``{ns}:{sNN}:rview:<run>``          hash   progress worker          the run's expiry
``{ns}:{sNN}:pos:<group>``          hash   projection workers       none (per-shard cursor)
``{ns}:{sNN}:dead``                 stream projection workers       trimmed by length
``{ns}:{sNN}:fail:<group>:<entry>`` hash   projection workers       the feed's retention
=================================== ====== ======================== ==========================

A run hash may hold ``data_key``: the run's data key wrapped by a master key
(``data_key.lua`` creates it once, ``rewrap_key.lua`` re-wraps it, ``erase.lua`` deletes
it; :mod:`eventstore.sealing`).

A run hash maps ``inv:<invocation id>`` to ``<tool call id> <event id>``: the call's id and
its first event's id, remembered for the run's whole life (:func:`registered_call_id`
reads the call id back). The event id tells a creation resent after its record expired
(a retry of a timed-out write) from a second call of the same id.

``refusals:`` is the run's bounded refusal log: one entry per call turned away before
any record existed (``at`` ms, ``tool`` when a tool name, ``call`` when an acceptable
tool call id else ``call_bytes``, ``code``), counted per code in the run hash
(``refused:<code>``); written only while the run hash exists.

``fail:`` holds the last failure reason of one delivered feed entry (written when a
handling attempt fails), so whichever consumer finally dead-letters it can say why.

Projection outputs rebuilt by ``canon rebuild`` live beside the first ones, at
``receipt.g<N>:`` and ``rview.g<N>:``; the namespace metadata names the generation
readers use (``generation:<projection>``) and the consumer group of generation N > 1 is
``<projection>.g<N>``.

**Ids in keys.** A run id (:func:`machine.ids.is_run_id`: no ``:``, braces, whitespace or
control characters) comes right after the kind; a tool call id
(:func:`machine.ids.is_tool_call_id`: up to 512 UTF-8 bytes, ``:``, braces and glob
characters allowed) is always the last component, so a key (and a ``run:call`` progress
item, :func:`split_identity`) splits at the first ``:`` after the run id, and the first
``{...}`` is the shard tag. An unacceptable id raises
:class:`~eventstore.errors.InvalidArgument` before any command is sent, never rewritten.
Parsing a SCANned key back into its ids lives here too, beside the formatting it inverts.

**Across namespaces.** No key lists a server's namespaces (a registry would be a key
outside every namespace, which a user limited to its own namespace's keys could not
write). A namespace that holds runs has run hashes and run indexes, so
:data:`RUNS_OF_ANY_NAMESPACE` (a SCAN MATCH pattern) finds them in every namespace, and
:func:`run_key_of_any_namespace` names the namespace (and run) of each: key names only,
no key of another namespace is read.

**Layouts.** ``{ns}:meta`` field ``layout`` names the namespace's key layout, written
when it is created with its shard count; neither ever changes. :data:`LAYOUT` (3) is the
one above with balanced shard tags: ``{sNN}`` stands for ``{sNN.<suffix>}``, the suffix
chosen once per shard (:func:`balanced_tag`, fixed for 48 shards in
:data:`BALANCED_TAGS_48`) so that the tags' hash slots are evenly spaced over the 16384
slots, and a cluster whose masters own equal contiguous slot ranges serves equal shares
of shards. :data:`PLAIN_TAG_LAYOUT` (2) is the same with plain ``{sNN}`` tags. Metadata
with a shard count but no layout means :data:`LEGACY_LAYOUT` (1): plain tags, and the
stream is ``<record key>:ev``; it accepts no tool call id holding ``:`` (an id ending in
``:ev`` would make its record look like another call's stream). All three are read and
written here.
"""

from __future__ import annotations

import binascii
import re
import zlib
from dataclasses import dataclass
from functools import lru_cache
from itertools import count, product
from typing import Final, Literal

from eventstore.errors import InvalidArgument
from machine.ids import is_invocation_id, is_run_id, is_tool_call_id

DEFAULT_NAMESPACE = "canon"
#: Shard count of a new namespace: 48 shards split evenly over 3, 4, 6, 8, 12, 16, 24 or
#: 48 equal masters (docs/cluster.md, "Sizing").
DEFAULT_SHARDS = 48
#: The key layout this version writes; recorded in ``{ns}:meta`` when a namespace is created.
LAYOUT: Final = 3
#: Layout 2: plain shard tags ``{sNN}``, whose hash slots fall where CRC16 puts them.
PLAIN_TAG_LAYOUT: Final = 2
#: The layout of a namespace whose metadata records none: the stream is ``<record>:ev``.
LEGACY_LAYOUT: Final = 1
#: Every layout this version reads and writes.
LAYOUTS: Final = (LEGACY_LAYOUT, PLAIN_TAG_LAYOUT, LAYOUT)
#: Hash slots of a Redis Cluster.
SLOTS: Final = 16384
#: The hash tag (between the braces) of shard ``k`` of :data:`DEFAULT_SHARDS` in
#: :data:`LAYOUT`: ``balanced_tags(48)``, fixed here so that no change of the search can
#: move a namespace's keys (a test recomputes it and checks the slots' spacing).
# fmt: off
BALANCED_TAGS_48: Final = (
    # Generated by balanced_tag(k, 48) for k in 0..47; slot k is near (2k + 1) * 16384 / 96.
    "s00.x", "s01.18", "s02.0k", "s03.0d", "s04.5", "s05.2u", "s06.0c", "s07.2w",
    "s08.k", "s09.h", "s10.6i", "s11.23", "s12.8", "s13.24", "s14.7", "s15.0",
    "s16.h", "s17.0z", "s18.18", "s19.j", "s20.0d", "s21.0k", "s22.6h", "s23.31",
    "s24.q", "s25.2f", "s26.31", "s27.4s", "s28.r", "s29.34", "s30.b", "s31.4w",
    "s32.2i", "s33.2b", "s34.2c", "s35.0s", "s36.1", "s37.0m", "s38.p", "s39.w",
    "s40.0f", "s41.2k", "s42.0y", "s43.2", "s44.2h", "s45.2c", "s46.23", "s47.19",
)
# fmt: on

_NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]{0,31}")
#: SCAN MATCH pattern of every run hash (``run:<run>``) and run index (``runs``), in every
#: namespace; a superset: :func:`run_key_of_any_namespace` tells them from the rest.
RUNS_OF_ANY_NAMESPACE: Final = "*:{s*}:run*"
#: A shard's hash tag in any layout: ``{s07}``, or ``{s07.x3}`` in :data:`LAYOUT`.
_TAG = r"\{s\d+(?:\.[0-9a-z]+)?\}"
_RUN_KEY_OF_ANY_NAMESPACE = re.compile(rf"({_NAMESPACE.pattern}):{_TAG}:run(?:s|:(.+))", re.DOTALL)
#: The suffixes :func:`balanced_tags` tries, in order: base 36, shortest first.
_SUFFIX_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
# Redis SCAN MATCH patterns give these characters a meaning; a backslash quotes one.
_GLOB = re.compile(r"([*?\[\]\\])")


def generation_kind(kind: str, generation: int) -> str:
    """Return the key kind of a projection's output at ``generation`` (1 is the plain kind).

    ``canon rebuild`` writes a projection into a new generation beside the current one;
    the generation number in the kind keeps their keys apart.
    """
    if generation < 1:
        raise InvalidArgument("generation must be at least 1")
    return kind if generation == 1 else f"{kind}.g{generation}"


def escape_glob(text: str) -> str:
    """Return ``text`` as a SCAN MATCH pattern that matches exactly ``text``."""
    return _GLOB.sub(r"\\\1", text)


def run_key_of_any_namespace(key: bytes | str) -> tuple[str, str | None] | None:
    """Read a key found with :data:`RUNS_OF_ANY_NAMESPACE`: ``(namespace, run_id)``.

    The run id is None for a shard's run index (the namespace holds runs). None for any
    other key: another kind that only looks like one, or a name no namespace can have.
    """
    text = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
    match = _RUN_KEY_OF_ANY_NAMESPACE.fullmatch(text)
    if match is None:
        return None
    namespace, run_id = match.groups()
    if run_id is not None and not is_run_id(run_id):
        return None
    return namespace, run_id


def split_identity(identity: str) -> tuple[str, str]:
    """Split a ``run:call`` item of a progress list into run id and tool call id.

    Run ids hold no ``:``, so the first ``:`` is the separator, whatever the call id holds.
    """
    run_id, _, tool_call_id = identity.partition(":")
    return run_id, tool_call_id


def registered_call_id(entry: bytes) -> str:
    """Return the tool call id of a run hash's ``inv:`` entry (``<call id> <event id>``).

    Tool call ids hold no whitespace, so the first space ends the id; an entry written
    before the event id was kept beside it is the call id alone.
    """
    return entry.partition(b" ")[0].decode()


def _run_id(value: str) -> str:
    """Return ``value`` if it is a run id; the error names the kind of id, never its text."""
    if not is_run_id(value):
        raise InvalidArgument("run id is not a safe id")
    return value


def key_slot(tag: str) -> int:
    """Return the Redis Cluster hash slot of a hash tag (the text between the braces)."""
    return binascii.crc_hqx(tag.encode(), 0) % SLOTS


def balanced_tag(shard: int, shards: int) -> str:
    """Search the hash tag of ``shard`` of ``shards`` in :data:`LAYOUT`: ``sNN.<suffix>``.

    The target slot of shard ``k`` is the middle of the ``k``-th of ``shards`` equal
    slices of the 16384 slots; the tag is the first suffix (base 36, shortest first)
    whose slot lies within a quarter slice of it. So a cluster whose masters own equal
    contiguous slot ranges serves an equal number of shards each whenever the master
    count divides the shard count. Never change this search: a namespace's keys are named
    by it (:data:`BALANCED_TAGS_48` pins the default table).
    """
    target = (2 * shard + 1) * SLOTS // (2 * shards)
    tolerance = SLOTS // (4 * shards)
    for length in count(1):
        for digits in product(_SUFFIX_DIGITS, repeat=length):
            tag = f"s{shard:02d}.{''.join(digits)}"
            if abs(key_slot(tag) - target) <= tolerance:
                return tag
    raise AssertionError("unreachable")  # pragma: no cover


@lru_cache(maxsize=16)
def balanced_tags(shards: int) -> tuple[str, ...]:
    """Return the hash tag of every shard of ``shards`` in :data:`LAYOUT` (:func:`balanced_tag`)."""
    if shards == len(BALANCED_TAGS_48):
        return BALANCED_TAGS_48
    return tuple(balanced_tag(shard, shards) for shard in range(shards))


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
        refusals: the run's refusal log.

    """

    record: str
    stream: str
    feed: str
    run: str
    control: str
    progress: str
    refusals: str


@dataclass(frozen=True, slots=True)
class InvocationKey:
    """A record or stream key read back from Redis (see :meth:`Keys.parse_invocation_key`).

    Attributes:
        kind: ``record`` or ``stream``.
        run_id: the run id the key names.
        tool_call_id: the tool call id the key names.
        placed: the ids are acceptable and build exactly this key (in the run's shard).

    """

    kind: Literal["record", "stream"]
    run_id: str
    tool_call_id: str
    placed: bool


@dataclass(frozen=True, slots=True)
class Keys:
    """Key layout of one namespace with a fixed shard count, in one of :data:`LAYOUTS`."""

    namespace: str = DEFAULT_NAMESPACE
    shards: int = DEFAULT_SHARDS
    layout: int = LAYOUT

    def __post_init__(self) -> None:
        if not isinstance(self.namespace, str) or not _NAMESPACE.fullmatch(self.namespace):
            raise InvalidArgument("namespace must be a safe id of at most 32 characters")
        if not 1 <= self.shards <= 1024:
            raise InvalidArgument("shards must be between 1 and 1024")
        if self.layout not in LAYOUTS:
            raise InvalidArgument("unknown key layout")

    def accepts_tool_call_id(self, value: object) -> bool:
        """Tell whether ``value`` is a tool call id this layout can hold in a key.

        Every :func:`machine.ids.is_tool_call_id` in :data:`LAYOUT`; in
        :data:`LEGACY_LAYOUT` only those without ``:``.
        """
        return is_tool_call_id(value) and (self.layout != LEGACY_LAYOUT or ":" not in value)

    def tag(self, shard: int) -> str:
        """Return the key prefix of one shard, hash tag included.

        ``{sNN}`` in the older layouts; in :data:`LAYOUT` the balanced tag
        ``{sNN.<suffix>}`` (:func:`balanced_tags`), so the tags' slots are evenly spaced.
        """
        if self.layout == LAYOUT:
            return f"{self.namespace}:{{{balanced_tags(self.shards)[shard]}}}"
        return f"{self.namespace}:{{s{shard:02d}}}"

    def tag_of(self, run_id: str) -> str:
        """Return the key prefix of the shard that owns ``run_id``.

        Raises:
            InvalidArgument: ``run_id`` is not a run id (so is every key built on it).

        """
        return self.tag(shard_of(_run_id(run_id), self.shards))

    def invocation(self, run_id: str, tool_call_id: str) -> InvocationKeys:
        """Return every key a write of one invocation touches, each id checked once.

        Raises:
            InvalidArgument: ``run_id`` or ``tool_call_id`` is not acceptable.

        """
        if type(run_id) is str and type(tool_call_id) is str:
            # The writes of one invocation follow each other closely: build its keys once.
            return _invocation_keys(self, run_id, tool_call_id)
        return _build_invocation_keys(self, run_id, tool_call_id)  # refuses it

    def meta(self) -> str:
        """Namespace metadata (shard count, layout, projection generations)."""
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

    def run_index(self, shard: int) -> str:
        """The shard's runs, scored by open time (trimmed by ``open_run.lua``)."""
        return f"{self.tag(shard)}:runs"

    def record(self, run_id: str, tool_call_id: str) -> str:
        """Canonical record of one invocation.

        Raises:
            InvalidArgument: ``run_id`` or ``tool_call_id`` is not acceptable.

        """
        return _record(self.tag_of(run_id), run_id, self._tool_call_id(tool_call_id))

    def stream(self, run_id: str, tool_call_id: str) -> str:
        """Event stream of one invocation.

        Raises:
            InvalidArgument: ``run_id`` or ``tool_call_id`` is not acceptable.

        """
        tag, call = self.tag_of(run_id), self._tool_call_id(tool_call_id)
        return _stream(self.layout, tag, run_id, call)

    def progress(self, run_id: str) -> str:
        """Ordered canonical identities of a run's finished calls."""
        return _progress(self.tag_of(run_id), run_id)

    def refusals(self, run_id: str) -> str:
        """The run's refusal log: calls turned away before any record existed."""
        return _refusals(self.tag_of(run_id), run_id)

    def feed(self, shard: int) -> str:
        """Shard feed: one small entry per committed event (the outbox)."""
        return _feed(self.tag(shard))

    def feed_of(self, run_id: str) -> str:
        """Feed of the shard that owns ``run_id``."""
        return self.feed(shard_of(run_id, self.shards))

    def receipt(self, run_id: str, invocation_id: str, generation: int = 1) -> str:
        """Materialized receipt of one invocation (in its run's shard), per generation.

        Raises:
            InvalidArgument: ``run_id`` is not a run id or ``invocation_id`` is not 64
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
        """SCAN MATCH pattern for one kind of key across all shards (``inv``, ``run``...).

        In :data:`LEGACY_LAYOUT`, ``inv`` also matches the streams; see
        :meth:`invocation_scan_pattern` and :meth:`parse_invocation_key`.
        """
        return f"{self.namespace}:{{s*}}:{kind}:*"

    def run_id_of(self, key: bytes | str) -> str | None:
        """The run id of a run hash key matched by ``scan_pattern("run")``, else None."""
        text = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
        prefix, separator, run_id = text.rpartition(":run:")
        if not separator or not prefix.startswith(f"{self.namespace}:") or not is_run_id(run_id):
            return None
        return run_id

    def invocation_scan_pattern(self, run_id: str | None = None) -> str:
        """SCAN MATCH pattern for every record and stream key (of ``run_id`` if given).

        A superset at worst, never missing one: tell records from streams (and from a
        key that only looks like one) with :meth:`parse_invocation_key`.

        Raises:
            InvalidArgument: ``run_id`` is not a run id.

        """
        tag = "{s*}" if run_id is None else escape_glob(self.tag_of(run_id).split(":", 1)[1])
        run = "*" if run_id is None else f"{escape_glob(run_id)}:*"
        if self.layout == LEGACY_LAYOUT:
            return f"{self.namespace}:{tag}:inv:{run}"
        # inv and ev are the only kinds starting with "in" or "ev".
        return f"{self.namespace}:{tag}:[ie][nv]*:{run}"

    def parse_invocation_key(self, key: bytes | str) -> InvocationKey | None:
        """Read the kind and ids of a record or stream key of this namespace and layout.

        Returns None for any other key. A key that looks like one but whose ids are not
        acceptable, or that is not in the run's shard, comes back with ``placed`` False.
        """
        raw = key if isinstance(key, bytes) else key.encode("utf-8", "surrogatepass")
        match = _invocation_key_re(self.namespace).fullmatch(raw.decode("utf-8", "replace"))
        if match is None:
            return None
        kind_name, run_id, rest = match.groups()
        kind: Literal["record", "stream"] = "record" if kind_name == "inv" else "stream"
        tool_call_id = rest
        if self.layout == LEGACY_LAYOUT:
            if kind == "stream":
                return None  # no "ev:" kind in this layout
            if rest.endswith(":ev"):
                kind, tool_call_id = "stream", rest[: -len(":ev")]
        placed = is_run_id(run_id) and self.accepts_tool_call_id(tool_call_id)
        if placed:
            built = (self.record if kind == "record" else self.stream)(run_id, tool_call_id)
            placed = built.encode() == raw
        return InvocationKey(kind=kind, run_id=run_id, tool_call_id=tool_call_id, placed=placed)

    def record_ids(self, key: str | bytes) -> tuple[str, str] | None:
        """Return ``(run_id, tool_call_id)`` of a record key exactly as :meth:`record` builds it.

        None for anything else: a stream, a key of another kind or namespace, or a record
        key in a shard other than its run's.
        """
        parsed = self.parse_invocation_key(key)
        if parsed is None or parsed.kind != "record" or not parsed.placed:
            return None
        return parsed.run_id, parsed.tool_call_id

    def _tool_call_id(self, value: str) -> str:
        """Return ``value`` if this layout accepts it as a tool call id (error names no text)."""
        if not self.accepts_tool_call_id(value):
            raise InvalidArgument("tool call id is not a safe id")
        return value


@lru_cache(maxsize=64)
def _invocation_key_re(namespace: str) -> re.Pattern[str]:
    # The run id ends at the first ":" after the kind; the tool call id is all the rest.
    return re.compile(rf"{re.escape(namespace)}:{_TAG}:(inv|ev):([^:]*):(.*)", re.DOTALL)


# One formatter per key kind, shared by the checked methods above and by
# Keys.invocation, so a layout change cannot make the two disagree.
def _control(tag: str) -> str:
    return f"{tag}:ctl"


def _run(tag: str, run_id: str) -> str:
    return f"{tag}:run:{run_id}"


def _record(tag: str, run_id: str, tool_call_id: str) -> str:
    return f"{tag}:inv:{run_id}:{tool_call_id}"


def _stream(layout: int, tag: str, run_id: str, tool_call_id: str) -> str:
    if layout == LEGACY_LAYOUT:
        return f"{_record(tag, run_id, tool_call_id)}:ev"
    # A prefix variant of the record key: the tool call id stays last, so no id (not even
    # one ending in ":ev") can make a record key equal another call's stream key.
    return f"{tag}:ev:{run_id}:{tool_call_id}"


def _progress(tag: str, run_id: str) -> str:
    return f"{tag}:progress:{run_id}"


def _refusals(tag: str, run_id: str) -> str:
    return f"{tag}:refusals:{run_id}"


def _feed(tag: str) -> str:
    return f"{tag}:feed"


def _build_invocation_keys(keys: Keys, run_id: str, tool_call_id: str) -> InvocationKeys:
    tag = keys.tag_of(run_id)
    call = keys._tool_call_id(tool_call_id)
    return InvocationKeys(
        record=_record(tag, run_id, call),
        stream=_stream(keys.layout, tag, run_id, call),
        feed=_feed(tag),
        run=_run(tag, run_id),
        control=_control(tag),
        progress=_progress(tag, run_id),
        refusals=_refusals(tag, run_id),
    )


# A refused id raises, and lru_cache keeps no exception: it is checked every time.
_invocation_keys = lru_cache(maxsize=4096)(_build_invocation_keys)
