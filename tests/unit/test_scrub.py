"""Secrets are scrubbed from text before it is stored (the failure detail of a raising tool).

Each case is text an exception really carries: a query string, a header, a dict repr,
JSON, a URL with a password, a provider's key shape. The secret becomes ``[Filtered]``;
the name before it, and everything that is not a secret, stays.
"""

from __future__ import annotations

import re

import httpx
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from machine.failure_detail import decode_failure_detail, failure_detail
from machine.scrub import FILTERED, Scrubber, scrub_secrets, scrubber

SECRETS = {
    "a query string": (
        "Unauthorized for url: https://api.example.com/v1/search?api_key=abc123def&q=1",
        "https://api.example.com/v1/search?api_key=[Filtered]&q=1",
    ),
    "a URL's password": (
        "could not connect to postgres://alice:hunter2@db.internal:5432/app",
        "postgres://alice:[Filtered]@db.internal:5432/app",
    ),
    "a dict repr of headers": (
        "headers={'Authorization': 'Bearer abcdefghijklmnop', 'Accept': 'application/json'}",
        "headers={'Authorization': '[Filtered]', 'Accept': 'application/json'}",
    ),
    "a header line": ("Authorization: Bearer abcdefghijklmnop", "Authorization: Bearer [Filtered]"),
    "basic credentials": ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "Basic [Filtered]"),
    "JSON": (
        '{"user": "bob", "password": "p@ss word"}',
        '{"user": "bob", "password": "[Filtered]"}',
    ),
    "key=value in a message": (
        "upstream 503 (token=demo-secret)",
        "upstream 503 (token=[Filtered])",
    ),
    "a name inside a longer name": ("x-api-key: zzz999; sessionid=abc", "x-api-key: [Filtered]"),
    "an OpenAI key anywhere": ("key sk-proj-abcdefghijklmnopqrstuvwx rejected", "key [Filtered] "),
    "an Anthropic key anywhere": (
        "sk-ant-api03-abcdefghijklmnopqrstu was revoked",
        "[Filtered] was",
    ),
    "an AWS access key id": ("AKIAIOSFODNN7EXAMPLE is not allowed", "[Filtered] is not allowed"),
    "a GitHub token": ("ghp_" + "a1" * 18 + " expired", "[Filtered] expired"),
    "a JSON Web Token": (
        "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_X end",
        "jwt [Filtered] end",
    ),
}


@pytest.mark.parametrize(("text", "kept"), SECRETS.values(), ids=list(SECRETS))
def test_a_secret_becomes_filtered_and_its_context_stays(text: str, kept: str) -> None:
    """The secret's value is replaced; the name and the rest of the text remain."""
    scrubbed = scrub_secrets(text)
    assert kept in scrubbed
    assert FILTERED in scrubbed


@pytest.mark.parametrize(("text", "kept"), SECRETS.values(), ids=list(SECRETS))
def test_scrubbing_scrubbed_text_changes_nothing(text: str, kept: str) -> None:
    """A reader may scrub what it shows again: scrubbed text comes back as it is (no
    ``[Filtered]]``), whatever shape the secret had."""
    once = scrub_secrets(text)
    assert scrub_secrets(once) == once


@given(
    st.lists(
        st.sampled_from([*[text for text, _ in SECRETS.values()], "plain words", " ", "; "]),
        max_size=6,
    )
)
def test_scrubbing_is_idempotent_on_any_mix(parts: list[str]) -> None:
    """Secrets of every shape mixed with plain text: scrubbing twice is scrubbing once."""
    once = scrub_secrets("".join(parts))
    assert scrub_secrets(once) == once


def test_text_without_secrets_is_unchanged() -> None:
    """Messages, exception type names and code without secrets are left as they are."""
    for text in (
        "ValueError: bad input 42 for tool search",
        "openai.AuthenticationError: Error code: 401",
        "aiohttp.ClientSessionError: closed",
        'File "tool.py", line 12, in search\n    return index.lookup(query)',
    ):
        assert scrub_secrets(text) == text


def test_a_real_httpx_error_is_scrubbed() -> None:
    """httpx names the request URL, query string and all, in its status error."""
    request = httpx.Request("GET", "https://api.example.com/v1?access_token=tok-live-123")
    response = httpx.Response(401, request=request)
    with pytest.raises(httpx.HTTPStatusError) as raised:
        response.raise_for_status()
    scrubbed = scrub_secrets(str(raised.value))
    assert "tok-live-123" not in scrubbed
    assert "access_token=[Filtered]" in scrubbed


def test_a_real_openai_error_is_scrubbed() -> None:
    """The OpenAI SDK's error repeats the server's body, which may echo the key."""
    request = httpx.Request("POST", "https://api.openai.com/v1/chat/completions")
    body = {"error": {"message": "Invalid key sk-proj-abcdefghijklmnopqrstuvwxyz0123"}}
    response = httpx.Response(401, request=request, json=body)
    error = openai.AuthenticationError("Error code: 401", response=response, body=body)
    scrubbed = scrub_secrets(f"{error} {error.body}")
    assert "sk-proj-abcdefghijklmnopqrstuvwxyz0123" not in scrubbed
    assert "Invalid key [Filtered]" in scrubbed


def test_extra_patterns_add_to_the_defaults() -> None:
    """A deployment's own patterns are scrubbed whole, beside the default ones."""
    scrub = scrubber([r"acct-\d{6}"])
    assert scrub("acct-123456 over limit, token=x1") == "[Filtered] over limit, token=[Filtered]"


def test_a_callable_replaces_the_default() -> None:
    """A callable scrubber is used as it is (compose it with the default to keep both)."""

    def upper(text: str) -> str:
        return text.upper()

    assert scrubber(upper) is upper
    assert scrubber(None) is scrub_secrets


def test_bad_scrub_settings_are_refused() -> None:
    """One string (not a list of patterns) and an invalid pattern are clear errors."""
    with pytest.raises(TypeError, match="list of patterns"):
        scrubber("token")
    with pytest.raises(re.error):
        Scrubber(extra=["("])


def test_the_failure_detail_is_scrubbed_before_it_is_bounded() -> None:
    """Message and traceback lose the secret; a scrubber that raises hides the text."""
    try:
        raise ConnectionError("upstream 503 from billing (token=demo-secret)")
    except ConnectionError as exc:
        error = exc
    data = failure_detail(error, "full", 8192)
    assert data is not None and b"demo-secret" not in data
    detail = decode_failure_detail(data)
    assert detail is not None
    assert detail.message == "upstream 503 from billing (token=[Filtered])"
    assert "token=[Filtered]" in detail.traceback

    def broken(text: str) -> str:
        raise RuntimeError("the scrubber broke")

    hidden = decode_failure_detail(failure_detail(error, "full", 8192, broken) or b"")
    assert hidden is not None
    assert "demo-secret" not in hidden.message + hidden.traceback
    assert hidden.message == "[Filtered: the scrubber raised]"
