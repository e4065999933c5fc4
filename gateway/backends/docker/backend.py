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

What a container is lives in docker_config.py, how its readiness is awaited in docker_ready.py.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import requests
from docker.client import DockerClient
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.models.containers import Container

from gateway.backends.base import LABEL_FUNCTION, LABEL_SPEC, BackendError, InstanceHandle
from gateway.backends.docker.config import (
    CONTAINER_PORT,
    LABEL_INSTANCE,
    LABEL_PORT,
    OWN_LABELS,
    ContainerTemplate,
    container_name,
    free_port,
)
from gateway.backends.docker.ready import remove, wait_health, wait_ready
from gateway.models import FunctionSpec

if TYPE_CHECKING:
    from gateway.settings import GatewaySettings

GATEWAY_ID_ENV = "STELLARIS_GATEWAY_ID"
NETWORK_ENV = "STELLARIS_DOCKER_NETWORK"
log = logging.getLogger("stellaris.gateway.docker")

__all__ = ["LABEL_INSTANCE", "LABEL_PORT", "DockerBackend", "container_name", "free_port", "from_settings"]


def from_settings(settings: GatewaySettings, redis_url: str | None) -> DockerBackend:
    """The gateway's docker backend (gateway/backends/registry.py); it reaches the engine only when first used."""
    return DockerBackend(
        namespace=settings.namespace,
        redis_url=redis_url,
        python=settings.docker_python,
        volumes=settings.docker_volumes or None,
        working_dir=settings.docker_workdir,
    )


class DockerBackend:
    """Instances as containers. Only `start` waits; every wait is bounded by `ready_timeout_s`.

    gateway_id labels this gateway's containers so that a restarted gateway finds them again (discover); default
    $STELLARIS_GATEWAY_ID, else the host name; namespace (the gateway's registry namespace) narrows that to one
    namespace's containers, so that gateways of several namespaces on one host never take each other's. base_url
    is the engine (default $DOCKER_HOST, else the local socket); client replaces both. redis_url is passed to
    every instance as REDIS_URL (a spec's own env wins).
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
        namespace: str | None = None,
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
        self.template = ContainerTemplate(
            gateway_id=gateway_id or os.environ.get(GATEWAY_ID_ENV) or socket.gethostname(),
            namespace=namespace,
            network=network if network is not None else os.environ.get(NETWORK_ENV) or None,
            publish_ip=publish_ip,
            redis_url=redis_url,
            python=python,
            entrypoint=list(entrypoint) if entrypoint else None,
            volumes=dict(volumes or {}),
            working_dir=working_dir,
            extra_env=dict(extra_env or {}),
            ready_timeout_s=ready_timeout_s,
            health_interval_s=health_interval_s,
        )
        self.base_url = base_url
        self.ready_timeout_s = ready_timeout_s
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

    @property
    def gateway_id(self) -> str:
        return self.template.gateway_id

    @property
    def network(self) -> str | None:
        return self.template.network

    def container_config(self, spec: FunctionSpec, *, instance_id: str, port: int = CONTAINER_PORT) -> dict[str, Any]:
        """The keyword arguments of `containers.create` for one instance (pure: no engine needed)."""
        return self.template.config(spec, instance_id=instance_id, port=port)

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
                wait_ready(container, what, deadline, self.ready_timeout_s)
                handle = self._handle(container, init_s=time.perf_counter() - started)
                wait_health(container, handle.url, what, deadline, self.ready_timeout_s)
        except BaseException:
            remove(container)
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
            remove(container)

    def kill(self, handle: InstanceHandle) -> None:
        """SIGKILL without draining; stop() still removes the container."""
        with self._engine_errors(f"kill instance {handle.id} of {handle.function!r}"):
            try:
                self.client.containers.get(handle.container_id or handle.id).kill()
            except NotFound:
                return
            except APIError as exc:
                # Not running any more is no failure: docker answers 409, podman 500 ("container state improper").
                if exc.status_code == 409:
                    return
                now = self._get_unless_gone(handle.container_id or handle.id)
                if now is not None and now.status == "running":
                    raise

    def discover(self) -> list[InstanceHandle]:
        """Running containers of this gateway (and namespace), of every function, as handles; exited ones are
        removed. Each handle names its function and spec digest, from the container's labels."""
        filters = self.template.discovery_filters()
        handles = []
        with self._engine_errors(f"discover the instances of gateway {self.gateway_id!r}"):
            for summary in self.client.api.containers(all=True, filters=filters):  # no inspect per container
                container = self._get_unless_gone(summary["Id"])
                if container is None:
                    continue  # removed since the list was taken
                if container.status != "running":
                    log.info("removing %s container %s of a previous gateway run", container.status, container.name)
                    remove(container)
                    continue
                try:
                    handles.append(self._handle(container))
                except BackendError as exc:
                    log.warning("ignoring container %s: %s", container.name, exc)
        return handles

    # -- helpers ---------------------------------------------------------------------------------------------

    def _get_unless_gone(self, container_id: str) -> Container | None:
        """The container, or None when it no longer exists (Docker: 404; podman answers a container removed while
        asked for with a 500 "no such container" / "does not exist")."""
        try:
            return self.client.containers.get(container_id)
        except NotFound:
            return None
        except APIError as exc:
            if exc.status_code == 500 and any(s in str(exc).lower() for s in ("no such container", "does not exist")):
                return None
            raise

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
            spec_digest=labels.get(LABEL_SPEC),
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
