"""A training job's specification (`JobSpec`: what every handler of the job reads from the cache, never from its
event), the request a control plane makes for one (`JobRequest`: the typed, validated algorithm config and the run's
plan) and `resolve`, the pure function from the one to the other.

A control plane builds the algorithm config itself, from a preset and its user's overrides (`resolve_algo`: the
same pure function wherever it runs, so what passes there passes in the functions), and sends the request's JSON;
the parameter function resolves the request when it creates the job (`functions.runtime.jobspec` stores the spec).
The run's planned length (`Plan`) is one object in the spec, read by β's horizon schedules and by the learning-rate
schedules alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from contract import algo_config
from contract.algo_config import AlgoName, EnvKind, PresetName, preset
from contract.distribution import Distribution, distribution_field
from contract.triggers import ParameterTrigger

AlgoConfig = Annotated[algo_config.AlgoConfig, Field(discriminator="algo")]


class Plan(BaseModel):
    """The run's planned length: read by the horizon schedules of β (`contract.algo_config.Schedule`) and by the
    learning-rate schedules (`functions.algos.lr_schedule`). Both None for a run bounded by wall-clock time only."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    horizon_rounds: PositiveInt | None = Field(default=None, description="the rounds the run is planned to last")
    horizon_steps: PositiveInt | None = Field(default=None, description="the env steps it is planned to last")

    @classmethod
    def of(cls, *, rounds: int | None, env_steps: int | None, train_batch_size: int) -> Plan:
        """The plan of a run stopping after `rounds` or `env_steps` (either may be None): its rounds are `rounds`
        when given, else the rounds `env_steps` take at `train_batch_size` steps a round."""
        if rounds is None and env_steps is not None:
            rounds = -(-env_steps // train_batch_size)
        return cls(horizon_rounds=rounds, horizon_steps=env_steps)


def _horizon_into_plan(data: Any) -> Any:
    """An older spec's or request's `algo.stellaris.horizon_rounds` (where the horizon used to live) moved into its
    `plan`; a plan's own horizon wins."""
    if not isinstance(data, Mapping) or not isinstance(data.get("algo"), Mapping):
        return data
    stellaris = data["algo"].get("stellaris")
    if not isinstance(stellaris, Mapping) or "horizon_rounds" not in stellaris:
        return data
    stellaris = dict(stellaris)
    horizon = stellaris.pop("horizon_rounds")
    plan = data.get("plan")
    plan = dict(plan.model_dump() if isinstance(plan, Plan) else plan or {})
    if plan.get("horizon_rounds") is None and horizon is not None:
        plan["horizon_rounds"] = horizon
    return {**data, "algo": {**data["algo"], "stellaris": stellaris}, "plan": plan}


class JobSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    job: str
    env_id: str
    algo: AlgoConfig
    plan: Plan = Field(default_factory=Plan, description="the run's planned length")
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

    @model_validator(mode="before")
    @classmethod
    def _older_horizon(cls, data: Any) -> Any:
        return _horizon_into_plan(data)

    @model_validator(mode="after")
    def _replay_needs_learners(self) -> JobSpec:
        # Replay re-reads trajectory batches from the cache; gradients_at_actors ships none, only headers.
        replay = getattr(self.algo, "replay", "full_batch")
        if replay != "full_batch" and self.distribution == "gradients_at_actors":
            raise ValueError(f"replay {replay!r} needs distribution 'trajectories' (gradients_at_actors ships none)")
        return self


class JobRequest(BaseModel):
    """What a control plane asks for: the typed, validated algorithm config (`resolve_algo`) and the run's plan. The
    functions side resolves it into a JobSpec (`resolve`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job: str
    env_id: str
    algo: AlgoConfig
    plan: Plan = Field(default_factory=Plan, description="the run's planned length")
    num_envs: int = Field(default=1, gt=0)
    actors: int = Field(default=1, gt=0)
    policy_refresh_steps: int = Field(default=0, ge=0, description="see JobSpec")
    seed: int = 0
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    env_module: str | None = Field(default=None, description="imported before making envs (it registers env_id)")
    distribution: Distribution = distribution_field()
    parameter_trigger: ParameterTrigger = Field(default_factory=ParameterTrigger, description="see JobSpec")

    @model_validator(mode="before")
    @classmethod
    def _older_horizon(cls, data: Any) -> Any:
        return _horizon_into_plan(data)


def env_kind(env_id: str) -> EnvKind:
    return "atari" if env_id.startswith("ALE/") else "mujoco"


def resolve_algo(
    algo: AlgoName, preset_name: PresetName, env_id: str, overrides: Mapping[str, Any] | None = None
) -> algo_config.AlgoConfig:
    """Preset + overrides -> the typed, validated algorithm config (a ValidationError's locations are the overrides'
    own: `lr`, `stellaris.d`); the `stellaris` and `network` sections merge key by key over the preset's."""
    base = preset(preset_name, algo, env_kind(env_id))
    fields = base.model_dump()
    for key, value in (overrides or {}).items():
        if key in ("stellaris", "network") and isinstance(value, Mapping):
            fields[key] = {**fields[key], **value}
        else:
            fields[key] = value
    return type(base).model_validate(fields)


def resolve(request: JobRequest) -> JobSpec:
    """A request -> a validated JobSpec; each actor invocation collects its share of one round."""
    per_invocation = request.actors * request.num_envs
    actor_steps = max(1, -(-request.algo.train_batch_size // per_invocation))
    return JobSpec(
        job=request.job,
        env_id=request.env_id,
        algo=request.algo,
        plan=request.plan,
        num_envs=request.num_envs,
        actor_steps=actor_steps,
        policy_refresh_steps=request.policy_refresh_steps,
        seed=request.seed,
        env_kwargs=request.env_kwargs,
        env_module=request.env_module,
        distribution=request.distribution,
        parameter_trigger=request.parameter_trigger,
    )
