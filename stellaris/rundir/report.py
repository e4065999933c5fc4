"""A round's report rows: the aggregations of the job's applied log (read into `AppliedRow`s, then trimmed) as
gradients.csv rows, and the round's info.csv row (INFO_COLUMNS) from its stats, batches and aggregations."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cache import BatchMeta, JobCache
from contract import AppliedRow, LearnerResult
from gateway.models import Activation
from stellaris.rundir.outputs import stats


def take_applied(job: JobCache) -> list[AppliedRow]:
    """The aggregations logged since the last call (the applied log is then trimmed; gradients.csv keeps them)."""
    items = job.client.xrange(job.keys.applied, min="-", max="+")
    if items:
        job.client.xdel(job.keys.applied, *[raw_id for raw_id, _ in items])
    return [AppliedRow.from_fields(f) for _, f in items]


def gradient_rows(applied: Sequence[AppliedRow]) -> list[dict[str, Any]]:
    return [
        {
            "gradient_id": g.gradient_id,
            "task_id": g.task_id,
            "round": g.round,
            "base_version": g.base_version,
            "applied_version": a.version,
        }
        for a in applied
        for g in a.gradients
    ]


def episode_returns(batches: Sequence[tuple[str, BatchMeta]]) -> list[float]:
    return [float(r) for _, b in batches for r in b.info.get("episode_returns", [])]


def _steps_by(batches: Sequence[tuple[str, BatchMeta]], unix_s: float) -> float:
    """The env steps a round's batches had taken by wall-clock `unix_s`: each batch's steps spread evenly over its
    collection span (an actor steps at an even pace within a batch); a batch without a span counts whole."""
    total = 0.0
    for _, meta in batches:
        span = meta.info.get("collect_span")
        if span is None or float(span[1]) <= float(span[0]):
            total += meta.env_steps
        else:
            began, ended = float(span[0]), float(span[1])
            total += meta.env_steps * min(1.0, max(0.0, (unix_s - began) / (ended - began)))
    return total


def timeline_rows(
    batches: Sequence[tuple[str, BatchMeta]], *, steps_before: int, now_s: float, now_unix: float
) -> list[dict[str, Any]]:
    """timeline.csv's rows of a round's episodes, in finishing order: when each ended on the run's clock (`now_s` is
    the run's elapsed seconds at wall-clock `now_unix`; an actor's clock ahead or behind is clamped to [0, now_s]) and
    the run's env steps then: `steps_before` the round, plus what every batch of the round had taken by that moment
    (so env_steps rises with wall_clock_s across actors). A batch whose header carries no episode ends (an actor from
    before they did) stamps its episodes now, with the round's steps."""
    rows: list[dict[str, Any]] = []
    for _, meta in batches:
        ends = meta.info.get("episode_end_times")
        for i, reward in enumerate(meta.info.get("episode_returns", [])):
            end = now_unix if ends is None else min(now_unix, float(ends[i]))
            at = max(0.0, now_s - (now_unix - end))
            step = steps_before + round(_steps_by(batches, end))
            rows.append({"wall_clock_s": round(at, 3), "env_steps": step, "episodic_reward": float(reward)})
    return sorted(rows, key=lambda row: (row["wall_clock_s"], row["env_steps"]))


class RoundTotals(Protocol):
    """What the info row reads of a round's statistics (`RoundStats`, stellaris/round/stats.py), by shape: the run
    directory is written from the round's outputs and imports nothing of the round."""

    learner_results: list[LearnerResult]
    activations: list[Activation]
    learner_compute_s: float
    parameter_compute_s: float
    cache_s: float
    invocation_s: float
    learner_wait_s: float
    redis_round_trips: int
    learner_restarts: int
    parameter_restarts: int
    actor_restarts: int


@dataclass(frozen=True)
class RoundFacts:
    """What the info row reports beyond the round's stats: who ran, how long, what it cost so far."""

    round_k: int
    duration_s: float
    actor_time_s: float
    actors: int
    envs_per_actor: int
    env_steps: int
    learner_function: str
    parameter_function: str
    cost_learner: float
    cost_actor: float
    dead_lettered: int


def info_row(
    facts: RoundFacts, rs: RoundTotals, returns: Sequence[float], applied: Sequence[AppliedRow]
) -> dict[str, Any]:
    deltas = [float(g.staleness) for a in applied for g in a.gradients]
    thresholds = [a.threshold for a in applied if a.threshold is not None]
    r_max, r_mean, r_min, r_std = stats(list(returns))
    s_max, s_mean, s_min, s_std = stats(deltas)
    results = rs.learner_results
    n_grads = sum(r.gradients for r in results)
    n_trunc = sum(r.truncated_n for r in results)
    n_clip = sum(r.clipped_n for r in results)
    learner_time = sum(a.duration_s or 0.0 for a in rs.activations if a.function == facts.learner_function)
    parameter_time = sum(a.duration_s or 0.0 for a in rs.activations if a.function == facts.parameter_function)
    return {
        "round_id": facts.round_k,
        "duration": round(facts.duration_s, 4),
        "num_actors": facts.actors,
        "envs_per_actor": facts.envs_per_actor,
        "episodes": len(returns),
        "learner_time": round(learner_time, 4),
        "actor_time": round(facts.actor_time_s, 4),
        "train_reward_max": r_max,
        "train_reward_mean": r_mean,
        "train_reward_min": r_min,
        "train_reward_std": r_std,
        # deterministic evaluation episodes on a separate env (--eval-every): filled by the trainer in those rounds
        "eval_reward_max": math.nan,
        "eval_reward_mean": math.nan,
        "eval_reward_min": math.nan,
        "eval_reward_std": math.nan,
        "eval_episodes": 0,
        "staleness_max": s_max,
        "staleness_mean": s_mean,
        "staleness_min": s_min,
        "staleness_std": s_std,
        "learner_loss": sum(r.loss_sum for r in results) / n_grads if n_grads else math.nan,
        "cost": facts.cost_learner + facts.cost_actor,
        "staleness_bound": thresholds[-1] if thresholds else math.nan,
        "env_steps": facts.env_steps,
        "truncated_fraction": sum(r.truncated_sum for r in results) / n_trunc if n_trunc else math.nan,
        # share of samples outside PPO's clip range (against μ, or the proximal policy in the decoupled form)
        "clip_fraction": sum(r.clipped_sum for r in results) / n_clip if n_clip else math.nan,
        "aggregations": len(applied),
        "flushes": sum(1 for a in applied if a.decision == "flush"),
        "parameter_time": round(parameter_time, 4),
        "learner_compute_time": round(rs.learner_compute_s, 4),
        "parameter_compute_time": round(rs.parameter_compute_s, 4),
        "cache_time": round(rs.cache_s, 4),
        "invocation_overhead": round(rs.invocation_s, 4),
        "cost_learner": facts.cost_learner,
        "cost_actor": facts.cost_actor,
        "learner_wait_time": round(rs.learner_wait_s, 4),
        "dead_lettered": facts.dead_lettered,
        "gradients_applied": len(deltas),
        "redis_round_trips": rs.redis_round_trips,
        "learner_restarts": rs.learner_restarts,
        "parameter_restarts": rs.parameter_restarts,
        "actor_restarts": rs.actor_restarts,
    }
