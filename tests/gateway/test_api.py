"""The gateway's HTTP API against real subprocess instances."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import httpx
import pytest

from cache import Cache
from cache.connection import credentials_env
from gateway.client import GatewayClient, GatewayError
from gateway.liveness import PROBE_IDLE_AFTER_S
from gateway.models import FunctionSpec
from tests.gateway.conftest import RunningGateway, start_gateway, stop_gateway
from tests.procs import pid_alive, wait_pid_gone

H = "tests.functions.sample_handlers"


def spec(name: str, handler: str = "echo", **kw: object) -> FunctionSpec:
    return FunctionSpec(name=name, target=f"{H}:{handler}", **kw)


def pids(client: GatewayClient, name: str) -> list[int]:
    return [i["pid"] for i in client.function(name)["status"]["instances"]]


def test_registration_crud(client: GatewayClient, fname: str) -> None:
    out = client.register(spec(fname, timeout_s=5))
    assert out["function"]["name"] == fname and out["warm_started"] == 0
    assert fname in [f["name"] for f in client.functions()]
    with pytest.raises(GatewayError) as exists:
        client.register(spec(fname))
    assert exists.value.status_code == 409
    client.register(spec(fname, timeout_s=7), replace=True)
    assert client.function(fname)["function"]["timeout_s"] == 7
    client.delete(fname)
    with pytest.raises(GatewayError) as gone:
        client.function(fname)
    assert gone.value.status_code == 404


def test_sync_invoke_and_activation_record(client: GatewayClient, fname: str) -> None:
    client.register(spec(fname, "count"))
    call_id, first = client.invoke_with_id(fname, {})
    _, second = client.invoke_with_id(fname, {})
    assert first["calls"] == 1 and second == {"calls": 2, "pid": first["pid"]}  # warm reuse: same instance, memo
    act = client.activation(call_id, wait_s=5)
    assert act.status == "success" and act.status_code == 200 and act.result == first
    assert act.cold is True and act.init_s is not None and act.init_s > 0
    assert act.duration_s is not None and act.duration_s >= 0 and act.end >= act.start
    assert act.instance and act.resource_seconds == act.duration_s
    assert act.cost_usd == pytest.approx(act.duration_s * 4.896 / 3600 / 128)


def test_async_invoke_returns_202_and_the_record_completes(client: GatewayClient, fname: str) -> None:
    client.register(spec(fname))
    resp = client.http.post(f"/async-function/{fname}", json={"x": 1})
    assert resp.status_code == 202
    act_id = resp.json()["activation_id"]
    assert resp.headers["X-Call-Id"] == act_id
    act = client.activation(act_id, wait_s=30)
    assert act.status == "success" and act.result == {"event": {"x": 1}, "call_id": act_id}


def test_error_statuses(gateway: RunningGateway, client: GatewayClient, fname: str) -> None:
    client.register(spec(fname, "fail"))
    with gateway.client(token=None) as anon:
        with pytest.raises(GatewayError) as unauth:
            anon.invoke(fname, {})
        assert unauth.value.status_code == 401
    with gateway.client(token="wrong") as bad, pytest.raises(GatewayError) as wrong:
        bad.functions()
    assert wrong.value.status_code == 401
    assert httpx.get(f"{gateway.url}/healthz").status_code == 200  # health needs no token
    with pytest.raises(GatewayError) as missing:
        client.invoke("no-such-fn", {})
    assert missing.value.status_code == 404
    bad_body = client.http.post(f"/function/{fname}", content=b"{not json")
    assert bad_body.status_code == 422 and "not valid JSON" in bad_body.json()["error"]["message"]
    bad_spec = client.http.post("/system/functions", json={"name": "Bad Name!", "target": "x:y"})
    assert bad_spec.status_code == 422 and "name" in bad_spec.json()["error"]["message"]
    with pytest.raises(GatewayError) as raised:
        client.invoke(fname, {"message": "boom"})
    assert raised.value.status_code == 502
    assert raised.value.error["type"] == "ValueError" and raised.value.error["message"] == "boom"
    assert "Traceback" in raised.value.error["traceback"]


def test_timeout_is_504(client: GatewayClient, fname: str) -> None:
    client.register(spec(fname, "sleep", timeout_s=0.5))
    with pytest.raises(GatewayError) as slow:
        client.invoke(fname, {"seconds": 30})
    assert slow.value.status_code == 504 and slow.value.error["type"] == "Timeout"


def _blocked_calls(client: GatewayClient, name: str, n: int, cache: Cache, key: str) -> list[threading.Thread]:
    """Start `n` calls that block until released; return once all have started on an instance."""
    results: list[int] = []
    threads = []
    for _ in range(n):
        event = {"started_key": f"{key}:started", "release_key": f"{key}:release", "timeout_s": 30}
        t = threading.Thread(
            target=lambda e=event: results.append(client.http.post(f"/function/{name}", json=e).status_code)
        )
        t.start()
        threads.append(t)
    for _ in range(n):
        assert cache.client.blpop([f"{key}:started"], timeout=30) is not None
    return threads


def test_concurrency_limit_and_queue_give_429(client: GatewayClient, fname: str, cache_conn: Cache) -> None:
    client.register(
        spec(fname, "wait_for_release", max_concurrency=1, queue_max=0, env=credentials_env(cache_conn.url))
    )
    key = f"test:{uuid.uuid4().hex}"
    threads = _blocked_calls(client, fname, 1, cache_conn, key)
    resp = client.http.post(f"/function/{fname}", json={})
    assert resp.status_code == 429 and int(resp.headers["Retry-After"]) >= 1
    cache_conn.client.rpush(f"{key}:release", 1)
    for t in threads:
        t.join(30)
    cache_conn.client.delete(f"{key}:started", f"{key}:release")


def test_keep_alive_expiry_stops_the_instance(client: GatewayClient, fname: str) -> None:
    client.register(spec(fname, "count", keep_alive_s=0.3))
    pid = client.invoke(fname, {})["pid"]
    assert wait_pid_gone(pid, 30), "idle instance outlived its keep-alive"
    assert client.function(fname)["status"]["instances"] == []
    assert client.invoke(fname, {})["pid"] != pid  # the next call starts a new instance (cold)


def test_min_warm_and_prewarm(client: GatewayClient, fname: str) -> None:
    out = client.register(spec(fname, "count", min_warm=2))
    assert out["warm_started"] == 2 and len(pids(client, fname)) == 2
    act_id, _ = client.invoke_with_id(fname, {})
    assert client.activation(act_id, wait_s=5).cold is False  # served by a pre-started instance
    plan = client.prewarm(fname, 3, wait_s=30)
    assert plan["starting"] == 1 and plan["start_in_s"] == 0
    assert len(pids(client, fname)) == 3
    # A deadline far beyond the measured start time schedules the start later, not now.
    later = client.prewarm(fname, 4, by_s=60)
    assert later["starting"] == 1 and later["start_in_s"] > 50
    assert len(pids(client, fname)) == 3


def test_an_affinity_key_brings_its_calls_back_to_the_instance_that_served_it(
    client: GatewayClient, fname: str
) -> None:
    """Without a key the most recently used idle instance serves (one instance would take every sequential call);
    with one, the instance that last served that key does, and a new key takes an instance no key has claimed."""
    client.register(spec(fname, "count", min_warm=2))
    assert len(pids(client, fname)) == 2
    home = {key: client.invoke(fname, {}, affinity=key)["pid"] for key in ("actor-0", "actor-1")}
    assert home["actor-0"] != home["actor-1"]
    for key in ["actor-0", "actor-1", "actor-1", "actor-0"] * 3:
        assert client.invoke(fname, {}, affinity=key)["pid"] == home[key]
    with pytest.raises(GatewayError) as long_key:
        client.invoke(fname, {}, affinity="k" * 201)
    assert long_key.value.status_code == 400 and "X-Affinity-Key is 201 characters" in str(long_key.value)


def test_killed_instance_fails_its_call_with_502_and_is_replaced(
    client: GatewayClient, fname: str, cache_conn: Cache
) -> None:
    client.register(spec(fname, "wait_for_release", env=credentials_env(cache_conn.url)))
    key = f"test:{uuid.uuid4().hex}"
    result: list[httpx.Response] = []
    event = {"started_key": f"{key}:started", "release_key": f"{key}:release", "timeout_s": 30}
    t = threading.Thread(target=lambda: result.append(client.http.post(f"/function/{fname}", json=event)))
    t.start()
    assert cache_conn.client.blpop([f"{key}:started"], timeout=30) is not None
    [victim] = pids(client, fname)
    os.kill(victim, signal.SIGKILL)
    t.join(30)
    assert result[0].status_code == 502 and result[0].json()["error"]["type"] == "InstanceCrashed"
    # A key of its own: a push on the old one may still go to the dead instance's BLPOP (tests/gateway/test_hung.py).
    cache_conn.client.rpush(f"{key}:again", 1)
    assert client.invoke(fname, {**event, "release_key": f"{key}:again", "timeout_s": 1})["released"] is True
    assert victim not in pids(client, fname)
    cache_conn.client.delete(f"{key}:started", f"{key}:release", f"{key}:again")
    assert f'stellaris_instance_deaths_total{{found="call",function="{fname}"}} 1.0' in client.metrics()


@pytest.mark.parametrize("probe_s", ["0", "0.2"], ids=["by-the-next-call", "by-the-sweep"])
def test_an_instance_killed_while_idle_is_replaced_and_counted_once(redis_server, fname: str, probe_s: str) -> None:
    """Killed while idle. Without the sweep, the next call's probe finds it dead (`idle`) and a replacement serves
    that call. With it, the sweep finds it and starts a replacement before any call comes (`sweep`: min_warm kept).
    Either way no call fails, and the next call reports the death once, in found_dead."""
    gw = start_gateway(redis_server.url, STELLARIS_GATEWAY_IDLE_PROBE_S=probe_s)
    try:
        with gw.client() as client:
            client.register(spec(fname, min_warm=1))
            _, first = client.invoke_metered(fname, {})
            assert first.found_dead == 0
            [victim] = pids(client, fname)
            os.kill(victim, signal.SIGKILL)
            assert wait_pid_gone(victim, 30)
            found = "idle" if probe_s == "0" else "sweep"
            if found == "idle":
                time.sleep(PROBE_IDLE_AFTER_S + 0.1)  # only an instance idle this long is probed (a time, no event)
            else:  # no call at all: the sweep's replacement shows in the pool's status (polled: no event to await)
                deadline = time.monotonic() + 30
                # One look an iteration: between two looks the victim may go before its replacement comes.
                while not ((now := pids(client, fname)) and victim not in now):
                    assert time.monotonic() < deadline, "the sweep replaced no dead idle instance"
                    time.sleep(0.05)
                [replacement] = now
            _, meter = client.invoke_metered(fname, {})  # no call fails: the probe finds it dead first
            assert meter.found_dead == 1 and meter.instance != first.instance and victim not in pids(client, fname)
            if found == "sweep":
                assert pids(client, fname) == [replacement]  # the call ran on the sweep's replacement, warm
                assert meter.cold is False
            assert f'stellaris_instance_deaths_total{{found="{found}",function="{fname}"}} 1.0' in client.metrics()
            _, meter = client.invoke_metered(fname, {})
            assert meter.found_dead == 0  # counted once
    finally:
        stop_gateway(gw)


def test_a_function_deleted_through_another_worker_stops_this_workers_instances_at_its_sweep(
    redis_server, fname: str
) -> None:
    """Two workers of one gateway (one namespace, so one registry). A function deleted through one gets no call on
    the other that would find it gone: the other's sweep closes its pool, the min_warm instance included (before,
    it lived as long as that worker). The same holds for a registry lost with the cache's data."""
    a = start_gateway(redis_server.url, STELLARIS_GATEWAY_IDLE_PROBE_S="0.2")
    b = start_gateway(redis_server.url, a.namespace, STELLARIS_GATEWAY_IDLE_PROBE_S="0.2")
    try:
        with a.client() as on_a, b.client() as on_b:
            on_a.register(spec(fname, min_warm=1))
            on_b.invoke(fname, {})  # b makes a pool of its own
            [b_pid] = pids(on_b, fname)
            assert b_pid not in pids(on_a, fname)
            on_a.delete(fname)
            assert wait_pid_gone(b_pid, 30), "the other worker kept the deleted function's instance"
            assert b.proc.poll() is None
    finally:
        try:
            stop_gateway(b)
        finally:
            stop_gateway(a)  # also when b's stop fails: a CI run once left a running on


def test_deleting_a_function_stops_the_instances_still_starting(
    redis_server, client: GatewayClient, fname: str, cache_conn: Cache
) -> None:
    key = f"test:{uuid.uuid4().hex}"
    env = {"STELLARIS_TEST_HELD_START_KEY": key, "STELLARIS_TEST_HELD_START_REDIS": redis_server.url}
    client.register(FunctionSpec(name=fname, target="tests.functions.held_start_handlers:pid", env=env))
    client.prewarm(fname, 1)  # a start in the pool's background
    answers: list[httpx.Response] = []
    call = threading.Thread(target=lambda: answers.append(client.http.post(f"/function/{fname}", json={})))
    call.start()  # a cold start for this call
    started = [cache_conn.client.blpop([f"{key}:started"], timeout=30) for _ in range(2)]
    assert None not in started, "the two instances never began to start"
    client.delete(fname)
    cache_conn.client.rpush(f"{key}:release", 1, 1)  # both starts finish after the delete
    call.join(60)
    assert answers[0].status_code == 503 and answers[0].json()["error"]["type"] == "FunctionDeleted"
    for _, pid in started:
        assert wait_pid_gone(int(pid), 30), "an instance that came up after its function's delete was left running"
    cache_conn.client.delete(f"{key}:started", f"{key}:release")


def test_metrics_count_invocations_and_cold_starts(client: GatewayClient, fname: str) -> None:
    client.register(spec(fname))
    client.invoke(fname, {})
    text = client.metrics()
    assert f'stellaris_invocations_total{{code="200",function="{fname}"}} 1.0' in text
    assert f'stellaris_cold_starts_total{{function="{fname}"}} 1.0' in text
    assert f'stellaris_warm_instances{{function="{fname}"}} 1.0' in text


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_gateway_exit_leaves_no_instance_process(redis_server, sig: signal.Signals) -> None:
    gw = start_gateway(redis_server.url)
    try:
        with gw.client() as c:
            name = f"fn-{uuid.uuid4().hex[:8]}"
            c.register(spec(name, min_warm=2))
            instance_pids = pids(c, name)
        assert len(instance_pids) == 2 and all(pid_alive(p) for p in instance_pids)
        gw.proc.send_signal(sig)
        gw.proc.wait(timeout=30)
        for pid in instance_pids:
            assert wait_pid_gone(pid, 10), f"instance {pid} outlived the gateway"
    finally:
        if gw.proc.poll() is None:
            stop_gateway(gw)


def test_refuses_non_loopback_bind_without_token() -> None:
    from gateway.settings import GatewaySettings

    with pytest.raises(ValueError, match="without a token"):
        GatewaySettings(host="0.0.0.0")
    assert GatewaySettings(host="0.0.0.0", token="t").host == "0.0.0.0"


def test_process_instances_get_cpu_affinity_and_a_memory_limit(client: GatewayClient, fname: str) -> None:
    from gateway.models import Resources

    client.register(spec(fname, "count", resources=Resources(cpus=1, memory_bytes=1536 * 1024**2)))
    pid = client.invoke(fname, {})["pid"]
    if len(os.sched_getaffinity(0)) > 1:
        assert len(os.sched_getaffinity(pid)) == 1
    with open(f"/proc/{pid}/limits") as f:
        data = next(line for line in f if line.startswith("Max data size"))
    assert data.split()[3] == str(1536 * 1024**2)
