"""API and registry models: function specs, activation records. Validated once at the edge."""

from __future__ import annotations

import hashlib
import re
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.backends.names import NAMES

NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
# The backends' names, declared once: the rows of gateway/backends/names.py.
BACKENDS: tuple[str, ...] = NAMES
if TYPE_CHECKING:
    BackendName = str  # to a type checker: a name, one of BACKENDS
else:
    # To pydantic: the choices of BACKENDS, so that a field of this type refuses any other name, naming the bad value
    # and the choices ("Input should be 'process', 'docker' or 'ray'"), and the docs and the CLI list them.
    BackendName = Literal[BACKENDS]

# The metering part of the activation record rides on the synchronous answer in this header, so a caller that
# accounts for cost (the control plane) needs no second request per call.
METER_HEADER = "X-Activation-Meter"
# A call may name a key whose instance it would rather reuse (gateway/instances.py).
AFFINITY_HEADER = "X-Affinity-Key"
METER_FIELDS = {
    *("start", "end", "cold", "init_s", "wait_s", "duration_s"),
    *("instance", "container_id", "image", "node", "resource_seconds", "cost_usd", "found_dead"),
}
# A registration's numbers are finite (NaN and +-Infinity are a 422, `allow_inf_nan=False` on each model) and bounded:
# a price of 1e308 would make every charge, and the records that carry it, infinite.
MAX_MEMORY_BYTES = 1 << 44  # 16 TiB: more than any one host offers (the gateway caps it lower, to its own host's)
MAX_USD_PER_HOUR = 10_000.0  # the dearest cloud instances cost a few hundred dollars an hour
MAX_FUNCTIONS_PER_INSTANCE = 100_000
# Environment variable names as a shell (and execve's NAME=value strings) take them: an '=', NUL or newline in a
# name, or a NUL in a value, cannot reach an instance's environment, which would fail to start (a 502 per call).
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Resources(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    cpus: float = Field(default=1.0, gt=0, le=1024, description="CPU cores (process: affinity; docker: nano_cpus)")
    memory_bytes: int = Field(
        default=2 * 1024**3, gt=0, le=MAX_MEMORY_BYTES, description="memory limit of one instance (at most 16 TiB)"
    )
    gpus: float = Field(
        default=0, ge=0, le=64, description="GPUs per instance (docker: whole GPUs; ray: fractions too, e.g. 0.25)"
    )
    custom: dict[str, float] = Field(
        default_factory=dict,
        description="ray: custom resources per instance, which place it on the nodes that declare them "
        "(e.g. {'gpu_node': 0.01})",
    )

    @field_validator("custom")
    @classmethod
    def _custom(cls, v: dict[str, float]) -> dict[str, float]:
        for name, amount in v.items():
            if not re.match(r"^[A-Za-z_][\w.-]{0,63}$", name) or name in ("CPU", "GPU", "memory"):
                raise ValueError(f"custom resource name {name!r} must be a Ray resource name other than CPU/GPU/memory")
            if not 0 < amount <= 1_000_000:
                raise ValueError(f"custom resource {name!r}: amount {amount} must be > 0 and <= 1e6")
        return v


class Pricing(BaseModel):
    """docs/experiments.md: price per resource-second = instance price per second / functions per instance."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    instance_type: str = "c6a.32xlarge"
    instance_usd_per_hour: float = Field(default=4.896, ge=0, le=MAX_USD_PER_HOUR, description="at most 10,000")
    functions_per_instance: int = Field(default=128, gt=0, le=MAX_FUNCTIONS_PER_INSTANCE, description="at most 1e5")

    @property
    def usd_per_second(self) -> float:
        return self.instance_usd_per_hour / 3600.0 / self.functions_per_instance


LEARNER_PRICING = Pricing(instance_type="p3.2xlarge", instance_usd_per_hour=3.06, functions_per_instance=4)
ACTOR_PRICING = Pricing()


class FunctionSpec(BaseModel):
    """A registered function: what to run, with which resources and limits."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(description="lowercase letters, digits and '-', at most 63 characters")
    target: str | None = Field(default=None, description="module:handler (process backend)")
    image: str | None = Field(default=None, description="container image (docker backend)")
    backend: str | None = Field(
        default=None,
        description=f"{', '.join(BACKENDS[:-1])} or {BACKENDS[-1]}; "
        "None: the gateway's default (STELLARIS_GATEWAY_BACKEND)",
    )
    resources: Resources = Resources()
    timeout_s: float = Field(default=60.0, gt=0, le=3600)
    concurrency_per_instance: int = Field(default=1, ge=1, le=1024)
    max_concurrency: int = Field(default=8, ge=1, le=4096, description="calls running at once over all instances")
    max_instances: int = Field(default=8, ge=1, le=1024)
    queue_max: int = Field(default=64, ge=0, le=100_000, description="calls waiting beyond max_concurrency")
    min_warm: int = Field(default=0, ge=0, le=1024)
    keep_alive_s: float = Field(default=600.0, gt=0, le=86400)
    env: dict[str, str] = Field(
        default_factory=dict, description="names like [A-Za-z_][A-Za-z0-9_]*, values without a NUL character"
    )
    pricing: Pricing = Pricing()

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(f"function name {v!r} must be lowercase letters, digits and '-' (1-63 chars)")
        return v

    @field_validator("target")
    @classmethod
    def _target(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", v):
            raise ValueError(f"target {v!r} must look like package.module:function")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            if not ENV_NAME_RE.fullmatch(name):
                raise ValueError(f"env name {name!r} must be letters, digits and '_', not starting with a digit")
            if "\x00" in value:
                raise ValueError(f"env {name!r}: its value contains a NUL character")
        return v

    @model_validator(mode="after")
    def _runnable(self) -> FunctionSpec:
        if self.backend is not None and self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.backend is None and not (self.target or self.image):
            raise ValueError("a function needs 'target' (module:handler, process backend) or 'image' (docker)")
        if self.backend == "process" and not self.target:
            raise ValueError("a process-backend function needs 'target' (module:handler)")
        if self.backend == "docker" and not self.image:
            raise ValueError("a docker-backend function needs 'image'")
        if self.backend == "ray" and not self.target:
            raise ValueError("a ray-backend function needs 'target' (module:handler; its actor runs the runtime)")
        if self.backend != "ray" and self.resources.gpus != int(self.resources.gpus):
            raise ValueError(f"resources.gpus {self.resources.gpus} is fractional: only the ray backend shares a GPU")
        if self.backend != "ray" and self.resources.custom:
            raise ValueError("resources.custom places instances on Ray nodes: it needs backend 'ray'")
        if self.min_warm > self.max_instances:
            raise ValueError(f"min_warm {self.min_warm} exceeds max_instances {self.max_instances}")
        return self

    def digest(self) -> str:
        """A short fingerprint of the whole spec: an instance found again after a restart is adopted only by the
        same function with the same spec (a container of a replaced spec is stopped, not reused)."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]


class Status(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCESS = "success"
    ERROR = "error"  # the handler raised: 502
    TIMEOUT = "timeout"  # 504
    REJECTED = "rejected"  # 429


class Activation(BaseModel):
    """One invocation, as OpenWhisk records it. Its numbers are finite: a record holding another is read with that
    field at its default (gateway/activations.py), never answered as JSON no client can parse."""

    model_config = ConfigDict(allow_inf_nan=False)

    id: str
    function: str
    status: Status
    status_code: int | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    start: float | None = Field(default=None, description="unix seconds when the call was accepted")
    end: float | None = None
    wait_s: float = 0.0
    init_s: float | None = Field(default=None, description="instance start time, cold starts only")
    duration_s: float | None = Field(default=None, description="handler time on the instance")
    instance: str | None = Field(default=None, description="the instance that ran it (its id in the pool)")
    container_id: str | None = Field(default=None, description="the container that ran it (docker backend)")
    image: str | None = Field(default=None, description="the image of that container (the function's spec's)")
    node: str | None = Field(default=None, description="the node that ran it (ray backend: the Ray node's address)")
    cold: bool | None = None
    found_dead: int = Field(default=0, description="idle instances found dead (and replaced) as this call looked")
    resource_seconds: float = 0.0
    cost_usd: float = 0.0
