"""The backend contract: start, probe and stop instances of a function. One file per backend implements it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from gateway.models import FunctionSpec

LABEL_APP = "io.stellaris.app"
LABEL_FUNCTION = "io.stellaris.function"
LABEL_GATEWAY = "io.stellaris.gateway"
LABEL_NAMESPACE = "io.stellaris.namespace"  # the gateway's registry namespace
LABEL_SPEC = "io.stellaris.spec"  # FunctionSpec.digest() of the spec the instance was started for


class BackendError(RuntimeError):
    """An instance could not be started or reached."""


@dataclass
class InstanceHandle:
    """A running instance: where its function runtime listens and how the backend knows it."""

    id: str
    function: str
    url: str  # http://host:port of the function runtime (GET /health, POST /invoke)
    backend: str
    pid: int | None = None  # process backend
    container_id: str | None = None  # docker backend
    node: str | None = None  # ray backend: the address of the node the instance runs on
    secret: str | None = None  # sent with every call (SECRET_HEADER) to a runtime off loopback, which checks it
    init_s: float = 0.0  # time from start request to READY
    spec_digest: str | None = None  # FunctionSpec.digest() of the spec it was started for
    labels: dict[str, str] = field(default_factory=dict)


class Backend(Protocol):
    name: str

    def start(self, spec: FunctionSpec, *, instance_id: str) -> InstanceHandle:
        """Start one instance and return once its runtime accepts invocations (raise BackendError)."""
        ...

    def alive(self, handle: InstanceHandle) -> bool:
        """Whether the instance's process or container still runs."""
        ...

    def stop(self, handle: InstanceHandle, *, timeout_s: float = 10.0) -> None:
        """Drain and stop the instance (SIGTERM, then kill after timeout_s). Idempotent."""
        ...

    def kill(self, handle: InstanceHandle) -> None:
        """SIGKILL without draining (a stuck handler); stop() still cleans up after it."""
        ...

    def discover(self) -> list[InstanceHandle]:
        """Instances of this gateway that survived a gateway restart (docker: by label; process: none), of every
        function: the gateway hands each to its own function's pool (gateway/discovery.py)."""
        ...
