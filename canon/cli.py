"""The ``canon`` command: one entry point, one module per subcommand.

``main(argv) -> int`` returns a named exit code; bad arguments give one clear line on
standard error, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Final

from canon.exitcodes import RET_USAGE

#: Subcommands; each is a module under ``canon.commands`` (``-`` spelled ``_``) with
#: ``register(subparsers)``.
COMMANDS: Final = (
    "demo",
    "replay",
    "verify",
    "export",
    "inspect",
    "status",
    "rebuild",
    "workers",
    "serve",
    "bench",
    "mcp-proxy",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(RET_USAGE, f"canon: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser with every available subcommand."""
    parser = _Parser(
        prog="canon",
        description="Canonical tool-invocation store for AI-agent harnesses.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    subparsers.required = True
    for name in COMMANDS:
        importlib.import_module(f"canon.commands.{name.replace('-', '_')}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``canon`` command line; returns the process exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        # --help exits 0 and a usage error exits RET_USAGE; both return instead of raising.
        return exit_.code if isinstance(exit_.code, int) else RET_USAGE
    code: int = args.handler(args)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
