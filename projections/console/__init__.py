"""The operator console served by ``canon serve`` under ``/console/``.

Its pages only read; its forms (each a POST with the login's CSRF token) decide governed
calls, reveal a masked payload and log out.

:class:`Console` (the ASGI app, :mod:`.app`), :class:`OperatorAuth` (the hashed operator
token and login sessions, :mod:`.auth`), the page data (:mod:`.views`) and the timeline
picture (:mod:`.timeline`); the page templates ship in ``templates/``.
"""

from projections.console.app import CONSOLE_ROUTES, Console
from projections.console.auth import OperatorAuth

__all__ = ["CONSOLE_ROUTES", "Console", "OperatorAuth"]
