"""Where each redis-py asyncio connection was made, named in its ``repr``; a plugin.

A connection garbage-collected while still open warns ``unclosed Connection <repr>`` from
its ``__del__``, which the suite's ``filterwarnings = error`` turns into a failure of
whichever test the collection happened to run in, often long after the connection was
lost. The ``repr`` then names the code that made it (the last frames of the stack, in
this repository or the test), so that such a failure points at its owner without a rerun
under tracemalloc. Recording a short stack costs a few microseconds per connection made,
and pools make few.
"""

from __future__ import annotations

import pathlib
import traceback
from collections.abc import Callable
from typing import Any

from redis.asyncio.connection import AbstractConnection

_ROOT = str(pathlib.Path(__file__).resolve().parents[2])
_FRAMES = 40
_SHOWN = 8

_made: Callable[..., None] = AbstractConnection.__init__
_named: Callable[[AbstractConnection], str] = AbstractConnection.__repr__


def _init(self: AbstractConnection, *args: Any, **kwargs: Any) -> None:
    _made(self, *args, **kwargs)
    self._canon_origin = traceback.extract_stack(limit=_FRAMES)[:-1]  # type: ignore[attr-defined]


def _repr(self: AbstractConnection) -> str:
    origin: traceback.StackSummary | None = getattr(self, "_canon_origin", None)
    if not origin:
        return _named(self)
    ours = [
        frame
        for frame in origin
        if frame.filename.startswith(_ROOT) and "/.venv" not in frame.filename
    ][-_SHOWN:]
    made = "; ".join(
        f"{pathlib.Path(frame.filename).relative_to(_ROOT)}:{frame.lineno} {frame.name}"
        for frame in ours
    )
    return f"{_named(self)} made at {made or 'an unknown place'}"


AbstractConnection.__init__ = _init  # type: ignore[method-assign]
AbstractConnection.__repr__ = _repr  # type: ignore[method-assign]
