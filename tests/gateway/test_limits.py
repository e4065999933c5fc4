"""The gateway's bounds against a real gateway: body size (413), JSON depth (400), slow heads and stalled bodies
(closed / 408), activation records, instances and memory per function, targets and env at registration, token
scopes, async admission, the cache pool: every refusal a JSON 4xx, never a 5xx."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

from gateway.client import GatewayClient, GatewayError
from gateway.limits import check_registration, json_depth, module_exists
from gateway.models import FunctionSpec
from gateway.settings import GatewaySettings
from tests.gateway.conftest import start_gateway, stop_gateway
from tests.gateway.test_api import spec

MIB = 1 << 20


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def test_json_depth() -> None:
    assert json_depth(1) == 0 and json_depth([]) == 1 and json_depth({"a": [1, {"b": []}]}) == 4
    assert json_depth([[[]], []]) == 3


def _error(resp, status: int, kind: str, word: str) -> None:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    error = resp.json()["error"]
    assert error["type"] == kind and word in error["message"]


@pytest.mark.parametrize("path", ["/function/{name}", "/async-function/{name}", "/system/functions"])
def test_a_body_over_the_limit_is_a_json_413(client: GatewayClient, fname: str, path: str) -> None:
    client.register(spec(fname))
    url = path.format(name=fname)
    declared = client.http.post(url, content=b"x" * (MIB + 1), headers={"content-type": "application/json"})
    _error(declared, 413, "PayloadTooLarge", "max_body_bytes")

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        for _ in range(3):
            yield b" " * (MIB // 2)

    chunked = client.http.post(url, content=chunks(), headers={"content-type": "application/json"})
    _error(chunked, 413, "PayloadTooLarge", "max_body_bytes")
    assert client.invoke(fname, {"ok": 1})["event"] == {"ok": 1}  # the gateway is fine afterwards


@pytest.mark.parametrize("depth", [65, 1_100, 100_000])
def test_json_nested_past_the_limit_is_a_json_400(client: GatewayClient, fname: str, depth: int) -> None:
    client.register(spec(fname))
    for path in (f"/function/{fname}", "/system/functions"):
        body = nested(depth) if path.startswith("/function") else b'{"name": ' + nested(depth) + b"}"
        resp = client.http.post(path, content=body, headers={"content-type": "application/json"})
        if path.startswith("/function"):
            _error(resp, 400, "BadRequest", "max_json_depth")
        else:  # a model route: refused as too deep or as not matching the model, never a 5xx
            assert resp.status_code in (400, 422), resp.text
            assert resp.json()["error"]["type"] in ("BadRequest", "ValidationError")
    assert client.invoke(fname, {"a": {"b": {"c": [1]}}})["event"] == {"a": {"b": {"c": [1]}}}  # 4 deep is fine


def test_the_cap_is_configurable_and_what_passes_it_reaches_the_handler(redis_server, fname: str) -> None:
    """A 2 MiB event under a 4 MiB cap is served (the runtime accepts whatever the gateway lets through; it used to
    answer a plain-text 413 past 1 MiB, which the gateway turned into a 500); past the cap it is a JSON 413."""
    gw = start_gateway(redis_server.url, STELLARIS_GATEWAY_MAX_BODY_BYTES=str(4 * MIB))
    try:
        with gw.client() as client:
            client.register(spec(fname))
            big = "x" * (2 * MIB)
            assert client.invoke(fname, {"big": big})["event"]["big"] == big
            resp = client.http.post(f"/function/{fname}", content=b"x" * (4 * MIB + 1))
            _error(resp, 413, "PayloadTooLarge", f"{4 * MIB} bytes")
    finally:
        stop_gateway(gw)


def test_activation_records_are_capped_by_count(redis_server, cache_conn, fname: str) -> None:
    """200 calls under a cap of 50 records: at most 50 records (and their done markers) are left, the newest kept,
    the oldest gone (404); the records' memory is bounded accordingly."""
    gw = start_gateway(redis_server.url, STELLARIS_GATEWAY_ACTIVATION_MAX="50")
    try:
        with gw.client() as client:
            client.register(spec(fname))
            ids = [client.invoke_with_id(fname, {"i": i})[0] for i in range(200)]
            assert client.activation(ids[-1], wait_s=5).status == "success"
            with pytest.raises(GatewayError) as gone:
                client.activation(ids[0])
            assert gone.value.status_code == 404
        prefix = f"stl:gw:{{{gw.namespace}}}:act:"
        keys = list(cache_conn.client.scan_iter(match=f"{prefix}*", count=1000))
        records = [k for k in keys if not k.endswith(b":done")]
        assert len(records) <= 50 and len(keys) - len(records) <= 50, len(records)
        assert cache_conn.client.zcard(f"stl:gw:{{{gw.namespace}}}:acts") <= 50
        used = sum(cache_conn.client.memory_usage(k) or 0 for k in keys)
        assert used < 50 * 2048, used  # ~1 KB a record: the cap bounds the memory
    finally:
        stop_gateway(gw)


def test_the_api_description_is_behind_the_token_unless_made_public(gateway, redis_server) -> None:
    import httpx

    with httpx.Client(base_url=gateway.url) as anon, gateway.client() as client:
        for path in ("/openapi.json", "/docs"):
            denied = anon.get(path)
            assert denied.status_code == 401 and denied.json()["error"]["type"] == "Unauthorized"
        assert "/function/{name}" in client.http.get("/openapi.json").json()["paths"]
        assert client.http.get("/docs").status_code == 200
        assert anon.get("/redoc").status_code in (401, 404)
    public = start_gateway(redis_server.url, STELLARIS_GATEWAY_PUBLIC_DOCS="true")
    try:
        with httpx.Client(base_url=public.url) as anon:
            assert "paths" in anon.get("/openapi.json").json() and anon.get("/docs").status_code == 200
            assert anon.get("/system/functions").status_code == 401  # only the description is public
    finally:
        stop_gateway(public)


def test_instance_and_memory_caps_refuse_a_registration_with_a_422(redis_server, fname: str) -> None:
    """A pre-warm of 1,024 instances once ran the host out of memory: now the gateway caps what one function may ask
    for, and names the field and the cap; a pre-warm never starts more than the function's (capped) max."""
    gw = start_gateway(
        redis_server.url,
        STELLARIS_GATEWAY_MAX_INSTANCES="3",
        STELLARIS_GATEWAY_MAX_INSTANCE_MEMORY_BYTES=str(512 * MIB),
    )
    try:
        with gw.client() as client:
            for kwargs, word in (
                ({"max_instances": 1024}, "max_instances 1024 is over the gateway's cap of 3"),
                ({"resources": {"memory_bytes": 1 << 40}}, "resources.memory_bytes 1099511627776 is over"),
            ):
                resp = client.http.post("/system/functions", json=spec(fname, **kwargs).model_dump())
                _error(resp, 422, "ValidationError", word)
            client.register(spec(fname, max_instances=3, resources={"memory_bytes": 256 * MIB}))
            out = client.http.post(f"/system/functions/{fname}/prewarm", json={"count": 1024, "wait_s": 30}).json()
            assert out["starting"] == 3 and len(client.function(fname)["status"]["instances"]) <= 3
            resp = client.http.put(f"/system/functions/{fname}", json=spec(fname, max_instances=64).model_dump())
            _error(resp, 422, "ValidationError", "max_instances 64")
    finally:
        stop_gateway(gw)


@pytest.mark.parametrize(
    ("fields", "word"),
    [
        # The probe's injection: an importable module run with an interpreter option in its environment.
        (
            {"target": "antigravity:geohash", "env": {"BROWSER": "perlthanks", "PERL5OPT": "-Mbase;system('id')"}},
            "target 'antigravity:geohash' is outside the allowed handler modules",
        ),
        ({"env": {"PYTHONSTARTUP": "/tmp/x.py"}}, "env 'PYTHONSTARTUP' changes how a program starts"),
        ({"env": {"LD_PRELOAD": "/tmp/x.so"}}, "env 'LD_PRELOAD' changes how a program starts"),
        ({"env": {"ld_preload": "/tmp/x.so"}}, "env 'ld_preload' changes how a program starts"),
        ({"env": {"SOME_VAR": "1"}}, "env 'SOME_VAR' is not on the allow-list"),
        ({"target": "tests.functions.no_such_module:echo"}, "no module 'tests.functions.no_such_module'"),
        ({"target": "functions.handlers.no_such:handle"}, "no module 'functions.handlers.no_such'"),
    ],
)
def test_registration_refuses_foreign_targets_and_dangerous_env(
    client: GatewayClient, fname: str, fields: dict, word: str
) -> None:
    body = {"name": fname, "target": "tests.functions.sample_handlers:echo", **fields}
    resp = client.http.post("/system/functions", json=body)
    _error(resp, 422, "ValidationError", word)
    assert fname not in [f["name"] for f in client.functions()]  # nothing was registered
    ok = {"name": fname, "target": "tests.functions.sample_handlers:echo", "env": {"OMP_NUM_THREADS": "1"}}
    assert client.http.post("/system/functions", json=ok).status_code == 201  # allowed names still pass


def test_a_target_module_is_found_without_running_its_package(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    assert module_exists("tests.functions.sample_handlers") and module_exists("json.decoder")
    assert not module_exists("tests.functions.no_such_module") and not module_exists("json.decoder.deeper")
    # Looked up, not imported (the gateway imports no functions/): checked in a fresh interpreter, since this test
    # process may have imported functions/ for other tests; and from a directory outside the checkout, where an
    # editable install's packages are found by its own finder, not by a sys.path entry.
    probe = (
        "import sys; from gateway.limits import module_exists; "
        "assert module_exists('functions.handlers.learner'); "
        "assert 'functions' not in sys.modules and 'functions.handlers' not in sys.modules, 'imported'"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_docker_registration_brings_its_own_modules() -> None:
    from starlette.exceptions import HTTPException

    target = "functions.handlers.no_such:handle"
    image_spec = FunctionSpec(name="f", backend="docker", image="example/img:1", target=target)
    check_registration(image_spec, GatewaySettings())  # the image's code, not the gateway's, runs it
    with pytest.raises(HTTPException, match=r"no module 'functions\.handlers\.no_such'"):
        check_registration(image_spec.model_copy(update={"backend": "ray"}), GatewaySettings())


def test_an_invoke_token_invokes_and_reads_activations_but_administers_nothing(redis_server, fname: str) -> None:
    import httpx

    gw = start_gateway(redis_server.url, STELLARIS_GATEWAY_INVOKE_TOKEN="invoke-only")
    try:
        with gw.client() as admin:
            admin.register(spec(fname))
        headers = {"Authorization": "Bearer invoke-only"}
        with httpx.Client(base_url=gw.url, headers=headers, timeout=30) as invoker:
            call = invoker.post(f"/function/{fname}", json={"x": 1})
            assert call.status_code == 200 and call.json()["event"] == {"x": 1}
            queued = invoker.post(f"/async-function/{fname}", json={"x": 2})
            assert queued.status_code == 202
            record = invoker.get(f"/activations/{queued.json()['activation_id']}", params={"wait_s": 10})
            assert record.status_code == 200 and record.json()["status"] == "success"
            for method, path, body in (
                ("POST", "/system/functions", spec(f"{fname}-x").model_dump()),
                ("PUT", f"/system/functions/{fname}", spec(fname).model_dump()),
                ("DELETE", f"/system/functions/{fname}", None),
                ("POST", f"/system/functions/{fname}/prewarm", {"count": 1}),
                ("GET", "/system/functions", None),
                ("GET", "/metrics", None),
                ("GET", "/openapi.json", None),
            ):
                resp = invoker.request(method, path, json=body)
                assert resp.status_code == 401, (method, path, resp.text)
        with gw.client() as admin:
            assert fname in [f["name"] for f in admin.functions()]  # nothing the invoker tried took effect
            assert f"{fname}-x" not in [f["name"] for f in admin.functions()]
    finally:
        stop_gateway(gw)


def test_async_admission_is_decided_before_the_202(client: GatewayClient, fname: str) -> None:
    """300 async calls at once against 2 slots + 8 queue places: every call that got a 202 runs to success, the rest
    are refused with a 429 up front (before, 115 of 127 accepted calls were rejected afterwards). More than 10 may be
    accepted: places free up while the burst is still arriving."""
    import asyncio

    import httpx

    client.register(spec(fname, "sleep", max_concurrency=2, max_instances=2, queue_max=8, timeout_s=30))
    headers = {"Authorization": client.http.headers["Authorization"]}

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=str(client.http.base_url), headers=headers, timeout=60) as http:
            return await asyncio.gather(
                *(http.post(f"/async-function/{fname}", json={"seconds": 0.2}) for _ in range(300))
            )

    answers = asyncio.run(burst())
    accepted = [r.json()["activation_id"] for r in answers if r.status_code == 202]
    refused = [r for r in answers if r.status_code == 429]
    assert len(accepted) + len(refused) == 300 and accepted and refused, (len(accepted), len(refused))
    assert all(r.json()["error"]["type"] == "TooManyRequests" for r in refused)
    for activation_id in accepted:
        assert client.activation(activation_id, wait_s=30).status == "success"


def test_a_small_cache_pool_makes_requests_wait_not_fail(redis_server, fname: str) -> None:
    """One cache connection for 200 concurrent requests (registry reads, activation writes): every one answered, no
    5xx (the pool used to run dry and answer 500)."""
    import asyncio

    import httpx

    gw = start_gateway(redis_server.url, STELLARIS_GATEWAY_REDIS_MAX_CONNECTIONS="1")
    try:
        with gw.client() as client:
            client.register(spec(fname, max_concurrency=4, max_instances=2, queue_max=1000))
            headers = {"Authorization": client.http.headers["Authorization"]}

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=gw.url, headers=headers, timeout=60) as http:
                calls = [http.post(f"/function/{fname}", json={"i": i}) for i in range(100)]
                reads = [http.get(f"/system/functions/{fname}") for _ in range(100)]
                return await asyncio.gather(*calls, *reads)

        codes = [r.status_code for r in asyncio.run(burst())]
        assert codes == [200] * 200, sorted(set(codes))
    finally:
        stop_gateway(gw)


def _raw(url: str) -> socket.socket:
    where = urlparse(url)
    return socket.create_connection((where.hostname, where.port), timeout=30)


def test_slow_request_heads_and_stalled_bodies_are_cut_off(redis_server, fname: str) -> None:
    """Slowloris: a head trickled a byte at a time is cut off after header_timeout_s although bytes keep coming
    (uvicorn's keep-alive timer restarts on every byte); a body that stalls gets a JSON 408 after body_timeout_s."""
    gw = start_gateway(redis_server.url, STELLARIS_GATEWAY_HEADER_TIMEOUT_S="1", STELLARIS_GATEWAY_BODY_TIMEOUT_S="1")
    try:
        with gw.client() as client:
            client.register(spec(fname))
        sock = _raw(gw.url)
        sock.sendall(f"POST /function/{fname} HTTP/1.1\r\nHost: x\r\n".encode())
        closed_after = None
        start = time.monotonic()
        for _ in range(40):  # a header byte every 0.25 s, for up to 10 s
            try:
                sock.sendall(b"X")
                sock.settimeout(0.25)
                if sock.recv(1024) == b"":
                    closed_after = time.monotonic() - start
                    break
            except TimeoutError:
                continue
            except OSError:
                closed_after = time.monotonic() - start
                break
        sock.close()
        assert closed_after is not None, "a trickled request head kept its connection for 10 s"

        sock = _raw(gw.url)
        head = f"POST /function/{fname} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer test-token\r\n"
        sock.sendall((head + 'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"a":').encode())
        sock.settimeout(30)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
        sock.close()
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b'"RequestTimeout"' in answer and b"body_timeout_s" in answer
        with gw.client() as client:
            assert client.invoke(fname, {"ok": 1})["event"] == {"ok": 1}  # normal calls are unaffected
    finally:
        stop_gateway(gw)


def test_a_pipelined_request_is_not_cut_off_by_the_head_deadline(redis_server, fname: str) -> None:
    """Two requests in one write (HTTP/1.1 pipelining) and header_timeout_s 1: the second's head came with the first,
    so the deadline for a next head is not armed while it runs (2 s); both answers arrive, in order."""
    gw = start_gateway(redis_server.url, STELLARIS_GATEWAY_HEADER_TIMEOUT_S="1")
    try:
        with gw.client() as client:
            client.register(spec(fname, "sleep", timeout_s=30))
        sock = _raw(gw.url)

        def request(seconds: float) -> bytes:
            body = f'{{"seconds": {seconds}}}'.encode()
            head = f"POST /function/{fname} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer test-token\r\n"
            return (head + f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body

        sock.sendall(request(0) + request(2))
        answer = b""
        while answer.count(b"HTTP/1.1 200") < 2 or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
        sock.close()
        assert answer.count(b"HTTP/1.1 200") == 2, answer[-300:]
        assert answer.index(b'{"slept_s": 0}') < answer.index(b'{"slept_s": 2}'), answer
    finally:
        stop_gateway(gw)
