"""What one modelled run needs (`PlanJob`), made from a `stellaris train` configuration as `stellaris train` makes its
job: the same `TrainConfig`, validated the same way, and the same job spec for N learners (`resolve` of its
`job_request`: the preset, the overrides, the knobs, the floor schedule's least β of N learners). No torch, no
functions: this runs before anything is computed, so a bad input fails at once (docs/scale-model.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from contract.jobspec import JobSpec, resolve
from contract.results import EVAL_MAX_EPISODE_STEPS
from stellaris.config import ConfigError, TrainConfig
from stellaris.plan.latency import LatencyModel, RoundTiming
from stellaris.round.triggers import Triggers


@dataclass(frozen=True)
class PlanJob:
    """One modelled run: the job spec an N-learner `stellaris train` would run, its actors and rounds, the latency
    model, the billing, the evaluation (`eval_episodes` 0: none; else after the last round, and every `eval_every`
    rounds when > 0), and fixed modelled seconds that replace the measured ones (`task_s` a task's compute, `collect_s`
    a batch's collection; None: measured), or calibration rounds whose timings each modelled round draws one of
    (`round_timings`: a task's compute and overhead, an apply, a collection, together)."""

    spec: JobSpec
    learners: int
    actors: int
    rounds: int
    latency: LatencyModel = field(default_factory=LatencyModel)
    billing: Literal["serverless", "serverful"] = "serverless"
    actor_kind: Literal["serverful", "serverless"] = "serverful"
    eval_episodes: int = 0
    eval_every: int = 0
    eval_max_episode_steps: int = EVAL_MAX_EPISODE_STEPS
    task_s: float | None = None
    collect_s: float | None = None
    apply_s: float | None = None
    round_timings: tuple[RoundTiming, ...] = ()

    @property
    def env_steps_per_round(self) -> int:
        return self.actors * self.spec.num_envs * self.spec.actor_steps

    def eval_due(self, round_k: int) -> bool:
        return self.eval_episodes > 0 and (
            round_k == self.rounds or (self.eval_every > 0 and round_k % self.eval_every == 0)
        )


def model_gaps(cfg: TrainConfig) -> list[str]:
    """What of `cfg` the model does not represent (docs/scale-model.md#limits): each a phrase naming the setting."""
    gaps = []
    if cfg.distribution != "trajectories":
        gaps.append(f"distribution {cfg.distribution!r} (the model runs the trajectories profile)")
    if cfg.actor_run_ahead != 0:
        gaps.append(f"actor_run_ahead {cfg.actor_run_ahead} (the model's actors collect between rounds: 0)")
    if cfg.elastic_actors or cfg.learner_schedule:
        gaps.append("elastic actors or a learner schedule (the model keeps the actors and N fixed)")
    if cfg.triggers != Triggers():
        gaps.append("triggers other than the default (the model fires on each round's batch and applies every look)")
    replay = getattr(cfg.algo_config(), "replay", "full_batch")
    if replay != "full_batch":
        gaps.append(f"replay {replay!r} (the model trains each batch once)")
    return gaps


def rounds_of(cfg: TrainConfig, env_steps_per_round: int) -> int:
    """The rounds a run of `cfg` lasts: `rounds`, or the rounds `total_steps` take at this many env steps a round
    (the first to be reached when both are given)."""
    bounds = [cfg.rounds] if cfg.rounds is not None else []
    if cfg.total_steps is not None:
        bounds.append(math.ceil(cfg.total_steps / env_steps_per_round))
    if not bounds:
        raise ConfigError("give --rounds or --total-steps: the model runs a planned number of rounds")
    return min(bounds)


def plan_job(
    cfg: TrainConfig,
    *,
    latency: LatencyModel,
    rounds: int | None = None,
    eval_episodes: int = 0,
    eval_every: int = 0,
    task_s: float | None = None,
    collect_s: float | None = None,
    apply_s: float | None = None,
    round_timings: tuple[RoundTiming, ...] = (),
) -> PlanJob:
    """The modelled run of `cfg` on its `learners` learners (N: the job spec is N's, e.g. the floor schedule's least
    β), for `rounds` rounds when given (the first rounds of the planned run: its plan, which β's and the learning
    rate's schedules read, stays `cfg`'s), else as many as `cfg` plans. Raises ConfigError naming what the model cannot
    represent."""
    gaps = model_gaps(cfg)
    if gaps:
        raise ConfigError(f"the model does not represent {'; '.join(gaps)}")
    spec = resolve(cfg.job_request(f"plan-{cfg.learners}"))
    steps = cfg.actors * spec.num_envs * spec.actor_steps
    return PlanJob(
        spec=spec,
        learners=cfg.learners,
        actors=cfg.actors,
        rounds=rounds_of(cfg, steps) if rounds is None else rounds,
        latency=latency,
        billing=cfg.billing,
        actor_kind=cfg.actor_kind,
        eval_episodes=eval_episodes,
        eval_every=eval_every,
        eval_max_episode_steps=cfg.eval_max_episode_steps,
        task_s=task_s,
        collect_s=collect_s,
        apply_s=apply_s,
        round_timings=round_timings,
    )
