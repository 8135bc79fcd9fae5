"""The payloads page masks what looks like a secret; revealing it is a logged POST.

The request and the raw response are the audit record and are stored as they were sent
and answered; the console shows them with the store's scrubber applied (a token, a
password, a key shape become ``[Filtered]``) until an operator with a login session
reveals them, a POST with the session's CSRF token that the console logs."""

from __future__ import annotations

import html
from datetime import timedelta
from typing import Any

import httpx
from structlog.testing import capture_logs

from eventstore.store import Store
from machine.codes import ErrorCode, EvidenceStatus
from machine.ids import invocation_id
from tests.support.console_run import OPERATOR_TOKEN, csrf_of, serving

RUN = "run-reveal"
SECRET = "sk-live-9f8e7d6c5b4a39281706"
PAYLOADS = f"/console/runs/{RUN}/invocations/{invocation_id(RUN, 'c1')}/payloads"


async def a_call_holding_a_secret(store: Store) -> None:
    """A READY call whose request and raw response carry the secret."""
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    head = await store.writer.create(RUN, "c1", "fetch", f'{{"api_key":"{SECRET}"}}'.encode())
    raw = f'{{"headers":{{"Authorization":"Bearer {SECRET}"}},"rows":[1]}}'.encode()
    head = await store.writer.start_projecting(head, raw)
    await store.writer.complete(head, b'{"rows":1}', EvidenceStatus.EVIDENCE_FOUND, "s")


async def test_payloads_are_masked_until_revealed_by_a_logged_post(make_store: Any) -> None:
    """GET shows [Filtered] and how many values it masked (the record is untouched); a POST
    without the session's CSRF token is 403 and reveals nothing; with it the page shows
    the bytes as stored and one payloads_revealed line names the run and invocation."""
    store: Store = make_store()
    await a_call_holding_a_secret(store)
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        login = await client.post("/console/login", data={"token": OPERATOR_TOKEN})
        assert login.status_code == 303

        masked = await client.get(PAYLOADS)
        assert masked.status_code == 200
        assert SECRET not in masked.text and "[Filtered]" in masked.text
        assert "2 value(s) that look like secrets" in masked.text
        assert '"rows":[1]' in html.unescape(masked.text)  # what is not a secret stays
        stored = await store.reader.fields(RUN, "c1")
        assert SECRET.encode() in stored[b"raw"] and SECRET.encode() in stored[b"request"]

        with capture_logs() as logs:
            forged = await client.post(PAYLOADS, data={"csrf": "forged"})
            revealed = await client.post(PAYLOADS, data={"csrf": csrf_of(masked.text)})
        assert forged.status_code == 403 and SECRET not in forged.text
        assert revealed.status_code == 200 and revealed.text.count(SECRET) == 2
        assert "that look like secrets" not in revealed.text
        events = [(entry["event"], entry.get("run_id")) for entry in logs]
        assert ("payloads_revealed", RUN) in events
        assert not any(SECRET in repr(entry) for entry in logs)


async def test_a_page_without_secrets_offers_nothing_to_reveal(make_store: Any) -> None:
    """Payloads with nothing that looks like a secret are shown as stored, with no form."""
    store: Store = make_store()
    await store.open_run(RUN, deadline=timedelta(minutes=5))
    head = await store.writer.create(RUN, "c1", "fetch", b'{"q":"refunds"}')
    await store.writer.fail(head, ErrorCode.EXECUTION_FAILED)
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        await client.post("/console/login", data={"token": OPERATOR_TOKEN})
        page = await client.get(PAYLOADS)
        assert page.status_code == 200 and '"q":"refunds"' in html.unescape(page.text)
        assert "Reveal" not in page.text and "[Filtered]" not in page.text
