"""``canon archive``: keep every finished call after its TTL, in SQLite or PostgreSQL.

``canon archive`` runs the archive worker (a consumer group over the shard feeds, like
``canon workers``) until SIGTERM or SIGINT, or with ``--burst`` until nothing is left.
``--migrate`` applies the archive's schema migrations and exits. The other actions:
``canon archive anchor --key FILE --out PATH`` writes a signed checkpoint of the
archive's chain heads (``canon verify --anchor`` checks one), ``canon archive keygen
--key FILE`` makes its Ed25519 key pair, ``canon archive prune`` applies the retention
now. The archive is ``--archive URL`` or ``$CANON_ARCHIVE_URL``; without either, and
with the embedded Redis, a SQLite file beside its data (``<data-dir>/archive.sqlite3``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import pathlib
import sys
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from canon.argtypes import non_negative, positive
from canon.command_errors import CommandError, fail
from canon.commands.readonly import ARCHIVE_ENV
from canon.connection import add_connection_args, configured_url, open_store
from canon.exitcodes import RET_OK, RET_USAGE
from canon.service import add_logging_args, add_worker_args, run_service, serving_metrics
from eventstore.logs import get_logger
from projections.archive.anchor import (
    Anchor,
    encode_anchor,
    load_private_key,
    make_anchor,
    new_key,
)
from projections.archive.database import archive_at
from projections.archive.projection import ArchiveWorker
from projections.archive.retention import DAY_MS, DEFAULT_RETENTION_DAYS, prune
from projections.archive.schema import SCHEMA_VERSION, check_schema, migrate
from projections.archive.store import Archive
from projections.metrics import Metrics
from projections.worker.supervisor import run_workers

log = get_logger("canon.archive")

#: What ``canon archive ACTION`` does.
ACTIONS = ("run", "anchor", "keygen", "prune")
#: Between two prunes of a running worker.
PRUNE_EVERY_S = 3600.0


def register(subparsers: Any) -> None:
    """Add the ``archive`` subcommand."""
    parser = subparsers.add_parser(
        "archive",
        help="keep finished calls after their TTL (SQLite or PostgreSQL), anchor, prune",
        description=__doc__,
    )
    parser.add_argument(
        "action",
        nargs="?",
        choices=ACTIONS,
        default="run",
        help="run the worker (default), write an anchor, make its key, or prune now",
    )
    parser.add_argument(
        "--archive",
        default=None,
        metavar="URL",
        help=f"sqlite:///FILE or postgresql://... (default: ${ARCHIVE_ENV}, else "
        "<data-dir>/archive.sqlite3 beside the embedded Redis)",
    )
    parser.add_argument(
        "--migrate", action="store_true", help="apply the schema's migrations, then exit"
    )
    parser.add_argument(
        "--burst", action="store_true", help="archive what is available now, then exit"
    )
    parser.add_argument(
        "--retention-days",
        type=non_negative,
        default=DEFAULT_RETENTION_DAYS,
        help="keep a run this long after its last activity; 0 keeps everything "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--run-sweep-s",
        type=positive,
        default=10,
        help="how often the run indexes are swept for closes, pauses, refusals (10)",
    )
    parser.add_argument(
        "--key", type=pathlib.Path, default=None, help="anchor/keygen: the Ed25519 private key"
    )
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=None,
        help="anchor: the checkpoint file, or a folder for anchor-<time>.json",
    )
    parser.add_argument(
        "--settle-s",
        type=non_negative,
        default=10,
        help="anchor: cover what was archived at least this long ago (10)",
    )
    add_connection_args(parser, embedded=True)
    add_worker_args(parser)
    add_logging_args(parser)
    parser.set_defaults(handler=run)


def _url(args: argparse.Namespace) -> str:
    """The archive URL: the flag, the environment, else a file beside the embedded data."""
    url = args.archive or os.environ.get(ARCHIVE_ENV)
    if url:
        return str(url)
    if configured_url(args) is not None:
        raise CommandError(
            f"name the archive with --archive URL or {ARCHIVE_ENV} (the SQLite default sits "
            "beside the embedded Redis's data, and a Redis URL is configured)"
        )
    return f"sqlite:///{pathlib.Path(args.data_dir).resolve() / 'archive.sqlite3'}"


async def _migrate(url: str) -> None:
    async with archive_at(url) as database:
        applied = await migrate(database)
    print(
        f"archive schema at version {SCHEMA_VERSION}"
        + (f" (applied {', '.join(map(str, applied))})" if applied else " (nothing to apply)")
    )


async def _work(args: argparse.Namespace) -> None:
    url = _url(args)
    async with open_store(args, embedded=True) as store, archive_at(url) as database:
        await check_schema(database)
        metrics = Metrics()
        worker = ArchiveWorker(
            store,
            database,
            run_sweep_s=float(args.run_sweep_s),
            consumer=args.consumer,
            block_ms=args.block_ms,
            batch=args.batch,
            min_idle_ms=args.min_idle_ms,
            max_deliveries=args.max_deliveries,
            metrics=metrics,
        )
        retention_ms = args.retention_days * DAY_MS
        with serving_metrics(metrics, args.metrics_port):
            if args.burst:
                await run_workers([worker], burst=True)
                if retention_ms:
                    await prune(worker.archive, older_than_ms=retention_ms)
                return
            pruner = (
                asyncio.create_task(_prune_periodically(worker.archive, retention_ms))
                if retention_ms
                else None
            )
            try:
                await run_workers([worker])
            finally:
                if pruner is not None:
                    pruner.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await pruner


async def _prune_periodically(archive: Archive, retention_ms: int) -> None:
    while True:
        try:
            pruned = await prune(archive, older_than_ms=retention_ms)
            if pruned:
                log.info("archive_pruned", runs=pruned)
        except Exception as exc:  # the database is away: the next round tries again
            log.warning("archive_prune_failed", error=type(exc).__name__)
        await asyncio.sleep(PRUNE_EVERY_S)


async def _make_anchor(args: argparse.Namespace, key: Ed25519PrivateKey) -> Anchor:
    async with archive_at(_url(args)) as database:
        await check_schema(database)
        return await make_anchor(
            Archive(database, args.namespace), key, settle_ms=args.settle_s * 1000
        )


def _anchor(args: argparse.Namespace) -> int:
    if args.key is None or args.out is None:
        fail("anchor needs --key FILE (the private key) and --out PATH")
        return RET_USAGE
    anchor = asyncio.run(_make_anchor(args, load_private_key(args.key.read_bytes())))
    out: pathlib.Path = args.out
    if out.is_dir():
        out = out / f"anchor-{args.namespace}-{anchor.created_at_ms}.json"
    out.write_bytes(encode_anchor(anchor))
    print(
        f"anchored {len(anchor.runs)} run(s) of namespace {args.namespace} up to "
        f"{anchor.cutoff_ms}: root {anchor.root} (key {anchor.key_id}) -> {out}"
    )
    return RET_OK


def _keygen(args: argparse.Namespace) -> int:
    if args.key is None:
        fail("keygen needs --key FILE (where the private key goes; FILE.pub gets the public)")
        return RET_USAGE
    if args.key.exists():
        fail("the key file exists already: keygen never overwrites a key")
        return RET_USAGE
    private, public = new_key()
    fd = os.open(args.key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as sink:
        sink.write(private)
    pathlib.Path(f"{args.key}.pub").write_bytes(public)
    print(f"wrote {args.key} (private, mode 600) and {args.key}.pub (give it to verifiers)")
    return RET_OK


async def _prune(args: argparse.Namespace) -> int:
    async with archive_at(_url(args)) as database:
        await check_schema(database)
        pruned = await prune(
            Archive(database, args.namespace),
            older_than_ms=args.retention_days * DAY_MS,
            max_batches=sys.maxsize,
        )
    print(f"pruned {pruned} run(s) last active over {args.retention_days} day(s) ago")
    return RET_OK


def run(args: argparse.Namespace) -> int:
    """Run the action; exit 0 when done."""
    if args.migrate:
        asyncio.run(_migrate(_url(args)))
        return RET_OK
    if args.action == "keygen":
        return _keygen(args)
    if args.action == "anchor":
        return _anchor(args)
    if args.action == "prune":
        if args.retention_days == 0:
            fail("--retention-days 0 keeps everything: nothing to prune")
            return RET_USAGE
        return asyncio.run(_prune(args))
    return run_service(args, _work)
