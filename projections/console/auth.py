"""The operator's credentials: one token, kept hashed, and the login sessions of the process.

The token is stored only as its SHA-256 digest and compared in constant time
(:func:`hmac.compare_digest`). A login starts a session: a random id kept in this
process's memory, handed to the browser as ``<id>.<HMAC of the id>`` under a key that
never leaves the process. The cookie is never the token, a restarted server forgets
every session, and a forged or ended session is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from typing import Final

from eventstore.errors import InvalidArgument

#: How long a login lasts.
SESSION_TTL_S: Final = 12 * 3600.0
#: Sessions kept at most; past it the oldest is forgotten.
MAX_SESSIONS: Final = 256
_MAX_TOKEN_CHARS: Final = 512


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class OperatorAuth:
    """Checks the operator token and the sessions of the logins it allowed."""

    def __init__(self, token: str, *, session_ttl_s: float = SESSION_TTL_S) -> None:
        """Keep ``token`` hashed.

        Raises:
            InvalidArgument: the token is empty, longer than 512 characters, or holds
                whitespace or control characters.

        """
        if not token or len(token) > _MAX_TOKEN_CHARS or not token.isprintable() or " " in token:
            raise InvalidArgument(
                "the operator token must be 1 to 512 printable characters without spaces"
            )
        self._token_sha256 = _digest(token)
        self._key = secrets.token_bytes(32)
        self._ttl_s = session_ttl_s
        self._sessions: OrderedDict[str, float] = OrderedDict()

    def __repr__(self) -> str:
        return "OperatorAuth(<token hidden>)"

    def check_token(self, token: str | None) -> bool:
        """Tell whether ``token`` is the operator token (constant-time comparison)."""
        if token is None or len(token) > _MAX_TOKEN_CHARS:
            return False
        return hmac.compare_digest(_digest(token), self._token_sha256)

    def _mac(self, session_id: str) -> str:
        return hmac.new(self._key, session_id.encode(), hashlib.sha256).hexdigest()

    def start_session(self) -> str:
        """Start a session; return the cookie value that names it."""
        session_id = secrets.token_urlsafe(24)
        self._sessions[session_id] = time.monotonic() + self._ttl_s
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return f"{session_id}.{self._mac(session_id)}"

    def _session_id(self, cookie: str | None) -> str | None:
        if not cookie or len(cookie) > 200:
            return None
        session_id, _, mac = cookie.partition(".")
        if not hmac.compare_digest(mac.encode(), self._mac(session_id).encode()):
            return None
        expires = self._sessions.get(session_id)
        if expires is None:
            return None
        if expires <= time.monotonic():
            del self._sessions[session_id]
            return None
        return session_id

    def check_session(self, cookie: str | None) -> bool:
        """Tell whether the cookie names a live session of this process."""
        return self._session_id(cookie) is not None

    def end_session(self, cookie: str | None) -> None:
        """Forget the session the cookie names (logging out); nothing if it names none."""
        session_id = self._session_id(cookie)
        if session_id is not None:
            del self._sessions[session_id]
