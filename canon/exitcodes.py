"""Named exit codes of the ``canon`` command."""

from typing import Final

RET_OK: Final = 0
#: The command ran and found a problem (an integrity failure, a failed check).
RET_PROBLEM: Final = 1
#: Bad arguments, or the Redis server could not be reached.
RET_USAGE: Final = 2
