"""The ``canon`` command: one entry point, one module per subcommand.

``main(argv) -> int`` returns a named exit code (:mod:`canon.exitcodes`); bad arguments,
bad settings and an unreachable server give one clear line on standard error, never a
traceback (:mod:`canon.command_errors`).
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Final

from canon.command_errors import database_of, explain, fail, server_of
from canon.exitcodes import RET_USAGE

#: Subcommands; each is a module under ``canon.commands`` with ``register(subparsers)``,
#: named as the command (``-`` spelled ``_``) unless :data:`_MODULES` names it otherwise.
COMMANDS: Final = (
    "demo",
    "replay",
    "verify",
    "export",
    "inspect",
    "runs",
    "status",
    "rebuild",
    "approvals",
    "settle",
    "reconcile",
    "operators",
    "workers",
    "archive",
    "erase",
    "keys",
    "search",
    "serve",
    "bench",
    "mcp-proxy",
)
#: The modules of commands whose name would collide: ``inspect`` (the stdlib's) and
#: ``mcp-proxy`` (the proxy's own package, :mod:`canon.mcp_proxy`).
_MODULES: Final = {"inspect": "inspect_invocation", "mcp-proxy": "mcp_proxy_command"}
#: The distribution ``canon --version`` reports.
DISTRIBUTION: Final = "canon-store"

# Descriptions come from module docstrings, written for Sphinx: the help shows plain text.
_ROLE = re.compile(r":(?:mod|class|func|meth|data|attr|exc|obj):`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")


def plain(text: str) -> str:
    """Strip Sphinx markup (roles, double-backquoted literals) from help text."""
    return _LITERAL.sub(r"\1", _ROLE.sub(r"\1", text))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(RET_USAGE, f"canon: error: {message}\n")

    def format_help(self) -> str:
        return plain(super().format_help())


def package_version() -> str:
    """The installed version of the package, or ``unknown`` when it is not installed."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser with every available subcommand."""
    parser = _Parser(
        prog="canon",
        description="Canonical tool-invocation store for AI-agent harnesses.",
        epilog="Exit codes: 0 ok, 1 problems found, 2 usage, 3 Redis unavailable.",
    )
    parser.add_argument(
        "--version", action="version", version=f"canon {package_version()}", help="print it"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    subparsers.required = True
    for name in COMMANDS:
        module = _MODULES.get(name, name.replace("-", "_"))
        importlib.import_module(f"canon.commands.{module}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``canon`` command line; returns the process exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        # --help exits 0 and a usage error exits RET_USAGE; both return instead of raising.
        return exit_.code if isinstance(exit_.code, int) else RET_USAGE
    try:
        code: int = args.handler(args)
    except Exception as exc:
        known = explain(exc, server_of(args), database_of(args))
        if known is None:
            raise  # a bug: its traceback is what a report needs
        message, code = known
        fail(message)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
