"""Actor function: pull the newest policy if it changed, step the envs, push one trajectory batch tagged with μ. An
`evaluate` event instead runs deterministic evaluation episodes of one policy version on an env of its own."""

from __future__ import annotations

import json
import time
from typing import Any

import torch

from cache import TrajectoryBatch, VersionNotFound
from contract import ActorResult
from contract.jobspec import env_kind
from contract.results import EvalRequest, EvalResult
from functions.actor.envs import make_vector_env
from functions.actor.evaluation import run_episodes
from functions.actor.fused import ship_gradients
from functions.actor.rollout import ClippedRewards, EpisodeTracker, RewardScaler, collect
from functions.actor.state import ActorState
from functions.handlers import job_id_of, quiet_on_job_loss
from functions.model.serialize import load_policy_bytes
from functions.model.warm import new_policy, spec_of
from functions.runtime.context import Context


def evaluate(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """The `evaluate` event (EvalRequest): deterministic episodes of one policy version on a fresh env of its own,
    seeded by the request (not an actor's seed stream); no trajectory is pushed and no actor state is touched."""
    job = ctx.job(job_id_of(event))
    spec = spec_of(ctx, job)
    request = EvalRequest.from_dict(event["evaluate"])
    try:
        if request.version is None:
            version, blob = job.policies.latest()
        else:
            version, blob = request.version, job.policies.get(request.version)
    except VersionNotFound as exc:
        raise LookupError(f"nothing to evaluate: {exc}") from exc
    policy = new_policy(ctx, spec)
    load_policy_bytes(policy, blob)
    env = make_vector_env(spec.env_id, 1, seed=request.seed, env_kwargs=spec.env_kwargs, env_module=spec.env_module)
    try:
        done = run_episodes(
            policy, env, episodes=request.episodes, seed=request.seed, max_episode_steps=request.max_episode_steps
        )
    finally:
        env.close()
    return EvalResult(version, done.returns, done.lengths, done.cut).to_dict()


@quiet_on_job_loss
def handle(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
    if "evaluate" in event:  # the control plane's periodic evaluation (SB3's EvalCallback), not a rollout
        return evaluate(event, ctx)
    job = ctx.job(job_id_of(event))
    actor_id = str(event.get("actor_id", "actor-0"))
    spec = spec_of(ctx, job)
    key = (job.keys.job, actor_id)
    state = ctx.memo.actors.get(key)
    if state is None:
        seed = spec.seed + 7919 * int(event.get("actor_index", 0))
        envs = make_vector_env(
            spec.env_id, spec.num_envs, seed=seed, env_kwargs=spec.env_kwargs, env_module=spec.env_module
        )
        obs, _ = envs.reset(seed=seed)
        scaler: RewardScaler | ClippedRewards | None = (
            RewardScaler.for_envs(spec.num_envs, spec.algo.gamma) if spec.algo.normalize_reward else None
        )
        if isinstance(scaler, RewardScaler):
            saved = job.client.hget(job.keys.actor_scalers, actor_id)  # a resumed job's, from its checkpoint
            if saved is not None:
                scaler.restore(json.loads(saved))
        if env_kind(spec.env_id) == "atari":
            scaler = ClippedRewards(then=scaler)
        rng = torch.Generator().manual_seed(seed)
        state = ActorState(envs, obs, EpisodeTracker.for_envs(spec.num_envs), new_policy(ctx, spec), scaler, rng)
        ctx.memo.actors[key] = state

    def refresh() -> bool:
        """Load the newest policy if it is not the one held (one round trip either way)."""
        newer = job.policies.newer_than(state.version if state.version >= 0 else None)
        if newer is None:
            return False
        state.version, blob = newer
        load_policy_bytes(state.policy, blob)
        return True

    try:
        refresh()
    except VersionNotFound as exc:
        raise LookupError(f"job {job.keys.job!r} has no policy yet") from exc
    first_version = state.version
    steps = int(event.get("steps", spec.actor_steps))
    began = time.time()  # wall clock: the control plane places each episode's end on the run's clock
    arrays, state.obs = collect(
        state.policy,
        state.envs,
        state.obs,
        state.tracker,
        steps,
        state.reward_scaler,
        refresh=refresh,
        refresh_every=spec.policy_refresh_steps,
        generator=state.rng,
    )
    ended, (returns, lengths, end_steps) = time.time(), state.tracker.take_with_steps()
    # An episode's end, interpolated by its step between the batch's start and end (steps take about equal time).
    end_times = [began + (ended - began) * t / steps for t in end_steps]
    scaler = state.reward_scaler.then if isinstance(state.reward_scaler, ClippedRewards) else state.reward_scaler
    batch = TrajectoryBatch(
        actor_id=actor_id,
        behaviour_version=first_version,  # the oldest policy in the batch (each step's log-prob is its own)
        env_steps=steps * spec.num_envs,
        arrays=arrays,
        # Round trips since the last batch (this one's push included below, as one): counted end to end per round.
        info={
            "episode_returns": returns,
            "episode_lengths": lengths,
            "episode_end_times": end_times,  # unix seconds
            "collect_span": [began, ended],  # the control plane counts the run's env steps at each episode's end
            "redis_round_trips": ctx.instance.cache.round_trips - state.round_trips + 1,
            "batch_seq": state.batches_pushed,
            # checkpointed by the control plane, so that a resumed actor scales rewards as this one did
            **({"reward_scaler": scaler.moments()} if scaler is not None else {}),
        },
    )
    if spec.distribution == "gradients_at_actors":  # A3C-style fusion: the batch's gradients go, its arrays stay
        batch_id = ship_gradients(ctx, job, spec, batch).header_id
    else:
        batch_id = job.trajectories.put(batch)
    state.round_trips = ctx.instance.cache.round_trips
    state.batches_pushed += 1
    return ActorResult(batch_id, first_version, batch.env_steps, returns).to_dict()
