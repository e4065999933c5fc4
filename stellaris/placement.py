"""Where a run's functions go, checked before anything starts: images are the docker backend's, custom resources
and the Ray address the ray backend's, GPUs either's (docs/deployment.md)."""

from __future__ import annotations

import socket
from importlib.metadata import version
from typing import Any, Literal, Protocol

from gateway.models import BackendName

Backend = BackendName  # the gateway's backends: the rows of gateway/backends/registry.py
Device = Literal["auto", "cpu", "cuda"]
FunctionRole = Literal["actor", "learner", "parameter"]
GPU_IMAGE = "stellaris/function"  # docker/Dockerfile.function: CUDA base (GPU learners and the parameter function)
CPU_IMAGE = "stellaris/function-cpu"  # docker/Dockerfile.function-cpu: CPU torch (actors, CPU-only functions)

_DOCKER_FIELDS = ("image", "learner_image", "parameter_image", "actor_image")
_RAY_FIELDS = ("ray_address", "learner_resources", "parameter_resources", "actor_resources")
_GPU_FIELDS = ("learner_gpus", "parameter_gpus")
_FIELD_BACKENDS = {
    **dict.fromkeys(_DOCKER_FIELDS, "docker"),
    **dict.fromkeys(_RAY_FIELDS, "ray"),
    **dict.fromkeys(_GPU_FIELDS, "docker or ray"),
}


class Placed(Protocol):
    """The fields of TrainConfig the placement rules read."""

    backend: str
    device: str
    ray_address: str | None
    redis_url: str | None
    learner_gpus: float
    parameter_gpus: float


def _shown(value: Any) -> Any:
    """A whole float as an int: `learner_gpus: 1`, not 1.0, in messages."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _foreign_fields(backend: str) -> tuple[str, ...]:
    """The placement fields that mean nothing on `backend` (process functions run beside the gateway)."""
    if backend == "docker":
        return _RAY_FIELDS
    if backend == "ray":
        return _DOCKER_FIELDS
    return _DOCKER_FIELDS + _RAY_FIELDS + _GPU_FIELDS


def _on_this_machine(host: str) -> bool:
    """Whether `host` names one of this machine's own addresses (loopback included): binding to it succeeds."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, kind, proto, _, addr in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.bind((addr[0], 0))
            return True
        except OSError:
            continue
    return False


def default_image(gpus: float) -> str:
    """The project's function image, as docker/ tags it (the package's version): the CUDA one where GPUs are asked
    for, else the CPU one."""
    return f"{GPU_IMAGE if gpus > 0 else CPU_IMAGE}:{version('stellaris')}"


def check_placement(cfg: Placed) -> None:
    """Raises ValueError naming the fields that do not fit the backend; `device: cuda` in a container or a Ray actor
    needs the GPUs requested."""
    foreign = [field for field in _foreign_fields(cfg.backend) if getattr(cfg, field)]
    if foreign:
        given = ", ".join(f"{f}: {_shown(getattr(cfg, f))!r} needs backend {_FIELD_BACKENDS[f]}" for f in foreign)
        raise ValueError(f"{given}, but backend is {cfg.backend!r} (give that backend, or drop them)")
    if cfg.backend == "ray" and cfg.ray_address and cfg.redis_url is None:
        host = cfg.ray_address.removeprefix("ray://").rsplit(":", 1)[0]
        if host != "auto" and not _on_this_machine(host):
            raise ValueError(
                f"ray_address {cfg.ray_address!r} is a cluster on other machines, but no redis_url is given: an "
                "embedded Redis listens on this machine's loopback only, which the cluster's nodes cannot reach; "
                "give --redis-url (or REDIS_URL) a Redis every node can reach (deploy/README.md)"
            )
    for role in ("learner", "parameter"):
        gpus = getattr(cfg, f"{role}_gpus")
        if cfg.backend == "docker" and gpus != int(gpus):
            raise ValueError(f"{role}_gpus {gpus} is fractional: a container takes whole GPUs (ray shares them)")
        if cfg.device == "cuda" and cfg.backend != "process" and gpus == 0:
            raise ValueError(
                f"device: 'cuda' with backend {cfg.backend!r} needs {role}_gpus > 0 (an instance sees no GPU it "
                f"did not request), but {role}_gpus is 0"
            )


class RoleMethods:
    """Each role's image, GPUs, Ray resources and device, from TrainConfig's fields (a base of TrainConfig)."""

    backend: str
    image: str | None
    device: str

    def role_image(self, role: FunctionRole) -> str | None:
        """The image a role's functions run (docker backend; None for the process backend): the role's own, else
        `image`, else the project's (the CUDA image where the role asks for GPUs; actors never do)."""
        if self.backend != "docker":
            return None
        own: str | None = getattr(self, f"{role}_image")
        return own or self.image or default_image(self.role_gpus(role))

    def role_gpus(self, role: FunctionRole) -> float:
        gpus = 0.0 if role == "actor" else float(getattr(self, f"{role}_gpus"))
        return int(gpus) if gpus == int(gpus) else gpus  # whole GPUs print as such

    def role_resources(self, role: FunctionRole) -> dict[str, float]:
        """The Ray custom resources a role's instances ask for (ray backend; empty elsewhere)."""
        return dict(getattr(self, f"{role}_resources"))

    def role_device(self, role: FunctionRole) -> str:
        """STELLARIS_DEVICE of a role's functions: actors always compute on the CPU."""
        return "cpu" if role == "actor" else self.device
