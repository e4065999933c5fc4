"""Deterministic evaluation episodes, as Stable-Baselines3's `evaluate_policy` runs them for its EvalCallback: the
policy's mode (argmax of a categorical head, mean of a Gaussian one) on one env of its own, whole episodes only.

Pure: a policy and an env in, returns out; no cache, no files. The observations go through the policy's own
normaliser (its buffers, as the actors' sampler reads them) and Box actions are clipped exactly as the actors clip
them, so an evaluation scores what the actors would do without exploration noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import torch

from contract.results import EVAL_MAX_EPISODE_STEPS, EVAL_MAX_EPISODE_STEPS_LIMIT
from functions.actor.rollout import _env_action
from functions.model.policies import ActorCritic


@dataclass(frozen=True)
class Episodes:
    """Each finished episode's undiscounted return and length, in order; `cut`: how many of them were ended at
    `max_episode_steps` rather than by the env."""

    returns: list[float]
    lengths: list[int]
    cut: int = 0


def run_episodes(
    policy: ActorCritic,
    env: gym.vector.VectorEnv,
    *,
    episodes: int,
    seed: int,
    max_episode_steps: int = EVAL_MAX_EPISODE_STEPS,
) -> Episodes:
    """`episodes` whole episodes of `policy`'s deterministic actions on `env` (one sub-env), reset with `seed` first
    and without a seed after each episode (the env's own RNG goes on): the same policy, env and seed give the same
    returns. An episode still running after `max_episode_steps` steps is ended there (counted in `cut`) and the env
    reset."""
    if env.num_envs != 1:
        raise ValueError(f"evaluation steps one env, got a vector of {env.num_envs}")
    if episodes < 1:
        raise ValueError(f"episodes must be at least 1, got {episodes}")
    if not 1 <= max_episode_steps <= EVAL_MAX_EPISODE_STEPS_LIMIT:
        raise ValueError(f"max_episode_steps must be in [1, {EVAL_MAX_EPISODE_STEPS_LIMIT}], got {max_episode_steps}")
    space = env.single_action_space
    # A same-step autoreset env is already in its next episode when one ends; any other (ALE's vector env resets on
    # the step after) is reset here, so that no step of an evaluation is a reset step.
    resets_itself = getattr(env, "autoreset_mode", None) == gym.vector.AutoresetMode.SAME_STEP
    obs, _ = env.reset(seed=seed)
    returns: list[float] = []
    lengths: list[int] = []
    cut, total, length = 0, 0.0, 0
    while len(returns) < episodes:
        action, _, _ = policy.act(torch.as_tensor(obs), deterministic=True)
        obs, reward, term, trunc, _ = env.step(_env_action(action, space))
        total += float(reward[0])
        length += 1
        ended = bool(term[0] or trunc[0])
        if ended or length >= max_episode_steps:
            returns.append(total)
            lengths.append(length)
            cut += not ended
            if not (ended and resets_itself):
                obs, _ = env.reset()
            total, length = 0.0, 0
    return Episodes(returns, lengths, cut)
