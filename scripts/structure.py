"""Print the product's structure from its imports: rooms, arrows, cycles.

    .venv/bin/python scripts/structure.py            # this checkout
    .venv/bin/python scripts/structure.py DIR        # another checkout (say, a git archive)

Each package in dependency order with its rooms (a subpackage, or a module of its own),
each room's module count and the rooms it imports, then whether any cycle exists. The
layout test (``tests/unit/test_layout.py``) holds the same rules.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from tests.support.structure import (
    ORDER,
    cycle_in,
    imported_packages,
    modules,
    room_imports,
    room_of,
)


def main(argv: list[str] | None = None) -> int:
    """Print the structure of the checkout named (this one by default); 1 on a cycle."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", type=pathlib.Path, default=pathlib.Path.cwd())
    root = parser.parse_args(argv).root.resolve()
    cycles = 0
    for package in ORDER:
        files = modules(root, package)
        below = sorted(
            {name for path in files for name in imported_packages(path)} & set(ORDER) - {package}
        )
        print(f"{package}  ({len(files)} modules; imports {', '.join(below) or 'nothing of ours'})")
        graph = room_imports(root, package)
        for room in sorted(graph):
            count = sum(
                1
                for path in files
                if room_of(".".join(path.relative_to(root).with_suffix("").parts)) == room
            )
            arrows = ", ".join(sorted(graph[room])) or "-"
            print(f"  {room:<42} {count:>3}  -> {arrows}")
        cycle = cycle_in(graph)
        if cycle:
            cycles += 1
            print(f"  CYCLE: {' -> '.join(cycle)}")
    print("cycles: none" if not cycles else f"cycles: {cycles}")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
