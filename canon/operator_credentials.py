"""Operators' credentials for every operator door: the console, the HTTP API, the CLI.

Operators are named, each with a token of their own. The operators file
(``--operators-file``, else the ``CANON_OPERATORS`` environment variable holding the same
lines) lists each operator's name and the SHA-256 digest of their token, one ``name
sha256:<hex>`` per line (``canon operators add NAME`` writes one): it never holds a token.
A decision made at any door is recorded as made by the operator whose token the door
checked, never by a name the caller types.

- ``canon serve`` (and ``canon demo --serve``) serve the console and the decision routes
  to every operator of the file. Without a file, one operator token
  (``--operator-token-file``, its first line, else ``CANON_OPERATOR_TOKEN``) stands for
  one operator named ``operator``; without either the console is off (its paths answer
  404) and the serve log says so. The console is meant for loopback: binding elsewhere
  logs a loud warning, since anyone who can reach the port can try a token.
- ``canon approve``, ``deny``, ``pause`` and ``unpause`` take the operator's own token
  (``CANON_OPERATOR_TOKEN`` or ``--operator-token-file``) and the operators file, and
  record the name the token has there.

A token under 16 bytes, an unreadable file or a malformed line is refused before
anything starts (one line, exit 2), never showing a token.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import pathlib
import secrets
from collections.abc import Mapping
from typing import Any, Final

import structlog

from canon.command_errors import CommandError
from eventstore.errors import InvalidArgument
from projections.archive.database import ArchiveDatabase
from projections.console import Console, OperatorAuth
from projections.console.auth import (
    DEFAULT_OPERATOR,
    Operators,
    check_operator_name,
    check_operator_token,
    operator_line,
)

TOKEN_ENV: Final = "CANON_OPERATOR_TOKEN"  # noqa: S105 (the variable's name, not a secret)
OPERATORS_ENV: Final = "CANON_OPERATORS"
log = structlog.get_logger("canon.console")


def add_console_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--operators-file`` and ``--operator-token-file`` to a command that serves."""
    parser.add_argument(
        "--operators-file",
        type=pathlib.Path,
        default=None,
        help=f"the operators: one 'name sha256:<hex>' line each (canon operators add NAME); "
        f"else ${OPERATORS_ENV}",
    )
    parser.add_argument(
        "--operator-token-file",
        type=pathlib.Path,
        default=None,
        help=f"without an operators file: a file whose first line is the one operator "
        f"token of the console at /console/ (else ${TOKEN_ENV}; without either the "
        f"console is off)",
    )


def add_credential_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--operators-file`` and ``--operator-token-file`` to a command that decides."""
    parser.add_argument(
        "--operators-file",
        type=pathlib.Path,
        default=None,
        help=f"the operators file that names you (else ${OPERATORS_ENV})",
    )
    parser.add_argument(
        "--operator-token-file",
        type=pathlib.Path,
        default=None,
        help=f"a file whose first line is your operator token (else ${TOKEN_ENV})",
    )


class NoBy(argparse.Action):
    """``--by`` refused with one line saying who is recorded instead.

    An operator's action is recorded as the operator the token names, never a name typed
    on the command line.
    """

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        """Refuse the flag (argparse calls this when ``--by`` is given)."""
        parser.error(
            "--by is not taken: the operator is the one your token names "
            f"(${TOKEN_ENV} or --operator-token-file, in ${OPERATORS_ENV} or "
            "--operators-file)"
        )


def _read(path: pathlib.Path, flag: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"{flag}: cannot read {path} ({type(exc).__name__})") from None


def operator_token(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """The operator token given (its file's first line, else ``CANON_OPERATOR_TOKEN``).

    Raises:
        CommandError: the token file cannot be read or is empty, or the token is not
            usable (under 16 bytes, over 512 characters, spaces or control characters);
            the message never shows the token.

    """
    path: pathlib.Path | None = getattr(args, "operator_token_file", None)
    if path is not None:
        lines = _read(path, "--operator-token-file").splitlines()
        token: str | None = lines[0].strip() if lines else ""
        if not token:
            raise CommandError(f"--operator-token-file: {path} holds no token")
        source = f"--operator-token-file {path}"
    else:
        token, source = environ.get(TOKEN_ENV) or None, f"${TOKEN_ENV}"
    if token is not None:
        try:
            check_operator_token(token)
        except InvalidArgument as exc:
            raise CommandError(f"{source}: {exc}") from None
    return token


def operators_file(args: argparse.Namespace, environ: Mapping[str, str]) -> Operators | None:
    """The operators of ``--operators-file`` (else ``CANON_OPERATORS``), or None.

    ``CANON_OPERATORS`` holds the file's lines, separated by newlines or ``;``.

    Raises:
        CommandError: the file cannot be read, or a line is malformed (its number named).

    """
    path: pathlib.Path | None = getattr(args, "operators_file", None)
    if path is not None:
        text, source = _read(path, "--operators-file"), f"--operators-file {path}"
    elif environ.get(OPERATORS_ENV):
        text, source = environ[OPERATORS_ENV].replace(";", "\n"), f"${OPERATORS_ENV}"
    else:
        return None
    try:
        return Operators.parse(text)
    except InvalidArgument as exc:
        raise CommandError(f"{source}: {exc}") from None


def served_operators(args: argparse.Namespace, environ: Mapping[str, str]) -> Operators | None:
    """Who may use a served console and its decision routes, or None (the console is off).

    The operators file; else one operator token, standing for one operator named
    ``operator``; else None.

    Raises:
        CommandError: as :func:`operators_file` and :func:`operator_token`.

    """
    operators = operators_file(args, environ)
    if operators is not None:
        return operators
    token = operator_token(args, environ)
    if token is None:
        return None
    return Operators.from_tokens({DEFAULT_OPERATOR: token})


def authenticated_operator(args: argparse.Namespace, environ: Mapping[str, str]) -> str:
    """The operator whose token this command was given, as the operators file names them.

    Raises:
        CommandError: no token, no operators file, or a token the file does not know.

    """
    operators = operators_file(args, environ)
    token = operator_token(args, environ)
    if operators is None or token is None:
        raise CommandError(
            f"an operator's decision needs your token (${TOKEN_ENV} or --operator-token-file) "
            f"and the operators file (${OPERATORS_ENV} or --operators-file): the decision "
            "is recorded as the operator the token names"
        )
    name = operators.name_of(token)
    if name is None:
        raise CommandError("that operator token is not in the operators file")
    return name


def add_operator(
    name: str, operators_path: pathlib.Path, token_path: pathlib.Path
) -> tuple[str, bool]:
    """Add operator ``name`` to the operators file, with the token of ``token_path``.

    A token file that holds a token is used as it is (the operator brought it); else a
    new token is made and written there, readable by its owner only. The operators file
    gets one more ``name sha256:<hex>`` line (made, readable by its owner only, if it
    does not exist). Returns the line and whether the token was made here.

    Raises:
        CommandError: the name or the token is not usable, the operators file cannot be
            read or names the operator already, or a file cannot be written.

    """
    try:
        check_operator_name(name)
    except InvalidArgument as exc:
        raise CommandError(str(exc)) from None
    existing = _read(operators_path, "--operators-file") if operators_path.exists() else ""
    try:
        known = Operators.parse(existing).names if existing.strip() else []
    except InvalidArgument as exc:
        raise CommandError(f"--operators-file {operators_path}: {exc}") from None
    if name in known:
        raise CommandError(f"--operators-file {operators_path} already names {name!r}")
    made = not token_path.exists()
    if made:
        token = secrets.token_urlsafe(24)
        _write_private(token_path, token + "\n")
    else:
        lines = _read(token_path, "--token-file").splitlines()
        token = lines[0].strip() if lines else ""
    try:
        line = operator_line(name, token)
    except InvalidArgument as exc:
        raise CommandError(f"--token-file {token_path}: {exc}") from None
    try:
        if not operators_path.exists():
            _write_private(operators_path, "# canon operators: name sha256:<hex of the token>\n")
        with operators_path.open("a", encoding="utf-8") as out:
            out.write(line + "\n")
    except OSError as exc:
        raise CommandError(f"cannot write {operators_path} ({type(exc).__name__})") from None
    return line, made


def _write_private(path: pathlib.Path, text: str) -> None:
    """Create ``path`` readable and writable by its owner only, holding ``text``."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            out.write(text)
    except OSError as exc:
        raise CommandError(f"cannot write {path} ({type(exc).__name__})") from None


def is_loopback(host: str) -> bool:
    """Tell whether ``host`` is a loopback address or ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def console_app(
    store: Any,
    operators: Operators | None,
    host: str,
    *,
    secure_cookies: bool = False,
    archive: ArchiveDatabase | None = None,
) -> Console | None:
    """The console over ``store`` for ``operators``, or None (logged) when there are none.

    ``secure_cookies`` marks the login cookie ``Secure`` also on plain HTTP (TLS ended by
    a proxy that does not send ``X-Forwarded-Proto``); over HTTPS it always is. With
    ``archive``, what Redis no longer holds is read from it and the search page searches
    it (:mod:`projections.console.archived`).
    """
    if operators is None:
        log.info(
            "console_disabled",
            reason=f"no operators (set {OPERATORS_ENV} or {TOKEN_ENV})",
        )
        return None
    if not is_loopback(host):
        log.warning(
            "console_exposed",
            host=host,
            warning="THE OPERATOR CONSOLE IS REACHABLE BEYOND THIS MACHINE: anyone who "
            "reaches this port can try an operator token; bind 127.0.0.1 or put it "
            "behind HTTPS and a firewall",
        )
    console = Console(store, OperatorAuth(operators), secure_cookie=secure_cookies, archive=archive)
    log.info(
        "console_enabled",
        path="/console/",
        operators=len(operators.names),
        secure_cookies=secure_cookies,
        archive=archive is not None,
    )
    return console
