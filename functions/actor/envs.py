"""Environment construction: any Gymnasium id with Box or Discrete actions; ALE ids through ale-py; ids a user's
module registers (`env_module`); `module:EnvClass` entry points."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from host.env_ids import gym_id


def make_vector_env(
    env_id: str,
    num_envs: int,
    *,
    seed: int,
    env_kwargs: dict[str, Any] | None = None,
    env_module: str | None = None,
) -> gym.vector.VectorEnv:
    """`num_envs` copies stepped in this process; finished episodes reset in the same step (final obs in info)."""
    kwargs = dict(env_kwargs or {})
    env_id = gym_id(env_id, env_module)
    if env_id.startswith("ALE/"):
        import ale_py

        gym.register_envs(ale_py)
        from ale_py.vector_env import AtariVectorEnv

        game = env_id.split("/", 1)[1].split("-")[0]
        game = "".join("_" + c.lower() if c.isupper() else c for c in game).lstrip("_")
        # Unclipped rewards, so logged episode returns are game scores; the actor clips for training.
        kwargs.setdefault("reward_clipping", False)
        env = AtariVectorEnv(game=game, num_envs=num_envs, stack_num=3, **kwargs)
        env.reset(seed=seed)
        return env
    env = SyncVectorEnv(
        [lambda: gym.make(env_id, **kwargs) for _ in range(num_envs)], autoreset_mode=AutoresetMode.SAME_STEP
    )
    env.reset(seed=seed)
    env.action_space.seed(seed)
    return env
