"""The archive: audit after the TTL, in a real database (SQLite or PostgreSQL).

Redis keeps a record for its TTL; the archive keeps it after. :mod:`.projection` is the
``archive`` projection (a consumer group over the shard feeds, run by the same worker
runtime as the others) that writes every invocation that reached a terminal state, with
its payloads as stored and every event with its hash, every later event, the run's
registry entry, its run events and its refusals. :mod:`.database` is the one interface
over both backends (:mod:`.sqlite`, :mod:`.postgres`), :mod:`.schema` the versioned
schema and its migrations, :mod:`.store` what is written and read, :mod:`.source` the
archive as a source the audit tools read (replay, verify, export, inspect),
:mod:`.compare` the check of live runs against their archived chains, :mod:`.anchor`
the signed checkpoints, :mod:`.search` the search across runs and :mod:`.retention` the
bounded pruning.
"""

from projections.archive.database import ArchiveDatabase, open_archive
from projections.archive.projection import ArchiveProjection, ArchiveWorker

__all__ = ["ArchiveDatabase", "ArchiveProjection", "ArchiveWorker", "open_archive"]
