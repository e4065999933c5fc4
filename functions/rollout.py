"""Stepping a vector of envs with a policy: the actor's computation, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch

from functions.policies import ActorCritic


@dataclass
class EpisodeTracker:
    """Running return and length per env; finished episodes are collected until taken."""

    returns: np.ndarray
    lengths: np.ndarray
    finished_returns: list[float] = field(default_factory=list)
    finished_lengths: list[int] = field(default_factory=list)

    @classmethod
    def for_envs(cls, num_envs: int) -> EpisodeTracker:
        return cls(np.zeros(num_envs), np.zeros(num_envs, dtype=np.int64))

    def step(self, rewards: np.ndarray, done: np.ndarray) -> None:
        self.returns += rewards
        self.lengths += 1
        for i in np.flatnonzero(done):
            self.finished_returns.append(float(self.returns[i]))
            self.finished_lengths.append(int(self.lengths[i]))
            self.returns[i] = 0.0
            self.lengths[i] = 0

    def take(self) -> tuple[list[float], list[int]]:
        out = (self.finished_returns, self.finished_lengths)
        self.finished_returns, self.finished_lengths = [], []
        return out


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

    def __call__(self, rewards: np.ndarray, done: np.ndarray) -> np.ndarray:
        self.returns = self.returns * self.gamma + rewards
        n, batch_mean, batch_var = len(self.returns), float(self.returns.mean()), float(self.returns.var())
        delta, total = batch_mean - self.mean, self.count + n
        self.var = (self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total
        self.mean += delta * n / total
        self.count = total
        self.returns[done] = 0.0
        return np.clip(rewards / np.sqrt(self.var + 1e-8), -self.clip, self.clip)


@dataclass
class ClippedRewards:
    """Atari's reward clipping to {-1, 0, 1} for training (DQN, IMPALA, CleanRL), optionally followed by another
    transform; the episode tracker still sees the game's own rewards."""

    then: RewardScaler | None = None

    def __call__(self, rewards: np.ndarray, done: np.ndarray) -> np.ndarray:
        clipped = np.sign(rewards)
        return clipped if self.then is None else self.then(clipped, done)


def _env_action(action: torch.Tensor, space: gym.Space) -> np.ndarray:
    a = action.numpy()
    if isinstance(space, gym.spaces.Box):
        return np.clip(a, space.low, space.high)  # the policy's Gaussian is unsquashed; log-probs use `a`
    return a


def collect(
    policy: ActorCritic,
    envs: gym.vector.VectorEnv,
    obs: np.ndarray,
    tracker: EpisodeTracker,
    steps: int,
    reward_scaler: RewardScaler | ClippedRewards | None = None,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Step `envs` for `steps` steps from `obs`; return time-major arrays [T, N, ...] and the next observation.

    Besides the trajectory it records what the learners need to bootstrap: V of the true final observation at
    truncated steps (`truncation_values`), and the observation and value after the last step.
    """
    n = envs.num_envs
    obs_buf = np.empty((steps, *obs.shape), dtype=obs.dtype)
    act_buf: np.ndarray | None = None
    logp = np.empty((steps, n), np.float32)
    values = np.empty((steps, n), np.float32)
    rewards = np.empty((steps, n), np.float32)
    terms = np.empty((steps, n), bool)
    truncs = np.empty((steps, n), bool)
    trunc_values = np.zeros((steps, n), np.float32)
    space = envs.single_action_space
    for t in range(steps):
        obs_buf[t] = obs
        action, lp, value = policy.act(torch.as_tensor(obs))
        if act_buf is None:
            act_buf = np.empty((steps, *action.shape), dtype=action.numpy().dtype)
        act_buf[t] = action.numpy()
        logp[t], values[t] = lp.numpy(), value.numpy()
        obs, reward, term, trunc, info = envs.step(_env_action(action, space))
        done = np.logical_or(term, trunc)
        tracker.step(np.asarray(reward, np.float64), done)
        if reward_scaler is not None:
            reward = reward_scaler(np.asarray(reward, np.float64), done)
        rewards[t], terms[t], truncs[t] = reward, term, trunc
        cut = np.flatnonzero(np.logical_and(trunc, np.logical_not(term)))
        if cut.size and "final_obs" in info:
            final = np.stack([info["final_obs"][i] for i in cut]).astype(obs.dtype)
            with torch.no_grad():
                trunc_values[t, cut] = policy.value(torch.as_tensor(final)).numpy()
    with torch.no_grad():
        last_values = policy.value(torch.as_tensor(obs)).numpy().astype(np.float32)
    assert act_buf is not None
    arrays = {
        "observations": obs_buf,
        "actions": act_buf,
        "rewards": rewards,
        "terminations": terms,
        "truncations": truncs,
        "behaviour_log_probs": logp,
        "values": values,
        "truncation_values": trunc_values,
        "last_observations": np.asarray(obs),
        "last_values": last_values,
    }
    return arrays, np.asarray(obs)
