"""Hypothesis strategies for hostile receipt-API requests: bent paths, near-miss tokens,
odd Authorization headers. Each names real ids and tokens of the runs under test."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from hypothesis import strategies as st

CAPS = "/v1/invocations/inspection-capabilities"


def tweaks(token: str, run_ids: list[str]) -> st.SearchStrategy[str]:
    """Near misses of a real token: one character changed, cut, extended, case-flipped,
    another run's id with this secret, or wrapped in whitespace and quotes."""
    prefix, run_id, secret = token.split(":", 2)
    positions = st.integers(0, len(token) - 1)
    return st.one_of(
        positions.flatmap(lambda i: st.characters().map(lambda c: token[:i] + c + token[i + 1 :])),
        positions.map(lambda i: token[:i]),
        st.text(min_size=1, max_size=8).map(lambda extra: token + extra),
        st.just(token.upper()),
        st.just(token.swapcase()),
        st.sampled_from(run_ids).map(lambda other: f"{prefix}:{other}:{secret}"),
        st.just(f"{prefix}:{run_id}:{secret[::-1]}"),
        st.just(f'"{token}"'),
        st.just(token.replace(":", "%3A")),
    )


def authorization_values(runs: dict[str, Any]) -> st.SearchStrategy[list[bytes]]:
    """Zero, one or two Authorization header values, real, tweaked or hostile."""
    tokens = [run.token for run in runs.values()]
    any_token = st.one_of(
        st.sampled_from(tokens),
        st.sampled_from(tokens).flatmap(lambda token: tweaks(token, list(runs))),
        st.text(max_size=40),
    )
    schemes = st.sampled_from(["Bearer ", "bearer ", "BEARER ", "Bearer  ", "Bearer\t", "Basic ",
                               "", "Token ", "Bearer:", " Bearer "])  # fmt: skip
    value = st.one_of(
        st.tuples(schemes, any_token).map(lambda pair: (pair[0] + pair[1]).encode("utf-8")),
        st.binary(max_size=64),
        st.just(b"Bearer " + b"x" * 100_000),
        st.just("Bearer ünïcødé-☃".encode()),
    )
    return st.lists(value, max_size=2)


def paths(runs: dict[str, Any]) -> st.SearchStrategy[str]:
    """Receipt paths of both runs, bent: case, traversal, encodings, slashes, junk."""
    ids = [i for run in runs.values() for i in run.invocation_ids]
    receipt = st.sampled_from(ids).map(lambda i: f"/v1/invocations/{i}/receipt")
    progress = st.sampled_from(list(runs)).map(lambda run_id: f"/v1/runs/{run_id}/progress")
    return st.one_of(
        receipt,
        progress,
        st.just(CAPS),
        st.sampled_from(list(runs)).map(lambda run_id: f"/v1/runs/{run_id.upper()}/progress"),
        st.sampled_from(list(runs)).map(lambda run_id: f"/v1/runs/{run_id}/../run-alpha/progress"),
        st.sampled_from(list(runs)).map(lambda run_id: f"/v1/runs/{run_id}%2Fprogress"),
        st.sampled_from(ids).map(lambda i: f"/v1/invocations/{i.upper()}/receipt"),
        st.sampled_from(ids).map(lambda i: f"/v1/invocations/{i}%2Freceipt"),
        st.sampled_from(ids).map(lambda i: f"/v1/invocations/{i}/receipt/"),
        st.sampled_from(ids).map(lambda i: f"//v1/invocations/{i}/receipt"),
        st.sampled_from(ids).map(lambda i: f"/v1/invocations/x/../{i}/receipt"),
        st.sampled_from(ids).map(lambda i: f"/v1/invocations/{i[:-1]}/receipt"),
        st.sampled_from(ids).map(lambda i: f"/v1/invocations/{i}0/receipt"),
        st.tuples(st.sampled_from(ids), st.sampled_from(ids)).map(
            lambda pair: f"/v1/invocations/{pair[0]}/receipt/../../{pair[1]}/receipt"
        ),
        st.sampled_from(ids).map(lambda i: f"/v1/invocations/{quote(i)}/%72eceipt"),
        st.sampled_from(ids).map(lambda i: f"/v1/invocations/{i[:32]}\n{i[32:]}/receipt"),
        st.sampled_from(ids).map(lambda i: f"/v1/invocations/{i}\r\n/receipt"),
        st.text(max_size=60).map(lambda text: "/" + text),
        st.just("/v1/invocations/" + "a" * 10_000 + "/receipt"),
    )
