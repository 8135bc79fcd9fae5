"""The console's operator token is kept hashed and long enough; sessions are process-local,
signed, bounded and carry a CSRF token; failed logins are limited per client and overall."""

from __future__ import annotations

import pytest

from eventstore.errors import InvalidArgument
from projections.console import auth as auth_module
from projections.console.auth import (
    CLIENT_BURST,
    CLIENT_REFILL_S,
    OVERALL_BURST,
    OVERALL_REFILL_S,
    LoginThrottle,
    OperatorAuth,
    client_key,
)

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


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "x",
        "fifteen-bytes!!",
        "\u00e9" * 7,  # 7 characters, 14 UTF-8 bytes
        "has space-and-is-long-enough",
        "tab\there-and-is-long-enough",
        "x" * 513,
        "new\nline-and-is-long-enough",
    ],
)
def test_an_unusable_token_is_refused(bad: str) -> None:
    """Under 16 UTF-8 bytes, over 512 characters, or holding whitespace or controls."""
    with pytest.raises(InvalidArgument, match="16"):
        OperatorAuth(bad)


@pytest.mark.parametrize("good", ["sixteen-bytes-ok", "\u00e9" * 8, "x" * 512])
def test_a_token_of_16_bytes_or_more_is_accepted(good: str) -> None:
    assert OperatorAuth(good).check_token(good)


def test_a_session_cookie_is_signed_and_can_be_ended() -> None:
    """A started session is accepted; a tweaked, foreign or ended one is not."""
    auth, other = OperatorAuth(TOKEN), OperatorAuth(TOKEN)
    cookie = auth.start_session("ana")
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
    assert not short.check_session(short.start_session("ana"))
    monkeypatch.setattr(auth_module, "MAX_SESSIONS", 3)
    auth = OperatorAuth(TOKEN)
    cookies = [auth.start_session("ana") for _ in range(4)]
    assert not auth.check_session(cookies[0])
    assert all(auth.check_session(cookie) for cookie in cookies[1:])


def test_each_session_has_its_own_csrf_token_checked_in_constant_time() -> None:
    """The token is tied to its live session: another session's, a tweaked one, none, or
    the token of an ended session is refused."""
    auth = OperatorAuth(TOKEN)
    one, two = auth.start_session("ana"), auth.start_session("ana")
    token_one, token_two = auth.csrf_token(one), auth.csrf_token(two)
    assert token_one and token_two and token_one != token_two
    assert token_one not in one and TOKEN not in token_one
    assert auth.check_csrf(one, token_one)
    assert not auth.check_csrf(one, token_two)
    assert not auth.check_csrf(one, token_one[:-1])
    assert not auth.check_csrf(one, None) and not auth.check_csrf(one, "")
    assert not auth.check_csrf(None, token_one) and not auth.check_csrf("forged.x", token_one)
    assert not auth.check_csrf(one, "\u00e9" + token_one[1:])  # not ASCII: never equal
    assert auth.csrf_token(None) is None
    auth.end_session(one)
    assert not auth.check_csrf(one, token_one) and auth.csrf_token(one) is None


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_failed_logins_of_one_client_are_limited_and_refill() -> None:
    """A burst of failures empties the client's allowance; the wait it names is when one
    attempt is allowed again; other clients are untouched."""
    clock = Clock()
    throttle = LoginThrottle(clock=clock)
    for _ in range(CLIENT_BURST):
        assert throttle.retry_after_s("10.0.0.1") == 0
        throttle.failed("10.0.0.1")
    wait = throttle.retry_after_s("10.0.0.1")
    assert 0 < wait <= CLIENT_REFILL_S
    assert throttle.retry_after_s("10.0.0.2") == 0
    clock.now += wait
    assert throttle.retry_after_s("10.0.0.1") == 0
    throttle.failed("10.0.0.1")
    assert throttle.retry_after_s("10.0.0.1") > 0


def test_failed_logins_of_all_clients_are_limited_together() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock=clock)
    for index in range(OVERALL_BURST):
        client = f"10.1.{index // 250}.{index % 250}"
        assert throttle.retry_after_s(client) == 0
        throttle.failed(client)
    assert 0 < throttle.retry_after_s("192.0.2.1") <= OVERALL_REFILL_S
    clock.now += OVERALL_REFILL_S
    assert throttle.retry_after_s("192.0.2.1") == 0


def test_clients_kept_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the cap the client seen longest ago is forgotten (memory stays bounded)."""
    monkeypatch.setattr(auth_module, "MAX_CLIENTS", 3)
    throttle = LoginThrottle(clock=Clock())
    for index in range(5):
        throttle.failed(f"10.2.0.{index}")
    assert len(throttle) == 3


def test_an_ipv6_client_is_its_64_bit_prefix() -> None:
    """One host holds a whole /64: its addresses share one allowance."""
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:bbbb::9")
    assert client_key("2001:db8:1:3::1") != client_key("2001:db8:1:2::1")
    assert client_key("192.0.2.7") == "192.0.2.7"
    assert client_key(None) == "unknown" and client_key("a-name") == "a-name"
