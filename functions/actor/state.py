"""What a warm actor instance keeps of one actor between invocations (`functions.runtime.context.WarmState`)."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from functions.actor.rollout import ClippedRewards, EpisodeTracker, RewardScaler
from functions.model.policies import ActorCritic


@dataclass
class ActorState:
    envs: gym.vector.VectorEnv
    obs: np.ndarray
    tracker: EpisodeTracker
    policy: ActorCritic
    reward_scaler: RewardScaler | ClippedRewards | None
    rng: torch.Generator  # the actor's own action sampling, seeded like its envs: round 1 repeats for a seed
    version: int = -1
    round_trips: int = 0  # the cache client's count when the last batch was pushed
    batches_pushed: int = 0  # numbers the batches, so that the control plane can tell a lost one
