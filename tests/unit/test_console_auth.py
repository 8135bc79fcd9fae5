"""The console's operator token is kept hashed; sessions are process-local, signed, bounded."""

from __future__ import annotations

import pytest

from eventstore.errors import InvalidArgument
from projections.console import auth as auth_module
from projections.console.auth import OperatorAuth

TOKEN = "operator-token-1234"


def test_the_token_is_kept_only_as_its_digest() -> None:
    """Nothing the object holds or prints is the token itself."""
    auth = OperatorAuth(TOKEN)
    assert TOKEN not in repr(auth)
    for value in vars(auth).values():
        assert TOKEN not in repr(value) and TOKEN.encode() not in repr(value).encode()
    assert auth.check_token(TOKEN)
    for wrong in (None, "", TOKEN + "x", TOKEN[:-1], "x" * 600):
        assert not auth.check_token(wrong)


@pytest.mark.parametrize("bad", ["", "has space", "tab\there", "x" * 513, "new\nline"])
def test_an_unusable_token_is_refused(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        OperatorAuth(bad)


def test_a_session_cookie_is_signed_and_can_be_ended() -> None:
    """A started session is accepted; a tweaked, foreign or ended one is not."""
    auth, other = OperatorAuth(TOKEN), OperatorAuth(TOKEN)
    cookie = auth.start_session()
    assert TOKEN not in cookie and auth.check_session(cookie)
    session_id, _, mac = cookie.partition(".")
    assert not auth.check_session(f"{session_id}.{'0' * len(mac)}")
    assert not auth.check_session(f"{session_id}x.{mac}")
    assert not other.check_session(cookie)  # another process (key) never knew it
    assert not auth.check_session(None) and not auth.check_session("")
    auth.end_session(cookie)
    assert not auth.check_session(cookie)


def test_sessions_expire_and_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A session past its lifetime is refused; past the cap the oldest is forgotten."""
    short = OperatorAuth(TOKEN, session_ttl_s=-1.0)
    assert not short.check_session(short.start_session())
    monkeypatch.setattr(auth_module, "MAX_SESSIONS", 3)
    auth = OperatorAuth(TOKEN)
    cookies = [auth.start_session() for _ in range(4)]
    assert not auth.check_session(cookies[0])
    assert all(auth.check_session(cookie) for cookie in cookies[1:])
