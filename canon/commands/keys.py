"""``canon keys new|rewrap``: the keyring that encrypts payloads at rest.

``canon keys new`` writes a keyring file (``--file``, default ``canon-keys.json``, made
readable by its owner only) holding one fresh 256-bit key, current; with ``--add`` it adds
the new key to an existing file and makes it current (rotation: new runs are encrypted
under it, older runs keep reading with their key id). The key is never printed. Give the
file to every process that writes or reads payloads as ``CANON_KEYS`` (the file's path,
or its JSON).

``canon keys rewrap`` re-wraps every run's data key still under an older key with the
current key of ``CANON_KEYS``, without touching a payload; afterwards the older key can
leave the keyring. See docs/encryption.md.

Exit 0 when done, 2 on usage errors (a bad keyring, a file that exists, no keyring), 3
when Redis is unavailable.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
from typing import Any, cast

from canon.command_errors import CommandError
from canon.commands.readonly import stdout_console
from canon.connection import add_connection_args, open_store
from canon.exitcodes import RET_OK
from eventstore.keyring import KEYS_ENV, new_keyring_text
from eventstore.sealing import DATA_KEY_FIELD

#: The keyring file ``canon keys new`` writes when no ``--file`` is given.
DEFAULT_KEYS_FILE = pathlib.Path("canon-keys.json")


def _new(args: argparse.Namespace) -> int:
    path: pathlib.Path = args.file
    existing: str | None = None
    if args.add:
        try:
            existing = path.read_text(encoding="utf-8")
        except OSError:
            raise CommandError(f"cannot read the keyring file {path}") from None
    elif path.exists():
        raise CommandError(f"{path} exists: add a key to it with --add, or name another --file")
    text = new_keyring_text(args.id, existing)
    try:
        # Readable by its owner only, from its first byte (never chmod after writing).
        descriptor = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(path.with_suffix(".tmp"), path)
    except OSError as exc:
        raise CommandError(f"cannot write {path}: {exc.strerror or type(exc).__name__}") from None
    done = "added to" if args.add else "written to"
    stdout_console().print(
        f"key {args.id} (current) {done} {path}; give it as {KEYS_ENV}={path}",
        highlight=False,
        soft_wrap=True,
    )
    return RET_OK


def _rewrap(args: argparse.Namespace) -> int:
    async def main() -> int:
        async with open_store(args) as store:
            seals = store.seals
            if seals is None:
                raise CommandError(f"no keyring: set {KEYS_ENV} to the keyring file")
            pattern = store.keys.scan_pattern("run")
            rewrapped = current = 0
            async for key in store.client.scan_iter(match=pattern, count=1000):
                run_id = store.keys.run_id_of(cast(bytes, key))
                # Only runs that hold a data key are looked at further.
                if run_id is None or not await store.client.hexists(key, DATA_KEY_FIELD):
                    continue
                done = await seals.rewrap(run_id)
                rewrapped += done is True
                current += done is False
        stdout_console().print(
            f"{rewrapped} run data key(s) re-wrapped with key {seals.keyring.current}; "
            f"{current} already were",
            highlight=False,
            soft_wrap=True,
        )
        return RET_OK

    return asyncio.run(main())


def register(subparsers: Any) -> None:
    """Add ``keys new`` and ``keys rewrap``."""
    parser = subparsers.add_parser(
        "keys", help="make, rotate and re-wrap the keys of payloads at rest", description=__doc__
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    new = actions.add_parser("new", help="write a keyring file with a new current key")
    new.add_argument(
        "--file",
        type=pathlib.Path,
        default=DEFAULT_KEYS_FILE,
        help="the keyring file (default %(default)s)",
    )
    new.add_argument("--id", default="k1", help="the new key's id (default %(default)s)")
    new.add_argument(
        "--add", action="store_true", help="add the key to the existing file and make it current"
    )
    new.set_defaults(handler=_new)
    rewrap = actions.add_parser(
        "rewrap", help="re-wrap every run's data key with the current key of CANON_KEYS"
    )
    add_connection_args(rewrap, writes=False)
    rewrap.set_defaults(handler=_rewrap)
