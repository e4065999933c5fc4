"""Stepping a vector of envs with a policy: the actor's computation, no I/O."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from functions.model.networks import FlattenObs
from functions.model.policies import ActorCritic


@dataclass
class EpisodeTracker:
    """Running return and length per env; finished episodes are collected until taken."""

    returns: np.ndarray
    lengths: np.ndarray
    finished_returns: list[float] = field(default_factory=list)
    finished_lengths: list[int] = field(default_factory=list)
    finished_steps: list[int] = field(default_factory=list)  # 1-based step of the block in which each one ended

    @classmethod
    def for_envs(cls, num_envs: int) -> EpisodeTracker:
        return cls(np.zeros(num_envs), np.zeros(num_envs, dtype=np.int64))

    def step(self, rewards: np.ndarray, done: np.ndarray) -> None:
        """Fold in one step (``[N]``) or consecutive steps (``[T, N]``, time-major) of rewards and episode ends.

        Episodes finish in time order and returns are summed left to right, exactly as step-by-step calls would.
        """
        n = len(self.returns)
        rewards = np.asarray(rewards, np.float64).reshape(-1, n)
        done = np.asarray(done, bool).reshape(-1, n)
        start = np.zeros(n, np.int64)  # each env's first step of its current episode within these steps
        for t, i in zip(*np.nonzero(done), strict=True):
            self.finished_returns.append(_running_total(self.returns[i], rewards[start[i] : t + 1, i]))
            self.finished_lengths.append(int(self.lengths[i] + t + 1 - start[i]))
            self.finished_steps.append(int(t) + 1)
            self.returns[i], self.lengths[i], start[i] = 0.0, 0, t + 1
        unfinished = np.where(np.arange(len(rewards))[:, None] >= start, rewards, 0.0)
        self.returns[:] = np.cumsum(np.vstack([self.returns, unfinished]), axis=0)[-1]
        self.lengths += len(rewards) - start

    def take(self) -> tuple[list[float], list[int]]:
        returns, lengths, _ = self.take_with_steps()
        return returns, lengths

    def take_with_steps(self) -> tuple[list[float], list[int], list[int]]:
        """(returns, lengths, steps): each finished episode's step in the block it ended in, with its return."""
        out = (self.finished_returns, self.finished_lengths, self.finished_steps)
        self.finished_returns, self.finished_lengths, self.finished_steps = [], [], []
        return out


def _running_total(start: float, values: np.ndarray) -> float:
    """`start` + values[0] + values[1] + …, added left to right (a running total, not a pairwise sum)."""
    return float(np.cumsum(np.concatenate(([start], values)))[-1])


@dataclass
class RewardScaler:
    """Rewards divided by the running std of the discounted return (Stable-Baselines3's VecNormalize, CleanRL's
    NormalizeReward), clipped; per actor, so it never crosses the wire. Episode returns are logged unscaled."""

    gamma: float
    returns: np.ndarray
    mean: float = 0.0
    var: float = 1.0
    count: float = 1e-4
    clip: float = 10.0

    @classmethod
    def for_envs(cls, num_envs: int, gamma: float) -> RewardScaler:
        return cls(gamma, np.zeros(num_envs))

    def moments(self) -> list[float]:
        """[mean, var, count] of the discounted return: what a resumed actor needs to scale as this one did (the
        returns in progress restart at 0 with the envs)."""
        return [self.mean, self.var, self.count]

    def restore(self, moments: list[float]) -> None:
        mean, var, count = (float(m) for m in moments)
        if not (math.isfinite(mean) and math.isfinite(var) and var >= 0 and count > 0):
            raise ValueError(f"reward scaler moments must be finite with var >= 0 and count > 0, got {moments!r}")
        self.mean, self.var, self.count = mean, var, count

    def __call__(self, rewards: np.ndarray, done: np.ndarray) -> np.ndarray:
        """Scale one step (``[N]``) or consecutive steps (``[T, N]``, time-major), each step by the std as it
        stood after that step's update, as step-by-step calls would."""
        steps_rewards = np.asarray(rewards, np.float64).reshape(-1, len(self.returns))
        steps_done = np.asarray(done, bool).reshape(steps_rewards.shape)
        discounted = np.empty_like(steps_rewards)
        returns = self.returns
        for t, ended in enumerate(steps_done.any(axis=1).tolist()):
            returns = returns * self.gamma + steps_rewards[t]
            discounted[t] = returns
            if ended:
                returns = np.where(steps_done[t], 0.0, returns)
        self.returns = returns
        n = discounted.shape[1]
        std = np.empty(len(discounted))
        for t, (batch_mean, batch_var) in enumerate(
            zip(discounted.mean(axis=1).tolist(), discounted.var(axis=1).tolist(), strict=True)
        ):
            delta, total = batch_mean - self.mean, self.count + n
            self.var = (self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total
            self.mean += delta * n / total
            self.count = total
            std[t] = math.sqrt(self.var + 1e-8)
        scaled = np.clip(steps_rewards / std[:, None], -self.clip, self.clip)
        return scaled.reshape(np.shape(rewards))


@dataclass
class ClippedRewards:
    """Atari's reward clipping to {-1, 0, 1} for training (DQN, IMPALA, CleanRL), optionally followed by another
    transform; the episode tracker still sees the game's own rewards."""

    then: RewardScaler | None = None

    def __call__(self, rewards: np.ndarray, done: np.ndarray) -> np.ndarray:
        clipped = np.sign(rewards)
        return clipped if self.then is None else self.then(clipped, done)


def _env_action(action: torch.Tensor | np.ndarray, space: gym.Space) -> np.ndarray:
    a = action.numpy() if isinstance(action, torch.Tensor) else action
    if isinstance(space, gym.spaces.Box):
        return np.clip(a, space.low, space.high)  # the policy's Gaussian is unsquashed; log-probs use `a`
    return a


Stepper = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], dict[str, Any]]


def _step_each(
    envs: gym.vector.SyncVectorEnv,
    actions: np.ndarray,
    obs: np.ndarray,
    rewards: np.ndarray,
    terms: np.ndarray,
    truncs: np.ndarray,
) -> dict[str, Any]:
    """`envs.step(actions)` of a same-step-autoreset SyncVectorEnv, written into the given rows (`[N, ...]` each)
    without batching every env's info dict: the same sub-env calls in the same order, the same observations, rewards
    and episode ends, and `final_obs` the only info (as SyncVectorEnv reports it). The vector env's own buffers are
    left stale; in same-step mode its `step` and `reset` never read them."""
    info: dict[str, Any] = {}
    for i, env in enumerate(envs.envs):
        obs[i], rewards[i], terms[i], truncs[i], _ = env.step(actions[i])
        if terms[i] or truncs[i]:
            info.setdefault("final_obs", np.full(len(obs), None, dtype=object))[i] = obs[i].copy()
            obs[i], _ = env.reset()
    return info


def _step_into(envs: gym.vector.VectorEnv, actions: np.ndarray, *rows: np.ndarray) -> dict[str, Any]:
    """The vector env's own `step`, its observations, rewards, terminations and truncations copied into `rows`."""
    *arrays, info = envs.step(actions)
    for row, array in zip(rows, arrays, strict=True):
        row[...] = array
    return dict(info)


def _stepper(envs: gym.vector.VectorEnv) -> Stepper:
    """`_step_each` where it is exact (a plain SyncVectorEnv, same-step autoreset, Box/Discrete observations),
    else the vector env's own `step`."""
    if (
        type(envs) is gym.vector.SyncVectorEnv
        and envs.autoreset_mode == gym.vector.AutoresetMode.SAME_STEP
        and isinstance(envs.single_observation_space, gym.spaces.Box | gym.spaces.Discrete)
    ):
        return partial(_step_each, envs)
    return partial(_step_into, envs)


def _stored_dtype(policy: ActorCritic, dtype: np.dtype) -> np.dtype:
    """float64 observations (MuJoCo's) are kept as float32 where the policy's encoder casts them to float32 first
    (`FlattenObs`): the sampler, the learners and the normaliser's moments all read them through it, so they see
    the same values, and a batch has 37 % fewer bytes to write, push and read (Hopper). Others stay as they come."""
    encoder = policy.encoder
    if isinstance(encoder, FlattenObs) and encoder.dtype == torch.float32 and dtype == np.float64:
        return np.dtype(np.float32)
    return dtype


def collect(
    policy: ActorCritic,
    envs: gym.vector.VectorEnv,
    obs: np.ndarray,
    tracker: EpisodeTracker,
    steps: int,
    reward_scaler: RewardScaler | ClippedRewards | None = None,
    *,
    refresh: Callable[[], bool] | None = None,
    refresh_every: int = 0,
    generator: torch.Generator | None = None,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Step `envs` for `steps` steps from `obs`; return time-major arrays [T, N, ...] and the next observation.

    With `refresh`, every `refresh_every` steps it is called to bring `policy` up to date (True when it changed
    the weights), so that a rollout collected while learners train follows their newest policy rather than the
    one it started with; every step's behaviour log-prob is that of the policy that took it. Actions are drawn
    from `generator` (an actor's own, seeded: the same actions whatever else ran in the process).

    One batched policy call per step for all N envs. Besides the trajectory it records what the learners need
    to bootstrap: V of the true final observation at truncated steps (`truncation_values`), and the observation
    and value after the last step. Episode tracking and reward scaling read only rewards and episode ends, so
    they run once over the whole [T, N] block after the loop.
    """
    if steps < 1:
        raise ValueError(f"a rollout needs at least 1 step, got steps={steps}")
    n = envs.num_envs
    # Each step's observation; the envs write the next one in place, and the last is the next rollout's first.
    obs_buf = np.empty((steps + 1, *obs.shape), dtype=_stored_dtype(policy, obs.dtype))
    obs_buf[0] = obs
    env_rewards = np.empty((steps, n), np.float64)
    terms = np.empty((steps, n), bool)
    truncs = np.empty((steps, n), bool)
    trunc_values = np.zeros((steps, n), np.float32)
    # Each step's outputs are copied into these and dropped: 3 tensors a step kept alive until the end cost about 5 %
    # of a Hopper actor's steps/s (fresh memory every step instead of the blocks just freed).
    actions: np.ndarray | None = None  # shaped and typed by the first step's actions
    log_probs = np.empty((steps, n), np.float32)
    values = np.empty((steps, n), np.float32)
    space = envs.single_action_space
    sample = policy.sampler(generator)  # a snapshot: taken again whenever `refresh` changes the policy
    step = _stepper(envs)
    for t in range(steps):
        if refresh is not None and refresh_every > 0 and t and t % refresh_every == 0 and refresh():
            sample = policy.sampler(generator)
        action_t, log_prob, value = sample(torch.as_tensor(obs_buf[t]))
        action = action_t.numpy()
        if actions is None:
            actions = np.empty((steps, *action.shape), action.dtype)
        actions[t], log_probs[t], values[t] = action, log_prob.numpy(), value.numpy()
        info = step(_env_action(action, space), obs_buf[t + 1], env_rewards[t], terms[t], truncs[t])
        if "final_obs" in info:  # some env's episode ended this step (same-step autoreset)
            cut = np.flatnonzero(np.logical_and(truncs[t], np.logical_not(terms[t])))
            if cut.size:
                final = np.stack([info["final_obs"][i] for i in cut]).astype(obs_buf.dtype)
                trunc_values[t, cut] = sample.value(torch.as_tensor(final)).numpy()
    assert actions is not None  # steps >= 1
    done = np.logical_or(terms, truncs)
    tracker.step(env_rewards, done)
    rewards = env_rewards if reward_scaler is None else reward_scaler(env_rewards, done)
    obs = obs_buf[steps].copy()
    last_values = sample.value(torch.as_tensor(obs)).numpy().astype(np.float32)
    arrays = {
        "observations": obs_buf[:steps],
        "actions": actions,
        "rewards": rewards.astype(np.float32),
        "terminations": terms,
        "truncations": truncs,
        "behaviour_log_probs": log_probs,
        "values": values,
        "truncation_values": trunc_values,
        "last_observations": obs,
        "last_values": last_values,
    }
    return arrays, obs
