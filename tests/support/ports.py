"""Loopback ports for the servers a test starts, that no other process takes meanwhile.

A port found by binding to port 0 is free a moment ago, and only that: until the
server the test starts binds it, the kernel may give the same port to any socket that
binds to port 0 or connects out, and a suite that opens thousands of Redis connections
does both all the time. The server then fails to bind and the test waits for nothing.
So the ports handed out here lie below the kernel's ephemeral range, where those
sockets never land, in a block of the xdist worker's own, and each is checked free
when it is handed out.
"""

from __future__ import annotations

import errno
import itertools
import os
import socket
from pathlib import Path

#: Ports handed out per xdist worker, in a block of that worker's own.
BLOCK = 400
#: Where the blocks start: above the ports services usually take, below every common
#: ephemeral range (Linux starts at 32768 by default).
FIRST = 20_000


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _block() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    blocks = (_ephemeral_start() - FIRST) // BLOCK
    if blocks < 1:
        raise RuntimeError("no room for test ports below the kernel's ephemeral range")
    # More workers than blocks share them; the check in free_port still holds.
    start = FIRST + BLOCK * ((int(worker) if worker.isdigit() else 0) % blocks)
    return range(start, start + BLOCK)


_candidates = itertools.cycle(_block())


def free_port() -> int:
    """A loopback port free now, outside the range other sockets are given by the kernel.

    Successive calls in one worker go round its block, so a port a test just let go is
    not handed out again soon after.
    """
    for _ in range(BLOCK):
        port = next(_candidates)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                continue
            return port
    raise RuntimeError("every test port of this worker is in use")
