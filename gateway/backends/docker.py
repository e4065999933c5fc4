"""Docker backend: each instance is a container running the function runtime, found again by its labels.

Works against Docker and against podman's Docker-compatible API. A container is created (never pulled: a missing
image is an error that names it), started, and is ready when its runtime prints `READY <port>` on stdout (read
from the log stream, event-driven) and then answers GET /health through the address the gateway will use. The
container also carries a Docker healthcheck on /health for the engine's own monitoring; podman without systemd
never runs it by itself (`podman healthcheck run ID` does), so readiness never depends on it.

Networking, one of three:
- default: bridge, container port 8080 published on 127.0.0.1 at a random host port (the gateway on the host);
- `network="host"`: host networking, the runtime listens on a free port picked here;
- `network=<name>`: the container joins that network and is reached at http://<container name>:8080 (the gateway
  itself runs in a container on the same network, as in compose.yaml).

"Host Python" mode (`python=..., volumes=...`, used by CI): the image is a bare rootfs and the interpreter, the
virtual environment and the project are bind-mounted read-only from the host; the runtime is started as
`<python> -m functions.runtime`. Otherwise the image's entrypoint (docker/entrypoint-function.sh) starts it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import re
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx
import requests
from docker.client import DockerClient
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.models.containers import Container
from docker.types import DeviceRequest

from gateway.backends.base import LABEL_APP, LABEL_FUNCTION, LABEL_GATEWAY, BackendError, InstanceHandle
from gateway.models import FunctionSpec

LABEL_INSTANCE = "io.stellaris.instance"
LABEL_PORT = "io.stellaris.port"  # the port the runtime listens on inside the container
OWN_LABELS = (LABEL_APP, LABEL_FUNCTION, LABEL_GATEWAY, LABEL_INSTANCE, LABEL_PORT)
APP = "stellaris"
CONTAINER_PORT = 8080
GATEWAY_ID_ENV = "STELLARIS_GATEWAY_ID"
NETWORK_ENV = "STELLARIS_DOCKER_NETWORK"
LOG_TAIL_LINES = 20
NS_PER_S = 1_000_000_000
# No spaces: podman's Docker-compatible API re-splits a healthcheck's CMD arguments on whitespace.
HEALTH_PROBE = "__import__('urllib.request').request.urlopen('http://127.0.0.1:{port}/health',timeout={timeout})"

log = logging.getLogger("stellaris.gateway.docker")


class DockerBackend:
    """Instances as containers. Only `start` waits; every wait is bounded by `ready_timeout_s`.

    gateway_id labels this gateway's containers so that a restarted gateway finds them again (discover); default
    $STELLARIS_GATEWAY_ID, else the host name. base_url is the engine (default $DOCKER_HOST, else the local
    socket); client replaces both. redis_url is passed to every instance as REDIS_URL (a spec's own env wins).
    network: None (bridge, published on publish_ip), "host", or a network name (default $STELLARIS_DOCKER_NETWORK).
    python, volumes (host path -> container path, mounted read-only) and working_dir run a bare image on the
    host's interpreter (entrypoint `<python> -m functions.runtime`, healthcheck with that python); entrypoint
    overrides the image's otherwise; extra_env is added to every instance's environment.
    """

    name = "docker"

    def __init__(
        self,
        *,
        gateway_id: str | None = None,
        redis_url: str | None = None,
        base_url: str | None = None,
        client: DockerClient | None = None,
        network: str | None = None,
        publish_ip: str = "127.0.0.1",
        python: str | None = None,
        entrypoint: Sequence[str] | None = None,
        volumes: Mapping[str, str] | None = None,
        working_dir: str | None = None,
        extra_env: Mapping[str, str] | None = None,
        ready_timeout_s: float = 120.0,
        health_interval_s: float = 10.0,
        api_timeout_s: float = 60.0,
    ) -> None:
        self.gateway_id = gateway_id or os.environ.get(GATEWAY_ID_ENV) or socket.gethostname()
        self.redis_url = redis_url
        self.base_url = base_url
        self.network = network if network is not None else os.environ.get(NETWORK_ENV) or None
        self.publish_ip = publish_ip
        self.python = python
        if entrypoint is None and python:
            entrypoint = [python, "-m", "functions.runtime"]
        self.entrypoint = list(entrypoint) if entrypoint else None
        self.volumes = dict(volumes or {})
        self.working_dir = working_dir
        self.extra_env = dict(extra_env or {})
        self.ready_timeout_s = ready_timeout_s
        self.health_interval_s = health_interval_s
        self.api_timeout_s = api_timeout_s
        self._client = client
        self._client_lock = threading.Lock()

    # -- the engine -------------------------------------------------------------------------------------------

    @property
    def engine(self) -> str:
        return self.base_url or os.environ.get("DOCKER_HOST") or "the default Docker socket"

    @property
    def client(self) -> DockerClient:
        """Connected on first use, so that a gateway without docker functions never needs an engine."""
        with self._client_lock:
            if self._client is None:
                try:
                    if self.base_url:
                        self._client = DockerClient(base_url=self.base_url, timeout=int(self.api_timeout_s))
                    else:
                        self._client = DockerClient.from_env(timeout=int(self.api_timeout_s))
                except DockerException as exc:
                    raise BackendError(f"container engine unreachable at {self.engine}: {exc}") from exc
            return self._client

    def ping(self) -> None:
        """Raise BackendError unless the engine answers."""
        with self._engine_errors("ping the engine"):
            self.client.ping()

    @contextlib.contextmanager
    def _engine_errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except BackendError:
            raise
        except (DockerException, requests.RequestException) as exc:
            raise BackendError(f"{what}: container engine at {self.engine} failed: {exc}") from exc

    # -- what a container is ----------------------------------------------------------------------------------

    def labels(self, spec: FunctionSpec, instance_id: str, port: int) -> dict[str, str]:
        return {
            LABEL_APP: APP,
            LABEL_FUNCTION: spec.name,
            LABEL_GATEWAY: self.gateway_id,
            LABEL_INSTANCE: instance_id,
            LABEL_PORT: str(port),
        }

    def container_config(self, spec: FunctionSpec, *, instance_id: str, port: int = CONTAINER_PORT) -> dict[str, Any]:
        """The keyword arguments of `containers.create` for one instance (pure: no engine needed)."""
        if not spec.image:
            raise BackendError(f"function {spec.name!r} has no image for the docker backend")
        if self.python and not spec.target:
            raise BackendError(f"function {spec.name!r} needs a target (module:handler) to run on the host's Python")
        args = ["--host", "0.0.0.0", "--allow-remote", "--port", str(port)]
        if spec.target:
            args = ["--handler", spec.target, *args]
        args += ["--concurrency", str(spec.concurrency_per_instance), "--timeout-s", f"{spec.timeout_s:g}"]
        python = self.python or "python"
        env = {**self.extra_env, **({"REDIS_URL": self.redis_url} if self.redis_url else {}), **spec.env}
        env.setdefault("PYTHONUNBUFFERED", "1")
        probe_timeout_s = max(1, math.ceil(self.health_interval_s / 2))
        config: dict[str, Any] = {
            "image": spec.image,
            "command": args,
            "name": container_name(self.gateway_id, instance_id),
            "labels": self.labels(spec, instance_id, port),
            "environment": env,
            "healthcheck": {
                "test": ["CMD", python, "-c", HEALTH_PROBE.format(port=port, timeout=probe_timeout_s)],
                "interval": int(self.health_interval_s * NS_PER_S),
                "timeout": probe_timeout_s * NS_PER_S,
                "retries": 3,
                "start_period": int(self.ready_timeout_s * NS_PER_S),
            },
            "nano_cpus": int(spec.resources.cpus * NS_PER_S),
            "mem_limit": spec.resources.memory_bytes,
            "stop_signal": "SIGTERM",
        }
        if self.entrypoint:
            config["entrypoint"] = self.entrypoint
        if self.working_dir:
            config["working_dir"] = self.working_dir
        if self.volumes:
            config["volumes"] = {host: {"bind": inside, "mode": "ro"} for host, inside in self.volumes.items()}
        if spec.resources.gpus > 0:
            config["device_requests"] = [DeviceRequest(count=spec.resources.gpus, capabilities=[["gpu"]])]
        if self.network is None:
            config["ports"] = {f"{port}/tcp": (self.publish_ip, None)}
        else:
            config["network"] = self.network
        return config

    # -- the Backend protocol ---------------------------------------------------------------------------------

    def start(self, spec: FunctionSpec, *, instance_id: str) -> InstanceHandle:
        started = time.perf_counter()
        port = free_port() if self.network == "host" else CONTAINER_PORT
        config = self.container_config(spec, instance_id=instance_id, port=port)
        what = f"function {spec.name!r} (image {spec.image!r})"
        try:
            client = self.client
        except BackendError as exc:
            raise BackendError(f"cannot start {what}: {exc}") from exc
        with self._engine_errors(f"start {what}"):
            try:
                container = client.containers.create(**config)
            except ImageNotFound as exc:
                raise BackendError(f"{what}: image not found on {self.engine}; build or pull it first") from exc
            except APIError as exc:
                raise BackendError(f"{what}: the engine refused the container: {exc.explanation or exc}") from exc
        try:
            with self._engine_errors(f"start {what}"):
                container.start()
                deadline = started + self.ready_timeout_s
                self._wait_ready(container, what, deadline)
                handle = self._handle(container, init_s=time.perf_counter() - started)
                self._wait_health(container, handle.url, what, deadline)
        except BaseException:
            self._remove(container)
            raise
        handle.init_s = time.perf_counter() - started
        log.info("%s started as %s at %s in %.2f s", what, container.short_id, handle.url, handle.init_s)
        return handle

    def alive(self, handle: InstanceHandle) -> bool:
        """Whether the container runs. False also when the engine cannot be asked: nothing can be sent there."""
        try:
            container = self.client.containers.get(handle.container_id or handle.id)
        except NotFound:
            return False
        except (BackendError, DockerException, requests.RequestException) as exc:
            log.warning("cannot ask %s about instance %s: %s", self.engine, handle.id, exc)
            return False
        return bool(container.status == "running")

    def stop(self, handle: InstanceHandle, *, timeout_s: float = 10.0) -> None:
        """SIGTERM (the runtime drains), SIGKILL after timeout_s, then remove. Idempotent."""
        with self._engine_errors(f"stop instance {handle.id} of {handle.function!r}"):
            try:
                container = self.client.containers.get(handle.container_id or handle.id)
            except NotFound:
                return
            with contextlib.suppress(NotFound):
                container.stop(timeout=math.ceil(timeout_s))
            self._remove(container)

    def kill(self, handle: InstanceHandle) -> None:
        """SIGKILL without draining; stop() still removes the container."""
        with self._engine_errors(f"kill instance {handle.id} of {handle.function!r}"):
            try:
                self.client.containers.get(handle.container_id or handle.id).kill()
            except NotFound:
                return
            except APIError as exc:
                if exc.status_code != 409:  # 409: not running any more
                    raise

    def discover(self) -> list[InstanceHandle]:
        """Running containers of this gateway, as handles; exited ones are removed."""
        filters = {"label": [f"{LABEL_APP}={APP}", f"{LABEL_GATEWAY}={self.gateway_id}"]}
        handles = []
        with self._engine_errors(f"discover the instances of gateway {self.gateway_id!r}"):
            for container in self.client.containers.list(all=True, filters=filters):
                if container.status != "running":
                    log.info("removing %s container %s of a previous gateway run", container.status, container.name)
                    self._remove(container)
                    continue
                try:
                    handles.append(self._handle(container))
                except BackendError as exc:
                    log.warning("ignoring container %s: %s", container.name, exc)
        return handles

    # -- helpers ----------------------------------------------------------------------------------------------

    def _handle(self, container: Container, *, init_s: float = 0.0) -> InstanceHandle:
        container.reload()
        labels = dict(container.labels)
        return InstanceHandle(
            id=labels.get(LABEL_INSTANCE, container.name),
            function=labels.get(LABEL_FUNCTION, ""),
            url=self._url(container, int(labels.get(LABEL_PORT, CONTAINER_PORT))),
            backend=self.name,
            container_id=container.id,
            init_s=init_s,
            labels={k: v for k, v in labels.items() if k in OWN_LABELS},
        )

    def _url(self, container: Container, port: int) -> str:
        """Where the gateway reaches the runtime: decided by how the container itself was networked."""
        attrs = container.attrs
        if attrs.get("HostConfig", {}).get("NetworkMode") == "host":
            return f"http://127.0.0.1:{port}"
        for binding in (attrs.get("NetworkSettings", {}).get("Ports") or {}).get(f"{port}/tcp") or []:
            if binding.get("HostPort"):
                ip = binding.get("HostIp") or "127.0.0.1"
                return f"http://{'127.0.0.1' if ip in ('0.0.0.0', '::') else ip}:{binding['HostPort']}"
        if self.network not in (None, "host"):
            return f"http://{container.name}:{port}"
        raise BackendError(f"container {container.name} publishes no port for {port}/tcp")

    def _wait_ready(self, container: Container, what: str, deadline: float) -> None:
        """Block until the runtime prints READY, the container exits, or the deadline passes.

        The log stream is opened and read on a helper thread: some engines (podman) answer the request only
        once the first line is out. On timeout the stream is closed, or the container's removal ends it.
        """
        outcome: queue.Queue[str] = queue.Queue(maxsize=1)
        streams: list[Any] = []

        def read() -> None:
            pending, result = b"", "ended"
            try:
                stream = container.logs(stream=True, follow=True, stdout=True, stderr=False)
                streams.append(stream)
                for chunk in stream:
                    lines = (pending + chunk).split(b"\n")
                    pending = lines.pop()
                    if any(line.startswith(b"READY ") for line in lines):
                        result = "ready"
                        break
                stream.close()
            except Exception as exc:  # the stream was closed under us, or the engine's read timed out
                result = f"stream failed: {exc}"
            with contextlib.suppress(queue.Full):
                outcome.put_nowait(result)

        threading.Thread(target=read, name=f"ready-{container.short_id}", daemon=True).start()
        try:
            result = outcome.get(timeout=max(0.0, deadline - time.perf_counter()))
        except queue.Empty:
            for stream in streams:
                stream.close()
            raise BackendError(
                f"{what}: not ready within {self.ready_timeout_s:g} s; last log lines:\n{self._tail(container)}"
            ) from None
        if result == "ready":
            return
        container.reload()
        if container.status != "running":
            raise self._exited(container, what)
        log.warning("%s: log stream of %s ended (%s); probing /health instead", what, container.short_id, result)

    def _wait_health(self, container: Container, url: str, what: str, deadline: float) -> None:
        """GET /health until 200: the runtime's port must answer through the address the gateway uses."""
        delay_s, last = 0.02, "no answer"
        while True:
            try:
                response = httpx.get(f"{url}/health", timeout=max(0.1, min(2.0, deadline - time.perf_counter())))
                if response.status_code == 200:
                    return
                last = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            container.reload()
            if container.status != "running":
                raise self._exited(container, what)
            if time.perf_counter() + delay_s > deadline:
                raise BackendError(
                    f"{what}: {url}/health did not answer within {self.ready_timeout_s:g} s ({last}); "
                    f"last log lines:\n{self._tail(container)}"
                )
            time.sleep(delay_s)  # bounded backoff: the port is published a moment after READY at most
            delay_s = min(0.5, delay_s * 2)

    def _exited(self, container: Container, what: str) -> BackendError:
        state = container.attrs.get("State", {})
        return BackendError(
            f"{what}: container {container.short_id} {container.status} (exit code {state.get('ExitCode')}"
            f"{', ' + state['Error'] if state.get('Error') else ''}); last log lines:\n{self._tail(container)}"
        )

    def _tail(self, container: Container) -> str:
        try:
            return bytes(container.logs(tail=LOG_TAIL_LINES)).decode(errors="replace").rstrip() or "(no output)"
        except (DockerException, requests.RequestException) as exc:
            return f"(logs unavailable: {exc})"

    def _remove(self, container: Container) -> None:
        try:
            container.remove(force=True)
        except NotFound:
            pass
        except (DockerException, requests.RequestException) as exc:
            log.warning("could not remove container %s: %s", container.name, exc)


def container_name(gateway_id: str, instance_id: str) -> str:
    """A valid, recognisable container name: stellaris-<gateway>-<instance>."""
    return re.sub(r"[^a-zA-Z0-9_.-]", "-", f"{APP}-{gateway_id}-{instance_id}")[:200]


def free_port(host: str = "127.0.0.1") -> int:
    """A port free at this moment (host networking: the runtime binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
