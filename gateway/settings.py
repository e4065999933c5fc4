"""Gateway settings, validated once at the edge (env vars STELLARIS_GATEWAY_* or explicit values)."""

from __future__ import annotations

import ipaddress
import os
import socket

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from contract.instance_env import INHERITED_ENV
from gateway.models import BackendName


def resolves_to_loopback(host: str) -> bool:
    """Whether `host` (an IP literal, or a name resolved now) reaches only loopback addresses."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(host, None))
        except OSError:
            return False


# What a registered function may set in its instances' environment: this project's settings and thread counts.
DEFAULT_ENV_ALLOW = (
    "STELLARIS_*",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "MUJOCO_GL",
)
# Variables that change how an interpreter, the dynamic loader or a shell starts: never, whatever env_allow says.
ENV_DENY = (
    "PYTHON*",
    "LD_*",
    "DYLD_*",
    "PERL*",
    "RUBY*",
    "NODE_*",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "PS4",
    "IFS",
    "PATH",
    "HOME",
    "BROWSER",
    "GCONV_PATH",
    "MALLOC_*",
    "TMPDIR",
)


def _physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class HangSettings(BaseSettings):
    """When a process that answers nothing is taken for hung and killed: the gateway's instances under a call
    (gateway/hung.py), and `stellaris train`'s local gateway, serverful actors and embedded Redis. Read by both from
    these variables."""

    model_config = SettingsConfigDict(env_prefix="STELLARIS_GATEWAY_", extra="ignore", frozen=True)

    hung_after_s: float = Field(
        default=10.0,
        ge=0,
        le=86_400,
        description="an instance under a call that answers none of its health probes for this long (stopped, stuck, "
        "cut off) is killed, and its calls end with a 502 InstanceHung; 0: never",
    )
    busy_probe_s: float = Field(
        default=2.0, gt=0, le=600, description="how often instances under a call are probed, and how long a probe waits"
    )

    @model_validator(mode="after")
    def _two_probes(self) -> HangSettings:
        if 0 < self.hung_after_s < 2 * self.busy_probe_s:
            raise ValueError(
                f"hung_after_s ({self.hung_after_s}) must be 0 (never) or at least twice busy_probe_s "
                f"({self.busy_probe_s}): a process is judged hung only after two probes went unanswered"
            )
        return self


class GatewaySettings(HangSettings):
    model_config = SettingsConfigDict(env_prefix="STELLARIS_GATEWAY_", extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    token: str | None = Field(
        default=None,
        description="admin bearer token (register, update, delete, metrics, docs, and invoke too); "
        "required to bind a non-loopback address",
    )
    invoke_token: str | None = Field(default=None, description="bearer token that may only invoke and read activations")
    redis_url: str | None = Field(default=None, description="None: $REDIS_URL, else an embedded redis-server")
    namespace: str = Field(default="gateway", description="registry namespace shared by this gateway's workers")
    backend: BackendName = Field(default="process", description="backend of a registration that names none")
    activation_ttl_s: float = Field(default=3600.0, gt=0, le=30 * 86400, description="age cap of a record")
    activation_max: int = Field(
        default=100_000, ge=1, le=10_000_000, description="count cap of records (~1 KB each; oldest dropped)"
    )
    max_instances: int = Field(default=64, ge=1, le=1024, description="cap on a function's max_instances")
    max_instance_memory_bytes: int = Field(
        default_factory=lambda: _physical_memory(), ge=1 << 20, description="cap on one instance's memory_bytes"
    )
    target_prefixes: list[str] = Field(
        default_factory=lambda: ["functions.handlers."],
        description="handler modules a registration may name (module path prefixes); anything else is a 422",
    )
    env_allow: list[str] = Field(
        default_factory=lambda: list(DEFAULT_ENV_ALLOW),
        description="env variable names (fnmatch patterns) a registration may set; the deny list always wins",
    )
    instance_env_inherit: list[str] = Field(
        default_factory=lambda: list(INHERITED_ENV),
        description="process backend: the gateway's env variables (fnmatch patterns) its instances inherit (a private "
        "Ray's nodes inherit the default's); credentials (tokens, passwords, REDIS_URL, STELLARIS_GATEWAY_*) never are",
    )
    public_docs: bool = Field(default=False, description="serve /openapi.json and /docs without the token")
    redis_max_connections: int = Field(default=64, ge=1, le=10_000, description="the gateway's cache connections")
    redis_wait_s: float = Field(default=5.0, gt=0, le=300, description="wait for a free cache connection (then 503)")
    header_timeout_s: float = Field(default=10.0, gt=0, le=600, description="time to send a request's head")
    body_timeout_s: float = Field(default=30.0, gt=0, le=3600, description="longest wait for the next body chunk")
    max_body_bytes: int = Field(default=1 << 20, ge=1, le=1 << 30, description="request body cap (413 beyond)")
    max_json_depth: int = Field(default=64, ge=1, le=512, description="JSON nesting cap of a body (400 beyond)")
    stop_timeout_s: float = Field(
        default=10.0, gt=0, le=3600, description="an instance's drain on stop (SIGTERM), then it is killed"
    )
    stop_report_s: float = Field(
        default=20.0,
        gt=0,
        le=3600,
        description="a stop still under way this long after it began prints every thread's and task's stack to stderr",
    )
    late_start_wait_s: float = Field(
        default=20.0,
        ge=0,
        le=600,
        description="on shutdown, the wait for instance starts still running and for the stops of instances no longer "
        "wanted (a deleted function's); one still running then is left behind, and named",
    )
    fork_servers: int = Field(
        default=2,
        ge=0,
        le=16,
        description="process backend: instances are forked from servers that have the runtime and handlers imported "
        "(one per load-time environment a registration asks for, e.g. OMP_NUM_THREADS), at most this many; 0: "
        "every instance starts a fresh interpreter",
    )
    fork_server_retry_s: float = Field(
        default=10.0,
        ge=0,
        le=3600,
        description="process backend: a fork server that failed to start is tried again after this long, doubled at "
        "each failure in a row up to 32 times; its instances start as fresh interpreters meanwhile",
    )
    fork_server_env: dict[str, str] | None = Field(
        default=None,
        description="start a process-backend fork server with the gateway, for registrations that set these load-time "
        "variables ({} for none), so that their first instance need not wait for one; None: at the first instance",
    )
    spec_refresh_s: float = Field(default=2.0, ge=0, description="how stale a worker's copy of a spec may get")
    idle_probe_s: float = Field(
        default=10.0,
        ge=0,
        le=3600,
        description="every this many seconds, idle instances are probed and the dead ones replaced (min_warm kept "
        "while no call comes); 0: only a call about to reuse one probes it",
    )
    # Docker backend: host-Python mode runs the project's own interpreter from read-only bind mounts (bare images).
    docker_python: str | None = Field(default=None, description="interpreter path inside the container")
    docker_volumes: dict[str, str] = Field(default_factory=dict, description="host path -> container path (ro)")
    docker_workdir: str | None = None
    # Ray backend (gateway/backends/ray/backend.py): instances are named detached actors in the Ray namespace
    # "stellaris-<namespace>", each serving the function runtime on its node's address.
    ray_address: str | None = Field(
        default=None,
        description="the Ray cluster to join (host:port of its GCS, or 'auto'); None: a private local Ray that this "
        "gateway starts on first use and stops on exit",
    )
    ray_startup_timeout_s: float = Field(
        default=120.0, gt=0, le=3600, description="wait for a ray instance to be placed and serve (then 502)"
    )

    @model_validator(mode="after")
    def _token_for_remote(self) -> GatewaySettings:
        if not resolves_to_loopback(self.host) and not self.token:
            raise ValueError(f"refusing to bind non-loopback address {self.host!r} without a token")
        if self.invoke_token is not None and self.token is None:
            raise ValueError("invoke_token needs an admin token too (without one the gateway is open to all)")
        if self.invoke_token is not None and self.invoke_token == self.token:
            raise ValueError("invoke_token must differ from the admin token")
        return self
