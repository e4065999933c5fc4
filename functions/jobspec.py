"""A training job's specification: what every handler of the job reads from the cache (never from its event)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from cache import JobCache
from functions.algos.config import IMPACTConfig, PPOConfig

AlgoConfig = Annotated[PPOConfig | IMPACTConfig, Field(discriminator="algo")]


class JobSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    job: str
    env_id: str
    algo: AlgoConfig
    num_envs: int = Field(default=4, gt=0, description="envs stepped by one actor")
    actor_steps: int = Field(default=128, gt=0, description="steps per env in one actor invocation")
    seed: int = 0
    env_kwargs: dict[str, Any] = Field(default_factory=dict)


def save_spec(job: JobCache, spec: JobSpec) -> None:
    job.set_spec(spec.model_dump_json())


def load_spec(job: JobCache) -> JobSpec:
    raw = job.spec()
    if raw is None:
        raise LookupError(f"job {job.keys.job!r} has no spec in the cache; create the job first")
    return JobSpec.model_validate_json(raw)
