"""Secrets scrubbed from text before it is stored: the failure detail of a raising tool.

An exception's message and traceback often carry what the tool was given: a URL with a
password, an ``Authorization`` header, an API key in a query string. The record keeps
that text for operators, so it is scrubbed before it is written, as Sentry scrubs an
event before it leaves the process: every match is replaced by :data:`FILTERED`.
Scrubbing is idempotent: text already scrubbed comes back as it is (a reader may scrub
what it shows again).

Two kinds of match, case-insensitive:

- **Key names** (after Sentry's default denylist, matched inside longer names): the value
  after a name that contains ``token``, ``secret``, ``password``, ``passwd``, ``pwd``,
  ``api_key``/``apikey``, ``authorization``, ``cookie``, ``session``,
  ``bearer``, ``private_key``, ``credential`` or ``csrf``, written as ``name=value``,
  ``name: value``, ``"name": "value"`` or ``'name': 'value'`` (query strings, headers,
  reprs of dicts, JSON). The name stays, so an operator still sees *what* was hidden.
- **Value shapes**, wherever they stand: ``Bearer``/``Basic``/``Token`` credentials,
  OpenAI- and Anthropic-style keys (``sk-...``), AWS access key ids (``AKIA...``),
  GitHub (``ghp_...``), Slack (``xox?-...``) and Google (``AIza...``) keys, JSON Web
  Tokens (``eyJ...``), and the password of a URL's ``user:password@``.

:class:`Scrubber` holds the patterns, compiled once; :data:`scrub_secrets` is the
default. ``Scrubber(extra=[...])`` adds a deployment's own patterns (each match
replaced whole). Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Final

#: What a scrubbed secret is replaced by.
FILTERED: Final = "[Filtered]"
#: A scrubber: text in, the same text with its secrets replaced.
Scrub = Callable[[str], str]

#: Parts of a key name that mark its value as secret (matched inside longer names, so
#: ``x_api_key``, ``sessionid`` and ``client_secret`` count too).
SECRET_KEY_PARTS: Final = (
    "token",
    "secret",
    "password",
    "passwd",
    "pwd",
    "api_key",
    "api-key",
    "apikey",
    "authorization",
    "cookie",
    "session",
    "bearer",
    "private_key",
    "privatekey",
    "credential",
    "csrf",
)

_NAME = r"[\w.-]*(?:" + "|".join(re.escape(part) for part in SECRET_KEY_PARTS) + r")[\w.-]*"
#: ``name=value``, ``name: value``, ``"name": "value"``, ``'name': 'value'``: the value
#: runs to the next quote, white space or separator (a quoted value to its closing quote).
_KEY_VALUE: Final = re.compile(
    r"""(?P<name>["']?\b""" + _NAME + r"""["']?)(?P<sep>\s*[:=]\s*)"""
    r"""(?:(?P<quote>["'])(?P<quoted>(?:\\.|(?!(?P=quote)).)*)(?P=quote)"""
    r"""|(?P<bare>(?:(?:bearer|basic|token)\s+)?(?:\[Filtered\]|[^\s"',;&}\])]+)))""",
    re.IGNORECASE,
)
#: Value shapes that are secrets wherever they stand.
_VALUE_SHAPES: Final = (
    # An HTTP credential after its scheme (the scheme stays).
    r"(?<=\bbearer )[A-Za-z0-9._~+/=-]{8,}",
    r"(?<=\bbasic )[A-Za-z0-9+/=]{8,}",
    # OpenAI (sk-..., sk-proj-...) and Anthropic (sk-ant-...) keys.
    r"\bsk-[A-Za-z0-9_-]{16,}",
    # AWS access key ids.
    r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[0-9A-Z]{16}\b",
    # GitHub tokens.
    r"\bgh[pousr]_[A-Za-z0-9]{30,}",
    r"\bgithub_pat_[A-Za-z0-9_]{30,}",
    # Slack tokens.
    r"\bxox[abposr]-[A-Za-z0-9-]{10,}",
    # Google API keys.
    r"\bAIza[0-9A-Za-z_-]{35}",
    # JSON Web Tokens (header.payload.signature, the header starting {" base64url).
    r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}",
)
_SHAPES: Final = re.compile("|".join(f"(?:{shape})" for shape in _VALUE_SHAPES), re.IGNORECASE)
#: The password of a URL's ``user:password@`` (the scheme, user and host stay).
_URL_PASSWORD: Final = re.compile(r"(?P<head>://[^:/@\s]+:)(?P<password>[^@/\s]+)(?=@)")


class Scrubber:
    """Replaces secrets in text by :data:`FILTERED` (see the module docstring).

    Args:
        extra: more regular expressions whose every match is a secret (replaced whole).

    Raises:
        re.error: an ``extra`` pattern is not a regular expression.

    """

    def __init__(self, extra: Iterable[str] = ()) -> None:
        self.extra = tuple(extra)
        self._extra = [re.compile(pattern) for pattern in self.extra]

    def __call__(self, text: str) -> str:
        """Return ``text`` with every secret it shows replaced by :data:`FILTERED`."""
        text = _URL_PASSWORD.sub(lambda match: match["head"] + FILTERED, text)
        text = _KEY_VALUE.sub(_filtered_value, text)
        text = _SHAPES.sub(FILTERED, text)
        for pattern in self._extra:
            text = pattern.sub(FILTERED, text)
        return text

    def __repr__(self) -> str:
        return f"Scrubber(extra={list(self.extra)!r})"


#: Name endings of exception and warning types: ``SessionError: ...`` is a message, not
#: a secret's name and value.
_TYPE_ENDINGS: Final = ("error", "exception", "warning", "exit", "interrupt")


def _filtered_value(match: re.Match[str]) -> str:
    if match["name"].strip("\"'").lower().endswith(_TYPE_ENDINGS):
        return match.group(0)
    if match["quote"] is not None:
        value = f"{match['quote']}{FILTERED}{match['quote']}"
    else:
        bare = match["bare"]
        scheme = re.match(r"(?i)(bearer|basic|token)\s+", bare)
        value = (scheme.group(0) if scheme else "") + FILTERED
    return f"{match['name']}{match['sep']}{value}"


#: The default scrubber: the key names and value shapes of the module docstring.
scrub_secrets: Final = Scrubber()


def scrubber(setting: Scrub | Iterable[str] | None) -> Scrub:
    """The scrubber a setting names.

    None is the default; a list of patterns, the default plus them; a callable, itself
    (it replaces the default: compose it with :data:`scrub_secrets` to keep both).

    Raises:
        re.error: a pattern is not a regular expression.
        TypeError: the setting is none of these.

    """
    if setting is None:
        return scrub_secrets
    if callable(setting):
        return setting
    if isinstance(setting, str | bytes):
        raise TypeError("scrub takes a list of patterns, not one string")
    return Scrubber(extra=setting)
