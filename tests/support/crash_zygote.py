"""A process that forks one child per crash-point cell, so each cell's process dies for real.

    python -m tests.support.crash_zygote

It imports everything once, then reads one JSON request a line on standard input
(``url``, ``namespace``, ``call``, ``point``, ``step``, ``path``: see
:func:`tests.support.crash_cells.run_step`), forks a child that arms the point and runs
the step, waits for it, and answers one JSON line: ``{"signal": N}`` when the child was
killed (SIGKILL is 9: it died at the point), ``{"code": N}`` when it exited. The zygote
holds no event loop, thread or connection when it forks, so each child starts clean and
fast (no interpreter start, no imports). It exits when its standard input closes.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback

from tests.support.crash_cells import run_step


def _child(request: dict[str, object]) -> None:
    """Run one step in the forked child; never returns."""
    code = 0
    try:
        asyncio.run(
            run_step(
                str(request["url"]),
                str(request["namespace"]),
                str(request["call"]),
                request["point"] if isinstance(request["point"], str) else None,
                request["step"],  # type: ignore[arg-type]
                request["path"],  # type: ignore[arg-type]
            )
        )
    except BaseException:
        traceback.print_exc(file=sys.stderr)
        code = 1
    sys.stderr.flush()
    os._exit(code)


def main() -> None:
    """Serve requests until standard input closes."""
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            answer = {"signal": os.WTERMSIG(status)}
        else:
            answer = {"code": os.WEXITSTATUS(status)}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
