"""The training job's configuration: YAML file + flag overrides, validated before anything starts.

The Stellaris knobs (`mode`, `d`, `v`, `rho`, `truncation`, `softsync_k`, `ssp_bound`) are declared once, in
`cache/contract/knobs.py`, and inherited here. A YAML file may also set them as `overrides.stellaris.<knob>`
(`rule` for `mode`), the job spec's spelling: that is the same field, so giving it both ways with different values
is an error naming both. An explicit flag beats the YAML file, either spelling (README, "Configuration").
"""

from __future__ import annotations

import socket
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from cache.contract.knobs import KNOB_NAMES, RuleName, StellarisKnobs, rule_field, train_name
from stellaris.env_check import env_kwargs_object, import_env_module, known_env, make_once

Mode = RuleName
Backend = Literal["process", "docker", "ray"]
Device = Literal["auto", "cpu", "cuda"]
FunctionRole = Literal["actor", "learner", "parameter"]
GPU_IMAGE = "stellaris/function"  # docker/Dockerfile.function: CUDA base (GPU learners and the parameter function)
CPU_IMAGE = "stellaris/function-cpu"  # docker/Dockerfile.function-cpu: CPU torch (actors, CPU-only functions)


_DOCKER_FIELDS = ("image", "learner_image", "parameter_image", "actor_image")
_RAY_FIELDS = ("ray_address", "learner_resources", "parameter_resources", "actor_resources")
_GPU_FIELDS = ("learner_gpus", "parameter_gpus")
_FIELD_BACKENDS = {
    **dict.fromkeys(_DOCKER_FIELDS, "docker"), **dict.fromkeys(_RAY_FIELDS, "ray"),
    **dict.fromkeys(_GPU_FIELDS, "docker or ray"),
}  # fmt: skip


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


class ConfigError(ValueError):
    """A bad configuration; the message names the field."""


class TrainConfig(StellarisKnobs):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # env_module first: validators run in field order, and env's and env_kwargs' need the module imported.
    env_module: str | None = Field(default=None, description="module imported first (it registers env ids)")
    env: str = Field(default="Hopper-v5", description="Gymnasium env id (Box or Discrete actions), or module:EnvClass")
    env_kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of gymnasium.make")
    algo: Literal["ppo", "impact", "appo"] = "ppo"
    preset: Literal["paper", "fast"] = "fast"
    mode: Mode = rule_field()
    rounds: int | None = Field(default=None, gt=0)
    total_steps: int | None = Field(default=None, gt=0)
    max_minutes: float | None = Field(default=None, gt=0, description="stop after this much wall-clock time")
    # Defaults for a 2-core machine: one actor stepping 2 envs with batched inference and 2 learners (Hopper fast
    # preset: 963 env steps/s, against 688 with 2 actors x 1 env and 2 learners, and ~500 with 4 learners).
    actors: int = Field(default=1, ge=1, le=1024)
    actor_kind: Literal["serverful", "serverless"] = "serverful"
    envs_per_actor: int = Field(default=2, ge=1, le=1024)
    # Policy lag: a batch is collected while learners train on the previous one. Following the newest policy every 4
    # steps mid-batch, Hopper (fast preset, seed 1) returned 1,330 over 200-250k steps, against 537 holding one
    # policy per batch and 887 refreshing every 16 steps (README, "Actors and policy lag").
    actor_run_ahead: int = Field(default=2, ge=1, le=64, description="batches per actor queued before it blocks")
    actor_policy_refresh: int = Field(
        default=4, ge=0, le=100_000,
        description="steps per env between an actor's looks for a newer policy mid-batch (0: once a batch)",
    )  # fmt: skip
    learners: int = Field(default=2, ge=1, le=256, description="max concurrent learner functions")
    seed: int = 0
    # SB3's EvalCallback: deterministic actions on a separate env, every N rounds (0: never), M episodes each time.
    eval_every: int = Field(default=0, ge=0, le=1_000_000, description="rounds between evaluations (0: none)")
    eval_episodes: int = Field(default=5, ge=1, le=10_000, description="deterministic episodes per evaluation")
    overrides: dict[str, Any] = Field(default_factory=dict, description="algorithm fields, e.g. {lr: 1e-4}")
    out: Path | None = Field(default=None, description="run directory (default runs/<env>-<mode>-<time>)")
    redis_url: str | None = None
    gateway_url: str | None = None
    gateway_token: str | None = None
    billing: Literal["serverless", "serverful"] = Field(
        default="serverless",
        description="serverless: each invocation's metered cost; serverful: actors, learner capacity and the "
        "parameter server charged for the whole wall-clock time (SPEC §7)",
    )
    torch_threads: int = Field(default=1, ge=1, le=64, description="torch threads per function instance")
    # Where the job's functions run (README, "Training on containers"). Serverful actors are always processes.
    backend: Backend = Field(default="process", description="the gateway backend of the job's functions")
    image: str | None = Field(default=None, description="docker: the image of every role without its own")
    learner_image: str | None = Field(default=None, description="docker: the learners' image")
    parameter_image: str | None = Field(default=None, description="docker: the parameter function's image")
    actor_image: str | None = Field(default=None, description="docker: the serverless actors' image")
    learner_gpus: float = Field(default=0, ge=0, le=64, description="docker/ray: GPUs per learner (ray: 0.25 shares)")
    parameter_gpus: float = Field(default=0, ge=0, le=64, description="docker/ray: GPUs of the parameter function")
    device: Device = Field(default="auto", description="learners' and parameter function's torch device")
    # Ray backend: the cluster, and the custom resources that place each role's instances on the nodes declaring them
    # (deploy/: GPU nodes declare gpu_node, CPU nodes cpu_node).
    ray_address: str | None = Field(default=None, description="ray: the cluster to join; None: a private local Ray")
    learner_resources: dict[str, float] = Field(default_factory=dict, description="ray: learners' custom resources")
    parameter_resources: dict[str, float] = Field(default_factory=dict, description="ray: the parameter function's")
    actor_resources: dict[str, float] = Field(default_factory=dict, description="ray: serverless actors' resources")

    @model_validator(mode="before")
    @classmethod
    def _knobs_from_overrides(cls, data: Any) -> Any:
        """`overrides.stellaris.<knob>` is the knob's field under the job spec's name: moved to the field, so the
        job request has one value for it; both given and different is an error naming both."""
        if not isinstance(data, dict) or not isinstance(data.get("overrides"), dict):
            return data
        section = data["overrides"].get("stellaris")
        if not isinstance(section, dict) or not set(section) & set(KNOB_NAMES):
            return data
        data, section = dict(data), dict(section)
        for knob in KNOB_NAMES:
            if knob not in section:
                continue
            field, value = train_name(knob), section.pop(knob)
            if field in data and data[field] != value:
                raise ValueError(
                    f"{field}: {data[field]!r} and overrides.stellaris.{knob}: {value!r} set the same knob; give one"
                )
            data[field] = value
        data["overrides"] = {**data["overrides"], "stellaris": section}
        return data

    @field_validator("env_module")
    @classmethod
    def _env_module_imports(cls, env_module: str | None) -> str | None:
        return import_env_module(env_module)

    @field_validator("env")
    @classmethod
    def _env_exists(cls, env: str, info: ValidationInfo) -> str:
        if "env_module" in info.data:  # else env_module failed and is named already
            known_env(env, info.data["env_module"])
        return env

    @field_validator("env_kwargs", mode="before")
    @classmethod
    def _kwargs_object(cls, value: Any) -> Any:
        return env_kwargs_object(value)

    @field_validator("env_kwargs")
    @classmethod
    def _kwargs_accepted(cls, env_kwargs: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if "env" in info.data and "env_module" in info.data:
            make_once(info.data["env"], info.data["env_module"], env_kwargs)
        return env_kwargs

    @model_validator(mode="after")
    def _budget(self) -> TrainConfig:
        if self.rounds is None and self.total_steps is None and self.max_minutes is None:
            raise ValueError("give rounds, total_steps or max_minutes")
        return self

    @model_validator(mode="after")
    def _placement(self) -> TrainConfig:
        """Images are the docker backend's, custom resources and the Ray address the ray backend's, GPUs either's;
        `device: cuda` in a container or a Ray actor needs the GPUs requested."""
        foreign = [field for field in _foreign_fields(self.backend) if getattr(self, field)]
        if foreign:
            given = ", ".join(f"{f}: {_shown(getattr(self, f))!r} needs backend {_FIELD_BACKENDS[f]}" for f in foreign)
            raise ValueError(f"{given}, but backend is {self.backend!r} (give that backend, or drop them)")
        if self.backend == "ray" and self.ray_address and self.redis_url is None:
            host = self.ray_address.removeprefix("ray://").rsplit(":", 1)[0]
            if host != "auto" and not _on_this_machine(host):
                raise ValueError(
                    f"ray_address {self.ray_address!r} is a cluster on other machines, but no redis_url is given: an "
                    "embedded Redis listens on this machine's loopback only, which the cluster's nodes cannot reach; "
                    "give --redis-url (or REDIS_URL) a Redis every node can reach (deploy/README.md)"
                )
        for role in ("learner", "parameter"):
            gpus = getattr(self, f"{role}_gpus")
            if self.backend == "docker" and gpus != int(gpus):
                raise ValueError(f"{role}_gpus {gpus} is fractional: a container takes whole GPUs (ray shares them)")
            if self.device == "cuda" and self.backend != "process" and gpus == 0:
                raise ValueError(
                    f"device: 'cuda' with backend {self.backend!r} needs {role}_gpus > 0 (an instance sees no GPU it "
                    f"did not request), but {role}_gpus is 0"
                )
        return self

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

    def run_dir(self) -> Path:
        if self.out is None:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            self.out = Path("runs") / f"{self.env.replace('/', '-')}-{self.mode}-{stamp}"
        return self.out

    def job_request(self, job: str) -> dict[str, Any]:
        """What the parameter function resolves into the job's spec (preset + overrides)."""
        # The floor schedules' least β: with L learners applying as gradients land, the gradients that end a
        # round reach a staleness of about L; a lower floor ends most rounds in a liveness flush (README).
        defaults = {"beta_floor": float(self.learners)}
        knobs = {knob: getattr(self, train_name(knob)) for knob in KNOB_NAMES}
        overrides = {**self.overrides, "stellaris": {**defaults, **self.overrides.get("stellaris", {}), **knobs}}
        return {
            "job": job,
            "env_id": self.env,
            "env_module": self.env_module,
            "env_kwargs": self.env_kwargs,
            "algo": self.algo,
            "preset": self.preset,
            "overrides": overrides,
            "num_envs": self.envs_per_actor,
            "actors": self.actors,
            "policy_refresh_steps": self.actor_policy_refresh,
            "seed": self.seed,
            "horizon_rounds": self.rounds,
            "horizon_steps": self.total_steps,
        }


def load_config(path: Path | None, overrides: dict[str, Any], *, section: str | None = None) -> TrainConfig:
    """YAML file (optional; `section` picks a sub-mapping) with flag overrides on top (a flag given, not None, beats
    the file, a knob's `overrides.stellaris` spelling included); raises ConfigError naming the bad field."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config {path} must be a mapping of fields, got {type(loaded).__name__}")
        data = dict(loaded or {})
        if section is not None:
            data = dict(data.get(section) or {})
    flags = {k: v for k, v in overrides.items() if v is not None}
    data = _without_overridden_knobs(data, flags)
    data.update(flags)
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"invalid configuration: {problems}") from exc


def _without_overridden_knobs(data: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """`data` less the `overrides.stellaris` spelling of each knob a flag sets: the flag wins."""
    section = (data.get("overrides") or {}).get("stellaris") if isinstance(data.get("overrides"), dict) else None
    if not isinstance(section, dict):
        return data
    kept = {k: v for k, v in section.items() if not (k in KNOB_NAMES and train_name(k) in flags)}
    return {**data, "overrides": {**data["overrides"], "stellaris": kept}}
