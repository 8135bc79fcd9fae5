"""Asking a server on a loopback port who it is, before any client is configured.

:class:`~eventstore.server.embedded.EmbeddedRedis` uses these to wait for a server it launched:
a bare RESP exchange over a socket, so the wait needs no client library and no
connection pool.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    """Return a loopback port that was free a moment ago (bound to port 0, released)."""
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


def serves_pid(port: int, pid: int, timeout: float) -> bool:
    """Tell whether the server on loopback ``port`` answers PING and is process ``pid``."""
    # A PONG alone could come from a foreign server that won a race for the port;
    # INFO's process_id proves the answer is from the process we launched.
    if _query(port, b"PING", timeout) != b"+PONG":
        return False
    info = _query(port, b"INFO server", timeout)
    return f"process_id:{pid}\r\n".encode() in info
