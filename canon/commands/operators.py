"""``canon operators add NAME``: name an operator and keep their token's digest.

Adds one ``NAME sha256:<hex>`` line to the operators file (``--operators-file``, default
``operators.txt``; made readable by its owner only when it does not exist). The token is
the first line of ``--token-file`` (default ``NAME.token``): an operator who brings a
token puts it there first; otherwise a new one is made and written there, readable by its
owner only. The token is never printed and never stored in the operators file: hand the
token file to the operator, and give the operators file to ``canon serve`` (and to the
CLI's decisions) as ``--operators-file`` or ``CANON_OPERATORS``.

Exit 0 when the operator was added, 2 when the name or the token is not usable, the file
already names the operator, or a file cannot be read or written.
"""

from __future__ import annotations

import argparse
import pathlib
from typing import Any

from canon.commands.readonly import stdout_console
from canon.exitcodes import RET_OK
from canon.operator_credentials import add_operator


def _add(args: argparse.Namespace) -> int:
    token_path: pathlib.Path = args.token_file or pathlib.Path(f"{args.name}.token")
    _, made = add_operator(args.name, args.operators_file, token_path)
    where = "a new token written to" if made else "the token of"
    stdout_console().print(
        f"operator {args.name} added to {args.operators_file}, with {where} {token_path}",
        highlight=False,
        soft_wrap=True,
    )
    return RET_OK


def register(subparsers: Any) -> None:
    """Add ``operators add``."""
    parser = subparsers.add_parser(
        "operators", help="name the operators who decide governed calls", description=__doc__
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    add = actions.add_parser("add", help="add an operator to the operators file")
    add.add_argument("name", help="the operator's name, as decisions will record it")
    add.add_argument(
        "--operators-file",
        type=pathlib.Path,
        default=pathlib.Path("operators.txt"),
        help="the operators file to add to (default operators.txt)",
    )
    add.add_argument(
        "--token-file",
        type=pathlib.Path,
        default=None,
        help="the operator's token: used if the file exists, else made there (default NAME.token)",
    )
    add.set_defaults(handler=_add)
