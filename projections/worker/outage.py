"""How a worker waits out a Redis outage: backing off, and saying so once at each end.

A reading lane that finds Redis unavailable pauses before it tries again, twice as long
each time up to a cap, instead of retrying (and logging) every half second for as long as
the outage lasts. It logs ``worker_read_failed`` when the outage starts, a reminder
``worker_still_unavailable`` at most once per ``remind_s``, and ``redis_recovered`` (with
how long Redis was gone and how many reads failed) once a read succeeds again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from eventstore.logs import get_logger

log = get_logger("canon.projections")

#: The first pause after a failed read, in seconds.
FIRST_PAUSE_S: Final = 0.25
#: The longest pause: also the longest a worker stays idle after Redis is back.
MAX_PAUSE_S: Final = 5.0
#: How often a long outage is logged again.
REMIND_S: Final = 60.0


class Outage:
    """The backoff and the log lines of one reading lane while Redis is unavailable.

    Args:
        projection: the worker's projection, named in the log lines.
        first_pause_s: the pause after the first failure; each further failure doubles it.
        max_pause_s: the cap of the pause.
        remind_s: the least time between two ``worker_still_unavailable`` lines.
        clock: monotonic seconds (tests pass their own).

    """

    def __init__(
        self,
        projection: str,
        *,
        first_pause_s: float = FIRST_PAUSE_S,
        max_pause_s: float = MAX_PAUSE_S,
        remind_s: float = REMIND_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.projection = projection
        self.first_pause_s = first_pause_s
        self.max_pause_s = max_pause_s
        self.remind_s = remind_s
        self.clock = clock
        self.failures = 0
        self._since = 0.0
        self._last_log = 0.0

    @property
    def down(self) -> bool:
        """Whether the last read failed."""
        return self.failures > 0

    def pause_s(self) -> float:
        """The pause before the next try: doubling with each failure, capped."""
        if self.failures == 0:
            return 0.0
        return float(min(self.max_pause_s, self.first_pause_s * 2 ** (self.failures - 1)))

    def failed(self, error: str, **fields: Any) -> float:
        """Count a failed read, log it when due, and return how long to pause."""
        now = self.clock()
        self.failures += 1
        pause = self.pause_s()
        if self.failures == 1:
            self._since = self._last_log = now
            log.warning(
                "worker_read_failed",
                projection=self.projection,
                error=error,
                retry_in_s=pause,
                **fields,
            )
        elif now - self._last_log >= self.remind_s:
            self._last_log = now
            log.warning(
                "worker_still_unavailable",
                projection=self.projection,
                error=error,
                down_s=round(now - self._since, 1),
                failures=self.failures,
                retry_in_s=pause,
                **fields,
            )
        return pause

    def succeeded(self, **fields: Any) -> None:
        """End the outage, if there was one, with one ``redis_recovered`` line."""
        if self.failures == 0:
            return
        log.info(
            "redis_recovered",
            projection=self.projection,
            down_s=round(self.clock() - self._since, 1),
            failures=self.failures,
            **fields,
        )
        self.failures = 0
