"""The gateway with the Docker backend against a real engine: keep-alive stop, re-discovery after a gateway
restart, a killed container -> 502 and a replacement. Skips (saying why) without an engine unless
STELLARIS_REQUIRE_DOCKER=1, as in CI."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator

import httpx
import pytest
from docker.client import DockerClient
from docker.errors import NotFound

from cache import Cache
from cache.connection import credentials_env
from gateway.backends.base import LABEL_GATEWAY
from gateway.models import FunctionSpec
from tests.gateway.conftest import RunningGateway, start_gateway, stop_gateway
from tests.gateway.test_docker_backend import IMAGE, REPO, engine, host_python_mounts  # noqa: F401 (fixture)

H = "tests.functions.sample_handlers"
HELD = "tests.functions.held_start_handlers"


@pytest.fixture
def gateway_id(engine: DockerClient) -> Iterator[str]:  # noqa: F811
    gid = f"test-{uuid.uuid4().hex[:10]}"
    yield gid
    for container in engine.containers.list(all=True, filters={"label": f"{LABEL_GATEWAY}={gid}"}):
        container.remove(force=True)


def docker_gateway(
    redis_url: str, gateway_id: str, namespace: str | None = None, *, stderr: int | None = None, **env: str
) -> RunningGateway:
    """A gateway whose docker functions run the host's Python in the test image (host-Python mode)."""
    return start_gateway(
        redis_url,
        namespace,
        stderr=stderr,
        STELLARIS_GATEWAY_ID=gateway_id,
        STELLARIS_DOCKER_NETWORK="host",  # containers reach the test's loopback Redis
        STELLARIS_GATEWAY_DOCKER_PYTHON=sys.executable,
        STELLARIS_GATEWAY_DOCKER_VOLUMES=json.dumps(host_python_mounts()),
        STELLARIS_GATEWAY_DOCKER_WORKDIR=str(REPO),
        **env,
    )


def dspec(name: str, handler: str, **kw: object) -> FunctionSpec:
    return FunctionSpec(name=name, backend="docker", image=IMAGE, target=f"{H}:{handler}", **kw)


def containers(engine: DockerClient, gateway_id: str) -> list[str]:  # noqa: F811
    return [c.id for c in engine.containers.list(all=True, filters={"label": f"{LABEL_GATEWAY}={gateway_id}"})]


def test_keep_alive_stops_the_container(redis_server, engine: DockerClient, gateway_id: str) -> None:  # noqa: F811
    gw = docker_gateway(redis_server.url, gateway_id)
    try:
        with gw.client() as c:
            c.register(dspec("ka", "count", keep_alive_s=0.5))
            assert c.invoke("ka", {})["calls"] == 1
            [cid] = containers(engine, gateway_id)
            with contextlib.suppress(NotFound):  # NotFound: already stopped and removed
                engine.containers.get(cid).wait(timeout=60)  # blocks until the container stops
            assert c.function("ka")["status"]["instances"] == []
    finally:
        stop_gateway(gw)
    assert containers(engine, gateway_id) == []


def test_instances_are_found_again_after_a_gateway_restart(
    redis_server,
    engine: DockerClient,  # noqa: F811
    gateway_id: str,
) -> None:
    first = docker_gateway(redis_server.url, gateway_id)
    with first.client() as c:
        c.register(dspec("keep", "count", min_warm=1))
        pid = c.invoke("keep", {})["pid"]
        [cid] = containers(engine, gateway_id)
    stop_gateway(first)
    assert containers(engine, gateway_id) == [cid]  # containers outlive the gateway, by design

    second = docker_gateway(redis_server.url, gateway_id, namespace=first.namespace)
    try:
        with second.client() as c:
            found = c.function("keep")["status"]["instances"]
            assert [i["container_id"] for i in found] == [cid]
            call_id, out = c.invoke_with_id("keep", {})
            assert out == {"calls": 2, "pid": pid}  # the same warm instance, memo intact
            assert c.activation(call_id, wait_s=5).cold is False
            c.delete("keep")
    finally:
        stop_gateway(second)


def test_killed_container_fails_its_call_with_502_and_is_replaced(
    redis_server,
    cache_conn: Cache,
    engine: DockerClient,  # noqa: F811
    gateway_id: str,
) -> None:
    gw = docker_gateway(redis_server.url, gateway_id)
    key = f"test:{uuid.uuid4().hex}"
    event = {"started_key": f"{key}:started", "release_key": f"{key}:release", "timeout_s": 30}
    try:
        with gw.client() as c:
            c.register(dspec("victim", "wait_for_release", env=credentials_env(cache_conn.url)))
            result: list[httpx.Response] = []
            t = threading.Thread(target=lambda: result.append(c.http.post("/function/victim", json=event)))
            t.start()
            assert cache_conn.client.blpop([f"{key}:started"], timeout=60) is not None
            [cid] = containers(engine, gateway_id)
            engine.containers.get(cid).kill()
            t.join(60)
            assert result[0].status_code == 502 and result[0].json()["error"]["type"] == "InstanceCrashed"
            cache_conn.client.rpush(f"{key}:release", 1)
            assert c.invoke("victim", {**event, "timeout_s": 1})["released"] is True  # served by a replacement
            assert cid not in [i["container_id"] for i in c.function("victim")["status"]["instances"]]
            c.delete("victim")
    finally:
        stop_gateway(gw)
        cache_conn.client.delete(f"{key}:started", f"{key}:release")


def test_a_start_in_flight_when_its_function_is_deleted_is_stopped_before_the_gateway_exits(
    redis_server,
    cache_conn: Cache,
    engine: DockerClient,  # noqa: F811
    gateway_id: str,
) -> None:
    """A job's end deletes its functions, then stops its gateway. A container start still in its thread then (a
    pre-warm) was never stopped: the event loop's end cancelled its task, and the container stayed (a CI flake).
    The gateway's shutdown now waits for it, and stops it."""
    gw = docker_gateway(redis_server.url, gateway_id, stderr=subprocess.PIPE)
    key = f"test:{uuid.uuid4().hex}"
    env = {"STELLARIS_TEST_HELD_START_KEY": key, "STELLARIS_TEST_HELD_START_REDIS": redis_server.url}
    spec = FunctionSpec(name="late", backend="docker", image=IMAGE, target=f"{HELD}:pid", env=env)
    waiting = threading.Event()
    log: list[str] = []

    def read_log() -> None:
        assert gw.proc.stderr is not None
        for line in gw.proc.stderr:
            log.append(line)
            if "waiting up to" in line:
                waiting.set()

    reader = threading.Thread(target=read_log, daemon=True)
    reader.start()
    try:
        with gw.client() as c:
            c.register(spec)
            c.prewarm("late", 1)
            # The container runs, its runtime held in the handler's import: the gateway's start waits in its thread.
            assert cache_conn.client.blpop([f"{key}:started"], timeout=60) is not None
            assert len(containers(engine, gateway_id)) == 1
            c.delete("late")
        gw.proc.terminate()
        # Before the fix: never said, and the event loop ended, leaving the start to run on in its thread unwatched.
        said = waiting.wait(timeout=20)
        cache_conn.client.rpush(f"{key}:release", 1)
        assert gw.proc.wait(timeout=60) == 0
    finally:
        stop_gateway(gw)
        reader.join(timeout=10)
        cache_conn.client.delete(f"{key}:started", f"{key}:release")
    assert containers(engine, gateway_id) == [], "".join(log)
    assert said, "".join(log)
