"""What a function container is, decided without an engine: its name, labels, command line, environment,
healthcheck, limits, GPUs and networking. Pure, so it is tested without Docker."""

from __future__ import annotations

import math
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from docker.types import DeviceRequest

from cache.acl import url_without_credentials
from cache.connection import REDIS_URL_ENV
from contract.runtime_http import HEALTH_PATH, RUNTIME_MODULE, runtime_argv
from gateway.backends.base import LABEL_APP, LABEL_FUNCTION, LABEL_GATEWAY, LABEL_NAMESPACE, LABEL_SPEC, BackendError
from gateway.models import FunctionSpec

LABEL_INSTANCE = "io.stellaris.instance"
LABEL_PORT = "io.stellaris.port"  # the port the runtime listens on inside the container
OWN_LABELS = (LABEL_APP, LABEL_FUNCTION, LABEL_GATEWAY, LABEL_NAMESPACE, LABEL_INSTANCE, LABEL_PORT, LABEL_SPEC)
INSTANCE_ENV = "STELLARIS_INSTANCE_ID"  # the instance's id, as the process backend sets it
APP = "stellaris"
CONTAINER_PORT = 8080  # docker/entrypoint-function.sh's default $STELLARIS_PORT
ALL_INTERFACES = "0.0.0.0"  # inside a container: reached through the container's own network
NS_PER_S = 1_000_000_000
# No spaces: podman's Docker-compatible API re-splits a healthcheck's CMD arguments on whitespace.
HEALTH_PROBE = (
    "__import__('urllib.request').request.urlopen('http://127.0.0.1:{port}" + HEALTH_PATH + "',timeout={timeout})"
)


@dataclass(frozen=True)
class ContainerTemplate:
    """How this gateway's containers are made. network: None (bridge, published on publish_ip), "host", or a
    network name. python (with volumes, host path -> container path, mounted read-only, and working_dir) runs a bare
    image on the host's interpreter; entrypoint overrides the image's otherwise; extra_env goes to every instance."""

    gateway_id: str
    namespace: str | None
    network: str | None
    publish_ip: str
    redis_url: str | None
    python: str | None
    entrypoint: list[str] | None
    volumes: Mapping[str, str]
    working_dir: str | None
    extra_env: Mapping[str, str]
    ready_timeout_s: float
    health_interval_s: float

    @property
    def command_prefix(self) -> list[str] | None:
        if self.entrypoint:
            return list(self.entrypoint)
        return [self.python, "-m", RUNTIME_MODULE] if self.python else None

    def labels(self, spec: FunctionSpec, instance_id: str, port: int) -> dict[str, str]:
        return {
            LABEL_APP: APP,
            LABEL_FUNCTION: spec.name,
            LABEL_GATEWAY: self.gateway_id,
            **({LABEL_NAMESPACE: self.namespace} if self.namespace is not None else {}),
            LABEL_INSTANCE: instance_id,
            LABEL_PORT: str(port),
            LABEL_SPEC: spec.digest(),
        }

    def discovery_filters(self) -> dict[str, list[str]]:
        """The engine's filter for this gateway's containers (and namespace's, when it has one)."""
        labels = [f"{LABEL_APP}={APP}", f"{LABEL_GATEWAY}={self.gateway_id}"]
        if self.namespace is not None:
            labels.append(f"{LABEL_NAMESPACE}={self.namespace}")
        return {"label": labels}

    def config(self, spec: FunctionSpec, *, instance_id: str, port: int = CONTAINER_PORT) -> dict[str, Any]:
        """The keyword arguments of `containers.create` for one instance."""
        if not spec.image:
            raise BackendError(f"function {spec.name!r} has no image for the docker backend")
        if self.python and not spec.target:
            raise BackendError(f"function {spec.name!r} needs a target (module:handler) to run on the host's Python")
        command = runtime_argv(
            spec.target,
            host=ALL_INTERFACES,
            port=port,
            concurrency=spec.concurrency_per_instance,
            timeout_s=spec.timeout_s,
        )
        # The cache's address without the deployment's credentials: a registration brings its job's own Redis user.
        address = {REDIS_URL_ENV: url_without_credentials(self.redis_url)} if self.redis_url else {}
        env = {**self.extra_env, **address, **spec.env}
        env[INSTANCE_ENV] = instance_id
        env.setdefault("PYTHONUNBUFFERED", "1")
        probe_timeout_s = max(1, math.ceil(self.health_interval_s / 2))
        probe = HEALTH_PROBE.format(port=port, timeout=probe_timeout_s)
        config: dict[str, Any] = {
            "image": spec.image,
            "command": command,
            "name": container_name(self.gateway_id, instance_id),
            "labels": self.labels(spec, instance_id, port),
            "environment": env,
            "healthcheck": {
                "test": ["CMD", self.python or "python", "-c", probe],
                "interval": int(self.health_interval_s * NS_PER_S),
                "timeout": probe_timeout_s * NS_PER_S,
                "retries": 3,
                "start_period": int(self.ready_timeout_s * NS_PER_S),
            },
            "nano_cpus": int(spec.resources.cpus * NS_PER_S),
            "mem_limit": spec.resources.memory_bytes,
            "stop_signal": "SIGTERM",
        }
        if self.command_prefix:
            config["entrypoint"] = self.command_prefix
        if self.working_dir:
            config["working_dir"] = self.working_dir
        if self.volumes:
            config["volumes"] = {host: {"bind": inside, "mode": "ro"} for host, inside in self.volumes.items()}
        if spec.resources.gpus > 0:
            config["device_requests"] = [DeviceRequest(count=int(spec.resources.gpus), capabilities=[["gpu"]])]
        if self.network is None:
            config["ports"] = {f"{port}/tcp": (self.publish_ip, None)}
        else:
            config["network"] = self.network
        return config


def container_name(gateway_id: str, instance_id: str) -> str:
    """A valid, recognisable container name: stellaris-<gateway>-<instance>."""
    return re.sub(r"[^a-zA-Z0-9_.-]", "-", f"{APP}-{gateway_id}-{instance_id}")[:200]


def free_port(host: str = "127.0.0.1") -> int:
    """A port free at this moment (host networking: the runtime binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
