"""DockerBackend against a real container engine (Docker, or podman's Docker API as .ci/podman-setup.sh sets up).

No engine answering: these tests skip, saying why, unless STELLARIS_REQUIRE_DOCKER=1 (CI), where they fail. The
image is a bare rootfs (STELLARIS_TEST_IMAGE, built by .ci/podman-setup.sh): containers run this very Python,
virtual environment and checkout, bind-mounted read-only, so `tests.functions.sample_handlers` is importable.
Every container a test starts carries a per-test gateway label and is removed in teardown, pass or fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import httpx
import pytest
from docker.client import DockerClient
from docker.errors import NotFound

from gateway.backends.base import LABEL_APP, LABEL_FUNCTION, LABEL_GATEWAY, BackendError
from gateway.backends.docker.backend import LABEL_INSTANCE, LABEL_PORT, DockerBackend
from gateway.models import FunctionSpec, Resources

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("STELLARIS_TEST_IMAGE", "localhost/stellaris-function:test")
REQUIRED = os.environ.get("STELLARIS_REQUIRE_DOCKER") == "1"
HANDLERS = "tests.functions.sample_handlers"
MiB = 1024**2


def unavailable(reason: str) -> NoReturn:
    if REQUIRED:
        pytest.fail(f"STELLARIS_REQUIRE_DOCKER=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def engine() -> Iterator[DockerClient]:
    where = os.environ.get("DOCKER_HOST", "the default Docker socket")
    try:
        client = DockerClient.from_env(timeout=20)
        client.ping()
    except Exception as exc:
        unavailable(f"no container engine answers at {where} ({type(exc).__name__}); run .ci/podman-setup.sh")
    try:
        client.images.get(IMAGE)
    except NotFound:
        unavailable(f"image {IMAGE} is missing on {where}; .ci/podman-setup.sh builds it")
    yield client
    client.close()


def is_podman(client: DockerClient) -> bool:
    components = client.version().get("Components") or []
    return any("podman" in str(c.get("Name", "")).lower() for c in components)


def host_python_mounts() -> dict[str, str]:
    """/usr, the Python install, the venv and the checkout, at the same paths inside (outermost paths only)."""
    paths = {"/usr", os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix), str(REPO)}
    outer = {p for p in paths if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in paths)}
    return {p: p for p in sorted(outer)}


@pytest.fixture
def gateway_id(engine: DockerClient) -> Iterator[str]:
    gid = f"test-{uuid.uuid4().hex[:10]}"
    yield gid
    for container in engine.containers.list(all=True, filters={"label": f"{LABEL_GATEWAY}={gid}"}):
        container.remove(force=True)


def make_backend(
    gateway_id: str,
    *,
    network: str | None = None,
    python: str | None = sys.executable,
    entrypoint: list[str] | None = None,
    extra_env: dict[str, str] | None = None,
    ready_timeout_s: float = 60.0,
) -> DockerBackend:
    """A backend that runs the bare test image on this Python, venv and checkout."""
    return DockerBackend(
        gateway_id=gateway_id,
        redis_url="redis://:secret@redis.invalid:6379/0",
        network=network,
        python=python,
        entrypoint=entrypoint,
        volumes=host_python_mounts(),
        working_dir=str(REPO),
        extra_env=extra_env,
        ready_timeout_s=ready_timeout_s,
    )


@pytest.fixture
def backend(gateway_id: str) -> DockerBackend:
    return make_backend(gateway_id)


def spec(handler: str = "echo", *, image: str = IMAGE) -> FunctionSpec:
    return FunctionSpec(
        name=handler.replace("_", "-"),
        backend="docker",
        image=image,
        target=f"{HANDLERS}:{handler}",
        resources=Resources(cpus=0.5, memory_bytes=512 * MiB),
        env={"STELLARIS_TEST_VAR": "from-spec"},
    )


def ours(engine: DockerClient, gateway_id: str) -> list[str]:
    return [c.name for c in engine.containers.list(all=True, filters={"label": f"{LABEL_GATEWAY}={gateway_id}"})]


def test_start_configures_and_serves_the_container(engine: DockerClient, backend: DockerBackend) -> None:
    handle = backend.start(spec(), instance_id="echo-1")
    assert handle.backend == "docker" and handle.id == "echo-1" and handle.function == "echo"
    assert handle.url.startswith("http://127.0.0.1:") and handle.init_s > 0
    container = engine.containers.get(handle.container_id)
    assert container.status == "running"

    labels = container.labels
    assert labels[LABEL_APP] == "stellaris" and labels[LABEL_FUNCTION] == "echo"
    assert labels[LABEL_GATEWAY] == backend.gateway_id and labels[LABEL_INSTANCE] == "echo-1"
    assert labels[LABEL_PORT] == "8080"

    host_config = container.attrs["HostConfig"]
    assert host_config["NanoCpus"] == 500_000_000
    assert host_config["Memory"] == 512 * MiB
    env = dict(item.split("=", 1) for item in container.attrs["Config"]["Env"])
    assert env["REDIS_URL"] == "redis://redis.invalid:6379/0"  # the address only: never the deployment's password
    assert env["STELLARIS_TEST_VAR"] == "from-spec"
    healthcheck = container.attrs["Config"]["Healthcheck"]
    assert healthcheck["Test"][0] == "CMD" and any("/health" in part for part in healthcheck["Test"])

    response = httpx.post(f"{handle.url}/invoke", json={"x": 1}, headers={"X-Call-Id": "c1"}, timeout=30)
    assert response.status_code == 200
    assert response.json() == {"event": {"x": 1}, "call_id": "c1"}
    assert backend.alive(handle)

    if is_podman(engine) and shutil.which("podman"):  # podman without systemd runs healthchecks only when asked
        check = subprocess.run(["podman", "healthcheck", "run", container.id], capture_output=True, text=True)
        assert check.returncode == 0, f"podman healthcheck run: {check.stdout}{check.stderr}"


def test_stop_drains_and_removes_the_container(engine: DockerClient, backend: DockerBackend) -> None:
    handle = backend.start(spec(), instance_id="echo-stop")
    backend.stop(handle, timeout_s=10)
    with pytest.raises(NotFound):
        engine.containers.get(handle.container_id)
    assert not backend.alive(handle)
    backend.stop(handle)  # idempotent


def test_discover_finds_instances_after_a_gateway_restart(
    engine: DockerClient, backend: DockerBackend, gateway_id: str
) -> None:
    handle = backend.start(spec(), instance_id="echo-survivor")
    restarted = make_backend(gateway_id)  # a new gateway process: nothing in memory
    found = restarted.discover()
    assert [(h.id, h.function, h.url, h.container_id) for h in found] == [
        (handle.id, "echo", handle.url, handle.container_id)
    ]
    response = httpx.post(f"{found[0].url}/invoke", json={"again": True}, timeout=30)
    assert response.status_code == 200 and response.json()["event"] == {"again": True}
    assert make_backend(f"{gateway_id}-other").discover() == []  # another gateway's instances are not its own
    restarted.stop(found[0])
    assert ours(engine, gateway_id) == []


def test_killed_container_is_not_alive_and_discover_clears_it(
    engine: DockerClient, backend: DockerBackend, gateway_id: str
) -> None:
    handle = backend.start(spec(), instance_id="echo-killed")
    container = engine.containers.get(handle.container_id)
    container.kill()
    container.wait(timeout=30)  # blocks until the engine reports the exit
    assert not backend.alive(handle)
    assert make_backend(gateway_id).discover() == []
    assert ours(engine, gateway_id) == []  # discover removed the exited container


def test_a_handler_that_cannot_load_reports_the_exit_and_its_logs(
    engine: DockerClient, backend: DockerBackend, gateway_id: str
) -> None:
    broken = spec("echo").model_copy(update={"name": "broken", "target": f"{HANDLERS}:no_such_handler"})
    with pytest.raises(BackendError) as info:
        backend.start(broken, instance_id="broken-1")
    message = str(info.value)
    assert "'broken'" in message and IMAGE in message and "exit code 1" in message
    assert "no_such_handler" in message  # from the container's last log lines
    assert ours(engine, gateway_id) == []


def test_a_missing_image_is_named(engine: DockerClient, backend: DockerBackend, gateway_id: str) -> None:
    missing = "localhost/stellaris-no-such-image:0"
    with pytest.raises(BackendError, match=f"image {missing!r}.*not found"):
        backend.start(spec(image=missing), instance_id="missing-1")
    assert ours(engine, gateway_id) == []


def test_not_ready_in_time_is_an_error_and_leaves_nothing(engine: DockerClient, gateway_id: str) -> None:
    impatient = make_backend(gateway_id, ready_timeout_s=0.05)  # far less than importing the runtime takes
    with pytest.raises(BackendError, match=r"not ready within 0\.05 s"):
        impatient.start(spec(), instance_id="slow-1")
    assert ours(engine, gateway_id) == []


def test_the_images_entrypoint_script_serves_the_handler_named_in_env(engine: DockerClient, gateway_id: str) -> None:
    """docker/entrypoint-function.sh as the real images run it: handler from STELLARIS_HANDLER, `python` on PATH."""
    backend = make_backend(
        gateway_id,
        python=None,
        entrypoint=["/bin/sh", str(REPO / "docker" / "entrypoint-function.sh")],
        extra_env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"},
    )
    from_env = spec().model_copy(update={"target": None, "env": {"STELLARIS_HANDLER": f"{HANDLERS}:count"}})
    handle = backend.start(from_env, instance_id="count-1")
    assert httpx.post(f"{handle.url}/invoke", json={}, timeout=30).json()["calls"] == 1
    if is_podman(engine) and shutil.which("podman"):
        check = subprocess.run(["podman", "healthcheck", "run", handle.container_id or ""], capture_output=True)
        assert check.returncode == 0, check
    backend.stop(handle)


def test_host_networking(engine: DockerClient, gateway_id: str) -> None:
    backend = make_backend(gateway_id, network="host")
    handle = backend.start(spec(), instance_id="echo-host")
    container = engine.containers.get(handle.container_id)
    assert container.attrs["HostConfig"]["NetworkMode"] == "host"
    assert handle.url == f"http://127.0.0.1:{container.labels[LABEL_PORT]}"
    assert httpx.post(f"{handle.url}/invoke", json={}, timeout=30).status_code == 200
    assert [h.url for h in make_backend(gateway_id, network="host").discover()] == [handle.url]
    backend.stop(handle)
    assert ours(engine, gateway_id) == []


# -- no engine needed ------------------------------------------------------------------------------------------


def test_container_config_requests_gpus_and_limits() -> None:
    backend = DockerBackend(gateway_id="gw", redis_url="redis://r:6379/0")
    learner = spec("echo").model_copy(update={"resources": Resources(cpus=2, memory_bytes=4096 * MiB, gpus=1)})
    config = backend.container_config(learner, instance_id="l-1")
    (request,) = config["device_requests"]
    assert request.count == 1 and request.capabilities == [["gpu"]]
    assert config["nano_cpus"] == 2_000_000_000 and config["mem_limit"] == 4096 * MiB
    assert config["ports"] == {"8080/tcp": ("127.0.0.1", None)}
    assert config["command"][:2] == ["--handler", f"{HANDLERS}:echo"]
    assert "entrypoint" not in config  # the image's entrypoint (docker/entrypoint-function.sh) runs the runtime
    assert config["environment"]["REDIS_URL"] == "redis://r:6379/0"
    assert all(" " not in part for part in config["healthcheck"]["test"][1:])  # podman re-splits on spaces
    assert "device_requests" not in backend.container_config(spec(), instance_id="a-1")


def test_container_config_networks() -> None:
    named = DockerBackend(gateway_id="gw", network="stellaris").container_config(spec(), instance_id="a-1")
    assert named["network"] == "stellaris" and "ports" not in named
    host = DockerBackend(gateway_id="gw", network="host").container_config(spec(), instance_id="a-1", port=41234)
    assert host["network"] == "host" and "ports" not in host and "41234" in host["command"]


def test_an_unreachable_engine_is_a_backend_error(tmp_path: Path) -> None:
    backend = DockerBackend(gateway_id="gw", base_url=f"unix://{tmp_path}/no-engine.sock", api_timeout_s=5)
    with pytest.raises(BackendError, match=r"no-engine\.sock"):
        backend.start(spec(), instance_id="a-1")
    with pytest.raises(BackendError, match=r"no-engine\.sock"):
        backend.ping()
