"""The operator console of ``canon serve`` and ``canon demo --serve``: its token and app.

The operator token comes from ``--operator-token-file`` (its first line) or the
``CANON_OPERATOR_TOKEN`` environment variable; without one the console is off (its paths
answer 404) and the serve log says so. A token under 16 bytes is refused before anything
starts (one line, exit 2). It is meant for loopback: binding elsewhere logs a loud
warning, since anyone who can reach the port can try the token.
"""

from __future__ import annotations

import argparse
import ipaddress
import pathlib
from typing import Any, Final

import structlog

from canon.failures import CommandError
from eventstore.errors import InvalidArgument
from projections.console import Console, OperatorAuth
from projections.console.auth import check_operator_token

TOKEN_ENV: Final = "CANON_OPERATOR_TOKEN"  # noqa: S105 (the variable's name, not a secret)
log = structlog.get_logger("canon.console")


def add_console_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--operator-token-file``."""
    parser.add_argument(
        "--operator-token-file",
        type=pathlib.Path,
        default=None,
        help=f"file whose first line is the operator token of the console at /console/ "
        f"(else ${TOKEN_ENV}; without either the console is off)",
    )


def operator_token(args: argparse.Namespace, environ: dict[str, str]) -> str | None:
    """The configured operator token, or None.

    Raises:
        CommandError: the token file cannot be read or is empty, or the token is not
            usable (under 16 bytes, over 512 characters, spaces or control characters);
            the message never shows the token.

    """
    path: pathlib.Path | None = getattr(args, "operator_token_file", None)
    if path is not None:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(
                f"--operator-token-file: cannot read {path} ({type(exc).__name__})"
            ) from None
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


def is_loopback(host: str) -> bool:
    """Tell whether ``host`` is a loopback address or ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def console_app(
    store: Any, token: str | None, host: str, *, secure_cookies: bool = False
) -> Console | None:
    """The console over ``store`` for ``token``, or None (logged) when no token is set.

    ``secure_cookies`` marks the login cookie ``Secure`` also on plain HTTP (TLS ended by
    a proxy that does not send ``X-Forwarded-Proto``); over HTTPS it always is.

    Raises:
        CommandError: the token is not usable.

    """
    if token is None:
        log.info("console_disabled", reason=f"no operator token (set {TOKEN_ENV})")
        return None
    try:
        auth = OperatorAuth(token)
    except InvalidArgument as exc:
        raise CommandError(f"operator token: {exc}") from None
    if not is_loopback(host):
        log.warning(
            "console_exposed",
            host=host,
            warning="THE OPERATOR CONSOLE IS REACHABLE BEYOND THIS MACHINE: anyone who "
            "reaches this port can try the operator token; bind 127.0.0.1 or put it "
            "behind HTTPS and a firewall",
        )
    console = Console(store, auth, secure_cookie=secure_cookies)
    log.info("console_enabled", path="/console/", secure_cookies=secure_cookies)
    return console
