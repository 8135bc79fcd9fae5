"""Each Lua script's KEYS/ARGV order is written once: its wrapper's layout, its header agrees."""

from __future__ import annotations

import inspect
import re
from importlib import resources
from typing import Any

import pytest

from canon.bench import minimal as bench_scripts
from eventstore.wire import scripts as store_scripts
from eventstore.wire.lua import Layout, LuaScript, ScriptFolder
from projections import scripts as projection_scripts
from projections.scripts import ReceiptPut, ShardKeys, Unproduced, ViewPut

FOLDERS: list[tuple[ScriptFolder, tuple[type[LuaScript], ...]]] = [
    (store_scripts.FOLDER, store_scripts.WRAPPERS),
    (projection_scripts.FOLDER, projection_scripts.WRAPPERS),
    (bench_scripts.FOLDER, bench_scripts.WRAPPERS),
]
WRAPPERS = [(folder, wrapper) for folder, wrappers in FOLDERS for wrapper in wrappers]

_FIXED = re.compile(r"\b(KEYS|ARGV)\[(\d+)\]\s+(\w+)")
_GROUP = re.compile(r"\b(KEYS|ARGV)\[([^\]\s]*\.\.[^\]\s]*)\]\s+\(([^)]*)\)\.\.\.")
_INCLUDE = re.compile(r"^-- @include (\w+)$", re.MULTILINE)


def _sample(kind: Any, names: str) -> Any:
    """A ``kind`` tuple whose values are the header's names of the positions they fill."""
    return kind(*names.split())


_SETTLED = [_sample(Unproduced, "shard entry_id counter")]
#: Values for the parameters that fill repeated groups: one group each, named as in the header.
GROUP_SAMPLES: dict[str, dict[str, Any]] = {
    "create": {"fields": ["field", "value"]},
    "append": {"fields": ["field", "value"]},
    "open_run": {"tools": [("tool", "tool_budget")]},
    "update_run": {"fields": ["field", "value"]},
    "minimal_write": {"fields": ["field", "value"]},
    "dead_letter": {"fields": ["field", "value"]},
    "read_snapshots": {"invocations": [("record", "stream")], "fields": ["field"]},
    "receipts_put": {
        "shards": [ShardKeys("position", "feed")],
        "receipts": [_sample(ReceiptPut, "receipt record shard entry_id version receipt")],
        "unproduced": _SETTLED,
    },
    "views_put": {
        "shards": [ShardKeys("position", "feed")],
        "views": [
            _sample(
                ViewPut,
                "view run shard entry_id tool_call_id version status evidence_status "
                "updated_at_ms facts covered",
            )
        ],
        "unproduced": _SETTLED,
    },
}
#: Arguments a wrapper computes from its input (one shard, one item in the samples).
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
def test_arguments_fill_keys_and_argv_in_layout_order(
    folder: ScriptFolder, wrapper: type[LuaScript]
) -> None:
    """Called with each value named after its position, ``arguments`` returns the layout."""
    layout = wrapper.layout
    samples = GROUP_SAMPLES.get(wrapper.name, {})
    parameters = inspect.signature(wrapper.arguments).parameters  # type: ignore[attr-defined]
    kwargs = {name: samples.get(name, name) for name in parameters}
    keys, args = wrapper.arguments(**kwargs)  # type: ignore[attr-defined]
    groups = [name for group in layout.key_groups for name in group]
    assert keys == [*layout.keys, *groups]
    argv = [COUNTS.get(name, name) for name in layout.argv]
    assert args == [*argv, *(name for group in layout.argv_groups for name in group)]


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
