"""Each Lua script's KEYS/ARGV order is written once: its wrapper's layout, its header agrees."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any, get_args, get_origin

import pytest

from canon.bench import minimal as bench_scripts
from eventstore.wire import scripts as store_scripts
from eventstore.wire.lua import Layout, LuaScript, ScriptFolder
from projections import scripts as projection_scripts
from projections.scripts import (
    ReceiptArgs,
    ReceiptKeys,
    ReceiptPut,
    ShardKeys,
    SnapshotKeys,
    Unproduced,
    ViewArgs,
    ViewKeys,
    ViewPut,
)

FOLDERS: list[tuple[ScriptFolder, tuple[type[LuaScript], ...]]] = [
    (store_scripts.FOLDER, store_scripts.WRAPPERS),
    (projection_scripts.FOLDER, projection_scripts.WRAPPERS),
    (bench_scripts.FOLDER, bench_scripts.WRAPPERS),
]
WRAPPERS = [(folder, wrapper) for folder, wrappers in FOLDERS for wrapper in wrappers]

_FIXED = re.compile(r"\b(KEYS|ARGV)\[(\d+)\]\s+(\w+)")
_GROUP = re.compile(r"\b(KEYS|ARGV)\[([^\]\s]*\.\.[^\]\s]*)\]\s+\(([^)]*)\)\.\.\.")
_INCLUDE = re.compile(r"^-- @include (\w+)$", re.MULTILINE)


def _named(kind: Any) -> Any:
    """A ``kind`` tuple whose values are the names of the positions they fill."""
    return kind(*kind._fields)


def declared(wrapper: type[LuaScript[Any, Any]]) -> tuple[Any, Any]:
    """The two classes a wrapper is parametrized with: its KEYS and its ARGV declarations."""
    bases = [base for kind in wrapper.__mro__ for base in getattr(kind, "__orig_bases__", ())]
    keys, argv = get_args(next(base for base in bases if get_origin(base) is LuaScript))
    return keys, argv


#: A batch of one item and one entry settled without output, each value named after its
#: position, and what each batch script must be given for it.
_BATCHES = {
    "receipts_put": lambda script: script.batch(
        "group",
        "now_ms",
        [_named(ShardKeys)],
        [ReceiptPut(_named(ReceiptKeys), _named(ReceiptArgs))],
        [_named(Unproduced)],
    ),
    "views_put": lambda script: script.batch(
        "group",
        "now_ms",
        [_named(ShardKeys)],
        [ViewPut(_named(ViewKeys), _named(ViewArgs))],
        [_named(Unproduced)],
    ),
    "read_snapshots": lambda script: script.reading([_named(SnapshotKeys)], ["field"]),
}
#: Arguments a batch computes from its input (one shard, one item in the samples).
COUNTS = {"shards": 1, "items": 1}


def _file(folder: ScriptFolder, name: str) -> str:
    return resources.files(folder.package).joinpath("scripts", f"{name}.lua").read_text("utf-8")


def header_layout(text: str) -> Layout:
    """The layout a script's header lists: its leading comment, KEYS[i]/ARGV[i] lines."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        lines.append(line.removeprefix("--").strip())
    header = " ".join(lines)
    fixed: dict[str, list[str]] = {"KEYS": [], "ARGV": []}
    for kind, index, name in _FIXED.findall(header):
        assert int(index) == len(fixed[kind]) + 1, f"{kind}[{index}] is out of order"
        fixed[kind].append(name)
    groups: dict[str, list[tuple[str, ...]]] = {"KEYS": [], "ARGV": []}
    for kind, _, names in _GROUP.findall(header):
        groups[kind].append(tuple(name.strip() for name in names.split(",")))
    return Layout(
        keys=tuple(fixed["KEYS"]),
        argv=tuple(fixed["ARGV"]),
        key_groups=tuple(groups["KEYS"]),
        argv_groups=tuple(groups["ARGV"]),
    )


@pytest.mark.parametrize(("folder", "wrapper"), WRAPPERS, ids=lambda w: getattr(w, "name", ""))
def test_header_lists_the_wrappers_keys_and_argv(
    folder: ScriptFolder, wrapper: type[LuaScript]
) -> None:
    """The KEYS[i]/ARGV[i] lines of the script's header are its wrapper's layout, in order."""
    assert header_layout(_file(folder, wrapper.name)) == wrapper.layout


@pytest.mark.parametrize(("folder", "wrapper"), WRAPPERS, ids=lambda w: getattr(w, "name", ""))
def test_the_layout_is_derived_from_the_tuples_the_call_is_packed_from(
    folder: ScriptFolder, wrapper: type[LuaScript[Any, Any]]
) -> None:
    """The fixed KEYS and ARGV of the layout are the fields of the two ``NamedTuple``
    classes the wrapper's ``arguments`` takes, and a call lays their values out in order."""
    keys_kind, argv_kind = declared(wrapper)
    assert wrapper.layout.keys == keys_kind._fields
    assert wrapper.layout.argv == argv_kind._fields
    keys, args = wrapper.arguments(_named(keys_kind), _named(argv_kind), ["k"], ["a"])
    assert keys == [*wrapper.layout.keys, "k"]
    assert args == [*wrapper.layout.argv, "a"]


@pytest.mark.parametrize("name", sorted(_BATCHES))
def test_a_batch_fills_its_groups_in_layout_order(name: str) -> None:
    """A batch of one item, each value named after its position, is the header's order."""
    wrapper = next(w for _, w in WRAPPERS if w.name == name)
    keys, args = _BATCHES[name](wrapper)
    layout = wrapper.layout
    assert keys == [*layout.keys, *(key for group in layout.key_groups for key in group)]
    argv = [COUNTS.get(position, position) for position in layout.argv]
    assert args == [*argv, *(arg for group in layout.argv_groups for arg in group)]


def test_a_header_out_of_step_with_its_wrapper_is_caught() -> None:
    """Swapping two KEYS in a header makes it disagree with the wrapper's layout."""
    text = _file(store_scripts.FOLDER, "append")
    swapped = text.replace("KEYS[1] record", "KEYS[1] stream", 1).replace(
        "KEYS[2] stream", "KEYS[2] record", 1
    )
    assert swapped != text
    assert header_layout(swapped) != store_scripts.AppendScript.layout


@pytest.mark.parametrize(
    ("folder", "wrappers"), FOLDERS, ids=["eventstore", "projections", "bench"]
)
def test_every_script_has_one_wrapper_and_every_other_file_is_included(
    folder: ScriptFolder, wrappers: tuple[type[LuaScript], ...]
) -> None:
    """A ``.lua`` file is one wrapper's script, or a part other scripts ``-- @include``."""
    files = {
        path.name.removesuffix(".lua")
        for path in resources.files(folder.package).joinpath("scripts").iterdir()
        if path.name.endswith(".lua")
    }
    wrapped = [wrapper.name for wrapper in wrappers]
    assert len(wrapped) == len(set(wrapped))
    included = {part for name in files for part in _INCLUDE.findall(_file(folder, name))}
    assert set(wrapped) | (included - set(folder.generated)) == files
    assert not set(wrapped) & included
    for name in wrapped:
        assert _INCLUDE.search(folder.source(name)) is None
