"""The gateway's edges against a real gateway: a registration's numbers and env names, auth before the body, and
what an invoke-token caller sees of a handler's failure (issue 58)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cache import Cache
from cache.keys import GatewayKeys
from tests.gateway.conftest import ROOT, TOKEN, RunningGateway, start_gateway, stop_gateway

H = "tests.functions.sample_handlers"
INVOKE_TOKEN = "invoke-only"
PREFIXES = '["functions.handlers.", "tests.functions."]'
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def gw(redis_server) -> Iterator[RunningGateway]:
    # Every env name allowed (the deny list still applies): only the name's own form may refuse one here.
    allow_all = {"STELLARIS_GATEWAY_ENV_ALLOW": '["*"]'}
    gateway = start_gateway(redis_server.url, STELLARIS_GATEWAY_INVOKE_TOKEN=INVOKE_TOKEN, **allow_all)
    yield gateway
    stop_gateway(gateway)


def _http(gateway: RunningGateway, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=gateway.url, headers=headers, timeout=60)


@pytest.fixture
def admin(gw: RunningGateway) -> Iterator[httpx.Client]:
    with _http(gw, TOKEN) as c:
        yield c


@pytest.fixture
def invoker(gw: RunningGateway) -> Iterator[httpx.Client]:
    with _http(gw, INVOKE_TOKEN) as c:
        yield c


def _spec(name: str, handler: str = "echo", **kw: Any) -> dict[str, Any]:
    return {"name": name, "target": f"{H}:{handler}", **kw}


def _refused(resp: httpx.Response, *named: str) -> str:
    assert resp.status_code == 422, resp.text
    message: str = resp.json()["error"]["message"]
    assert all(n in message for n in named), message
    return message


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"pricing": {"instance_usd_per_hour": "Infinity"}}, "pricing.instance_usd_per_hour"),
        ({"pricing": {"instance_usd_per_hour": "NaN"}}, "pricing.instance_usd_per_hour"),
        ({"pricing": {"instance_usd_per_hour": 1e308}}, "pricing.instance_usd_per_hour"),
        ({"pricing": {"functions_per_instance": 10**20}}, "pricing.functions_per_instance"),
        ({"resources": {"memory_bytes": 1e308}}, "resources.memory_bytes"),
        ({"resources": {"cpus": "-Infinity"}}, "resources.cpus"),
        ({"backend": "ray", "resources": {"custom": {"slot": "Infinity"}}}, "resources.custom.slot"),
        ({"timeout_s": "NaN"}, "timeout_s"),
        ({"keep_alive_s": "Infinity"}, "keep_alive_s"),
    ],
)
def test_a_registrations_numbers_are_finite_and_bounded(
    admin: httpx.Client, fname: str, body: dict[str, Any], field: str
) -> None:
    _refused(admin.post("/system/functions", json=_spec(fname, **body)), field)
    assert admin.get(f"/system/functions/{fname}").status_code == 404  # nothing was stored


def test_json_infinity_literals_are_refused_too(admin: httpx.Client, fname: str) -> None:
    # Python's JSON decoder (FastAPI's) reads the bare literals Infinity and NaN.
    raw = json.dumps(_spec(fname, pricing={"instance_usd_per_hour": 1.0})).replace("1.0", "Infinity").encode()
    for method, path in (("POST", "/system/functions"), ("PUT", f"/system/functions/{fname}")):
        resp = admin.request(method, path, content=raw, headers=JSON)
        _refused(resp, "pricing.instance_usd_per_hour", "finite")


def test_prewarm_and_activation_waits_are_finite_and_bounded(
    admin: httpx.Client, invoker: httpx.Client, fname: str
) -> None:
    assert admin.post("/system/functions", json=_spec(fname)).status_code == 201
    for by_s in ("Infinity", "NaN", 1e308):
        _refused(admin.post(f"/system/functions/{fname}/prewarm", json={"count": 1, "by_s": by_s}), "by_s")
    _refused(admin.post(f"/system/functions/{fname}/prewarm", json={"count": 1, "wait_s": "NaN"}), "wait_s")
    for wait_s in ("nan", "inf"):
        _refused(invoker.get(f"/activations/{uuid.uuid4().hex}", params={"wait_s": wait_s}), "wait_s")


def test_the_largest_price_allowed_still_meters_a_finite_cost(
    admin: httpx.Client, invoker: httpx.Client, fname: str
) -> None:
    pricing = {"instance_usd_per_hour": 10_000, "functions_per_instance": 1}
    assert admin.post("/system/functions", json=_spec(fname, pricing=pricing)).status_code == 201
    call = invoker.post(f"/function/{fname}", json={})
    assert call.status_code == 200
    record = invoker.get(f"/activations/{call.headers['X-Call-Id']}", params={"wait_s": 10})
    assert record.status_code == 200 and 0 <= record.json()["cost_usd"] < 1e6


@pytest.mark.parametrize("stored_cost", ["null", '"Infinity"', "Infinity", '"not a number"'])
def test_a_stored_record_with_an_unreadable_number_is_still_answered(
    gw: RunningGateway, invoker: httpx.Client, cache_conn: Cache, stored_cost: str
) -> None:
    # What a gateway before the bounds wrote for a call of a function priced at Infinity: `null` (pydantic's JSON).
    act_id = uuid.uuid4().hex
    record = {"id": act_id, "function": "priced-at-infinity", "status": "success", "status_code": 200}
    raw = json.dumps({**record, "result": {"x": 1}, "duration_s": 0.5, "cost_usd": "COST"})
    cache_conn.client.set(GatewayKeys(gw.namespace).activation(act_id), raw.replace('"COST"', stored_cost), ex=600)
    resp = invoker.get(f"/activations/{act_id}")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert {k: body[k] for k in record} == record and body["result"] == {"x": 1} and body["duration_s"] == 0.5
    assert body["cost_usd"] == 0.0  # its default: the rest of the record is answered as it was stored


def test_a_stored_registration_the_bounds_refuse_is_left_out_named_and_can_be_replaced(
    gw: RunningGateway, admin: httpx.Client, cache_conn: Cache, fname: str
) -> None:
    """A function registered before the bounds with an infinite price (stored as `null`): listing the functions
    leaves it out (a restarted gateway starts all the same), invoking it says why, and PUT or DELETE still work."""
    stored = json.dumps({**_spec(fname), "pricing": {"instance_usd_per_hour": None}})
    cache_conn.client.hset(GatewayKeys(gw.namespace).functions, fname, stored)
    listed = admin.get("/system/functions")
    assert listed.status_code == 200 and fname not in {f["name"] for f in listed.json()}
    called = admin.post(f"/function/{fname}", json={})
    assert called.status_code == 409 and "instance_usd_per_hour" in called.json()["error"]["message"], called.text
    assert admin.put(f"/system/functions/{fname}", json=_spec(fname)).status_code == 200
    assert admin.post(f"/function/{fname}", json={"x": 1}).json()["event"] == {"x": 1}
    assert admin.delete(f"/system/functions/{fname}").status_code in (200, 204)


@pytest.mark.parametrize("name", ["A=B", "A\x00", "A\nB", "1A", "A\n", "", "A B", "Ä"])
def test_env_names_must_be_variable_names(admin: httpx.Client, fname: str, name: str) -> None:
    _refused(admin.post("/system/functions", json=_spec(fname, env={name: "1"})), "env name", repr(name))
    assert admin.get(f"/system/functions/{fname}").status_code == 404


def test_env_values_hold_no_nul(admin: httpx.Client, fname: str) -> None:
    refused = _refused(admin.post("/system/functions", json=_spec(fname, env={"OMP_NUM_THREADS": "1\x00"})), "NUL")
    assert "'OMP_NUM_THREADS'" in refused
    ok = admin.post("/system/functions", json=_spec(fname, env={"OMP_NUM_THREADS": "1"}))
    assert ok.status_code == 201, ok.text


MALFORMED = b"{not json"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/system/functions"),
        ("PUT", "/system/functions/some-fn"),
        ("POST", "/system/functions/some-fn/prewarm"),
    ],
)
def test_an_admin_route_checks_the_token_before_the_body(gw: RunningGateway, method: str, path: str) -> None:
    for token in (None, "wrong", INVOKE_TOKEN):
        with _http(gw, token) as c:
            resp = c.request(method, path, content=MALFORMED, headers=JSON)
        assert resp.status_code == 401, (token, resp.text)
        assert resp.json()["error"]["type"] == "Unauthorized" and resp.headers["WWW-Authenticate"] == "Bearer"
    with _http(gw, TOKEN) as c:  # the body is indeed malformed: the admin is told so
        resp = c.request(method, path, content=MALFORMED, headers=JSON)
    assert resp.status_code == 422 and "json" in resp.json()["error"]["message"].lower(), resp.text


@pytest.mark.parametrize("path", ["/function/some-fn", "/async-function/some-fn"])
def test_an_invocation_checks_the_token_before_the_body(gw: RunningGateway, path: str) -> None:
    for token in (None, "wrong"):
        with _http(gw, token) as c:
            assert c.post(path, content=MALFORMED).status_code == 401


def test_an_invoke_token_caller_sees_the_handlers_error_but_not_its_traceback(
    admin: httpx.Client, invoker: httpx.Client, fname: str
) -> None:
    assert admin.post("/system/functions", json=_spec(fname, "fail")).status_code == 201
    call = invoker.post(f"/function/{fname}", json={"message": "boom"})
    assert call.status_code == 502 and call.json() == {"error": {"type": "ValueError", "message": "boom"}}
    queued = invoker.post(f"/async-function/{fname}", json={"message": "later"})
    assert queued.status_code == 202
    for act_id, message in ((call.headers["X-Call-Id"], "boom"), (queued.json()["activation_id"], "later")):
        seen = invoker.get(f"/activations/{act_id}", params={"wait_s": 30}).json()
        assert seen["status"] == "error" and seen["error"] == {"type": "ValueError", "message": message}
        assert "sample_handlers" not in json.dumps(seen)
        kept = admin.get(f"/activations/{act_id}").json()["error"]  # the record keeps it, for the admin
        assert kept["type"] == "ValueError" and "Traceback" in kept["traceback"]
        assert "sample_handlers.py" in kept["traceback"]
    by_admin = admin.post(f"/function/{fname}", json={"message": "boom"})
    assert by_admin.status_code == 502 and "Traceback" in by_admin.json()["error"]["traceback"]


def _start_open_gateway(redis_url: str) -> RunningGateway:
    """A gateway with no token at all (loopback dev mode); conftest's start_gateway always sets one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STELLARIS_GATEWAY_")}
    env |= {
        "REDIS_URL": redis_url,
        "STELLARIS_GATEWAY_PORT": "0",
        "STELLARIS_GATEWAY_NAMESPACE": f"gw-{uuid.uuid4().hex[:8]}",
        "STELLARIS_GATEWAY_TARGET_PREFIXES": PREFIXES,
    }
    proc = subprocess.Popen([sys.executable, "-m", "gateway"], cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        proc.kill()
        raise RuntimeError(f"gateway did not start: {line!r}")
    return RunningGateway(proc, f"http://127.0.0.1:{int(line.split()[1])}", env["STELLARIS_GATEWAY_NAMESPACE"])


def test_without_tokens_every_caller_is_the_admin(redis_server, fname: str) -> None:
    gateway = _start_open_gateway(redis_server.url)
    try:
        with _http(gateway, None) as anyone:
            assert (
                anyone.post("/system/functions", content=MALFORMED, headers=JSON).status_code == 422
            )  # no token to check first
            assert anyone.post("/system/functions", json=_spec(fname, "fail")).status_code == 201
            call = anyone.post(f"/function/{fname}", json={"message": "boom"})
            assert call.status_code == 502 and "Traceback" in call.json()["error"]["traceback"]
            record = anyone.get(f"/activations/{call.headers['X-Call-Id']}", params={"wait_s": 10}).json()
            assert "Traceback" in record["error"]["traceback"]
    finally:
        stop_gateway(gateway)
