"""Gateway settings that change behaviour: the default backend (STELLARIS_GATEWAY_BACKEND, which compose.yaml sets to
docker) and how long stopping an instance may take (STELLARIS_GATEWAY_STOP_TIMEOUT_S)."""

from __future__ import annotations

import threading
import time
import uuid

import httpx
import pytest

from cache import Cache
from cache.connection import credentials_env
from gateway.client import GatewayClient, GatewayError
from gateway.models import FunctionSpec
from gateway.settings import GatewaySettings
from tests.gateway.conftest import start_gateway, stop_gateway
from tests.procs import wait_pid_gone

H = "tests.functions.sample_handlers"
IMAGE = "stellaris/function:0.1.0"  # never started here: min_warm 0 and no call


def test_a_registration_naming_no_backend_gets_the_default_one(client: GatewayClient, fname: str) -> None:
    stored = client.register(FunctionSpec(name=fname, target=f"{H}:echo"))["function"]
    assert stored["backend"] == "process"  # the default gateway's default
    assert client.function(fname)["function"]["backend"] == "process"
    assert client.invoke(fname, {"x": 1})["event"] == {"x": 1}


def test_a_docker_gateway_runs_unnamed_registrations_as_containers(redis_server, fname: str) -> None:
    gw = start_gateway(redis_server.url, STELLARIS_GATEWAY_BACKEND="docker")
    try:
        with gw.client() as c:
            stored = c.register(FunctionSpec(name=fname, image=IMAGE))["function"]
            assert stored["backend"] == "docker" and c.function(fname)["function"]["backend"] == "docker"
            # A process function must say so on this gateway: a bare target has no image to run.
            with pytest.raises(GatewayError) as no_image:
                c.register(FunctionSpec(name=f"{fname}-t", target=f"{H}:echo"))
            assert no_image.value.status_code == 422
            assert "needs 'image'" in no_image.value.error["message"]
            assert "default backend" in no_image.value.error["message"]
            named = c.register(FunctionSpec(name=f"{fname}-p", backend="process", target=f"{H}:echo"))
            assert named["function"]["backend"] == "process"
            assert c.invoke(f"{fname}-p", {})["event"] == {}
    finally:
        stop_gateway(gw)


def test_a_registration_names_a_target_or_an_image() -> None:
    with pytest.raises(ValueError, match=r"'target'.*or 'image'"):
        FunctionSpec(name="nothing")
    with pytest.raises(ValueError, match="backend"):
        GatewaySettings(backend="kubernetes")  # type: ignore[arg-type]


def test_stop_timeout_bounds_the_drain_of_a_busy_instance(redis_server, cache_conn: Cache, fname: str) -> None:
    """Deleting a function stops its instances: one busy with a long call is killed after stop_timeout_s."""
    gw = start_gateway(redis_server.url, STELLARIS_GATEWAY_STOP_TIMEOUT_S="0.5")
    key = f"test:{uuid.uuid4().hex}"
    try:
        with gw.client() as c:
            c.register(
                FunctionSpec(
                    name=fname, target=f"{H}:wait_for_release", timeout_s=60, env=credentials_env(cache_conn.url)
                )
            )
            event = {"started_key": f"{key}:started", "release_key": f"{key}:release", "timeout_s": 60}
            answers: list[httpx.Response] = []
            call = threading.Thread(target=lambda: answers.append(c.http.post(f"/function/{fname}", json=event)))
            call.start()
            assert cache_conn.client.blpop([f"{key}:started"], timeout=30) is not None
            [pid] = [i["pid"] for i in c.function(fname)["status"]["instances"]]
            began = time.monotonic()
            c.delete(fname)  # waits for the instance to stop
            elapsed_s = time.monotonic() - began
            assert wait_pid_gone(pid, 5)
            call.join(30)
        assert elapsed_s < 5, f"stop took {elapsed_s:.1f} s; the call would have held it for 60"
        assert answers[0].status_code == 502  # the call died with its instance
    finally:
        cache_conn.client.delete(f"{key}:started", f"{key}:release")
        stop_gateway(gw)
