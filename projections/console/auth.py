"""Operators' credentials: named operators, their tokens kept hashed, logins, a limit.

Operators are named: each has a token, at least :data:`MIN_TOKEN_BYTES` long, kept only
as its SHA-256 digest (:class:`Operators`: from an operators file of ``name
sha256:<hex>`` lines, or one token for one operator, ``operator``) and compared in
constant time (:func:`hmac.compare_digest`, against every operator's digest). The
operator a token names is who every decision made with it is recorded as: never a
name a form or a body gives. A login starts a session for that operator: a random id
kept in this process's memory, handed to the browser as ``<id>.<HMAC of the id>`` under
a key that never leaves the process. The cookie is never the token, a restarted server
forgets every session, and a forged or ended session is refused. Each session has its
CSRF token (another HMAC of its id), which every state-changing form carries and which
is compared in constant time.

:class:`LoginThrottle` counts failed token checks (the login form and Bearer headers
alike) in two token buckets, one per client address and one for all clients: an empty
bucket refuses every token check, right or wrong, until it refills, and says when.
:class:`OperatorGate` puts the tokens and that limit together for everyone who takes an
operator's token: the console's pages and the HTTP API's decision routes share one
allowance.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Final

from eventstore.errors import InvalidArgument
from eventstore.logs import get_logger
from machine.governance import RUN_IDENTITY_PREFIX

log = get_logger("canon.console")

#: The name of the one operator a single operator token stands for.
DEFAULT_OPERATOR: Final = "operator"
#: Longest operator name (characters), as an approver's.
MAX_OPERATOR_NAME_CHARS: Final = 200
#: How a digest is spelled in an operators file.
_SHA256_PREFIX: Final = "sha256:"
#: How long a login lasts.
SESSION_TTL_S: Final = 12 * 3600.0
#: Sessions kept at most; past it the oldest is forgotten.
MAX_SESSIONS: Final = 256
#: The shortest operator token accepted, in UTF-8 bytes.
MIN_TOKEN_BYTES: Final = 16
#: Failed logins one client address may make in a burst, and the seconds that give one back.
CLIENT_BURST: Final = 10
CLIENT_REFILL_S: Final = 6.0
#: Failed logins all clients together may make in a burst, and the seconds that give one back.
OVERALL_BURST: Final = 100
OVERALL_REFILL_S: Final = 1.0
#: Client addresses whose failures are remembered; past it the one seen longest ago goes.
MAX_CLIENTS: Final = 4096
_MAX_TOKEN_CHARS: Final = 512
_MAX_CLIENT_CHARS: Final = 64


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def check_operator_token(token: str) -> None:
    """Check that ``token`` may be the operator token.

    Raises:
        InvalidArgument: the token is under 16 UTF-8 bytes, longer than 512 characters,
            or holds whitespace or control characters (the message never shows it).

    """
    if (
        len(token) > _MAX_TOKEN_CHARS
        or not token.isprintable()
        or " " in token
        or len(token.encode("utf-8", "surrogatepass")) < MIN_TOKEN_BYTES
    ):
        raise InvalidArgument(
            f"the operator token must be at least {MIN_TOKEN_BYTES} bytes and at most "
            f"{_MAX_TOKEN_CHARS} printable characters without spaces "
            "(make one with: head -c 24 /dev/urandom | base64)"
        )


def could_be_token(value: str) -> bool:
    """Tell whether ``value`` is long enough to be an operator token (so a guess at it)."""
    size = len(value.encode("utf-8", "surrogatepass"))
    return size >= MIN_TOKEN_BYTES and len(value) <= _MAX_TOKEN_CHARS


def _same(left: str, right: str) -> bool:
    """Constant-time equality of two strings (bytes, so non-ASCII input is no error)."""
    return hmac.compare_digest(
        left.encode("utf-8", "surrogatepass"), right.encode("utf-8", "surrogatepass")
    )


def check_operator_name(name: str) -> str:
    """Return ``name`` when it may name an operator.

    Printable, 1 to 200 characters, no whitespace (an operators file separates its
    fields with it), never ``run:...`` (a run's own identity).

    Raises:
        InvalidArgument: it may not.

    """
    if (
        not isinstance(name, str)
        or not 1 <= len(name) <= MAX_OPERATOR_NAME_CHARS
        or not name.isprintable()
        or any(character.isspace() for character in name)
        or name.startswith(RUN_IDENTITY_PREFIX)
    ):
        raise InvalidArgument(
            f"an operator's name is 1 to {MAX_OPERATOR_NAME_CHARS} printable characters "
            f"without spaces, not starting with {RUN_IDENTITY_PREFIX!r}"
        )
    return name


def operator_line(name: str, token: str) -> str:
    """The operators-file line of ``name`` with ``token``: ``name sha256:<hex>``.

    Raises:
        InvalidArgument: the name or the token is not usable.

    """
    check_operator_token(token)
    return f"{check_operator_name(name)} {_SHA256_PREFIX}{_digest(token).hex()}"


class Operators:
    """Named operators and the SHA-256 digests of their tokens (never the tokens).

    Build it with :meth:`from_tokens` or :meth:`parse`; :meth:`name_of` tells which
    operator a token names.
    """

    def __init__(self, digests: Mapping[str, bytes]) -> None:
        """Keep ``digests`` (operator name -> SHA-256 digest of the token).

        Raises:
            InvalidArgument: no operator, a name that is not usable, a digest that is not
                32 bytes, or two operators with one token.

        """
        if not digests:
            raise InvalidArgument("no operator is named")
        for name, digest in digests.items():
            check_operator_name(name)
            if len(digest) != hashlib.sha256().digest_size:
                raise InvalidArgument(f"operator {name!r}: not a SHA-256 digest")
        if len(set(digests.values())) != len(digests):
            raise InvalidArgument("two operators have the same token: each needs its own")
        self._digests = dict(digests)

    def __repr__(self) -> str:
        return f"Operators({sorted(self._digests)!r}, <tokens hidden>)"

    @property
    def names(self) -> list[str]:
        """The operators' names, sorted."""
        return sorted(self._digests)

    @classmethod
    def from_tokens(cls, tokens: Mapping[str, str]) -> Operators:
        """Operators named by ``tokens`` (name -> token), each token checked and hashed.

        Raises:
            InvalidArgument: a token is under 16 bytes, over 512 characters or holds
                whitespace or control characters (:func:`check_operator_token`), or as
                :class:`Operators`.

        """
        for token in tokens.values():
            check_operator_token(token)
        return cls({name: _digest(token) for name, token in tokens.items()})

    @classmethod
    def parse(cls, text: str) -> Operators:
        """Operators from an operators file: one ``name sha256:<64 hex>`` per line.

        Blank lines and lines starting with ``#`` are skipped. ``canon operators add``
        writes such lines; the file never holds a token.

        Raises:
            InvalidArgument: a line is not ``name sha256:<hex>`` (its number is named), a
                name appears twice, or as :class:`Operators`.

        """
        digests: dict[str, bytes] = {}
        for number, line in enumerate(text.splitlines(), start=1):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            parts = stripped.split()
            digest = _parse_digest(parts[1]) if len(parts) == 2 else None
            if digest is None:
                raise InvalidArgument(
                    f"line {number}: expected 'name sha256:<64 hex digits>' "
                    "(make one with: canon operators add NAME)"
                )
            if parts[0] in digests:
                raise InvalidArgument(f"line {number}: operator {parts[0]!r} is named twice")
            digests[parts[0]] = digest
        return cls(digests)

    def name_of(self, token: str | None) -> str | None:
        """The operator ``token`` names, or None.

        Every operator's digest is compared, in constant time each, so how long it takes
        says nothing of which operator (if any) was close.
        """
        if token is None or len(token) > _MAX_TOKEN_CHARS:
            return None
        digest = _digest(token)
        found: str | None = None
        for name, expected in self._digests.items():
            if hmac.compare_digest(digest, expected):
                found = name
        return found


def _parse_digest(text: str) -> bytes | None:
    """The 32 bytes ``sha256:<64 lowercase hex>`` spells, or None."""
    if not text.startswith(_SHA256_PREFIX):
        return None
    hex_part = text[len(_SHA256_PREFIX) :]
    if len(hex_part) != 64 or any(c not in "0123456789abcdef" for c in hex_part):
        return None
    return bytes.fromhex(hex_part)


class OperatorAuth:
    """Checks operators' tokens and the sessions of the logins they made."""

    def __init__(self, operators: Operators | str, *, session_ttl_s: float = SESSION_TTL_S) -> None:
        """Check tokens against ``operators`` (one token: one operator, ``operator``).

        Raises:
            InvalidArgument: the one token is under 16 bytes, longer than 512 characters,
                or holds whitespace or control characters (:func:`check_operator_token`).

        """
        if isinstance(operators, str):
            operators = Operators.from_tokens({DEFAULT_OPERATOR: operators})
        self._operators = operators
        self._key = secrets.token_bytes(32)
        self._ttl_s = session_ttl_s
        self._sessions: OrderedDict[str, tuple[float, str]] = OrderedDict()

    def __repr__(self) -> str:
        return f"OperatorAuth({self._operators!r})"

    @property
    def session_ttl_s(self) -> float:
        """How long a login lasts, in seconds."""
        return self._ttl_s

    @property
    def operators(self) -> Operators:
        """The operators whose tokens are accepted."""
        return self._operators

    def operator_of(self, token: str | None) -> str | None:
        """The operator ``token`` names, or None (constant-time comparisons)."""
        return self._operators.name_of(token)

    def check_token(self, token: str | None) -> bool:
        """Tell whether ``token`` is an operator's token (constant-time comparisons)."""
        return self.operator_of(token) is not None

    def _mac(self, session_id: str) -> str:
        return hmac.new(self._key, session_id.encode(), hashlib.sha256).hexdigest()

    def _csrf(self, session_id: str) -> str:
        # Another message under the same key: never equal to the cookie's MAC.
        return hmac.new(self._key, b"csrf\0" + session_id.encode(), hashlib.sha256).hexdigest()

    def start_session(self, operator: str) -> str:
        """Start a session of ``operator``; return the cookie value that names it."""
        session_id = secrets.token_urlsafe(24)
        self._sessions[session_id] = (time.monotonic() + self._ttl_s, operator)
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return f"{session_id}.{self._mac(session_id)}"

    def _session_id(self, cookie: str | None) -> str | None:
        if not cookie or len(cookie) > 200 or not cookie.isascii():
            return None
        session_id, _, mac = cookie.partition(".")
        if not _same(mac, self._mac(session_id)):
            return None
        session = self._sessions.get(session_id)
        if session is None:
            return None
        if session[0] <= time.monotonic():
            del self._sessions[session_id]
            return None
        return session_id

    def check_session(self, cookie: str | None) -> bool:
        """Tell whether the cookie names a live session of this process."""
        return self._session_id(cookie) is not None

    def session_operator(self, cookie: str | None) -> str | None:
        """The operator of the live session the cookie names, or None."""
        session_id = self._session_id(cookie)
        return None if session_id is None else self._sessions[session_id][1]

    def end_session(self, cookie: str | None) -> None:
        """Forget the session the cookie names (logging out); nothing if it names none."""
        session_id = self._session_id(cookie)
        if session_id is not None:
            del self._sessions[session_id]

    def csrf_token(self, cookie: str | None) -> str | None:
        """The CSRF token of the live session the cookie names, or None."""
        session_id = self._session_id(cookie)
        return None if session_id is None else self._csrf(session_id)

    def check_csrf(self, cookie: str | None, token: str | None) -> bool:
        """Tell whether ``token`` is the CSRF token of the cookie's live session.

        The comparison takes constant time.
        """
        expected = self.csrf_token(cookie)
        return expected is not None and token is not None and _same(token, expected)


def client_key(host: str | None) -> str:
    """Whose allowance a client address uses.

    The address; an IPv6 address's /64 (one host often holds a whole /64); ``unknown``
    without one.
    """
    if not host:
        return "unknown"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host[:_MAX_CLIENT_CHARS]
    if address.version == 6:
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


class _Bucket:
    """A token bucket: ``burst`` tokens at most, one given back every ``refill_s``."""

    __slots__ = ("burst", "refill_s", "tokens", "updated")

    def __init__(self, burst: int, refill_s: float, now: float) -> None:
        self.burst, self.refill_s = burst, refill_s
        self.tokens, self.updated = float(burst), now

    def wait_s(self, now: float) -> float:
        """Refill up to ``now``; the seconds until one token is there (0: one is)."""
        self.tokens = min(self.burst, self.tokens + (now - self.updated) / self.refill_s)
        self.updated = now
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) * self.refill_s

    def take(self, now: float) -> None:
        self.wait_s(now)
        self.tokens = max(self.tokens - 1, 0.0)


class LoginThrottle:
    """Limits failed operator-token checks per client address and for all clients together.

    Only failures take from the buckets, so an operator who types the token right is never
    slowed down unless someone else's failures emptied a bucket first. Memory is bounded:
    at most :data:`MAX_CLIENTS` addresses are remembered.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        """Start with full buckets, timed by ``clock`` (seconds, monotonic)."""
        self._clock = clock
        self._overall = _Bucket(OVERALL_BURST, OVERALL_REFILL_S, clock())
        self._clients: OrderedDict[str, _Bucket] = OrderedDict()

    def __repr__(self) -> str:
        return f"LoginThrottle(clients={len(self._clients)})"

    def __len__(self) -> int:
        """How many client addresses are remembered."""
        return len(self._clients)

    def retry_after_s(self, client: str) -> int:
        """Whole seconds until ``client`` may try a token again; 0 when it may now."""
        now = self._clock()
        wait = self._overall.wait_s(now)
        bucket = self._clients.get(client_key(client))
        if bucket is not None:
            wait = max(wait, bucket.wait_s(now))
        return math.ceil(wait)

    def failed(self, client: str) -> None:
        """Count one failed token check of ``client``."""
        now, key = self._clock(), client_key(client)
        self._overall.take(now)
        bucket = self._clients.pop(key, None) or _Bucket(CLIENT_BURST, CLIENT_REFILL_S, now)
        bucket.take(now)
        self._clients[key] = bucket
        while len(self._clients) > MAX_CLIENTS:
            self._clients.popitem(last=False)


class OperatorGate:
    """The operator token's check and its limit on failures, shared by all who take it.

    The console (its login form and Bearer headers) and the HTTP API's decision routes
    check the same token against the same :class:`LoginThrottle`: a guess at one uses up
    the allowance of the other, so a second door gives an attacker no second allowance.
    """

    def __init__(self, auth: OperatorAuth, throttle: LoginThrottle | None = None) -> None:
        """Check tokens with ``auth``, limiting failures with ``throttle`` (else a new one)."""
        self.auth = auth
        # Not `throttle or ...`: a throttle remembering no client yet has len() 0.
        self.throttle = throttle if throttle is not None else LoginThrottle()

    def __repr__(self) -> str:
        return f"OperatorGate({self.throttle!r})"

    def retry_after_s(self, client: str) -> int:
        """Whole seconds until ``client`` may try a token again; 0 when it may now."""
        return self.throttle.retry_after_s(client)

    def check(self, token: str, client: str) -> tuple[str | None, int]:
        """The operator ``client``'s ``token`` names (None: none), and the seconds to wait.

        The seconds are those the client must wait before trying a token (0: none): a client
        past its limit gets ``(None, seconds)`` without its token being looked at. A wrong
        token is not counted here: the caller decides whether it was a guess
        (:meth:`failed`); a run's own token sent to an operator route is none.
        """
        if could_be_token(token):
            wait_s = self.throttle.retry_after_s(client)
            if wait_s:
                return None, wait_s
        return self.auth.operator_of(token), 0

    def failed(self, client: str, token: str) -> None:
        """Count a wrong ``token`` from ``client``; log each time it leaves the client limited.

        A value too short to be the token is no guess at it: it is not counted.
        """
        if not could_be_token(token):
            return
        self.throttle.failed(client)
        wait_s = self.throttle.retry_after_s(client)
        if wait_s:
            log.warning("console_logins_limited", client=client_key(client), retry_after_s=wait_s)
