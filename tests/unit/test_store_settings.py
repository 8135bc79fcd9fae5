"""One frozen StoreSettings configures a store; the keyword arguments users pass to
Store.from_url are its fields, and what the store derives comes from it."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable
from datetime import timedelta

import pytest

from eventstore.errors import InvalidArgument
from eventstore.settings import FEED_GRACE, StoreOptions, StoreSettings
from eventstore.store import Store
from machine.limits import Limits

#: Never reached: building a store opens no connection.
OFFLINE = "redis://127.0.0.1:1/0"


def test_the_keyword_arguments_are_exactly_the_settings_fields() -> None:
    """StoreOptions (the keywords of Store and from_url) and StoreSettings list the same
    names with the same types, so neither can grow a setting the other lacks; only the
    forms ``with_options`` turns into a setting widen a type (``limits=None`` for the
    default limits, ``scrub=None`` or a list of patterns for the scrubber)."""
    fields = {field.name: field.type for field in dataclasses.fields(StoreSettings)}
    options = typing.get_type_hints(StoreOptions)
    hints = typing.get_type_hints(StoreSettings)
    wider = {"limits": None, "scrub": Iterable[str] | None}
    assert set(options) == set(fields)
    for name, hint in hints.items():
        expected = hint | wider[name] if name in wider else hint
        assert options[name] == expected, name


def test_settings_are_frozen() -> None:
    """A store's settings cannot change under it."""
    settings = StoreSettings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.namespace = "other"  # type: ignore[misc]


def test_ttl_and_feed_retention_are_derived_once() -> None:
    """ttl_ms is the TTL in ms; the feed keeps entries the grace hour longer."""
    settings = StoreSettings(ttl=timedelta(seconds=90))
    assert settings.ttl_ms == 90_000
    assert settings.feed_retention_ms == 90_000 + int(FEED_GRACE.total_seconds() * 1000)


@pytest.mark.parametrize("ttl", [timedelta(0), timedelta(seconds=-1)])
def test_a_ttl_that_is_not_positive_is_refused(ttl: timedelta) -> None:
    """A record must expire some time after it is written."""
    with pytest.raises(InvalidArgument, match="ttl"):
        StoreSettings(ttl=ttl)


def test_runs_keep_their_last_thousand_refusals_by_default() -> None:
    """refusals_kept bounds each run's refusal log: 1,000 unless set, and at least 1."""
    assert StoreSettings().refusals_kept == 1000
    assert StoreSettings(refusals_kept=5).refusals_kept == 5
    for kept in (0, -1, 2.5, True):
        with pytest.raises(InvalidArgument, match="refusals_kept"):
            StoreSettings(refusals_kept=kept)  # type: ignore[arg-type]


async def test_from_url_keywords_build_the_settings() -> None:
    """The public keywords of from_url end up in store.settings, and in the keys."""
    limits = Limits(result_bytes=4096)
    store = Store.from_url(
        OFFLINE, namespace="kw", shards=4, ttl=timedelta(hours=2), limits=limits, timeout_s=0.5
    )
    try:
        assert store.settings == StoreSettings(
            namespace="kw", shards=4, ttl=timedelta(hours=2), limits=limits, timeout_s=0.5
        )
        assert (store.keys.namespace, store.keys.shards) == ("kw", 4)
    finally:
        await store.aclose()


async def test_keywords_apply_on_top_of_given_settings() -> None:
    """from_url(url, settings, shards=8) keeps the other settings; limits=None keeps limits."""
    base = StoreSettings(namespace="base", limits=Limits(fact_count=7), timeout_s=0.5)
    store = Store.from_url(OFFLINE, base, shards=8, limits=None)
    try:
        assert store.settings == dataclasses.replace(base, shards=8)
    finally:
        await store.aclose()


async def test_store_passes_settings_on_unchanged() -> None:
    """Store(client, settings) uses the very settings object it was given."""
    settings = StoreSettings(namespace="same")
    built = Store.from_url(OFFLINE, settings)
    try:
        again = Store(built.client, built.settings)
        assert built.settings is settings
        assert again.settings is settings
    finally:
        await built.aclose()
