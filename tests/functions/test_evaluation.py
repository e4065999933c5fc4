"""Deterministic evaluation episodes (functions/actor/evaluation.py) against hand-checked returns, and the actor
function's
`evaluate` event on a real Redis."""

from __future__ import annotations

import uuid
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from cache import Cache
from contract.results import EvalResult, ResultError
from functions.actor.envs import make_vector_env
from functions.actor.evaluation import run_episodes
from functions.handlers import actor
from functions.model.policies import ActorCritic, build_policy
from functions.model.serialize import load_policy_bytes
from functions.runtime.context import Context
from tests.functions.driver import Driver
from tests.functions.test_pipeline import small_spec

HERE = "tests.functions.test_evaluation"


class Corridor(gym.Env):
    """Episode i (counted from the seed a seeded reset sets) lasts 2 + i % 3 steps; action 1 earns +1 a step,
    action 0 −1. The observation is always [1.0]."""

    observation_space = gym.spaces.Box(-10.0, 10.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self.episode, self.t = 0, 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.episode = seed if seed is not None else self.episode + 1
        self.t = 0
        return np.ones(1, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return np.ones(1, np.float32), 1.0 if int(action) == 1 else -1.0, self.t >= 2 + self.episode % 3, False, {}


class Slope(gym.Env):
    """Three steps an episode; the reward is the action taken (the actors clip Box actions to [−1, 1])."""

    observation_space = gym.spaces.Box(-10.0, 10.0, (1,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self) -> None:
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.ones(1, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return np.ones(1, np.float32), float(np.asarray(action)[0]), self.t >= 3, False, {}


def prefers_action_one() -> ActorCritic:
    """Logits [0, 1] whatever the observation: argmax 1, though a sample is 0 about one time in four."""
    policy = build_policy(Corridor.observation_space, Corridor.action_space, hidden=())
    with torch.no_grad():
        policy.actor[-1].weight.zero_()
        policy.actor[-1].bias.copy_(torch.tensor([0.0, 1.0]))
    return policy


def test_deterministic_episodes_return_what_the_env_pays_for_the_argmax() -> None:
    env = make_vector_env(f"{HERE}:Corridor", 1, seed=0)
    done = run_episodes(prefers_action_one(), env, episodes=4, seed=0)
    assert done.returns == [2.0, 3.0, 4.0, 2.0] and done.lengths == [2, 3, 4, 2] and done.cut == 0
    again = run_episodes(prefers_action_one(), env, episodes=4, seed=1)  # the seed picks where the episodes start
    assert again.returns == [3.0, 4.0, 2.0, 3.0]


def test_an_episode_is_ended_at_max_episode_steps_and_the_env_reset() -> None:
    env = make_vector_env(f"{HERE}:Corridor", 1, seed=2)
    done = run_episodes(prefers_action_one(), env, episodes=3, seed=2, max_episode_steps=3)
    # episode 2 would last 4 steps: cut at 3; the reset starts episode 3 (2 steps), then episode 4 (3 steps)
    assert done.returns == [3.0, 2.0, 3.0] and done.lengths == [3, 2, 3] and done.cut == 1


def test_gaussian_actions_are_the_mean_of_normalised_observations_clipped_as_the_actors_clip() -> None:
    policy = build_policy(Slope.observation_space, Slope.action_space, hidden=(), normalize_obs=True)
    assert policy.obs_normalizer is not None
    with torch.no_grad():
        policy.actor[-1].weight.fill_(5.0)
        policy.actor[-1].bias.zero_()
        policy.log_std.fill_(2.0)  # a sample would scatter widely
        policy.obs_normalizer.mean.fill_(2.0)  # obs 1.0 normalises to −1: the mean action is −5, clipped to −1
    done = run_episodes(policy, make_vector_env(f"{HERE}:Slope", 1, seed=0), episodes=2, seed=0)
    assert done.returns == [-3.0, -3.0] and done.lengths == [3, 3]


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="vector of 2"):
        run_episodes(prefers_action_one(), make_vector_env(f"{HERE}:Corridor", 2, seed=0), episodes=1, seed=0)
    env = make_vector_env(f"{HERE}:Corridor", 1, seed=0)
    with pytest.raises(ValueError, match="episodes must be at least 1"):
        run_episodes(prefers_action_one(), env, episodes=0, seed=0)
    with pytest.raises(ValueError, match="max_episode_steps"):
        run_episodes(prefers_action_one(), env, episodes=1, seed=0, max_episode_steps=0)


def test_the_actor_function_evaluates_a_policy_version_of_the_job(cache_conn: Cache, job_id: str) -> None:
    driver = Driver(cache_conn, small_spec(job_id))
    try:

        def call(request: dict[str, Any]) -> dict[str, Any]:
            return actor.handle({"job": job_id, "evaluate": request}, Context(uuid.uuid4().hex[:12], driver.instance))

        result = EvalResult.from_dict(call({"episodes": 3, "seed": 1_000_003, "version": 0}))
        # the same episodes as the policy of version 0 run here on an env of the same seed
        version, blob = driver.job.policies.latest()
        policy = build_policy(*spaces(), hidden=(32, 32))
        load_policy_bytes(policy, blob)
        expected = run_episodes(policy, make_vector_env("CartPole-v1", 1, seed=1_000_003), episodes=3, seed=1_000_003)
        assert (result.version, result.episode_returns, result.episode_lengths) == (
            version,
            expected.returns,
            expected.lengths,
        )
        assert result.episode_returns == [float(n) for n in result.episode_lengths]  # CartPole pays 1 a step
        assert EvalResult.from_dict(call({"episodes": 3, "seed": 1_000_003})) == result  # no version: the newest
        assert driver.job.client.xlen(driver.job.keys.traj) == 0  # an evaluation pushes no batch
        with pytest.raises(LookupError, match="policy version 7"):
            call({"episodes": 1, "seed": 0, "version": 7})
        with pytest.raises(ResultError, match="episodes"):
            call({"episodes": 0, "seed": 0})
    finally:
        driver.job.delete()


def spaces() -> tuple[gym.Space, gym.Space]:
    env = gym.make("CartPole-v1")
    return env.observation_space, env.action_space
