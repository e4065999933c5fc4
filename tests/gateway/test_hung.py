"""A hung instance under a call (stopped with SIGSTOP: alive, its connections open, answering nothing) is found by
the gateway's busy probes and killed, so its call ends with a 502 InstanceHung instead of waiting for its timeout;
a busy instance that answers its probes, however long its call, is left alone."""

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
from gateway.client import GatewayClient
from gateway.models import FunctionSpec
from gateway.settings import GatewaySettings
from gateway.silence import Silence
from tests.gateway.conftest import RunningGateway, start_gateway, stop_gateway
from tests.gateway.test_api import pids, spec
from tests.procs import wait_pid_gone

HUNG_AFTER_S, PROBE_S = 2.0, 0.25


@pytest.fixture(scope="module")
def watched(redis_server) -> RunningGateway:
    gw = start_gateway(
        redis_server.url,
        STELLARIS_GATEWAY_HUNG_AFTER_S=str(HUNG_AFTER_S),
        STELLARIS_GATEWAY_BUSY_PROBE_S=str(PROBE_S),
    )
    yield gw
    stop_gateway(gw)


@pytest.fixture
def client(watched: RunningGateway) -> GatewayClient:
    with watched.client() as c:
        yield c


def _call_in_background(client: GatewayClient, fname: str, event: dict) -> tuple[threading.Thread, list]:
    answers: list[httpx.Response] = []
    t = threading.Thread(target=lambda: answers.append(client.http.post(f"/function/{fname}", json=event)))
    t.start()
    return t, answers


def test_a_stopped_instance_under_a_call_is_killed_and_its_call_ends_with_502(
    client: GatewayClient, fname: str, cache_conn: Cache
) -> None:
    client.register(
        spec(fname, "wait_for_release", timeout_s=600, env=credentials_env(cache_conn.url))
    )  # its own timeout would take 10 minutes
    key = f"test:{uuid.uuid4().hex}"
    event = {"started_key": f"{key}:started", "release_key": f"{key}:release", "timeout_s": 600}
    t, answers = _call_in_background(client, fname, event)
    assert cache_conn.client.blpop([f"{key}:started"], timeout=30) is not None
    [victim] = pids(client, fname)
    stopped = time.monotonic()
    os.kill(victim, signal.SIGSTOP)
    t.join(60)
    assert answers, "the hung instance's call did not end"
    waited = time.monotonic() - stopped
    error = answers[0].json()["error"]
    assert answers[0].status_code == 502 and error["type"] == "InstanceHung", answers[0].text
    assert "answered no health probe" in error["message"] and waited >= HUNG_AFTER_S
    assert wait_pid_gone(victim, 30), "the hung instance was not killed"
    # A key of its own: Redis may still hand a push on the old one to the dead instance's BLPOP (its connection's
    # close not yet seen), and the replacement would then wait in vain (a CI flake).
    cache_conn.client.rpush(f"{key}:again", 1)
    assert client.invoke(fname, {**event, "release_key": f"{key}:again", "timeout_s": 1})["released"] is True
    cache_conn.client.delete(f"{key}:started", f"{key}:release", f"{key}:again")
    assert f'stellaris_instance_deaths_total{{found="hung",function="{fname}"}} 1.0' in client.metrics()
    print(f"the stopped instance's call ended {waited:.2f} s after SIGSTOP (hung after {HUNG_AFTER_S} s)")


@pytest.mark.parametrize("handler", ["wait_for_release", "spin"])
def test_a_busy_instance_that_answers_its_probes_is_left_alone(
    client: GatewayClient, fname: str, cache_conn: Cache, handler: str
) -> None:
    """Calls three times as long as `hung_after_s`: one blocked in Redis, one on the CPU in pure Python (its handler
    thread wants the GIL all the time, and the runtime's event loop still answers)."""
    target = f"tests.functions.sample_handlers:{handler}"
    client.register(FunctionSpec(name=fname, target=target, timeout_s=60, env=credentials_env(cache_conn.url)))
    key = f"test:{uuid.uuid4().hex}"
    seconds = 3 * HUNG_AFTER_S
    if handler == "spin":
        answer = client.invoke(fname, {"seconds": seconds})
        assert answer["turns"] > 0
    else:
        event = {"started_key": f"{key}:started", "release_key": f"{key}:release", "timeout_s": 60}
        t, answers = _call_in_background(client, fname, event)
        assert cache_conn.client.blpop([f"{key}:started"], timeout=30) is not None
        time.sleep(seconds)  # probes come and are answered meanwhile: a span of time, no event to await
        cache_conn.client.rpush(f"{key}:release", 1)
        t.join(30)
        assert answers[0].status_code == 200 and answers[0].json()["released"] is True
        cache_conn.client.delete(f"{key}:started", f"{key}:release")
    assert f'found="hung",function="{fname}"' not in client.metrics()


def test_hung_after_must_span_two_probes_or_be_zero() -> None:
    with pytest.raises(ValueError, match=r"hung_after_s \(3\.0\) must be 0 \(never\) or at least twice busy_probe_s"):
        GatewaySettings(hung_after_s=3, busy_probe_s=2)
    assert GatewaySettings(hung_after_s=0, busy_probe_s=2).hung_after_s == 0
    assert GatewaySettings(hung_after_s=4, busy_probe_s=2).hung_after_s == 4
    with pytest.raises(ValueError, match="busy_probe_s"):
        GatewaySettings(busy_probe_s=0)


def test_silence_is_hung_after_two_misses_spanning_hung_after_s() -> None:
    """Hand-worked: probes sent at 0.0, 1.0, 2.0 unanswered; hung_after_s 2.0."""
    silence = Silence()
    silence.missed(0.0)
    assert not silence.hung(now=5.0, hung_after_s=2.0)  # one miss is never enough, however long ago
    silence.missed(1.0)
    assert silence.silent_s(1.5) == 1.5 and not silence.hung(now=1.5, hung_after_s=2.0)
    assert silence.hung(now=2.0, hung_after_s=2.0)  # two misses, 2.0 s since the first was sent
    silence.answered()
    assert silence.silent_s(9.0) == 0.0 and not silence.hung(now=9.0, hung_after_s=2.0)
    silence.missed(10.0)
    silence.missed(11.0)
    assert not silence.hung(now=11.5, hung_after_s=2.0)  # the run starts again at 10.0
