"""A tiny discrete env for the custom-environment tests: the observation is one-hot of a target in [0, size), and
the reward is 1 for the action equal to the target (learnable); `size` sets the observation size and action count;
`crash_on_step` makes every step raise (an env that breaks only once an actor steps it)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class PickTarget(gym.Env[np.ndarray, int]):
    def __init__(self, size: int = 2, episode_steps: int = 8, crash_on_step: bool = False) -> None:
        if size < 2:
            raise ValueError(f"size must be at least 2, got {size}")
        self.size, self.episode_steps, self.crash_on_step = size, episode_steps, crash_on_step
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(size,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(size)
        self._target, self._steps = 0, 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.size, dtype=np.float32)
        obs[self._target] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._target, self._steps = int(self.np_random.integers(self.size)), 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self.crash_on_step:
            raise RuntimeError("PickTarget was made with crash_on_step")
        reward = 1.0 if int(action) == self._target else 0.0
        self._target, self._steps = int(self.np_random.integers(self.size)), self._steps + 1
        return self._obs(), reward, False, self._steps >= self.episode_steps, {}


gym.register(id="PickTarget-v0", entry_point=PickTarget)
