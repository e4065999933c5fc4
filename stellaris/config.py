"""The training job's configuration: YAML file + flag overrides, validated before anything starts.

The Stellaris knobs (`mode`, `d`, `v`, `rho`, `truncation`, `softsync_k`, `ssp_bound`) are declared once, in
`contract/knobs.py`, and inherited here. A YAML file may also set them as `overrides.stellaris.<knob>`
(`rule` for `mode`), the job spec's spelling: that is the same field, so giving it both ways with different values
is an error naming both. An explicit flag beats the YAML file, either spelling (docs/training.md); `--set`
entries merge over the file's `overrides:`. Every override is resolved against the preset here, before anything
starts (stellaris/override_check.py), and what crosses to the functions is the typed result (`job_request`): the
validated algorithm config and the run's plan (`contract.jobspec.Plan`, built once here), never the overrides.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from contract.algo_config import AlgoConfig, AlgoName, PresetName
from contract.distribution import DistributionKnob
from contract.jobspec import JobRequest, Plan, resolve, resolve_algo
from contract.knobs import KNOB_NAMES, Rule, StellarisKnobs, rule_field, train_name
from stellaris.elastic_options import ElasticOptions
from stellaris.env_check import env_kwargs_object, import_env_module, known_env, make_once
from stellaris.override_check import override_problems
from stellaris.placement import Backend, Device, RoleMethods, check_placement
from stellaris.round.triggers import TriggerFields


def default_learners() -> int:
    """One learner per core past the one the actor, parameter function and Redis share, at most 2 (beyond that,
    `--learners`). On 2 cores, 1: a second one there added no env steps/s and cost 40 % more (docs/training.md)."""
    try:
        cores = len(os.sched_getaffinity(0))  # the cores this process may use (a container's cpuset), not the host's
    except AttributeError:  # macOS has no affinity
        cores = os.cpu_count() or 1
    return max(1, min(2, cores - 1))


class ConfigError(ValueError):
    """A bad configuration; the message names the field."""


class TrainConfig(StellarisKnobs, DistributionKnob, ElasticOptions, TriggerFields, RoleMethods):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # env_module first: validators run in field order, and env's and env_kwargs' need the module imported.
    env_module: str | None = Field(
        default=None, description="module imported first, in every function (it registers env ids)"
    )
    env: str = Field(default="Hopper-v5", description="Gymnasium env id (Box or Discrete actions), or module:EnvClass")
    env_kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of gymnasium.make")
    algo: AlgoName = Field(default="ppo", description="the learning algorithm")
    preset: PresetName = Field(
        default="fast",
        description="hyperparameters: paper (the Stellaris paper's) or fast (CleanRL/SB3's PPO, annealed lr)",
    )
    mode: Rule = rule_field()
    rounds: int | None = Field(default=None, gt=0, description="stop after this many rounds")
    total_steps: int | None = Field(default=None, gt=0, description="stop after this many env steps")
    max_minutes: float | None = Field(default=None, gt=0, description="stop after this much wall-clock time")
    # Defaults for a 2-core machine: one actor stepping 2 envs with batched inference (Hopper fast preset, 2 learners:
    # 963 env steps/s, against 688 with 2 actors x 1 env; ~500 with 4 learners). Learners: `default_learners`.
    actors: int = Field(default=1, ge=1, le=1024, description="actors collecting each round's batch")
    actor_kind: Literal["serverful", "serverless"] = Field(
        default="serverful", description="serverful (long-lived processes) or serverless (one invocation a batch)"
    )
    envs_per_actor: int = Field(default=2, ge=1, le=1024, description="envs one actor steps (batched inference)")
    # Policy lag (docs/algorithms.md): at 0 a batch is collected once the round training the previous one
    # ends, with the policy it ended on; at 1 while it trains, following the newest policy every 4 steps.
    actor_run_ahead: int = Field(default=0, ge=0, le=64, description="batches per actor queued or in training")
    actor_policy_refresh: int = Field(
        default=4,
        ge=0,
        le=100_000,
        description="steps per env between an actor's looks for a newer policy mid-batch (0: once a batch)",
    )
    learners: int = Field(
        default_factory=default_learners,
        ge=1,
        le=256,
        description="max concurrent learner functions: one per CPU core past the first, at most 2, unless given",
    )
    standby: int = Field(default=0, ge=0, le=16, description="warm spare learner and parameter-function instances each")
    seed: int = Field(default=0, description="seed of envs, action sampling, minibatch order and network init")
    eval_every: int = Field(default=0, ge=0, le=1_000_000, description="rounds between evaluations, and the last")
    eval_episodes: int = Field(default=5, ge=1, le=10_000, description="deterministic episodes per evaluation")
    eval_max_episode_steps: int = Field(default=10_000, ge=1, le=10_000_000, description="eval episode cap (steps)")
    overrides: dict[str, Any] = Field(
        default_factory=dict, description='algorithm fields over the preset, e.g. {"lr": 1e-4} (or --set lr=1e-4)'
    )
    out: Path | None = Field(default=None, description="run directory (none: runs/<env>-<mode>-<time>)")
    redis_url: str | None = Field(
        default=None,
        description="the Redis to use (none: a private embedded one)",
        json_schema_extra={"envvar": "REDIS_URL"},
    )
    gateway_url: str | None = Field(
        default=None,
        description="a running gateway (none: a local one)",
        json_schema_extra={"envvar": "STELLARIS_GATEWAY_URL"},
    )
    gateway_token: str | None = Field(
        default=None, description="the gateway's bearer token", json_schema_extra={"envvar": "STELLARIS_GATEWAY_TOKEN"}
    )
    billing: Literal["serverless", "serverful"] = Field(
        default="serverless",
        description="serverless: each invocation's metered cost; serverful: actors, learner capacity and the "
        "parameter server charged for the whole wall-clock time",
    )
    torch_threads: int = Field(default=1, ge=1, le=64, description="torch threads per function instance")
    # Where the job's functions run (docs/deployment.md). Serverful actors are always processes.
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
    ray_address: str | None = Field(default=None, description="ray: the cluster to join (none: a private local Ray)")
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
        check_placement(self)
        return self

    @model_validator(mode="after")
    def _overrides_resolve(self) -> TrainConfig:
        """Every override checked now, naming the field as written, rather than by the parameter function once the
        platform is up (stellaris/override_check.py: a local check, not the control plane calling functions)."""
        stellaris = self.overrides.get("stellaris", {})
        if not isinstance(stellaris, dict):
            raise ValueError(f"overrides.stellaris: must be a mapping of fields, got {stellaris!r}")
        horizon = {"horizon_rounds": stellaris.get("horizon_rounds")}  # the plan's, spelled as a stellaris field
        problems = override_problems(
            lambda: Plan.model_validate(horizon), self.algo, at=("overrides", "stellaris")
        ) or override_problems(lambda: resolve(self.job_request("check")), self.algo)
        if problems:
            raise ValueError(problems)
        return self

    def run_dir(self) -> Path:
        if self.out is None:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            self.out = Path("runs") / f"{self.env.replace('/', '-')}-{self.mode}-{stamp}"
        return self.out

    def algo_config(self) -> AlgoConfig:
        """The typed, validated algorithm config: the preset, the overrides over it, the knobs, and the floor
        schedules' least β unless the overrides set one (`stellaris.horizon_rounds` is the plan's: `plan`)."""
        stellaris = {k: v for k, v in self.overrides.get("stellaris", {}).items() if k != "horizon_rounds"}
        knobs = {knob: getattr(self, train_name(knob)) for knob in KNOB_NAMES}
        algo = resolve_algo(self.algo, self.preset, self.env, {**self.overrides, "stellaris": {**stellaris, **knobs}})
        if "beta_floor" in stellaris:
            return algo
        # The floor schedules' least β: the tasks in flight (two a learner claiming ahead) + 1; lower flushes
        # (docs/algorithms.md)
        floor = float(self.learners * (1 + algo.stellaris.claim_ahead) + 1)
        return algo.model_copy(update={"stellaris": algo.stellaris.model_copy(update={"beta_floor": floor})})

    def plan(self, algo: AlgoConfig) -> Plan:
        """The run's planned length, read by β's horizon schedules and the learning-rate schedules: `rounds` (or
        `overrides.stellaris.horizon_rounds`, which sets the horizon without stopping the run), else `total_steps` in
        rounds of `algo`'s batch; none for a run bounded by time only."""
        horizon = self.overrides.get("stellaris", {}).get("horizon_rounds")
        rounds = self.rounds if horizon is None else horizon
        return Plan.of(rounds=rounds, env_steps=self.total_steps, train_batch_size=algo.train_batch_size)

    def job_request(self, job: str) -> JobRequest:
        """What the parameter function resolves into the job's spec: the typed algorithm config and plan (its JSON
        is what crosses)."""
        algo = self.algo_config()
        return JobRequest(
            job=job,
            env_id=self.env,
            env_module=self.env_module,
            env_kwargs=self.env_kwargs,
            algo=algo,
            plan=self.plan(algo),
            num_envs=self.envs_per_actor,
            actors=self.actors,
            policy_refresh_steps=self.actor_policy_refresh if self.actor_run_ahead else 0,  # none lands mid-batch
            seed=self.seed,
            distribution=self.distribution,
            parameter_trigger=self.triggers.parameter,
        )


def load_config(
    path: Path | None, overrides: dict[str, Any], *, section: str | None = None, sets: dict[str, Any] | None = None
) -> TrainConfig:
    """YAML file (optional; `section` picks a sub-mapping) with flag overrides on top (a flag given, not None, beats
    the file, a knob's `overrides.stellaris` spelling included) and `sets` (`--set`, nested) merged over its
    `overrides:`, a knob's `stellaris.<knob>` taken as the knob's flag; raises ConfigError naming the bad field."""
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
    sets = _knob_sets_as_flags(dict(sets or {}), flags)
    data = _without_overridden_knobs(data, flags)
    data.update(flags)
    if sets:
        if not isinstance(data.get("overrides", {}), dict):
            raise ConfigError(f"overrides: {data['overrides']!r} is not a mapping, so --set cannot add to it")
        data["overrides"] = _merged(data.get("overrides", {}), sets)
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" if e["loc"] else e["msg"].removeprefix("Value error, ")
            for e in exc.errors()
        )
        raise ConfigError(f"invalid configuration: {problems}") from exc


def _knob_sets_as_flags(sets: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """`sets` less its `stellaris.<knob>` entries, which go to `flags` as the knob's field (a knob's one value);
    the same knob given as a flag too, with another value, is an error naming both."""
    section = sets.get("stellaris")
    if not isinstance(section, dict):
        return sets
    section = dict(section)
    for knob in [k for k in KNOB_NAMES if k in section]:
        field, value = train_name(knob), section.pop(knob)
        if flags.get(field, value) != value:
            flag = "--" + field.replace("_", "-")
            raise ConfigError(
                f"{flag} {flags[field]!r} and --set stellaris.{knob}={value!r} set the same knob; give one"
            )
        flags[field] = value
    return {**sets, "stellaris": section} if section else {k: v for k, v in sets.items() if k != "stellaris"}


def _merged(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`top` over `base`, mappings merged key by key (`--set network.hidden=...` keeps the file's network.kind)."""
    merged = dict(base)
    for key, value in top.items():
        both = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = _merged(merged[key], value) if both else value
    return merged


def _without_overridden_knobs(data: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """`data` less the `overrides.stellaris` spelling of each knob a flag sets: the flag wins."""
    section = (data.get("overrides") or {}).get("stellaris") if isinstance(data.get("overrides"), dict) else None
    if not isinstance(section, dict):
        return data
    kept = {k: v for k, v in section.items() if not (k in KNOB_NAMES and train_name(k) in flags)}
    return {**data, "overrides": {**data["overrides"], "stellaris": kept}}
