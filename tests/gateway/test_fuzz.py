"""Property-based fuzzing of the gateway's API (hypothesis, bounded): arbitrary JSON, arbitrary bytes, wrong
content types, odd query values and ids on every route. A client fault is a 4xx with a JSON error; the only 5xx
allowed are the documented ones for a handler's failure (502) or timeout (504)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.client import GatewayError
from tests.gateway.conftest import TOKEN, RunningGateway
from tests.gateway.test_api import spec

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=30,
)
bodies = st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=200),
    st.integers(1, 3_000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(1, 3_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
)
content_types = st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded", ""])


@pytest.fixture(scope="module")
def fuzz_http(gateway: RunningGateway) -> Iterator[tuple[httpx.Client, str]]:
    name = "fuzz-echo"
    with gateway.client() as client, contextlib.suppress(GatewayError):  # 409: there from an earlier run
        client.register(spec(name, max_instances=1, max_concurrency=1, queue_max=64))
    with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as http:
        yield http, name


def _ok(resp: httpx.Response) -> None:
    assert resp.status_code < 500 or resp.status_code in (502, 504), (resp.status_code, resp.text[:500])
    if resp.status_code >= 400:
        assert resp.headers["content-type"].startswith("application/json"), resp.text[:200]
        assert "error" in resp.json() or "detail" in resp.json()


@FUZZ
@given(body=bodies, content_type=content_types, route=st.sampled_from(["function", "async-function"]))
def test_invocation_routes(fuzz_http, body: bytes, content_type: str, route: str) -> None:
    http, name = fuzz_http
    _ok(http.post(f"/{route}/{name}", content=body, headers={"content-type": content_type} if content_type else {}))


@FUZZ
@given(body=bodies | json_values.map(lambda v: json.dumps({"name": "fuzz-x", "target": v}).encode()))
def test_registration_routes(fuzz_http, body: bytes) -> None:
    http, name = fuzz_http
    headers = {"content-type": "application/json"}
    _ok(http.post("/system/functions", content=body, headers=headers))
    _ok(http.put(f"/system/functions/{name}", content=body, headers=headers))
    _ok(http.post(f"/system/functions/{name}/prewarm", content=body, headers=headers))


@FUZZ
@given(
    ident=st.text(min_size=1, max_size=40).map(lambda s: quote(s, safe="")).filter(lambda s: s not in (".", "..")),
    wait=st.one_of(st.text(max_size=8), st.floats(allow_nan=True, allow_infinity=True).map(str)),
)
def test_read_routes_with_odd_ids_and_queries(fuzz_http, ident: str, wait: str) -> None:
    http, _ = fuzz_http
    _ok(http.get(f"/activations/{ident}", params={"wait_s": wait}))
    _ok(http.get(f"/system/functions/{ident}"))
    _ok(http.delete(f"/system/functions/{ident}x-nope"))
