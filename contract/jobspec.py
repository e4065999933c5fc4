"""A training job's specification (`JobSpec`: what every handler of the job reads from the cache, never from its
event) and the request a control plane makes for one (`JobRequest`: a preset plus overrides), with `resolve`, the
pure function from the one to the other. The parameter function resolves a job's request when it creates the job
(`functions.runtime.jobspec` stores the spec); the control plane resolves it too, locally, to check a request's
overrides before anything starts (`stellaris.override_check`)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contract import algo_config
from contract.algo_config import preset
from contract.distribution import Distribution, distribution_field
from contract.triggers import ParameterTrigger

AlgoConfig = Annotated[algo_config.AlgoConfig, Field(discriminator="algo")]


class JobSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    job: str
    env_id: str
    algo: AlgoConfig
    num_envs: int = Field(default=4, gt=0, description="envs stepped by one actor")
    actor_steps: int = Field(default=128, gt=0, description="steps per env in one actor invocation")
    policy_refresh_steps: int = Field(
        default=0, ge=0, description="steps per env between an actor's looks for a newer policy (0: once a batch)"
    )
    seed: int = 0
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    env_module: str | None = Field(default=None, description="imported before making envs (it registers env_id)")
    distribution: Distribution = distribution_field()
    parameter_trigger: ParameterTrigger = Field(default_factory=ParameterTrigger, description="when it applies")

    @model_validator(mode="after")
    def _replay_needs_learners(self) -> JobSpec:
        # Replay re-reads trajectory batches from the cache; gradients_at_actors ships none, only headers.
        replay = getattr(self.algo, "replay", "full_batch")
        if replay != "full_batch" and self.distribution == "gradients_at_actors":
            raise ValueError(f"replay {replay!r} needs distribution 'trajectories' (gradients_at_actors ships none)")
        return self


class JobRequest(BaseModel):
    """What a control plane asks for: a preset plus overrides. The functions side resolves it into a JobSpec,
    so control planes need no algorithm code (docs/architecture.md: they talk to functions only through the gateway)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job: str
    env_id: str
    algo: str = "ppo"
    preset: str = "paper"
    overrides: dict[str, Any] = Field(default_factory=dict, description="algorithm fields; 'stellaris' nests")
    num_envs: int = Field(default=1, gt=0)
    actors: int = Field(default=1, gt=0)
    policy_refresh_steps: int = Field(default=0, ge=0, description="see JobSpec")
    seed: int = 0
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    env_module: str | None = Field(default=None, description="imported before making envs (it registers env_id)")
    horizon_rounds: int | None = Field(default=None, gt=0, description="the run's planned rounds, when known")
    horizon_steps: int | None = Field(default=None, gt=0, description="the run's planned env steps, when known")
    distribution: Distribution = distribution_field()
    parameter_trigger: ParameterTrigger = Field(default_factory=ParameterTrigger, description="see JobSpec")


def env_kind(env_id: str) -> str:
    return "atari" if env_id.startswith("ALE/") else "mujoco"


def resolve(request: JobRequest) -> JobSpec:
    """Preset + overrides -> a validated JobSpec; each actor invocation collects its share of one round."""
    base = preset(request.preset, request.algo, env_kind(request.env_id))  # type: ignore[arg-type]
    fields = base.model_dump()
    for key, value in request.overrides.items():
        if key == "stellaris" and isinstance(value, dict):
            fields["stellaris"] = {**fields["stellaris"], **value}
        elif key == "network" and isinstance(value, dict):
            fields["network"] = {**fields["network"], **value}
        else:
            fields[key] = value
    algo = type(base).model_validate(fields)
    if algo.stellaris.horizon_rounds is None:  # the horizon schedules measure k against the planned run
        horizon = request.horizon_rounds
        if horizon is None and request.horizon_steps is not None:
            horizon = -(-request.horizon_steps // algo.train_batch_size)
        if horizon is not None:
            algo = algo.model_copy(update={"stellaris": algo.stellaris.model_copy(update={"horizon_rounds": horizon})})
    per_invocation = request.actors * request.num_envs
    actor_steps = max(1, -(-algo.train_batch_size // per_invocation))
    return JobSpec(
        job=request.job,
        env_id=request.env_id,
        algo=algo,
        num_envs=request.num_envs,
        actor_steps=actor_steps,
        policy_refresh_steps=request.policy_refresh_steps,
        seed=request.seed,
        env_kwargs=request.env_kwargs,
        env_module=request.env_module,
        distribution=request.distribution,
        parameter_trigger=request.parameter_trigger,
    )
