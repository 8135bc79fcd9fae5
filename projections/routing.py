"""What the receipt API's and the console's route tables share.

Exact routes, the path parameters' shapes, and each route described as ``canon serve
--help`` names it.

Both apps declare their routes with Starlette (:class:`ExactRoute`, a ``Route`` that
matches the whole path and only the methods it names); what each app answers a path or
a method it does not serve stays its own (:class:`WrongMethod` carries the route).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable
from typing import Any, Final

from starlette.convertors import Convertor, register_url_convertor
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from machine.errors import CanonError

#: A path parameter that is any one segment, empty included: a malformed id is told
#: apart (400, checked by the route) from a path of another shape (404).
SEGMENT: Final = "canon_segment"
#: A path parameter that is a run id (:func:`machine.ids.is_run_id`'s shape): another
#: segment is a path of another shape.
RUN_ID: Final = "canon_run_id"
#: A path parameter that is the rest of the path, whatever it holds (line feeds too).
REST: Final = "canon_rest"
#: How a parameter is named in ``--help``: ``{run_id}`` is ``<run id>``.
_PARAMETER: Final = re.compile(r"\{([a-z_]+)(?::[a-z_]+)?\}")


class _Text(Convertor[str]):
    """A path parameter kept as the text it matched."""

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


class _Segment(_Text):
    regex = "[^/]*"


class _RunId(_Text):
    regex = r"[A-Za-z0-9_\-][A-Za-z0-9._\-]{0,127}"


class _Rest(_Text):
    regex = "(?s:.*)"


register_url_convertor(SEGMENT, _Segment())
register_url_convertor(RUN_ID, _RunId())
register_url_convertor(REST, _Rest())


class WrongMethod(CanonError):
    """Raised when a request's path is a route's but its method is not one it serves.

    ``route`` is the route's name and ``allow`` its methods, so each app answers in its
    own words (the API as a path it does not serve, the console naming its form).
    """

    def __init__(self, route: str, allow: str) -> None:
        super().__init__(f"the route serves {allow}")
        self.route, self.allow = route, allow


class ExactRoute(Route):
    """A Starlette route that matches the whole path and only the methods it names.

    Starlette's pattern ends in ``$``, which also matches before a final line feed, and
    a GET route also serves HEAD: here a path ending in a line feed is another path, and
    HEAD is served only where it is named. A method the route does not serve raises
    :class:`WrongMethod`.
    """

    def __init__(
        self,
        path: str,
        endpoint: Callable[..., Any],
        *,
        methods: Collection[str] | None = None,
        name: str | None = None,
    ) -> None:
        """Route ``path`` to ``endpoint`` for ``methods`` (every method when None)."""
        super().__init__(path, endpoint, methods=methods, name=name)
        self.methods = None if methods is None else {method.upper() for method in methods}
        self.path_regex = re.compile(self.path_regex.pattern.removesuffix("$") + r"\Z")

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer with the endpoint, or raise :class:`WrongMethod`."""
        if self.methods and scope["method"] not in self.methods:
            raise WrongMethod(self.name, ", ".join(sorted(self.methods)))
        await self.app(scope, receive, send)


def described(routes: Iterable[BaseRoute]) -> tuple[str, ...]:
    """Each route's methods and path as ``--help`` lists them (``GET /v1/runs/<run id>``)."""
    lines: list[str] = []
    for route in routes:
        if not isinstance(route, Route) or route.methods is None:
            continue
        path = _PARAMETER.sub(lambda match: f"<{match.group(1).replace('_', ' ')}>", route.path)
        lines.extend(f"{method} {path}" for method in sorted(route.methods))
    return tuple(lines)
