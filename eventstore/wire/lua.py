"""The one loader of the Lua scripts (``eventstore`` and ``projections``) and their wrappers' base.

A script is ``<package>/scripts/<name>.lua``. A line ``-- @include <part>`` is replaced
by ``<part>.lua`` of the same folder, or by a part the package generates (the lifecycle
tables), so code shared by scripts is written once. Sources are read with
``importlib.resources`` and registered once per client; redis-py's ``Script`` is called
by SHA and reloaded when the server answers NOSCRIPT (the batcher does the same).

Each script has one typed wrapper, a :class:`LuaScript` subclass in the module that
loads it. A script's KEYS and ARGV are declared once, in order, as two ``NamedTuple``
classes (and one for each repeated group); the wrapper's :class:`Layout` is derived
from them, and so is the packing: :meth:`LuaScript.arguments` lays the tuples' values
out in their declared order, so no list of names or positions is written twice. The
wrapper's call turns the reply into a typed value and refusals into typed exceptions. A
test checks every script's header against its wrapper's layout.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any, ClassVar, Final, Generic, NamedTuple, TypeVar

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.typing import EncodableT, KeyT

from eventstore.wire.batching import call_script

_INCLUDE: Final = re.compile(r"^-- @include (\w+)$", re.MULTILINE)

#: How a wrapper sends a call: :func:`~eventstore.wire.batching.call_script` (alone) or a
#: batcher's ``call`` (sharing a round trip with its event-loop turn).
ScriptCall = Callable[[AsyncScript, Sequence[KeyT], Iterable[EncodableT]], Awaitable[Any]]
#: A script call's KEYS and ARGV, in the order of the script's header.
KeysAndArgs = tuple[list[str], list[EncodableT]]
#: The declaration of some of a script's positions: a ``NamedTuple`` class (its fields, in
#: order, name the positions), or the names themselves.
Declared = type[tuple[Any, ...]] | tuple[str, ...]
#: A script's fixed KEYS and its fixed ARGV, each one ``NamedTuple`` declaring them.
KeysT = TypeVar("KeysT", bound=tuple[Any, ...])
ArgvT = TypeVar("ArgvT", bound=tuple[Any, ...])


class Nothing(NamedTuple):
    """The declaration of a script that has no fixed KEYS, or no fixed ARGV."""


#: The one value of :class:`Nothing`.
NOTHING: Final = Nothing()
#: A repeated group of field/value pairs (a hash's fields), passed flat.
FIELD_VALUE: Final = ("field", "value")


def names(declared: Declared) -> tuple[str, ...]:
    """The position names a declaration lists, in order."""
    if isinstance(declared, tuple):
        return declared
    fields: tuple[str, ...] = getattr(declared, "_fields")  # noqa: B009 (a NamedTuple class)
    return fields


def flat(items: Iterable[Iterable[Any]]) -> list[Any]:
    """The values of repeated groups, one group after another, as a script reads them."""
    return [value for item in items for value in item]


@dataclass(frozen=True, slots=True)
class Layout:
    """A script's KEYS and ARGV, in order, as its header lists them.

    Attributes:
        keys: the names of ``KEYS[1]``, ``KEYS[2]`` ...
        argv: the names of ``ARGV[1]``, ``ARGV[2]`` ...
        key_groups: groups repeated after the fixed keys, in order (each a tuple of
            names, e.g. a batch's position and feed of each shard).
        argv_groups: groups repeated after the fixed arguments (e.g. field/value pairs).

    """

    keys: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()
    key_groups: tuple[tuple[str, ...], ...] = ()
    argv_groups: tuple[tuple[str, ...], ...] = ()

    @classmethod
    def of(
        cls,
        keys: Declared = Nothing,
        argv: Declared = Nothing,
        *,
        key_groups: Sequence[Declared] = (),
        argv_groups: Sequence[Declared] = (),
    ) -> Layout:
        """The layout that the declarations of a script's positions list, in order."""
        return cls(
            keys=names(keys),
            argv=names(argv),
            key_groups=tuple(names(group) for group in key_groups),
            argv_groups=tuple(names(group) for group in argv_groups),
        )


@dataclass(frozen=True)
class ScriptFolder:
    """The ``scripts`` folder of one package, with the parts the package generates.

    Args:
        package: the package holding ``scripts/*.lua``.
        generated: included parts that are not files, by name, each a function
            returning Lua source (called once).

    """

    package: str
    generated: Mapping[str, Callable[[], str]] = field(default_factory=dict)

    def __hash__(self) -> int:
        return hash(self.package)

    def source(self, name: str) -> str:
        """Return the source of ``<name>.lua`` with every ``-- @include`` replaced."""
        return _source(self, name)

    def part(self, name: str) -> str:
        """Return one included part: generated, else ``<name>.lua`` as it is."""
        if name in self.generated:
            return self.generated[name]()
        return resources.files(self.package).joinpath("scripts", f"{name}.lua").read_text("utf-8")


@cache
def _source(folder: ScriptFolder, name: str) -> str:
    return _INCLUDE.sub(lambda match: folder.part(match.group(1)), folder.part(name))


class LuaScript(Generic[KeysT, ArgvT]):
    """One script registered on one client, and the path its calls take.

    Subclasses name their script (``name``), are parametrized by the ``NamedTuple``
    classes declaring its fixed KEYS and ARGV, derive their ``layout`` from those
    declarations (:meth:`Layout.of`) and provide a typed call.
    """

    name: ClassVar[str]
    layout: ClassVar[Layout]

    @classmethod
    def arguments(
        cls,
        keys: KeysT,
        argv: ArgvT,
        group_keys: Iterable[str] = (),
        group_args: Iterable[EncodableT] = (),
    ) -> KeysAndArgs:
        """KEYS and ARGV of one call: the declared values in their declared order.

        ``group_keys`` and ``group_args`` are the repeated groups' values, already in
        order (:func:`flat` lays out a sequence of group tuples).
        """
        return [*keys, *group_keys], [*argv, *group_args]

    def __init__(self, client: Redis, folder: ScriptFolder, call: ScriptCall = call_script) -> None:
        self.script: AsyncScript = client.register_script(folder.source(self.name))
        self._call = call

    @property
    def sha(self) -> str:
        """The SHA the script is called by."""
        return str(self.script.sha)

    @property
    def source(self) -> str:
        """The script's source as sent to Redis (includes resolved)."""
        source = self.script.script
        return source.decode() if isinstance(source, bytes) else str(source)
