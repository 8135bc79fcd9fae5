"""Fault injection for the crash-point tests: kill this process at one named point.

The crash-point matrix (``tests/faults/test_crash_matrix.py``) proves what a call leaves
behind when its process dies at each point of the plain and the governed path. To die
exactly there, not at a random time, a test process arms one point with :func:`arm`
before it makes its call, and the store SIGKILLs the process when it reaches that point:
``before:<event type>`` and ``after:<event type>`` around the script call that writes
that event (the Writer's), ``before:<script>`` around a projection's settling script.
Nothing arms a point unless a test calls :func:`arm`; unarmed, a point costs one
attribute read (:data:`ARMED`).
"""

from __future__ import annotations

import os
import signal

#: Whether a point is armed in this process (read on every script call; False unless a
#: test armed one).
ARMED = False
_point: str | None = None


def arm(point: str | None) -> None:
    """Kill this process when it reaches ``point`` (None: disarm)."""
    global ARMED, _point
    _point = point
    ARMED = point is not None


def reached(point: str) -> None:
    """Called at ``point``: SIGKILL this process if that is the point armed."""
    if point == _point:
        os.kill(os.getpid(), signal.SIGKILL)
